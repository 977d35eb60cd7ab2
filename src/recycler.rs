//! Objects handed out again once no one holds them: the HAL's events, so that an
//! operation that orders work with an event does not create and destroy one each time
//! (`cuEventCreate` and `cuEventDestroy` cost about a microsecond each on the H100 hosts).

use std::sync::Arc;

use parking_lot::Mutex;

/// A few shared objects, each handed out again when the recycler is its only holder. For
/// events: take one, record it, give clones to whatever waits on it (a buffer's side
/// uses, a pinned block); once they have all let go it is recorded again elsewhere.
pub(crate) struct Recycler<T> {
    kept: Mutex<Vec<Arc<T>>>,
    cap: usize,
}

impl<T> Recycler<T> {
    /// A recycler that keeps at most `cap` objects (any more are made and dropped as
    /// usual).
    pub(crate) fn new(cap: usize) -> Self {
        Recycler {
            kept: Mutex::new(Vec::new()),
            cap,
        }
    }

    /// A kept object no one else holds, or a new one from `make` (kept if there is room).
    /// Holders only ever let go of an object, never take it again from one another
    /// without it, so one found free under the lock stays free until handed out.
    pub(crate) fn take<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let mut kept = self.kept.lock();
        if let Some(free) = kept.iter().find(|x| Arc::strong_count(x) == 1) {
            return Ok(free.clone());
        }
        let new = Arc::new(make()?);
        if kept.len() < self.cap {
            kept.push(new.clone());
        }
        Ok(new)
    }

    /// Objects kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.kept.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> (
        std::cell::Cell<u32>,
        impl Fn(&std::cell::Cell<u32>) -> Result<u32, ()>,
    ) {
        (std::cell::Cell::new(0), |made: &std::cell::Cell<u32>| {
            made.set(made.get() + 1);
            Ok(made.get())
        })
    }

    #[test]
    fn an_object_is_handed_out_again_only_once_no_one_holds_it() {
        let r = Recycler::new(4);
        let (made, make) = counter();
        let a = r.take(|| make(&made)).unwrap();
        let b = r.take(|| make(&made)).unwrap();
        assert_ne!(*a, *b, "a held object is not handed out twice");
        assert_eq!(made.get(), 2);
        drop(a);
        let c = r.take(|| make(&made)).unwrap();
        assert_eq!(*c, 1, "the first is free again");
        assert_eq!(made.get(), 2, "nothing new made");
        // A copy of the handle kept elsewhere (a buffer's side list) keeps it taken.
        let keep = c.clone();
        drop(c);
        let d = r.take(|| make(&made)).unwrap();
        assert_eq!(*d, 3);
        drop(keep);
        assert_eq!(*r.take(|| make(&made)).unwrap(), 1);
    }

    #[test]
    fn past_the_cap_objects_are_made_and_not_kept() {
        let r = Recycler::new(2);
        let (made, make) = counter();
        let held: Vec<_> = (0..5).map(|_| r.take(|| make(&made)).unwrap()).collect();
        assert_eq!(made.get(), 5);
        assert_eq!(r.kept(), 2);
        drop(held);
        assert_eq!(*r.take(|| make(&made)).unwrap(), 1);
        assert_eq!(made.get(), 5);
    }

    #[test]
    fn a_failure_to_make_one_is_passed_on_and_nothing_kept() {
        let r: Recycler<u32> = Recycler::new(2);
        assert_eq!(r.take(|| Err::<u32, &str>("no")).unwrap_err(), "no");
        assert_eq!(r.kept(), 0);
    }
}
