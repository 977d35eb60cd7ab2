//! Threads kept for work that runs beside its caller: a read past the pinned pool copies
//! its device snapshot out on one of them, so that `read_async` returns at once.
//!
//! Starting a thread for each such read took 50-90 us of `read_async` on the GPU machines,
//! and the new thread's first instruction ran about 90 us after that: more than the rest
//! of the call together. A kept thread takes its next task in a few microseconds.
//!
//! Threads start as tasks need them (as many as run at once) and end after [`KEEP`]
//! without a task. They are named `cuda-hal-read`, which is how Nsight Systems shows them.
//!
//! Not the copy threads (`copy_threads.rs`): a read's task itself runs a staged download,
//! whose chunks go to the copy threads. A task on one of them would wait for its own pool,
//! and `copy_threads::run_each` gives such a caller a thread of its own per chunk instead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long a thread waits for its next task before it ends.
const KEEP: Duration = Duration::from_secs(5);

/// The process's kept threads.
static THREADS: KeptThreads = KeptThreads::new(KEEP);

/// Runs `f` on a kept thread (started if none is idle). An error only where the OS would
/// not start a thread; `f` was then dropped unrun, on this thread.
pub(crate) fn run<T, F>(f: F) -> std::io::Result<Task<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    THREADS.run(f)
}

/// What a task left: its value, or the payload of the panic that ended it.
pub(crate) type Outcome<T> = std::thread::Result<T>;

/// A task handed to a kept thread.
pub(crate) struct Task<T> {
    slot: Arc<Slot<T>>,
}

struct Slot<T> {
    outcome: Mutex<Option<Outcome<T>>>,
    ready: Condvar,
}

impl<T> Task<T> {
    /// Whether the task has ended (`join` returns at once).
    pub(crate) fn is_finished(&self) -> bool {
        self.slot.outcome.lock().is_some()
    }

    /// Waits for the task to end. Everything `f` took was dropped by then.
    pub(crate) fn join(self) -> Outcome<T> {
        let mut outcome = self.slot.outcome.lock();
        loop {
            if let Some(o) = outcome.take() {
                return o;
            }
            self.slot.ready.wait(&mut outcome);
        }
    }
}

/// Hands a task's outcome to its [`Task`] as it goes: after what the task took was
/// dropped, and after its thread is back on the idle list (so a task that follows the
/// outcome finds it there). A task dropped unrun (its thread never started) still wakes
/// whoever waits for it.
struct Completion<T> {
    slot: Arc<Slot<T>>,
    outcome: Option<Outcome<T>>,
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err(Box::new("the task never ran")));
        *self.slot.outcome.lock() = Some(outcome);
        self.slot.ready.notify_all();
    }
}

/// A task as its thread runs it: what it returns is dropped to hand the outcome over.
type Job = Box<dyn FnOnce() -> Delivery + Send>;

/// A finished task's [`Completion`].
type Delivery = Box<dyn Send>;

/// Threads waiting for a task, each by its channel.
struct KeptThreads {
    idle: Mutex<Vec<Idle>>,
    keep: Duration,
    next_id: AtomicU64,
}

struct Idle {
    id: u64,
    jobs: mpsc::Sender<Job>,
}

impl KeptThreads {
    const fn new(keep: Duration) -> Self {
        KeptThreads {
            idle: Mutex::new(Vec::new()),
            keep,
            next_id: AtomicU64::new(0),
        }
    }

    fn run<T, F>(&'static self, f: F) -> std::io::Result<Task<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = Arc::new(Slot {
            outcome: Mutex::new(None),
            ready: Condvar::new(),
        });
        let mut done = Completion {
            slot: slot.clone(),
            outcome: None,
        };
        // `f`'s captures are dropped as its call ends, before `done` hands the outcome over.
        let mut job: Job = Box::new(move || {
            done.outcome = Some(catch_unwind(AssertUnwindSafe(f)));
            Box::new(done)
        });
        loop {
            let idle = self.idle.lock().pop();
            let Some(thread) = idle else { break };
            match thread.jobs.send(job) {
                Ok(()) => return Ok(Task { slot }),
                // (Not expected: a thread ends only after taking itself off the list.)
                Err(mpsc::SendError(j)) => job = j,
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("cuda-hal-read".into())
            .spawn(move || self.serve(id, job, jobs, queue))?;
        Ok(Task { slot })
    }

    /// A kept thread's life: its first job, then each job sent to it while it is on the
    /// idle list, until it waited `keep` for one.
    fn serve(&self, id: u64, first: Job, jobs: mpsc::Sender<Job>, queue: mpsc::Receiver<Job>) {
        let mut job = first;
        loop {
            let delivery = job(); // (panics are caught inside)
            self.idle.lock().push(Idle {
                id,
                jobs: jobs.clone(),
            });
            drop(delivery);
            job = loop {
                match queue.recv_timeout(self.keep) {
                    Ok(next) => break next,
                    Err(RecvTimeoutError::Timeout) => {
                        let mut idle = self.idle.lock();
                        if let Some(k) = idle.iter().position(|t| t.id == id) {
                            idle.swap_remove(k);
                            return;
                        }
                        // Off the list: a caller took this thread, and its job is on its way.
                    }
                    // (This thread holds a sender: the channel stays open.)
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KeptThreads;
    use std::sync::mpsc;
    use std::time::Duration;

    fn threads(keep_ms: u64) -> &'static KeptThreads {
        Box::leak(Box::new(KeptThreads::new(Duration::from_millis(keep_ms))))
    }

    #[test]
    fn a_task_returns_its_value_and_a_panic_becomes_an_error() {
        let t = threads(1000);
        let task = t.run(|| 6 * 7).unwrap();
        assert_eq!(task.join().unwrap(), 42);
        let task = t.run(|| -> u32 { panic!("on purpose") }).unwrap();
        assert!(task.join().is_err());
        // The thread goes on after a panicking task.
        assert_eq!(t.run(|| 1).unwrap().join().unwrap(), 1);
        assert_eq!(t.idle.lock().len(), 1, "one thread served all three");
    }

    #[test]
    fn tasks_one_after_another_share_a_thread_and_are_finished_when_joined() {
        let t = threads(1000);
        let first = t.run(|| std::thread::current().id()).unwrap();
        let first_id = first.join().unwrap();
        let (go, wait) = mpsc::channel::<()>();
        let second = t
            .run(move || {
                wait.recv().unwrap();
                std::thread::current().id()
            })
            .unwrap();
        assert!(!second.is_finished(), "the task waits for its go");
        go.send(()).unwrap();
        while !second.is_finished() {
            std::thread::yield_now();
        }
        assert_eq!(second.join().unwrap(), first_id);
    }

    #[test]
    fn tasks_at_once_get_threads_of_their_own() {
        let t = threads(1000);
        // Each task hands the other its token and waits for the other's: one thread for both
        // would wait forever (the timeouts turn that into a failure).
        let (to_b, from_a) = mpsc::channel::<u32>();
        let (to_a, from_b) = mpsc::channel::<u32>();
        let a = t
            .run(move || {
                to_b.send(1).unwrap();
                from_b.recv_timeout(Duration::from_secs(10)).ok()
            })
            .unwrap();
        let b = t
            .run(move || {
                to_a.send(2).unwrap();
                from_a.recv_timeout(Duration::from_secs(10)).ok()
            })
            .unwrap();
        assert_eq!(a.join().unwrap(), Some(2));
        assert_eq!(b.join().unwrap(), Some(1));
    }

    #[test]
    fn an_idle_thread_ends_after_its_keep_time_and_a_new_one_starts() {
        let t = threads(20);
        let first = t
            .run(|| std::thread::current().id())
            .unwrap()
            .join()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            std::thread::sleep(Duration::from_millis(30));
            if t.idle.lock().is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the idle thread never ended"
            );
        }
        let second = t
            .run(|| std::thread::current().id())
            .unwrap()
            .join()
            .unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn what_a_task_took_is_dropped_before_its_outcome_is_seen() {
        struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Flag(dropped.clone());
        let t = threads(1000);
        let task = t
            .run(move || {
                let _held = &flag;
                std::thread::sleep(Duration::from_millis(20));
            })
            .unwrap();
        task.join().unwrap();
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    }
}
