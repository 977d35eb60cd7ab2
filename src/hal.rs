//! `CudaHal`: one device's context, stream, memory pool, kernels and counters.

use std::borrow::Cow;
use std::sync::Arc;

use cuda_sys::CUdeviceptr;
use parking_lot::Mutex;

use crate::allocs::{Allocs, Granted, Ticket};
use crate::buffer::Buffer;
use crate::driver::{
    api, DeviceInfo, Event, Function, MemPool, Poisoning, PoolStats, PrimaryContext, Stream,
};
use crate::kernels::KernelTable;
use crate::ledger::{AllocKind, Dir, Ledger, LedgerSnapshot};
use crate::pinned::{PinnedPool, PinnedPoolStats};
use crate::recycler::Recycler;
use crate::staging::{StagingConfig, StagingPool, StagingStats};
use crate::tracking::MemoryReport;
use crate::{Error, Result, PHASES};

/// Settings of a [`CudaHal`]. A byte limit, for example, refuses an allocation before
/// the driver is asked, and says what holds the memory:
///
/// ```
/// use cuda_hal::{CudaHal, Error, HalConfig};
/// let config = HalConfig {
///     memory_limit: Some(1 << 20),
///     ..HalConfig::default()
/// };
/// let Ok(hal) = CudaHal::with_config(0, config) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let witness = hal.alloc::<u8>("witness", 768 << 10).unwrap();
/// match hal.alloc::<u8>("trace", 512 << 10) {
///     Err(Error::OutOfMemory { requested, in_use, limit, largest, .. }) => {
///         assert_eq!((requested, in_use, limit), (512 << 10, 768 << 10, Some(1 << 20)));
///         assert_eq!(largest[0], ("witness".to_string(), 768 << 10));
///     }
///     other => panic!("expected OutOfMemory, got {other:?}"),
/// }
/// drop(witness);
/// assert!(hal.alloc::<u8>("trace", 512 << 10).is_ok()); // within the limit now
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HalConfig {
    /// Bytes the HAL's pool keeps reserved when the stream synchronises; the default
    /// `u64::MAX` keeps everything, so steady-state allocation never reaches the OS.
    pub release_threshold: u64,
    /// Pinned staging used by phase 4.
    pub staging: StagingConfig,
    /// Phase 3: freed pool blocks up to this many bytes are kept, keyed by exact size, and
    /// handed to the next allocation of that size without a driver call (0 disables).
    /// Safe because every use of a block is ordered on the HAL's stream. Flushed when an
    /// allocation runs out of memory, by [`CudaHal::trim_pool`] and on drop.
    pub block_cache_bytes: usize,
    /// Most bytes of pinned blocks kept for async reads and coalesced transfers.
    pub pinned_pool_bytes: usize,
    /// Phase 2: freed buffers' host copies up to this many bytes are kept, by exact size,
    /// for the next buffer of that size that needs one: its pages are faulted in already
    /// (new host memory costs a page fault per 4 KiB when first touched; filling a new
    /// 64 MiB copy took 36 ms on the H100 host, a reused one 5 ms). 0 disables. Freed by
    /// [`CudaHal::trim_pool`] and on drop. See [`HalStats::host_copies`].
    pub host_copy_cache_bytes: usize,
    /// A cap on the bytes of this HAL's live allocations (device buffers and managed
    /// memory); an allocation past it fails with `OutOfMemory` before the driver is asked.
    /// Freed blocks the block cache keeps and memory the pool keeps reserved do not count:
    /// `block_cache_bytes` and `release_threshold` bound those. `None`: only the device
    /// limits.
    pub memory_limit: Option<usize>,
    /// Keep the name and size of every live device allocation
    /// ([`CudaHal::memory_report`]); the limit needs it and turns it on. (Pinned buffers
    /// are tracked whatever it says: [`CudaHal::pinned_report`].)
    pub track_allocations: bool,
    /// Time every transfer on the device with events, so the ledger reports device time and
    /// bandwidth per direction. Costs two event records per copy (about 1 us), so it is off
    /// by default.
    pub time_transfers: bool,
    /// Phase 3: count each allocation that reaches the pool as a hit or a miss
    /// ([`LedgerSnapshot::pool_hits`](crate::LedgerSnapshot::pool_hits), `pool_misses`) by
    /// reading the pool's reserved bytes after it: one `cuMemPoolGetAttribute` per such
    /// allocation (two with a `release_threshold` below `u64::MAX`, since the pool then
    /// shrinks at synchronisations; block cache hits make none). A trim resets the
    /// baseline. With such a threshold the counts are approximate: another thread's
    /// synchronisation between the two reads can shrink the pool, and an allocation that
    /// grew it then counts as a hit. Off, those allocations are not classified:
    /// `pool_hits` then counts only the block cache's hits and `pool_misses` stays 0.
    pub count_pool_hits: bool,
    /// NTTs of `2^4` to `2^27` points run pass kernels compiled for their size, with
    /// every stride and layout a constant (`build.rs` compiles one for each pass of each
    /// plan; a single-pass size, up to `2^12`, for a column count that is a multiple of
    /// `min(32, 2^(12 - log_n))`, and other counts take the generic kernel): a
    /// `2^24`-point NTT took 165 us against 190 us with the generic passes (bench-prover,
    /// H200). Off, they run the generic pass kernels, which take those as arguments (to
    /// compare the two; both give the same results).
    pub ntt_fixed_passes: bool,
    /// A coset LDE's NTT reads the coefficients in its first pass (times the shift's
    /// powers, zeros above), so the expanded column is never written and read back.
    /// Off, an expansion kernel writes it into the output first and the NTT reads it
    /// there (to compare the two; both give the same results). The radix-2 path (columns
    /// of fewer than 16 points) always expands first.
    pub lde_fused_expand: bool,
    /// Batches (`upload_batch`, `download_batch`, `gather`) move their bytes with their
    /// kernel alone, which reads or writes the pinned pool's block in place through its
    /// device mapping (where the device can map host memory): no device scratch and no copy
    /// call. On an H200, 256 slices of 1 KiB went up in 46 us against 50 us and down in 48
    /// us against 58 us, and a gather of 64 elements took 15 us against 24 us; on a
    /// coherent device such as GB10 no second copy of the bytes is made in the memory CPU
    /// and GPU share. An upload with a slice over 64 KiB is copied: its kernel's reads of
    /// host memory are no faster than the copy engine there. Off, every batch copies its
    /// block to or from a device scratch the kernel uses (to compare the two; both give the
    /// same results).
    pub mapped_batches: bool,
    /// Load every kernel of the crate's module (and of each [`CudaHal::load_module`]) when
    /// it is loaded, rather than at each kernel's first launch. (The HALs of one device
    /// share the crate's module: the first loads it, the first with this on its kernels.)
    /// With lazy loading, the driver's default (`CUDA_MODULE_LOADING`), loading a kernel
    /// may wait for the whole context: without this, the first launch of each kernel
    /// waits for the work queued on every stream of the device's context, and a kernel
    /// that waits for another's progress may never end
    /// ([`crate::driver::Module::load_all_functions`]). A driver older than CUDA 12.4
    /// cannot: kernels then load at first use, as with this off.
    pub preload_kernels: bool,
}

impl Default for HalConfig {
    fn default() -> Self {
        HalConfig {
            release_threshold: u64::MAX,
            staging: StagingConfig::default(),
            block_cache_bytes: 1 << 30,
            pinned_pool_bytes: 256 << 20,
            host_copy_cache_bytes: 1 << 30,
            memory_limit: None,
            track_allocations: true,
            time_transfers: false,
            count_pool_hits: true,
            ntt_fixed_passes: true,
            lde_fused_expand: true,
            mapped_batches: true,
            preload_kernels: true,
        }
    }
}

/// Everything [`CudaHal::stats`] reports.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let before = hal.stats().unwrap();
/// let b = hal.copy_from("col", &[7u32; 1024]).unwrap();
/// let after = hal.stats().unwrap();
/// assert_eq!(after.ledger.since(&before.ledger).h2d.bytes, 4096);
/// assert!(after.pool.used_current >= 4096 || !cuda_hal::PHASES.pool_alloc);
/// drop(b);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalStats {
    /// Transfers, allocations, cache lookups and launches so far.
    pub ledger: LedgerSnapshot,
    /// The HAL's own memory pool, from the driver.
    pub pool: PoolStats,
    /// The pinned staging pool.
    pub staging: StagingStats,
    /// Bytes of freed pool blocks kept for reuse (counted as used by `pool`).
    pub cached_bytes: u64,
    /// The pinned block pool used by async reads and coalesced transfers.
    pub pinned: PinnedPoolStats,
    /// Phase 2: the cache of freed buffers' host copies.
    pub host_copies: crate::host_copies::HostCopyStats,
}

/// A handle to one device: cheap to clone, `Send + Sync`. Buffers keep the HAL alive, so
/// the context, stream and pool outlive every allocation made from them.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.copy_from("a", &[1u32, 2, 3]).unwrap();
/// assert_eq!(a.get_at(1).unwrap(), 2);
/// ```
pub struct CudaHal {
    pub(crate) inner: Arc<HalInner>,
    /// Whether this handle counts as one of the user's (`handles`): the library's own
    /// short-lived handles (see [`CudaHal::internal`]) do not, so that dropping them never
    /// takes the count to zero again.
    counted: bool,
}

impl Clone for CudaHal {
    fn clone(&self) -> Self {
        CudaHal::from_inner(self.inner.clone())
    }
}

impl Drop for CudaHal {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let left = self
            .inner
            .handles
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            - 1;
        if left == 0 {
            // The prover tables are buffers, which hold the HAL: free them with the last
            // handle (a later handle made from a buffer rebuilds them on use).
            self.inner.prover.clear();
            let report = self.inner.allocs.report();
            if !report.live.is_empty() {
                log::warn!(
                    "the last handle of the HAL of device {} is gone while buffers remain: {report}",
                    self.inner.info.ordinal
                );
            }
            let pinned = self.inner.aside.pinned_buffers.report();
            if !pinned.live.is_empty() {
                log::warn!(
                    "the last handle of the HAL of device {} is gone while pinned buffers \
                     remain: {pinned}",
                    self.inner.info.ordinal
                );
            }
        }
    }
}

pub(crate) struct HalInner {
    // Declaration order is drop order: everything below goes before the context.
    pub(crate) kernels: KernelTable,
    /// Device tables of the prover operations (twiddles, Poseidon2 constants).
    pub(crate) prover: crate::prover_ops::ProverCache,
    staging: StagingPool,
    pub(crate) pinned: PinnedPool,
    /// The block cache, the tracker and the hot-path counts, under one lock.
    pub(crate) allocs: Allocs,
    pool: MemPool,
    pub(crate) stream: std::sync::Arc<Stream>,
    pub(crate) ledger: Ledger,
    /// The sticky error that poisoned the context, shared by every HAL on it. Checked by
    /// every operation, so a lock-free read.
    poisoned: Arc<Poisoning>,
    timings: Mutex<Timings>,
    /// Peer access and reused events: boxed, off the allocation path's lines.
    pub(crate) aside: Box<Aside>,
    /// Live `CudaHal` handles (buffers hold the inner state, not a handle).
    handles: std::sync::atomic::AtomicUsize,
    info: DeviceInfo,
    pub(crate) config: HalConfig,
    pub(crate) ctx: PrimaryContext,
}

impl CudaHal {
    /// Opens device `ordinal` with the default [`HalConfig`].
    ///
    /// ```
    /// use cuda_hal::{driver::device_count, CudaHal, Error};
    /// match CudaHal::new(0) {
    ///     Ok(hal) => println!("device 0: {}", hal.info().name),
    ///     Err(e) => return println!("no CUDA device here: {e}"),
    /// }
    /// // An ordinal past the last device is a typed error, not a panic.
    /// let n = device_count().unwrap();
    /// assert!(matches!(CudaHal::new(n), Err(Error::NoDevice { .. })));
    /// ```
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_config(ordinal, HalConfig::default())
    }

    /// Opens device `ordinal`: retains its primary context, creates a non-blocking stream,
    /// creates the HAL's own memory pool and loads the embedded kernels, or shares them
    /// with the HALs already open on the device (loading them is most of a first HAL's
    /// start).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, HalConfig};
    /// let config = HalConfig {
    ///     block_cache_bytes: 0,      // every free goes back to the pool
    ///     track_allocations: false,  // no names kept
    ///     ..HalConfig::default()
    /// };
    /// let Ok(hal) = CudaHal::with_config(0, config) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// drop(hal.alloc::<u8>("scratch", 4096).unwrap());
    /// assert_eq!(hal.stats().unwrap().cached_bytes, 0);
    /// assert!(hal.memory_report().live.is_empty());
    /// ```
    pub fn with_config(ordinal: usize, config: HalConfig) -> Result<Self> {
        // On a device whose context a fault broke earlier in the process, the driver still
        // hands the context out, and the first call in it fails with the sticky error
        // (`ContextPoisoned`). A HAL on a context that a live one found broken is refused
        // without asking the driver.
        let hal = Self::open(ordinal, config)?;
        hal.inner.usable()?;
        Ok(hal)
    }

    /// [`CudaHal::with_config`] but for the check that no live HAL found the context broken.
    fn open(ordinal: usize, config: HalConfig) -> Result<Self> {
        let info = DeviceInfo::query(ordinal)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        ctx.bind()?;
        let stream = Arc::new(Stream::new_non_blocking()?);
        let pool = MemPool::new(ordinal, config.release_threshold)?;
        let kernels = KernelTable::load(ctx.raw(), config.preload_kernels);
        let staging = StagingPool::new(config.staging);
        let hal = CudaHal {
            counted: true,
            inner: Arc::new(HalInner {
                kernels,
                prover: Default::default(),
                staging,
                pinned: PinnedPool::new(
                    config.pinned_pool_bytes,
                    config.mapped_batches && info.can_map_host_memory,
                ),
                allocs: Allocs::new(
                    config.track_allocations,
                    config.memory_limit,
                    config.block_cache_bytes,
                ),
                pool,
                stream,
                ledger: Ledger::default(),
                poisoned: Poisoning::of(ctx.raw()),
                timings: Mutex::new(Timings::default()),
                aside: Box::new(Aside {
                    peers: Mutex::new(Vec::new()),
                    events: Recycler::new(EVENTS_KEPT),
                    copy_id: crate::streams::new_stream_id(),
                    pool_reserved: Mutex::new(0),
                    host_copies: crate::host_copies::HostCopies::new(config.host_copy_cache_bytes),
                    pinned_buffers: Default::default(),
                }),
                handles: std::sync::atomic::AtomicUsize::new(1),
                info,
                config,
                ctx,
            }),
        };
        register_on_device(ordinal, &hal.inner);
        Ok(hal)
    }

    /// The device's properties.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let info = hal.info();
    /// println!("{} sm_{}{}, {} SMs", info.name, info.compute_capability.0, info.compute_capability.1, info.multiprocessors);
    /// assert_eq!(info.ordinal, 0);
    /// assert!(info.total_memory > 0);
    /// ```
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The configuration the HAL was made with.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, HalConfig};
    /// let config = HalConfig { memory_limit: Some(1 << 30), ..HalConfig::default() };
    /// let Ok(hal) = CudaHal::with_config(0, config) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(hal.config().memory_limit, Some(1 << 30));
    /// ```
    pub fn config(&self) -> &HalConfig {
        &self.inner.config
    }

    /// Waits for all work queued on the HAL's stream.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 1 << 20).unwrap();
    /// b.fill(3).unwrap(); // queued on the stream
    /// hal.synchronize().unwrap(); // done now
    /// assert_eq!(b.get_at(12345).unwrap(), 3);
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let _range = crate::nvtx::range(|| "synchronize".to_string());
        let h = &self.inner;
        h.enter()?;
        h.guard(h.stream.synchronize())
    }

    /// Counters, pool statistics and staging statistics.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// drop(hal.alloc::<u8>("scratch", 1 << 20).unwrap());
    /// let stats = hal.stats().unwrap();
    /// println!("pool reserves {} B, uses {} B", stats.pool.reserved_current, stats.pool.used_current);
    /// if cuda_hal::PHASES.pool_alloc {
    ///     assert_eq!(stats.cached_bytes, 1 << 20); // the freed block waits for its size
    ///     hal.trim_pool(0).unwrap();
    ///     assert_eq!(hal.stats().unwrap().cached_bytes, 0);
    /// }
    /// ```
    pub fn stats(&self) -> Result<HalStats> {
        let h = &self.inner;
        h.ctx.bind()?;
        h.harvest_timings(true)?;
        Ok(HalStats {
            ledger: h.ledger.snapshot(h.allocs.counts()),
            pool: h.pool.stats()?,
            staging: h.staging.stats(),
            cached_bytes: h.allocs.cached_bytes() as u64,
            pinned: h.pinned.stats(),
            host_copies: h.aside.host_copies.stats(),
        })
    }

    /// The HAL's stream, for queueing your own kernels in order with the HAL's work
    /// (use [`Buffer::device_ptr`] and [`Buffer::device_ptr_mut`] for their arguments).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 1 << 20).unwrap();
    /// b.fill(5).unwrap(); // queued on the HAL's stream
    /// // SAFETY: the stream is the HAL's, alive while `hal` is.
    /// unsafe {
    ///     let d = cuda_hal::cuda_sys::driver().unwrap();
    ///     d.cuStreamSynchronize(hal.stream_handle()).unwrap(); // waits for the fill
    /// }
    /// assert_eq!(b.get_at(0).unwrap(), 5);
    /// ```
    pub fn stream_handle(&self) -> cuda_sys::CUstream {
        self.inner.stream.raw()
    }

    /// Just the counters (no driver call). Pool hits and misses count pooled allocations
    /// served without and with the pool growing:
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let before = hal.ledger();
    /// for _ in 0..3 {
    ///     drop(hal.alloc::<u32>("round", 1 << 16).unwrap());
    /// }
    /// let d = hal.ledger().since(&before);
    /// assert_eq!(d.frees, 3);
    /// if cuda_hal::PHASES.pool_alloc {
    ///     assert!(d.pool_hits >= 2, "the same size again needs no growth: {d:?}");
    /// }
    /// ```
    pub fn ledger(&self) -> LedgerSnapshot {
        let h = &self.inner;
        h.ledger.snapshot(h.allocs.counts())
    }

    /// Frees the cached blocks and returns the pool's reserved memory above `keep_bytes`
    /// to the OS, after the stream's pending frees complete; frees the host copies kept
    /// for reuse and the prover operations' tables (twiddles, shift powers, Poseidon2
    /// constants: made again when next needed) too. NTTs that ran in column groups for want
    /// of memory ask for a whole batch's scratch again.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// drop(hal.alloc::<u8>("big", 64 << 20).unwrap());
    /// hal.trim_pool(0).unwrap();
    /// let stats = hal.stats().unwrap();
    /// assert_eq!(stats.cached_bytes, 0);
    /// assert_eq!(stats.pool.used_current, 0);
    /// assert_eq!(stats.host_copies.kept_bytes, 0);
    /// ```
    pub fn trim_pool(&self, keep_bytes: usize) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("trim_pool keep {keep_bytes} B"));
        let h = &self.inner;
        h.enter()?;
        h.aside.host_copies.clear();
        // The tables are freed before the trim, which then gives their blocks back. Room
        // may be made: NTTs ask for a whole batch's scratch again.
        h.prover.clear();
        h.trim(keep_bytes)
    }

    /// The error that made the context unusable, if a device fault happened.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// // Bad arguments are errors that leave the context usable.
    /// let b = hal.alloc::<u32>("b", 4).unwrap();
    /// assert!(b.get_at(4).is_err());
    /// assert!(hal.poisoned().is_none());
    /// ```
    pub fn poisoned(&self) -> Option<cuda_sys::Error> {
        self.inner.poisoned.cause().cloned()
    }

    /// A buffer of `len` elements with unspecified contents.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let name = format!("column-{}", 3); // a name can also be a `String`
    /// let b = hal.alloc::<u64>(name, 1 << 16).unwrap();
    /// assert_eq!((b.len(), b.size_bytes(), b.name()), (1 << 16, 8 << 16, "column-3"));
    /// assert!(matches!(hal.alloc::<u64>("empty", 0), Err(Error::ZeroLength { .. })));
    /// ```
    pub fn alloc<T: bytemuck::Pod>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Buffer<T>> {
        Buffer::new(self, name.into(), len)
    }

    /// A buffer of `len` zeroed elements.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let acc = hal.alloc_zeroed::<u32>("acc", 1000).unwrap();
    /// assert!(acc.to_vec().unwrap().iter().all(|&x| x == 0));
    /// ```
    pub fn alloc_zeroed<T: bytemuck::Pod>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Buffer<T>> {
        let b = Buffer::new(self, name.into(), len)?;
        let _range = crate::nvtx::range(|| format!("zero {}", b.name()));
        let h = &self.inner;
        h.enter()?;
        // SAFETY: the range is the whole fresh allocation; the memset is stream-ordered.
        let d = h.guard(api())?;
        h.guard(
            h.stream
                .queue(|st| unsafe { d.cuMemsetD8Async(b.raw_ptr(), 0, b.size_bytes(), st) })
                .map_err(Error::from),
        )?;
        // (Still fresh for the host cache: a first `view_mut` starts from the host copy's
        // zeros, which are now the device's too.)
        Ok(b)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let trace: Vec<u32> = (0..1000).collect();
    /// let b = hal.copy_from("trace", &trace).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), trace);
    /// ```
    pub fn copy_from<T: bytemuck::Pod>(
        &self,
        name: impl Into<Cow<'static, str>>,
        data: &[T],
    ) -> Result<Buffer<T>> {
        let b = Buffer::new(self, name.into(), data.len())?;
        b.copy_from_slice(data)?;
        Ok(b)
    }

    pub(crate) fn from_inner(inner: Arc<HalInner>) -> Self {
        inner
            .handles
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        CudaHal {
            inner,
            counted: true,
        }
    }

    /// A handle for the library's own use inside one call (a buffer's operation that needs
    /// the HAL's methods): not one of the user's, so it neither keeps the HAL's tables nor,
    /// when dropped, logs the report of buffers left alive a second time.
    pub(crate) fn internal(inner: &Arc<HalInner>) -> Self {
        CudaHal {
            inner: inner.clone(),
            counted: false,
        }
    }

    /// Every live allocation by name and size, with totals per name and overall (current
    /// and peak). Its `Display` is the report a HAL logs when its last handle is dropped
    /// while buffers live.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.alloc::<u32>("column", 1024).unwrap();
    /// drop(hal.alloc::<u32>("column", 256).unwrap());
    /// let report = hal.memory_report();
    /// assert_eq!(report.current_bytes, 4096);
    /// let column = report.by_name.iter().find(|t| t.name == "column").unwrap();
    /// assert_eq!((column.live, column.current_bytes, column.peak_bytes), (1, 4096, 5120));
    /// assert_eq!(column.allocations, 2);
    /// println!("{report}");
    /// drop(a);
    /// ```
    pub fn memory_report(&self) -> MemoryReport {
        self.inner.allocs.report()
    }

    /// The live allocations, largest first (same as `memory_report().live`).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let _small = hal.alloc::<u8>("digest", 32).unwrap();
    /// let _big = hal.alloc::<u8>(format!("layer-{}", 3), 4096).unwrap();
    /// let live = hal.live_allocations();
    /// assert_eq!((live[0].name.as_str(), live[0].bytes), ("layer-3", 4096));
    /// assert_eq!((live[1].name.as_str(), live[1].bytes), ("digest", 32));
    /// ```
    pub fn live_allocations(&self) -> Vec<crate::LiveAllocation> {
        self.inner.allocs.report().live
    }

    pub(crate) fn same(&self, other: &Arc<HalInner>) -> bool {
        Arc::ptr_eq(&self.inner, other)
    }
}

/// What a HAL keeps for operations off the allocation path.
pub(crate) struct Aside {
    /// HALs on other devices this one has asked to reach, and whether it can (peer access
    /// on and their pools open to this device): see `CudaHal::enable_peer_access`. A weak
    /// handle keeps the other's allocation, so its address is never another HAL's.
    pub(crate) peers: Mutex<Vec<(std::sync::Weak<HalInner>, bool)>>,
    /// Events for ordering, reused once no one holds them: see [`HalInner::event`].
    pub(crate) events: Recycler<Event>,
    /// The id under which copies by this HAL's main stream from another HAL's buffers are
    /// recorded with those buffers ([`crate::streams::SideUses`]): unique to this HAL, so
    /// copies from two HALs of one device are both waited for.
    pub(crate) copy_id: u64,
    /// The pool's reserved bytes after the last classified pooled allocation or trim, under
    /// a lock held across the allocation and the read, so that two allocations growing the
    /// pool at once are both counted as misses.
    pub(crate) pool_reserved: Mutex<u64>,
    /// Phase 2: freed buffers' host copies, for new buffers' (`HalConfig::
    /// host_copy_cache_bytes`).
    pub(crate) host_copies: crate::host_copies::HostCopies,
    /// The user's pinned buffers by name and size ([`CudaHal::pinned_report`]).
    pub(crate) pinned_buffers: crate::pinned::PinnedBuffers,
}

/// Events a HAL keeps for reuse: more than the operations in flight on its streams that
/// hold one at a time in ordinary use.
const EVENTS_KEPT: usize = 16;

/// Every HAL of the process with its device's ordinal. Memory one HAL's block cache and
/// pool hold back counts as used for the driver, so a HAL that runs out of memory makes
/// room in the other HALs of its device too ([`HalInner::make_room_in_neighbours`]).
static DEVICE_HALS: Mutex<Vec<(usize, std::sync::Weak<HalInner>)>> = Mutex::new(Vec::new());

fn register_on_device(ordinal: usize, hal: &Arc<HalInner>) {
    let mut hals = DEVICE_HALS.lock();
    hals.retain(|(_, w)| w.strong_count() > 0);
    hals.push((ordinal, Arc::downgrade(hal)));
}

impl HalInner {
    /// An event of this context that no one waits on, to record on one of its streams:
    /// a reused one when one is free. The context is current.
    pub(crate) fn event(&self) -> Result<Arc<Event>> {
        // (A new event belongs to the current context: this HAL's, whatever the caller's
        // code in between left current.)
        self.aside.events.take(|| {
            self.ctx.bind()?;
            Event::new()
        })
    }

    /// Records `ev` on `stream` right after queuing work there that uses memory the caller
    /// frees or hands back once `ev` completes. If the record fails, the stream is waited
    /// for first: on that error path no queued work may still use the memory.
    pub(crate) fn record_use(&self, ev: &Event, stream: &Stream) -> Result<()> {
        let recorded = ev.record(stream);
        if recorded.is_err() {
            let _ = stream.synchronize();
        }
        self.guard(recorded)
    }

    /// The kernel `name` ([`KernelTable::get`]); the HAL's context is current (after
    /// [`HalInner::enter`]).
    pub(crate) fn function(&self, name: &str, embedded_only: bool) -> Result<Function<'_>> {
        self.kernels.get(self.ctx.raw(), name, embedded_only)
    }

    /// Checks the context is usable and current on this thread.
    #[inline]
    pub(crate) fn enter(&self) -> Result<()> {
        self.usable()?;
        self.ctx.bind()
    }

    /// Checks the context is usable (not poisoned by a device fault).
    #[inline]
    fn usable(&self) -> Result<()> {
        match self.poisoned.cause() {
            Some(cause) => Err(Error::ContextPoisoned {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Passes `r` through, recording a sticky driver error as poisoning the context.
    pub(crate) fn guard<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.guarded(e))
    }

    /// [`HalInner::guard`] of an error: a sticky one recorded, and returned as
    /// [`Error::ContextPoisoned`].
    pub(crate) fn guarded(&self, e: Error) -> Error {
        let Some(cause) = e.poisoning() else {
            return e;
        };
        if self.poisoned.set(cause) {
            log::error!(
                "CUDA context of device {} poisoned: {cause}",
                self.info.ordinal
            );
        }
        Error::ContextPoisoned {
            cause: cause.clone(),
        }
    }

    /// Allocates `bytes` (> 0): [`HalInner::alloc_with`], the allocation returned as is.
    // A `&Cow` (not `&str`): cloning it keeps a static name borrowed, with no allocation.
    #[allow(clippy::ptr_arg)]
    pub(crate) fn alloc_raw(&self, name: &Cow<'static, str>, bytes: usize) -> Result<DeviceAlloc> {
        self.alloc_with(name.clone(), bytes, |alloc, _| alloc)
    }

    /// Allocates `bytes` (> 0) and hands the allocation, with its name, to `finish`: with
    /// phase 3 from the block cache or the pool on the stream, else `cuMemAlloc`. Refused
    /// before the driver is asked when it would pass the HAL's limit or the device's size.
    /// Out of memory frees the prover tables, flushes the cache, trims the pool and retries
    /// once ([`HalInner::make_room`]). The limit, the tracking and the cache take one lock
    /// section. A cached block makes no driver call, so the context is bound only to reach
    /// the driver: every operation that calls the driver binds it itself.
    ///
    /// Inlined, so that `finish` gets the allocation in registers. (Returned as a `Result`
    /// through memory, its fields written one by one were read back as wider words before
    /// the writes had retired: a store-forwarding stall on every allocation, 12-13% of a
    /// cached alloc+free on the H100 host.)
    #[inline]
    pub(crate) fn alloc_with<R>(
        &self,
        name: Cow<'static, str>,
        bytes: usize,
        finish: impl FnOnce(DeviceAlloc, Cow<'static, str>) -> R,
    ) -> Result<R> {
        self.usable()?;
        let _range = crate::nvtx::range(|| format!("alloc {name} ({bytes} B)"));
        if bytes > self.info.total_memory {
            return Err(self.oom(&name, bytes, None));
        }
        let pooled = PHASES.pool_alloc;
        let Some(Granted { ticket, cached }) = self.allocs.alloc(&name, bytes, pooled) else {
            return Err(self.oom(&name, bytes, None));
        };
        let (ptr, ticket) = match cached {
            Some(ptr) => {
                log::trace!("alloc `{name}`: {bytes} bytes at {ptr:#x} (cached block)");
                (ptr, ticket)
            }
            None => self.alloc_from_driver(&name, bytes, pooled, ticket)?,
        };
        let alloc = DeviceAlloc {
            ptr,
            bytes,
            pooled,
            ticket,
        };
        Ok(finish(alloc, name))
    }

    /// Allocates from the pool (`pooled`) or with `cuMemAlloc` the request `ticket` admits.
    /// Out of memory makes room ([`HalInner::make_room`]) and retries once, and if it is
    /// still out of memory and other HALs of the device are usable, makes room in them and
    /// retries once more. A refused request is forgotten before room is made and admitted
    /// again before its retry (which may then find a cached block): the peaks never count
    /// it beside the memory freed for it, and its limit is checked again. Where making room
    /// fails in part (a free the driver refused), the retry is made all the same, unless
    /// the failure broke the context. The allocation and its ticket; the request is
    /// forgotten on error.
    // A `&Cow`: a static name readmitted stays keyed by its address.
    #[allow(clippy::ptr_arg)]
    #[inline(never)]
    fn alloc_from_driver(
        &self,
        name: &Cow<'static, str>,
        bytes: usize,
        pooled: bool,
        mut ticket: Ticket,
    ) -> Result<(CUdeviceptr, Ticket)> {
        let mut attempt = 0;
        loop {
            let result = self.ctx.bind().map_err(AllocFail::Other).and_then(|()| {
                self.classified_alloc(bytes, pooled)
                    .map_err(|e| self.alloc_fail(e))
            });
            let refused = match result {
                Ok(ptr) => {
                    self.ledger.alloc(match pooled {
                        true => AllocKind::Pool,
                        false => AllocKind::Driver,
                    });
                    log::trace!(
                        "alloc `{name}`: {bytes} bytes at {ptr:#x} ({})",
                        if pooled { "pool" } else { "driver" }
                    );
                    return Ok((ptr, ticket));
                }
                Err(fail) => {
                    // Forgotten first, so that neither `in_use` nor a peak counts it while
                    // room is made.
                    self.allocs.abandon(ticket, bytes);
                    match fail {
                        AllocFail::OutOfMemory(e) => e,
                        AllocFail::Other(e) => return Err(e),
                    }
                }
            };
            let retry = match attempt {
                0 => {
                    log::debug!(
                        "alloc `{name}` of {bytes} bytes: out of memory; trimming and retrying"
                    );
                    if let Err(e) = self.make_room() {
                        // (`trim` gave back all it could; a broken context was recorded.)
                        self.usable()?;
                        log::warn!("alloc `{name}`: making room: {e}; retrying all the same");
                    }
                    true
                }
                1 => self.make_room_in_neighbours(),
                _ => false,
            };
            if !retry {
                return Err(self.oom(name, bytes, Some(refused)));
            }
            self.ledger.oom_retry();
            let Some(granted) = self.allocs.alloc(name, bytes, pooled) else {
                return Err(self.oom(name, bytes, None));
            };
            ticket = granted.ticket;
            if let Some(ptr) = granted.cached {
                log::trace!("alloc `{name}`: {bytes} bytes at {ptr:#x} (cached block)");
                return Ok((ptr, ticket));
            }
            attempt += 1;
        }
    }

    /// A failed driver allocation: out of memory, or another error (a sticky one recorded
    /// as poisoning the context).
    fn alloc_fail(&self, e: cuda_sys::Error) -> AllocFail {
        if e.is_out_of_memory() {
            return AllocFail::OutOfMemory(e);
        }
        AllocFail::Other(self.guarded(e.into()))
    }

    /// [`HalInner::driver_alloc`], and with `count_pool_hits` a pooled allocation counted
    /// as a hit (the pool served it without growing: its reserved bytes did not rise) or a
    /// miss. The reserved bytes are read after the allocation (one attribute read), and
    /// before it too when the pool gives memory back at synchronisations (a release
    /// threshold below `u64::MAX`), since the last read is then no baseline. An allocation
    /// whose read fails is not classified.
    fn classified_alloc(&self, bytes: usize, pooled: bool) -> Result<CUdeviceptr, cuda_sys::Error> {
        if !(pooled && self.config.count_pool_hits) {
            return self.driver_alloc(bytes, pooled);
        }
        let mut last = self.aside.pool_reserved.lock();
        if self.config.release_threshold != u64::MAX {
            if let Ok(now) = self.pool.reserved_bytes() {
                *last = now;
            }
        }
        let ptr = self.driver_alloc(bytes, pooled)?;
        if let Ok(reserved) = self.pool.reserved_bytes() {
            self.ledger.pool_hit(reserved <= *last);
            *last = reserved;
        }
        Ok(ptr)
    }

    fn driver_alloc(&self, bytes: usize, pooled: bool) -> Result<CUdeviceptr, cuda_sys::Error> {
        // The driver is initialised: `enter` bound the context.
        let d = cuda_sys::driver()?;
        let mut ptr: CUdeviceptr = 0;
        if pooled {
            // SAFETY: out-pointer valid; pool and stream are live.
            self.stream.queue(|st| unsafe {
                d.cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool.raw(), st)
            })?;
        } else {
            // SAFETY: out-pointer valid.
            unsafe { d.cuMemAlloc(&mut ptr, bytes)? };
        }
        Ok(ptr)
    }

    /// Frees every cached block, waits for the stream, and trims the pool to `keep_bytes`:
    /// each step even if one before it failed, and the first error is returned, so that a
    /// free the driver refused (which keeps its block) does not keep the rest of the pool's
    /// reserve from going back too (making room for a refused allocation, `trim_pool`).
    fn trim(&self, keep_bytes: usize) -> Result<()> {
        let blocks = self.allocs.drain_cache();
        let d = api()?;
        let mut first = Ok(());
        // Each result checked for poisoning; the first error kept.
        let mut step = |r: Result<()>| {
            let r = self.guard(r);
            if first.is_ok() {
                first = r;
            }
        };
        // Every drained block is freed even if one free fails: the tracker forgot them all.
        for ptr in blocks {
            // SAFETY: cached blocks came from the pool and are no longer referenced.
            let freed = self.stream.queue(|st| unsafe { d.cuMemFreeAsync(ptr, st) });
            step(freed.map_err(Error::from));
        }
        step(self.stream.synchronize());
        // The pool's baseline for hits and misses, under its lock: an allocation that
        // grows the pool back after the trim is a miss. (The pool gives back only memory
        // no allocation holds and no queued free still waits for.)
        let mut last = self.aside.pool_reserved.lock();
        step(self.pool.trim_to(keep_bytes));
        if let Ok(now) = self.pool.reserved_bytes() {
            *last = now;
        }
        first
    }

    /// What an allocation the driver refused gives back before its retry: the prover
    /// tables (made again when next needed; a table an operation in flight holds stays
    /// until it lets go), then the cached blocks and the pool's reserve. The column groups
    /// NTTs fell back to are kept (a refusal says memory is short; `trim_pool` forgets
    /// them).
    fn make_room(&self) -> Result<()> {
        // The tables first: their blocks go to the block cache, which the trim empties.
        self.prover.free_tables();
        self.trim(0)
    }

    /// Makes room ([`HalInner::make_room`]) in this HAL, then in the other HALs of its
    /// device. A failure in part (a free the driver refused) is logged, not returned: the
    /// rest was given back. An error only where the context broke.
    pub(crate) fn make_room_on_device(&self) -> Result<()> {
        if let Err(e) = self.make_room() {
            self.usable()?;
            log::warn!("making room on device {}: {e}", self.info.ordinal);
        }
        self.make_room_in_neighbours();
        Ok(())
    }

    /// Makes room in the other usable HALs of this device (their prover tables, cached
    /// blocks and pools), after this one ran out of memory even with its own room made;
    /// true if there was any. Their errors are logged, not returned: the caller's request
    /// stands or falls by its retry. The context is current (the device's primary
    /// context, which they share).
    pub(crate) fn make_room_in_neighbours(&self) -> bool {
        let others: Vec<Arc<HalInner>> = DEVICE_HALS
            .lock()
            .iter()
            .filter(|(ordinal, _)| *ordinal == self.info.ordinal)
            .filter_map(|(_, w)| w.upgrade())
            .filter(|o| !std::ptr::eq(Arc::as_ptr(o), self) && o.usable().is_ok())
            .collect();
        let any = !others.is_empty();
        for o in &others {
            log::debug!(
                "out of memory on device {}: trimming another HAL of it",
                self.info.ordinal
            );
            if let Err(e) = o.ctx.bind().and_then(|()| o.make_room()) {
                log::warn!("trimming another HAL of device {}: {e}", self.info.ordinal);
            }
        }
        // (Dropping the last handle of one of them here frees it here: it binds its own
        // context, this device's.)
        drop(others);
        let _ = self.ctx.bind();
        any
    }

    /// The error of a device allocation refused for lack of memory, counted.
    pub(crate) fn oom(&self, name: &str, bytes: usize, driver: Option<cuda_sys::Error>) -> Error {
        self.oom_of(name, bytes, self.info.total_memory, driver)
    }

    /// [`HalInner::oom`] where the device's memory is `device_total` bytes (managed
    /// memory gives the driver's own figure).
    pub(crate) fn oom_of(
        &self,
        name: &str,
        bytes: usize,
        device_total: usize,
        driver: Option<cuda_sys::Error>,
    ) -> Error {
        self.ledger.out_of_memory();
        let report = self.allocs.report();
        log::debug!(
            "refused `{name}`: {bytes} bytes, {} in use, limit {:?}, device {device_total}{}",
            report.current_bytes,
            self.config.memory_limit,
            match &driver {
                Some(e) => format!(", the driver said: {e}"),
                None => String::new(),
            }
        );
        Error::OutOfMemory {
            name: name.to_string(),
            requested: bytes,
            in_use: report.current_bytes,
            limit: self.config.memory_limit,
            device_total,
            largest: report.largest(5),
            driver: driver.map(Box::new),
        }
    }

    /// Frees an allocation of `alloc_raw`: stream-ordered when pooled; otherwise after the
    /// stream has drained, since `cuMemFree` is not ordered with it. A pooled block is kept
    /// by the cache, or untracked right before its stream-ordered free is queued, in one
    /// lock section; any other allocation stays counted until `cuMemFree` has returned.
    pub(crate) fn free_raw(&self, name: &str, a: DeviceAlloc) {
        let DeviceAlloc {
            ptr,
            bytes,
            pooled,
            ticket,
        } = a;
        let _range = crate::nvtx::range(|| format!("free {name} ({bytes} B)"));
        // A block the cache keeps needs no driver call, so no context to bind.
        let kept = pooled && self.allocs.free(ptr, bytes, ticket, true);
        let result = match kept {
            true => Ok(()),
            // Freed even if the bind fails: the stream and the pointer name their context
            // (skipping the free would leak the memory until the HAL's pool goes, or for
            // the process's life).
            false => {
                let bound = self.ctx.bind();
                let freed = match pooled {
                    // SAFETY: ptr came from the pool (alloc_raw) and is freed once, in
                    // stream order with every use queued on the stream.
                    true => api().and_then(|d| {
                        self.stream
                            .queue(|st| unsafe { d.cuMemFreeAsync(ptr, st) })
                            .map_err(Error::from)
                    }),
                    // SAFETY: ptr came from cuMemAlloc (alloc_raw) and is freed once, here.
                    false => unsafe { self.free_after_stream(ptr) },
                };
                bound.and(freed)
            }
        };
        if !pooled {
            self.allocs.free(ptr, bytes, ticket, false);
        }
        log::trace!("free `{name}`: {bytes} bytes at {ptr:#x}");
        if let Err(e) = result {
            log::warn!("freeing `{name}` ({bytes} bytes) failed: {e}");
        }
    }

    /// Frees `ptr` with `cuMemFree` once the stream's work is over, or once a device fault
    /// broke the context, which runs no more work (skipping the free there leaked the
    /// memory: found by the sticky fault injection under memcheck). Past another failure of
    /// the stream's wait the device may still use the memory, which is leaked. The wait's
    /// error, else the free's.
    ///
    /// # Safety
    /// `ptr` came from `cuMemAlloc` or `cuMemAllocManaged` in this HAL's context, only this
    /// HAL's stream may still use it, and nothing frees it again or uses it after.
    pub(crate) unsafe fn free_after_stream(&self, ptr: CUdeviceptr) -> Result<()> {
        let synced = self.stream.synchronize();
        let freeable = match &synced {
            Ok(()) => true,
            Err(e) => e.poisoning().is_some(),
        };
        let freed = match freeable {
            // SAFETY: the caller's promise; the stream's work is over or will never run.
            true => api().and_then(|d| unsafe { d.cuMemFree(ptr) }.map_err(Error::from)),
            false => Ok(()),
        };
        synced.and(freed)
    }

    /// Copies host bytes to the device. Phase 4: staged and asynchronous (returns when the
    /// source is free); otherwise synchronous.
    pub(crate) fn upload(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        if PHASES.async_copy {
            return self.upload_staged(dst, src);
        }
        let r = self.timed(Dir::H2D, |start| {
            start()?;
            let d = api()?;
            // SAFETY: src is valid for its length for the whole call, which ends only after
            // the stream (and so the copy) has completed.
            self.stream.queue(|st| unsafe {
                d.cuMemcpyHtoDAsync(dst, src.as_ptr().cast(), src.len(), st)
            })?;
            self.stream.synchronize()
        });
        self.copied(Dir::H2D, src.len(), r)
    }

    /// Whether an upload of `len` bytes from one host slice fills pinned memory with
    /// streaming stores (`StagingConfig::streaming_upload_max_bytes`).
    pub(crate) fn streams_upload(&self, len: usize) -> bool {
        self.staging.streams_upload(len)
    }

    /// Whether the staging slots would take an upload of `len` bytes in one chunk, filled
    /// by the calling thread alone (no worker beside it, no fill overlapping a copy).
    pub(crate) fn stages_in_one_chunk(&self, len: usize) -> bool {
        self.staging.one_chunk(len)
    }

    /// Uploads through pinned staging whatever the phase: returns once `src` is free.
    pub(crate) fn upload_staged(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        let r = self.timed(Dir::H2D, |start| {
            self.staging
                .upload(&self.ctx, &self.stream, dst, src, start)
        });
        self.copied(Dir::H2D, src.len(), r)
    }

    /// Uploads `len` bytes that `fill` writes chunk by chunk through pinned staging (see
    /// [`StagingPool::upload_filled`]): returns once every chunk is filled and queued.
    pub(crate) fn upload_staged_filled(
        &self,
        dst: CUdeviceptr,
        len: usize,
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) -> Result<()> {
        let r = self.timed(Dir::H2D, |start| {
            self.staging
                .upload_filled(&self.ctx, &self.stream, dst, len, fill, start)
        });
        self.copied(Dir::H2D, len, r)
    }

    /// Copies device bytes to the host; returns when `dst` holds them.
    pub(crate) fn download(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
        let len = dst.len();
        let r = self.timed(Dir::D2H, |start| {
            if PHASES.async_copy {
                return self
                    .staging
                    .download(&self.ctx, &self.stream, dst, src, start);
            }
            start()?;
            let d = api()?;
            // SAFETY: dst is valid for writes of its length until the stream completes,
            // which this call waits for.
            self.stream.queue(|st| unsafe {
                d.cuMemcpyDtoHAsync(dst.as_mut_ptr().cast(), src, len, st)
            })?;
            self.stream.synchronize()
        });
        self.copied(Dir::D2H, len, r)
    }

    /// The end of a copy of `bytes` in direction `dir`: counted in the ledger if it
    /// succeeded (a failed copy is not), and its error checked for poisoning.
    fn copied(&self, dir: Dir, bytes: usize, r: Result<()>) -> Result<()> {
        if r.is_ok() {
            self.ledger.copy(dir, bytes);
        }
        self.guard(r)
    }

    /// Downloads `src` into `dst` through the staging slots on `stream` (not the main
    /// stream): returns once `dst` holds the bytes. Counted in the ledger, untimed.
    pub(crate) fn download_on(
        &self,
        stream: &Stream,
        dst: &mut [u8],
        src: CUdeviceptr,
    ) -> Result<()> {
        let len = dst.len();
        let r = self
            .staging
            .download(&self.ctx, stream, dst, src, &|| Ok(()));
        self.copied(Dir::D2H, len, r)
    }

    /// Whether an allocation of `bytes` the HAL makes for itself, for a while, fits easily:
    /// within the HAL's limit, and either served by memory the HAL holds unused (a block
    /// of that size in the block cache, or the pool's spare reserve: it then takes no
    /// device memory) or at most half the device memory the driver reports free.
    ///
    /// The HAL's own memory is checked first: `cuMemGetInfo` took 60-100 us in
    /// `read_async` after a large read on the GPU machines (5-8 us called again at once).
    pub(crate) fn fits_easily(&self, bytes: usize) -> Result<bool> {
        self.fits_in_share_of_free(bytes, 2)
    }

    /// Whether an allocation of `bytes` fits as memory stands, with no room made (no prover
    /// table freed, no cache or pool trimmed, in this HAL or another): within the HAL's
    /// limit, and served by memory the HAL holds unused or by what the driver reports free.
    /// For a request that may ask for less where this is false (a growable buffer's growth
    /// beyond what it needs).
    pub(crate) fn fits_as_is(&self, bytes: usize) -> Result<bool> {
        self.fits_in_share_of_free(bytes, 1)
    }

    /// [`HalInner::fits_easily`] with `1 / share` of the free device memory in place of half.
    fn fits_in_share_of_free(&self, bytes: usize, share: usize) -> Result<bool> {
        if bytes > self.allocs.room_under_limit() {
            return Ok(false);
        }
        if PHASES.pool_alloc
            && (self.allocs.caches_block_of(bytes)
                || self
                    .pool
                    .spare_bytes()
                    .is_ok_and(|spare| spare >= bytes as u64))
        {
            return Ok(true);
        }
        let (free, _) = self.memory_info()?;
        Ok(bytes <= free / share)
    }

    /// The device's free and total memory, as the driver reports them. The context is
    /// current.
    pub(crate) fn memory_info(&self) -> Result<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers are valid references.
        self.guard(unsafe { api()?.cuMemGetInfo(&mut free, &mut total) }.map_err(Error::from))?;
        Ok((free, total))
    }

    /// Copies between device ranges on the stream (synchronous without phase 4).
    pub(crate) fn copy_d2d(&self, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Result<()> {
        let r = self.timed(Dir::D2D, |start| {
            start()?;
            let d = api()?;
            // SAFETY: both ranges lie inside live allocations (checked by the buffer layer).
            self.stream
                .queue(|st| unsafe { d.cuMemcpyDtoDAsync(dst, src, bytes, st) })?;
            if PHASES.async_copy {
                Ok(())
            } else {
                self.stream.synchronize()
            }
        });
        self.copied(Dir::D2D, bytes, r)
    }

    /// Whether `other` is a HAL of the same device: the two share its primary context.
    pub(crate) fn same_device(&self, other: &HalInner) -> bool {
        self.info.ordinal == other.info.ordinal
    }

    pub(crate) fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Lets device `ordinal` access this HAL's pool allocations.
    pub(crate) fn pool_grant_access(&self, ordinal: usize) -> Result<()> {
        self.guard(self.pool.grant_access(ordinal))
    }

    /// Multiprocessor count, for launch shapes.
    pub(crate) fn info_sms(&self) -> u32 {
        self.info.multiprocessors
    }

    /// Runs `enqueue` between two timing events on the main stream when transfer timing is
    /// on; the device time is added to the ledger once the events complete.
    /// `enqueue` gets the hook that records the start; it calls it right before its first
    /// copy (after any set-up such as taking staging memory).
    fn timed<R>(
        &self,
        dir: Dir,
        enqueue: impl FnOnce(&dyn Fn() -> Result<()>) -> Result<R>,
    ) -> Result<R> {
        if !self.config.time_transfers {
            return enqueue(&|| Ok(()));
        }
        self.ctx.bind()?;
        let (start, stop) = {
            let mut t = self.timings.lock();
            (t.event()?, t.event()?)
        };
        let r = enqueue(&|| start.record(&self.stream));
        if r.is_err() {
            // A failed transfer may not have recorded the start: it is not timed.
            let mut t = self.timings.lock();
            t.free.push(start);
            t.free.push(stop);
            return r;
        }
        stop.record(&self.stream)?;
        self.timings.lock().pending.push_back((dir, start, stop));
        // The transfer is queued: a failure to read earlier timings is not its failure.
        if let Err(e) = self.harvest_timings(false) {
            log::debug!("reading transfer timings: {e}");
        }
        r
    }

    /// Adds the device time of completed timed transfers to the ledger, oldest first,
    /// stopping at the first one still in flight unless `all`.
    pub(crate) fn harvest_timings(&self, all: bool) -> Result<()> {
        let mut t = self.timings.lock();
        let mut kept = std::collections::VecDeque::new();
        let mut failed = Ok(());
        while let Some((dir, start, stop)) = t.pending.pop_front() {
            match stop.is_complete() {
                Ok(true) => {
                    match stop.elapsed_ms(&start) {
                        Ok(ms) => self.ledger.device_time(dir, (ms as f64 * 1e6) as u64),
                        // (A pair that cannot be timed is dropped, not kept forever.)
                        Err(e) => log::debug!("timing a transfer: {e}"),
                    }
                    t.free.push(start);
                    t.free.push(stop);
                }
                Ok(false) => {
                    kept.push_back((dir, start, stop));
                    if !all {
                        break;
                    }
                }
                Err(e) => {
                    kept.push_back((dir, start, stop));
                    failed = Err(e);
                    break;
                }
            }
        }
        kept.extend(t.pending.drain(..));
        t.pending = kept;
        failed
    }
}

/// Why a driver allocation of [`HalInner::alloc_from_driver`] failed: out of memory (room
/// is made and it is retried), or another error (returned).
enum AllocFail {
    OutOfMemory(cuda_sys::Error),
    Other(Error),
}

/// A device allocation made by [`HalInner::alloc_raw`], freed by [`HalInner::free_raw`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceAlloc {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) bytes: usize,
    pub(crate) pooled: bool,
    ticket: crate::allocs::Ticket,
}

/// Timing events of transfers whose device time is not yet in the ledger, and spares.
#[derive(Default)]
struct Timings {
    pending: std::collections::VecDeque<(Dir, Event, Event)>,
    free: Vec<Event>,
}

impl Timings {
    fn event(&mut self) -> Result<Event> {
        match self.free.pop() {
            Some(e) => Ok(e),
            None => Event::new_timing(),
        }
    }
}

impl Drop for HalInner {
    fn drop(&mut self) {
        // Free cached blocks and let pending frees and copies finish before the stream,
        // pool and context go.
        // Trimmed even if the bind fails: the stream and the pool name their context.
        let bound = self.ctx.bind();
        if let Err(e) = bound.and(self.trim(0)) {
            log::warn!("dropping the HAL of device {}: {e}", self.info.ordinal);
            // If the bind or the trim's wait failed, the stream's copies may still read
            // staging slots that are freed next.
            let _ = self.stream.synchronize();
        }
    }
}
