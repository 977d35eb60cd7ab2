//! Counters of every transfer, allocation and cache lookup a HAL makes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Bytes and calls in one direction.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let before = hal.ledger();
/// let b = hal.copy_from("b", &[0u8; 1000]).unwrap();
/// b.to_vec().unwrap();
/// b.to_vec().unwrap(); // phase 2 serves this one from the host copy
/// let d = hal.ledger().since(&before);
/// assert_eq!((d.h2d.bytes, d.h2d.calls), (1000, 1));
/// assert_eq!(d.d2h.bytes, if cuda_hal::PHASES.host_cache { 1000 } else { 2000 });
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes moved.
    pub bytes: u64,
    /// Logical copies: one chunked transfer counts once, and so does a batch whose kernel
    /// moves its bytes through a mapped pinned block (`HalConfig::mapped_batches`).
    pub calls: u64,
    /// Device time of the timed copies, in nanoseconds (`HalConfig::time_transfers`).
    pub device_ns: u64,
}

impl Traffic {
    /// Bytes per second over the timed device time (0 when nothing was timed).
    ///
    /// ```
    /// use cuda_hal::Traffic;
    /// let t = Traffic { bytes: 1 << 30, calls: 1, device_ns: 25_000_000 };
    /// assert!((t.bandwidth() / 1e9 - 42.95).abs() < 0.01); // GB/s
    /// assert_eq!(Traffic::default().bandwidth(), 0.0);
    /// ```
    pub fn bandwidth(&self) -> f64 {
        if self.device_ns == 0 {
            0.0
        } else {
            self.bytes as f64 / (self.device_ns as f64 * 1e-9)
        }
    }
}

/// A snapshot of a HAL's counters. Subtract two with [`LedgerSnapshot::since`].
///
/// ```
/// use cuda_hal::{CudaHal, HalConfig};
/// let config = HalConfig { time_transfers: true, ..HalConfig::default() };
/// let Ok(hal) = CudaHal::with_config(0, config) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.copy_from("b", &vec![1u32; 16 << 20]).unwrap();
/// let s = hal.stats().unwrap().ledger; // (`ledger()` alone does not collect the timings)
/// println!("upload: {:.1} GB/s on the device", s.h2d.bandwidth() / 1e9);
/// assert_eq!(s.h2d.bytes, 64 << 20);
/// drop(b);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// Host to device.
    pub h2d: Traffic,
    /// Device to host.
    pub d2h: Traffic,
    /// Device to device.
    pub d2d: Traffic,
    /// Allocations through `cuMemAlloc`.
    pub driver_allocs: u64,
    /// Allocations through `cuMemAllocFromPoolAsync`.
    pub pool_allocs: u64,
    /// Allocations served by a cached pool block (phase 3), with no driver call.
    pub cached_allocs: u64,
    /// Frees of either kind.
    pub frees: u64,
    /// Host reads served by the phase-2 cache without a transfer.
    pub cache_hits: u64,
    /// Host reads that had to transfer.
    pub cache_misses: u64,
    /// Kernel launches.
    pub launches: u64,
    /// Pooled allocations served without the pool growing (block-cache hits included).
    pub pool_hits: u64,
    /// Pooled allocations that made the pool reserve more memory.
    pub pool_misses: u64,
    /// Times an allocation the driver refused for lack of memory made room (the prover
    /// tables, the block cache and the pool's reserve freed, after a wait for the stream;
    /// then the other HALs of the device) and asked again, whether or not it then got
    /// its memory. Each costs a stream wait: a count that grows says the working set is
    /// at the device's size.
    pub oom_retries: u64,
    /// Allocations refused with [`Error::OutOfMemory`](crate::Error::OutOfMemory): past
    /// the HAL's limit or the device's size, or by the driver after the retries. Those
    /// the crate's own operations absorb (an NTT that then runs in column groups) count
    /// too.
    pub out_of_memory: u64,
}

impl LedgerSnapshot {
    /// The counts between `earlier` and `self`.
    ///
    /// ```
    /// use cuda_hal::LedgerSnapshot;
    /// let mut a = LedgerSnapshot::default();
    /// let mut b = a;
    /// b.d2h.bytes = 4;
    /// b.d2h.calls = 1;
    /// assert_eq!(b.since(&a).d2h.bytes, 4);
    /// a.cache_hits = 0;
    /// ```
    pub fn since(&self, earlier: &LedgerSnapshot) -> LedgerSnapshot {
        let t = |a: Traffic, b: Traffic| Traffic {
            bytes: a.bytes.saturating_sub(b.bytes),
            calls: a.calls.saturating_sub(b.calls),
            device_ns: a.device_ns.saturating_sub(b.device_ns),
        };
        LedgerSnapshot {
            h2d: t(self.h2d, earlier.h2d),
            d2h: t(self.d2h, earlier.d2h),
            d2d: t(self.d2d, earlier.d2d),
            driver_allocs: self.driver_allocs.saturating_sub(earlier.driver_allocs),
            pool_allocs: self.pool_allocs.saturating_sub(earlier.pool_allocs),
            cached_allocs: self.cached_allocs.saturating_sub(earlier.cached_allocs),
            frees: self.frees.saturating_sub(earlier.frees),
            cache_hits: self.cache_hits.saturating_sub(earlier.cache_hits),
            cache_misses: self.cache_misses.saturating_sub(earlier.cache_misses),
            launches: self.launches.saturating_sub(earlier.launches),
            pool_hits: self.pool_hits.saturating_sub(earlier.pool_hits),
            pool_misses: self.pool_misses.saturating_sub(earlier.pool_misses),
            oom_retries: self.oom_retries.saturating_sub(earlier.oom_retries),
            out_of_memory: self.out_of_memory.saturating_sub(earlier.out_of_memory),
        }
    }

    /// Bytes moved in all directions.
    ///
    /// ```
    /// use cuda_hal::{LedgerSnapshot, Traffic};
    /// let s = LedgerSnapshot {
    ///     h2d: Traffic { bytes: 10, calls: 1, device_ns: 0 },
    ///     d2d: Traffic { bytes: 5, calls: 1, device_ns: 0 },
    ///     ..LedgerSnapshot::default()
    /// };
    /// assert_eq!(s.bytes_moved(), 15);
    /// ```
    pub fn bytes_moved(&self) -> u64 {
        self.h2d.bytes + self.d2h.bytes + self.d2d.bytes
    }
}

/// Direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    H2D,
    D2H,
    D2D,
}

/// Kind of allocation that reached the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocKind {
    Driver,
    Pool,
}

/// Counts of the allocation hot path, kept as plain integers under the lock every free
/// and every pooled allocation takes anyway (`crate::allocs`), instead of as atomics; a
/// HAL that tracks its allocations derives them from the tracker instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HotCounts {
    /// Allocations served by a cached block (each also a pool hit).
    pub(crate) cached_allocs: u64,
    /// Frees of either kind.
    pub(crate) frees: u64,
}

#[derive(Default)]
pub(crate) struct Ledger {
    bytes: [AtomicU64; 3],
    calls: [AtomicU64; 3],
    device_ns: [AtomicU64; 3],
    driver_allocs: AtomicU64,
    pool_allocs: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    launches: AtomicU64,
    pool_hits: AtomicU64,
    pool_misses: AtomicU64,
    oom_retries: AtomicU64,
    out_of_memory: AtomicU64,
}

impl Ledger {
    pub(crate) fn copy(&self, dir: Dir, bytes: usize) {
        let i = dir as usize;
        self.bytes[i].fetch_add(bytes as u64, Relaxed);
        self.calls[i].fetch_add(1, Relaxed);
    }

    pub(crate) fn device_time(&self, dir: Dir, ns: u64) {
        self.device_ns[dir as usize].fetch_add(ns, Relaxed);
    }

    pub(crate) fn alloc(&self, kind: AllocKind) {
        match kind {
            AllocKind::Driver => &self.driver_allocs,
            AllocKind::Pool => &self.pool_allocs,
        }
        .fetch_add(1, Relaxed);
    }

    pub(crate) fn cache(&self, hit: bool) {
        if hit {
            &self.cache_hits
        } else {
            &self.cache_misses
        }
        .fetch_add(1, Relaxed);
    }

    /// A batch's host reads: `hits` served by valid host copies, `misses` transferred.
    pub(crate) fn cache_reads(&self, hits: usize, misses: usize) {
        if hits > 0 {
            self.cache_hits.fetch_add(hits as u64, Relaxed);
        }
        if misses > 0 {
            self.cache_misses.fetch_add(misses as u64, Relaxed);
        }
    }

    pub(crate) fn pool_hit(&self, hit: bool) {
        if hit {
            &self.pool_hits
        } else {
            &self.pool_misses
        }
        .fetch_add(1, Relaxed);
    }

    pub(crate) fn launch(&self) {
        self.launches.fetch_add(1, Relaxed);
    }

    /// An allocation the driver refused made room and asks again.
    pub(crate) fn oom_retry(&self) {
        self.oom_retries.fetch_add(1, Relaxed);
    }

    /// An allocation was refused with `Error::OutOfMemory`.
    pub(crate) fn out_of_memory(&self) {
        self.out_of_memory.fetch_add(1, Relaxed);
    }

    /// The counters, with the hot-path counts kept elsewhere added in.
    pub(crate) fn snapshot(&self, hot: HotCounts) -> LedgerSnapshot {
        let t = |d: Dir| Traffic {
            bytes: self.bytes[d as usize].load(Relaxed),
            calls: self.calls[d as usize].load(Relaxed),
            device_ns: self.device_ns[d as usize].load(Relaxed),
        };
        LedgerSnapshot {
            h2d: t(Dir::H2D),
            d2h: t(Dir::D2H),
            d2d: t(Dir::D2D),
            driver_allocs: self.driver_allocs.load(Relaxed),
            pool_allocs: self.pool_allocs.load(Relaxed),
            cached_allocs: hot.cached_allocs,
            frees: hot.frees,
            cache_hits: self.cache_hits.load(Relaxed),
            cache_misses: self.cache_misses.load(Relaxed),
            launches: self.launches.load(Relaxed),
            pool_hits: self.pool_hits.load(Relaxed) + hot.cached_allocs,
            pool_misses: self.pool_misses.load(Relaxed),
            oom_retries: self.oom_retries.load(Relaxed),
            out_of_memory: self.out_of_memory.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_direction_and_kind() {
        let l = Ledger::default();
        l.copy(Dir::H2D, 100);
        l.copy(Dir::H2D, 28);
        l.copy(Dir::D2H, 4);
        l.alloc(AllocKind::Pool);
        l.alloc(AllocKind::Driver);
        l.pool_hit(false);
        l.cache(true);
        l.cache(false);
        l.cache(false);
        l.oom_retry();
        l.oom_retry();
        l.out_of_memory();
        let hot = HotCounts {
            cached_allocs: 2,
            frees: 1,
        };
        let s = l.snapshot(hot);
        assert_eq!((s.h2d.bytes, s.h2d.calls), (128, 2));
        assert_eq!((s.d2h.bytes, s.d2h.calls), (4, 1));
        l.device_time(Dir::D2H, 1_000_000_000);
        assert_eq!(l.snapshot(hot).d2h.bandwidth(), 4.0);
        assert_eq!(s.d2d, Traffic::default());
        assert_eq!((s.pool_allocs, s.driver_allocs, s.frees), (1, 1, 1));
        assert_eq!((s.cache_hits, s.cache_misses), (1, 2));
        assert_eq!(s.cached_allocs, 2);
        assert_eq!((s.oom_retries, s.out_of_memory), (2, 1));
        assert_eq!(
            (s.pool_hits, s.pool_misses),
            (2, 1),
            "cached blocks are pool hits"
        );
        let before = s;
        l.copy(Dir::D2D, 8);
        l.out_of_memory();
        let d = l.snapshot(hot).since(&before);
        assert_eq!((d.oom_retries, d.out_of_memory), (0, 1));
        assert_eq!((d.d2d.bytes, d.d2d.calls), (8, 1));
        assert_eq!(d.bytes_moved(), 8);
        assert_eq!(d.h2d, Traffic::default());
    }
}
