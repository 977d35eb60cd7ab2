//! The threads that share a staged transfer's chunks: one pool for the process, started on
//! first use, so that a transfer does not start threads of its own. Starting and joining a
//! thread costs tens of microseconds, and a transfer of 16 workers paid that 15 times.
//!
//! The pool's threads are named `cuda-hal-copy-N`, which is how Nsight Systems shows them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::{Error, Result};

/// The copy threads, or `None` where the OS would not start them.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.clamp(1, 64))
            .thread_name(|i| format!("cuda-hal-copy-{i}"))
            .build()
            .map_err(|e| log::warn!("no copy threads ({e}): each transfer starts its own"))
            .ok()
    })
    .as_ref()
}

/// Runs `work(w)` for every `w` in `0..n`, `work(0)` on the calling thread, and returns
/// when all have ended: `Ok`, or the error of the lowest `w` that failed. A `work` that
/// panics fails with [`Error::InvalidArgument`]. Up to one more than the host has cores
/// run at once, the rest after them: no `work(w)` may wait for another.
///
/// The others run on the copy threads, unless the caller is itself a thread of a rayon
/// pool: such a thread would run other tasks of its pool while it waits, and one of those
/// could wait for what this call holds. Those callers, and any where the copy threads
/// could not start, get a thread of their own for each `w`, as before the pool.
pub(crate) fn run_each(n: usize, work: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let run = |w: usize| {
        catch_unwind(AssertUnwindSafe(|| work(w)))
            .unwrap_or_else(|_| Err(Error::InvalidArgument("a copy worker panicked".into())))
    };
    if n <= 1 {
        return (0..n).try_for_each(run);
    }
    let results: Vec<Mutex<Result<()>>> = (0..n).map(|_| Mutex::new(Ok(()))).collect();
    match pool() {
        Some(pool) if rayon::current_thread_index().is_none() => {
            // In place: this thread is no worker of any pool, so it waits for the tasks
            // without running others.
            pool.in_place_scope(|s| {
                for (w, out) in results.iter().enumerate().skip(1) {
                    let run = &run;
                    s.spawn(move |_| *out.lock() = run(w));
                }
                *results[0].lock() = run(0);
            });
        }
        _ => std::thread::scope(|s| {
            let mut here = vec![0];
            for (w, out) in results.iter().enumerate().skip(1) {
                let run = &run;
                if std::thread::Builder::new()
                    .spawn_scoped(s, move || *out.lock() = run(w))
                    .is_err()
                {
                    // The OS would not start a thread (a thread limit): this one runs that
                    // worker after its own, so the transfer still completes.
                    here.push(w);
                }
            }
            for w in here {
                *results[w].lock() = run(w);
            }
        }),
    }
    results.into_iter().try_for_each(Mutex::into_inner)
}

/// Runs `f` over `bytes` cut into a piece per core (whole multiples of `unit` bytes), on
/// the copy threads, for work on memory that a caller holding a buffer's lock may need:
/// zeroing a host copy, faulting in new pinned memory as the staging pool grows. Never on
/// the rayon pool: its threads may all be waiting for that lock (a prover's `par_iter`
/// reading the buffer), and would never take the pieces, a deadlock. The copy threads take
/// no buffer's lock. Below two units, or on a rayon thread (which would get a thread of
/// its own per piece), `f` runs over the whole on the calling thread.
pub(crate) fn split_over(bytes: &mut [u8], unit: usize, f: &(dyn Fn(&mut [u8]) + Sync)) {
    if bytes.len() < 2 * unit || rayon::current_thread_index().is_some() {
        return f(bytes);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let piece = bytes.len().div_ceil(threads).next_multiple_of(unit);
    let pieces: Vec<Mutex<&mut [u8]>> = bytes.chunks_mut(piece).map(Mutex::new).collect();
    let done = run_each(pieces.len(), &|w| {
        f(&mut pieces[w].lock());
        Ok(())
    });
    if done.is_err() {
        // (Only a piece's panic fails it: each piece again, here.)
        for p in &pieces {
            f(&mut p.lock());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// Every worker runs once, the first on the calling thread, with the others at the
    /// same time: each waits until all have started, which would hang if they took turns.
    fn all_run_at_once(n: usize) -> Vec<std::thread::ThreadId> {
        let started = AtomicUsize::new(0);
        let threads = Mutex::new(vec![None; n]);
        run_each(n, &|w| {
            started.fetch_add(1, SeqCst);
            let t0 = std::time::Instant::now();
            while started.load(SeqCst) < n {
                assert!(
                    t0.elapsed().as_secs() < 30,
                    "worker {w} waited for the others"
                );
                std::thread::yield_now();
            }
            threads.lock()[w] = Some(std::thread::current().id());
            Ok(())
        })
        .unwrap();
        threads
            .into_inner()
            .into_iter()
            .map(Option::unwrap)
            .collect()
    }

    #[test]
    fn split_over_reaches_every_byte_once() {
        for len in [0, 1, 4095, 1 << 20, (8 << 20) + 17] {
            let mut bytes = vec![0u8; len];
            split_over(&mut bytes, 1 << 20, &|p| p.iter_mut().for_each(|b| *b += 1));
            assert!(bytes.iter().all(|&b| b == 1), "{len} bytes");
        }
    }

    #[test]
    fn workers_run_at_once_the_first_on_the_calling_thread() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for n in [1, 2, 5, 16].map(|n: usize| n.min(cores + 1)) {
            let ids = all_run_at_once(n);
            assert_eq!(ids[0], std::thread::current().id(), "n = {n}");
            let distinct: std::collections::HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), n, "n = {n}: one thread a worker");
        }
        assert_eq!(run_each(0, &|_| unreachable!()), Ok(()));
    }

    #[test]
    fn a_thread_of_a_rayon_pool_gets_threads_of_its_own() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        // More workers than the host has cores, all at once: their own threads.
        let ids = pool.install(|| all_run_at_once(24));
        assert_eq!(ids.len(), 24);
        // The copy threads serve a caller that is no pool's thread, named as such.
        let names = Mutex::new(Vec::new());
        run_each(3, &|_| {
            names
                .lock()
                .push(std::thread::current().name().map(str::to_owned));
            Ok(())
        })
        .unwrap();
        let names = names.into_inner();
        let copy = names
            .iter()
            .flatten()
            .filter(|n| n.starts_with("cuda-hal-copy-"));
        assert_eq!(copy.count(), 2, "{names:?}");
    }

    #[test]
    fn more_workers_than_copy_threads_all_run() {
        let ran = Mutex::new(Vec::new());
        run_each(100, &|w| {
            ran.lock().push(w);
            Ok(())
        })
        .unwrap();
        let mut ran = ran.into_inner();
        ran.sort_unstable();
        assert_eq!(ran, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn the_lowest_failing_worker_gives_the_error_and_a_panic_is_an_error() {
        let ran = AtomicUsize::new(0);
        let r = run_each(6, &|w| {
            ran.fetch_add(1, SeqCst);
            match w {
                2 => Err(Error::InvalidArgument("two".into())),
                4 => Err(Error::InvalidArgument("four".into())),
                _ => Ok(()),
            }
        });
        assert_eq!(r, Err(Error::InvalidArgument("two".into())));
        assert_eq!(ran.load(SeqCst), 6, "every worker runs to its end");
        let r = run_each(3, &|w| if w == 1 { panic!("worker one") } else { Ok(()) });
        assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("panicked")));
    }
}
