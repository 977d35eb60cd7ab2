//! A value shared by the HALs of one context while one of them holds it: the context's
//! poisoning, the crate's loaded kernels. Looked up by context handle when a HAL starts
//! (and when a sticky error comes), never on an operation's path.

use std::sync::{Arc, Weak};

use cuda_sys::CUcontext;
use parking_lot::Mutex;

/// One context's value, behind a lock of its own that is held while the value is made.
type Slot<T> = Arc<Mutex<Weak<T>>>;

/// Values of type `T`, one per context, each kept while something holds it.
///
/// Making a value (loading a module takes milliseconds) holds only its context's slot: HALs
/// starting at once on one context make it once, and on different contexts side by side.
pub(crate) struct PerContext<T> {
    slots: Mutex<Vec<(usize, Slot<T>)>>,
}

impl<T> PerContext<T> {
    pub(crate) const fn new() -> Self {
        PerContext {
            slots: Mutex::new(Vec::new()),
        }
    }

    /// The value of context `ctx` that something holds, else the one `make` gives, kept for
    /// the next caller while a holder lives. A failure of `make` is returned and not kept:
    /// the next caller makes it again.
    pub(crate) fn get_or_make<E>(
        &self,
        ctx: CUcontext,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let slot = {
            let mut slots = self.slots.lock();
            // A slot no caller holds is not locked, so the check does not wait; its entry
            // goes once its value has no holder, so the table does not grow.
            slots.retain(|(_, s)| Arc::strong_count(s) > 1 || s.lock().strong_count() > 0);
            match slots.iter().find(|(c, _)| *c == ctx as usize) {
                Some((_, s)) => Arc::clone(s),
                None => {
                    let s = Slot::default();
                    slots.push((ctx as usize, Arc::clone(&s)));
                    s
                }
            }
        };
        let mut held = slot.lock();
        if let Some(value) = held.upgrade() {
            return Ok(value);
        }
        let value = Arc::new(make()?);
        *held = Arc::downgrade(&value);
        Ok(value)
    }

    /// The value of context `ctx`, if something holds it.
    pub(crate) fn get(&self, ctx: CUcontext) -> Option<Arc<T>> {
        let slot = self
            .slots
            .lock()
            .iter()
            .find(|(c, _)| *c == ctx as usize)
            .map(|(_, s)| Arc::clone(s))?;
        let value = slot.lock().upgrade();
        value
    }

    /// How many contexts have an entry (a test's check that entries go).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    fn ctx(n: usize) -> CUcontext {
        (n * 0x1000) as CUcontext
    }

    #[test]
    fn a_value_is_made_once_while_held_and_again_after() {
        let table = PerContext::<usize>::new();
        let made = AtomicUsize::new(0);
        let make = || Ok::<_, ()>(made.fetch_add(1, Ordering::SeqCst));
        let a1 = table.get_or_make(ctx(1), make).unwrap();
        let a2 = table.get_or_make(ctx(1), make).unwrap();
        assert!(Arc::ptr_eq(&a1, &a2), "one value per context while held");
        let b = table.get_or_make(ctx(2), make).unwrap();
        assert_eq!((*a1, *b), (0, 1), "another context gets its own");
        assert!(Arc::ptr_eq(&table.get(ctx(1)).unwrap(), &a1));
        drop((a1, a2));
        assert!(table.get(ctx(1)).is_none(), "no holder: gone");
        assert_eq!(*table.get_or_make(ctx(1), make).unwrap(), 2, "made again");
        assert_eq!(made.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_failed_make_is_not_kept() {
        let table = PerContext::<u8>::new();
        assert_eq!(
            table.get_or_make(ctx(1), || Err("no module")),
            Err("no module")
        );
        assert!(table.get(ctx(1)).is_none());
        assert_eq!(*table.get_or_make(ctx(1), || Ok::<_, &str>(7)).unwrap(), 7);
    }

    #[test]
    fn entries_of_values_no_one_holds_go() {
        let table = PerContext::<u8>::new();
        let kept = table.get_or_make(ctx(1), || Ok::<_, ()>(1)).unwrap();
        for n in 2..100 {
            drop(table.get_or_make(ctx(n), || Ok::<_, ()>(2)).unwrap());
        }
        drop(table.get_or_make(ctx(100), || Ok::<_, ()>(3)).unwrap());
        // The last caller's entry is swept by the next call; the held one stays.
        assert!(table.entries() <= 2, "{} entries", table.entries());
        assert_eq!(*table.get(ctx(1)).unwrap(), *kept);
    }

    #[test]
    fn threads_starting_at_once_on_one_context_make_it_once() {
        let table = PerContext::<usize>::new();
        let made = AtomicUsize::new(0);
        let start = Barrier::new(8);
        let values: Vec<Arc<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        table
                            .get_or_make(ctx(1), || {
                                std::thread::sleep(std::time::Duration::from_millis(20));
                                Ok::<_, ()>(made.fetch_add(1, Ordering::SeqCst))
                            })
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|v| Arc::ptr_eq(v, &values[0])));
    }

    #[test]
    fn contexts_make_their_values_side_by_side() {
        // Context 1's value is made only once context 2's making has begun: a table that
        // made one context's value at a time would never get there (the timeout fails it).
        let table = &PerContext::<u8>::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let first = s.spawn(move || {
                table.get_or_make(ctx(1), || {
                    rx.recv_timeout(std::time::Duration::from_secs(10))
                        .map(|()| 1)
                        .map_err(|_| "context 2 waited for context 1")
                })
            });
            // Let the first thread take its slot before this one starts.
            std::thread::sleep(std::time::Duration::from_millis(50));
            let second = table.get_or_make(ctx(2), || {
                tx.send(()).unwrap();
                Ok::<_, &str>(2)
            });
            assert_eq!(*second.unwrap(), 2);
            assert_eq!(*first.join().unwrap().unwrap(), 1);
        });
    }
}
