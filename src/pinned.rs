//! Pinned host memory: typed user buffers, a pool of reusable blocks for the HAL's own
//! asynchronous copies, and registration of existing host memory.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use bytemuck::Pod;
use parking_lot::Mutex;

use crate::driver::{api, Event, PinnedFlags, PinnedMemory, Stream};
use crate::hal::HalInner;
use crate::ledger::Dir;
use crate::tracking::Tracker;
use crate::{Buffer, CudaHal, Error, HalStream, MemoryReport, Result};

/// Typed page-locked host memory with selectable flags, named like a device buffer and
/// tracked by its HAL ([`CudaHal::pinned_report`]). Copies to and from device buffers are
/// asynchronous; host access waits for the copy that last used the memory.
///
/// ```
/// use cuda_hal::{CudaHal, PinnedFlags};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut pinned = hal.alloc_pinned::<u32>("witness-in", 1024, PinnedFlags::default()).unwrap();
/// pinned.host_mut().unwrap().fill(7);
/// let dev = hal.alloc::<u32>("dev", 1024).unwrap();
/// dev.copy_from_pinned(&pinned).unwrap();        // returns at once
/// dev.copy_to_pinned(&mut pinned).unwrap();      // also asynchronous
/// assert_eq!(pinned.host().unwrap()[5], 7);      // waits for the copy
/// ```
pub struct PinnedBuffer<T> {
    hal: Arc<HalInner>,
    mem: PinnedMemory,
    len: usize,
    flags: PinnedFlags,
    name: Cow<'static, str>,
    /// Its place among the HAL's tracked pinned buffers.
    ticket: PinnedTicket,
    /// Recorded after each asynchronous copy that used `mem` since the host last waited:
    /// one, unless threads sharing the buffer queued copies at once (each keeps its own).
    pending: Mutex<Vec<Arc<Event>>>,
    _t: PhantomData<T>,
}

impl CudaHal {
    /// Allocates `len` elements of pinned host memory named `name`: a new mapping
    /// registered with the driver (write-combined memory: `cuMemHostAlloc`). Pinning takes
    /// milliseconds (64 MiB: about 3.4 ms on the H200 host, against 33 ms for
    /// `cuMemHostAlloc`): allocate once and reuse. The buffer is tracked by name and size
    /// until it is dropped ([`CudaHal::pinned_report`]); host memory, it does not count
    /// towards the HAL's device byte limit.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// // Write-combined: for host data the CPU only writes and the GPU reads.
    /// let flags = PinnedFlags { write_combined: true, ..PinnedFlags::default() };
    /// let mut upload = hal.alloc_pinned::<u32>("trace-upload", 1 << 20, flags).unwrap();
    /// upload.host_mut().unwrap().fill(1);
    /// let dev = hal.alloc::<u32>("dev", 1 << 20).unwrap();
    /// dev.copy_from_pinned(&upload).unwrap();
    /// assert_eq!(dev.get_at(0).unwrap(), 1);
    /// ```
    pub fn alloc_pinned<T: Pod>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
        flags: PinnedFlags,
    ) -> Result<PinnedBuffer<T>> {
        let name = name.into();
        let _range = crate::nvtx::range(|| {
            format!(
                "alloc_pinned {name} ({len} x {} B)",
                std::mem::size_of::<T>()
            )
        });
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Err(Error::ZeroLength {
                name: name.into_owned(),
            });
        }
        if std::mem::align_of::<T>() > PINNED_ALIGN {
            // `host` hands out `&[T]`, which must be aligned; pinned memory is page-aligned.
            return Err(Error::InvalidArgument(format!(
                "`{name}`: pinned elements aligned to {} bytes; pinned memory is aligned to \
                 {PINNED_ALIGN}",
                std::mem::align_of::<T>()
            )));
        }
        self.inner.enter()?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("`{name}`: {len} elements overflow")))?;
        let mem = self.inner.guard(PinnedMemory::new(bytes, flags))?;
        // (Tracked once made: a refused request is never counted.)
        let ticket = self.inner.aside.pinned_buffers.track(&name, bytes);
        log::trace!(
            "alloc `{name}`: {bytes} bytes of pinned memory at {:p}",
            mem.as_ptr()
        );
        Ok(PinnedBuffer {
            hal: self.inner.clone(),
            mem,
            len,
            flags,
            name,
            ticket,
            pending: Mutex::new(Vec::new()),
            _t: PhantomData,
        })
    }

    /// The HAL's live pinned buffers ([`CudaHal::alloc_pinned`]) by name and size, with
    /// totals per name and overall (current and peak): page-locked host memory, kept apart
    /// from [`CudaHal::memory_report`]'s device memory. Not the HAL's own pool of pinned
    /// blocks for its transfers ([`PinnedPoolStats`]). Logged, like the device report, when
    /// the HAL's last handle goes while pinned buffers live. Always kept, whatever
    /// `HalConfig::track_allocations` says (pinning takes milliseconds; tracking costs
    /// nothing beside it). A buffer whose last copy could not be waited for is never
    /// freed (the device may still use it), and stays in the report: that memory stays
    /// pinned for the life of the process.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let staging = hal.alloc_pinned::<u8>("proof-out", 4096, PinnedFlags::default()).unwrap();
    /// drop(hal.alloc_pinned::<u8>("proof-out", 8192, PinnedFlags::default()).unwrap());
    /// let report = hal.pinned_report();
    /// assert_eq!((report.current_bytes, report.peak_bytes), (4096, 12288));
    /// assert_eq!((report.live[0].name.as_str(), report.live[0].bytes), ("proof-out", 4096));
    /// assert_eq!(report.by_name[0].allocations, 2);
    /// assert!(hal.memory_report().live.is_empty(), "no device memory");
    /// drop(staging);
    /// ```
    pub fn pinned_report(&self) -> MemoryReport {
        self.inner.aside.pinned_buffers.report()
    }
}

/// A pinned buffer's place among its HAL's tracked pinned buffers: its name's id and its
/// slot (`None` past what the tracker can count, which no real memory reaches).
#[derive(Clone, Copy)]
struct PinnedTicket(Option<(u32, u32)>);

/// The live pinned buffers of a HAL by name and size, with no limit: the tracker of device
/// memory, kept apart. Not on a hot path (pinning takes milliseconds).
#[derive(Default)]
pub(crate) struct PinnedBuffers(Mutex<Tracker>);

impl PinnedBuffers {
    #[allow(clippy::ptr_arg)]
    fn track(&self, text: &Cow<'static, str>, bytes: usize) -> PinnedTicket {
        let mut t = self.0.lock();
        let name = t.name_id(text);
        let slot = t.charge_and_track_new(name, bytes, 0);
        if let Some(slot) = slot {
            t.name_slot(slot, name, text);
        }
        PinnedTicket(slot.map(|slot| (name, slot)))
    }

    fn untrack(&self, ticket: PinnedTicket, bytes: usize) {
        if let PinnedTicket(Some((name, slot))) = ticket {
            self.0.lock().release(name, slot, bytes);
        }
    }

    pub(crate) fn report(&self) -> MemoryReport {
        self.0.lock().report(std::iter::empty(), 0)
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// Number of elements.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(hal.alloc_pinned::<u64>("pinned", 16, PinnedFlags::default()).unwrap().len(), 16);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: pinned buffers have at least one element.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(!hal.alloc_pinned::<u8>("pinned", 1, PinnedFlags::default()).unwrap().is_empty());
    /// assert!(hal.alloc_pinned::<u8>("pinned", 0, PinnedFlags::default()).is_err());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags it was allocated with.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let flags = PinnedFlags { portable: true, ..PinnedFlags::default() };
    /// assert!(hal.alloc_pinned::<u32>("pinned", 8, flags).unwrap().flags().portable);
    /// ```
    pub fn flags(&self) -> PinnedFlags {
        self.flags
    }

    /// The name it was allocated under.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc_pinned::<u32>("column-in", 8, PinnedFlags::default()).unwrap();
    /// assert_eq!(b.name(), "column-in");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    fn settle(&self) -> Result<()> {
        let mut pending = self.pending.lock();
        if pending.is_empty() {
            return Ok(());
        }
        self.hal.enter()?;
        // Forgotten only once waited for: after an error the rest stay pending.
        while let Some(ev) = pending.last() {
            self.hal.guard(ev.synchronize())?;
            pending.pop();
        }
        Ok(())
    }

    /// The elements, once the last copy that used them is done.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let dev = hal.copy_from("dev", &[3u16; 64]).unwrap();
    /// let mut out = hal.alloc_pinned::<u16>("out", 64, PinnedFlags::default()).unwrap();
    /// dev.copy_to_pinned(&mut out).unwrap(); // queued
    /// assert!(out.host().unwrap().iter().all(|&x| x == 3)); // waited for
    /// ```
    pub fn host(&self) -> Result<&[T]> {
        self.settle()?;
        Ok(bytemuck::cast_slice(
            &self.mem.as_slice()[..self.len * std::mem::size_of::<T>()],
        ))
    }

    /// The elements for writing, once the last copy that used them is done.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let dev = hal.alloc::<u32>("dev", 4).unwrap();
    /// let mut staging = hal.alloc_pinned::<u32>("staging", 4, PinnedFlags::default()).unwrap();
    /// for round in 0..3u32 {
    ///     // Waits for the previous round's upload before the memory is overwritten.
    ///     staging.host_mut().unwrap().fill(round);
    ///     dev.copy_from_pinned(&staging).unwrap();
    /// }
    /// assert_eq!(dev.to_vec().unwrap(), vec![2; 4]);
    /// ```
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        self.settle()?;
        let n = self.len * std::mem::size_of::<T>();
        Ok(bytemuck::cast_slice_mut(&mut self.mem.as_mut_slice()[..n]))
    }

    /// Orders `stream` after every copy still pending on this memory (on the device: the
    /// host does not wait), then runs `queue`, which queues a copy of it on `stream` and
    /// returns the event recorded after that copy. Only that event is kept: it completes
    /// after all the others. The pending list stays locked throughout, so that two threads
    /// queueing copies of one buffer each order theirs after the other's.
    pub(crate) fn queue_after_pending(
        &self,
        hal: &HalInner,
        stream: &Stream,
        queue: impl FnOnce() -> Result<Arc<Event>>,
    ) -> Result<()> {
        let mut pending = self.pending.lock();
        for ev in pending.iter() {
            hal.guard(stream.wait_event(ev))?;
        }
        let ev = queue()?;
        pending.clear();
        pending.push(ev);
        Ok(())
    }

    /// The device's address of the elements, when allocated with `device_mapped`: kernels
    /// of your own (launched `unsafe`) may read or write them in place over the bus. The
    /// HAL does not see those uses: wait for such a kernel before `host`/`host_mut`.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mapped = PinnedFlags { device_mapped: true, ..PinnedFlags::default() };
    /// assert!(hal.alloc_pinned::<u32>("pinned", 256, mapped).unwrap().device_ptr().is_some());
    /// let plain = hal.alloc_pinned::<u32>("plain", 256, PinnedFlags::default()).unwrap();
    /// assert!(plain.device_ptr().is_none());
    /// ```
    pub fn device_ptr(&self) -> Option<cuda_sys::CUdeviceptr> {
        self.mem.device_ptr()
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    pub(crate) fn hal(&self) -> &Arc<HalInner> {
        &self.hal
    }
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // The memory is freed after the copy that last used it (waited for even if the bind
        // fails: the event names its context).
        for ev in self.pending.get_mut().drain(..) {
            let bound = self.hal.ctx.bind();
            let waited = ev.synchronize();
            // (Only the wait decides: the event names its context.)
            keep_if_still_used(&self.mem, &waited);
            if let Err(e) = bound.and(waited) {
                log::warn!("waiting for `{}`'s last copy: {e}", self.name);
            }
        }
        let bytes = self.mem.len();
        if self.mem.kept_forever() {
            // Never freed: it stays in the report, under its name.
            return;
        }
        self.hal.aside.pinned_buffers.untrack(self.ticket, bytes);
        log::trace!(
            "free `{}`: {bytes} bytes of pinned memory at {:p}",
            self.name,
            self.mem.as_ptr()
        );
    }
}

/// A block of the HAL's pinned pool, with the event of the last copy that used it.
pub(crate) struct PinnedBlock {
    pub(crate) mem: PinnedMemory,
    /// The event of the last copy the block was given back after (once the host has
    /// waited for the stream it was recorded on since, the block is idle with no query).
    pending: Option<Arc<Event>>,
    /// While the block is lent out: the pool's count of bytes lent, which it leaves when
    /// given back or freed.
    lent: Option<Arc<AtomicUsize>>,
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            lent.fetch_sub(self.mem.len(), Relaxed);
        }
    }
}

impl PinnedBlock {
    /// Whether no queued copy uses the block any more (known from a wait for its stream,
    /// or asked of its event, without waiting). An error of the event counts as busy:
    /// `settle` then reports it.
    fn is_idle(&mut self) -> bool {
        let idle = self.pending.as_ref().is_none_or(|done| done.done_now());
        if idle {
            self.pending = None;
        }
        idle
    }

    /// Waits for the block's last copy, unless a wait for its stream showed it done. Where
    /// the wait fails, the block is never freed ([`keep_if_still_used`]).
    fn settle(&mut self) -> Result<()> {
        match self.pending.take() {
            Some(done) if !done.known_done() => {
                let waited = done.synchronize();
                keep_if_still_used(&self.mem, &waited);
                waited
            }
            _ => Ok(()),
        }
    }
}

/// After a wait for the copies that use `mem`: where it failed without breaking the context,
/// the device may still run them, and `mem` is never freed nor reused
/// ([`PinnedMemory::keep_forever`]), as device memory in the same case is never freed
/// (`HalInner::free_after_stream`). A fault that broke the context runs no more work.
pub(crate) fn keep_if_still_used(mem: &PinnedMemory, waited: &Result<()>) {
    if let Err(e) = waited {
        if e.poisoning().is_none() {
            mem.keep_forever();
        }
    }
}

/// Statistics of the pinned block pool.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.copy_from("b", &[1u32; 1 << 16]).unwrap();
/// for _ in 0..3 {
///     b.read_async().unwrap().wait().unwrap(); // each read borrows a pinned block
/// }
/// let p = hal.stats().unwrap().pinned;
/// assert!(p.hits + p.misses >= 3 && p.misses <= 1, "blocks are reused: {p:?}");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedPoolStats {
    /// Blocks handed out from the pool without allocating.
    pub hits: u64,
    /// Blocks that had to be allocated (pinned anew).
    pub misses: u64,
    /// Pinned bytes held by free blocks now.
    pub cached_bytes: u64,
}

/// A block given back to a full pool frees idle blocks of other sizes up to this many
/// times its size to make room, not larger ones.
const EVICT_RATIO: usize = 4;

/// The alignment pinned memory has at least: a page (a mapping's, or the driver's).
const PINNED_ALIGN: usize = 4096;

/// Reusable pinned blocks in power-of-two sizes (64 KiB and up), bounded in bytes. A
/// request larger than the pool keeps gets a block of its own size (in 64 KiB steps),
/// freed when given back.
pub(crate) struct PinnedPool {
    free: Mutex<(Vec<PinnedBlock>, usize)>,
    /// Bytes of the blocks lent out now: with the free ones, what the pool would hold if
    /// all came back.
    lent: Arc<AtomicUsize>,
    limit: usize,
    /// The most bytes [`PinnedPool::keeps_two`] holds for, worked out once: it is asked
    /// once a slice by the batches' grouping.
    two_kept_max: usize,
    /// Whether blocks are mapped for the device (`HalConfig::mapped_batches`).
    mapped: bool,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl PinnedPool {
    /// A pool of blocks of up to `limit` bytes in all, mapped for the device with `mapped`.
    pub(crate) fn new(limit: usize, mapped: bool) -> Self {
        PinnedPool {
            free: Mutex::new((Vec::new(), 0)),
            lent: Arc::new(AtomicUsize::new(0)),
            limit,
            two_kept_max: Self::two_kept_max(limit),
            mapped,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The size of the block that serves `bytes`: its power-of-two class when the pool could
    /// keep a block of that size, else `bytes` in 64 KiB steps (a block the pool cannot keep
    /// is freed when given back: rounding it up to a power of two would only pin up to twice
    /// the bytes, 8 GiB for a read of 4 GiB and 4 KiB).
    fn block_size(&self, bytes: usize) -> usize {
        const STEP: usize = 64 << 10;
        match bytes.max(STEP).checked_next_power_of_two() {
            Some(class) if class <= self.limit => class,
            // (Past usize::MAX in steps: the allocation of `bytes` fails anyway.)
            _ => bytes.checked_next_multiple_of(STEP).unwrap_or(bytes),
        }
    }

    /// Whether the pool keeps two blocks of the size that serves `bytes` (> 0): one in use
    /// by a queued copy and one being filled. Larger requests are better served in chunks.
    #[inline]
    pub(crate) fn keeps_two(&self, bytes: usize) -> bool {
        bytes <= self.two_kept_max
    }

    /// The most bytes whose block the pool keeps two of under `limit`: the largest power of
    /// two of at least 64 KiB that fits twice (0 where none does). A request past a class
    /// the pool keeps is served by a block past half the limit.
    fn two_kept_max(limit: usize) -> usize {
        const STEP: usize = 64 << 10;
        match (limit / 2).checked_ilog2() {
            Some(log) if 1 << log >= STEP => 1 << log,
            _ => 0,
        }
    }

    /// A block of at least `bytes`, ready for the host. The context is current.
    ///
    /// A free block whose last copy has completed is reused. Otherwise a new block is made
    /// where the pool could keep it beside every block it holds or has lent, so that
    /// back-to-back batches do not wait for copies still queued (which may sit behind a
    /// long kernel). Where it could not (the block would be freed when given back, after
    /// waiting for its own copy), the oldest free block of that size still in use by a
    /// copy is waited for instead, if there is one.
    pub(crate) fn take(&self, bytes: usize) -> Result<PinnedBlock> {
        let size = self.block_size(bytes);
        let busy = match self.take_free(size, true) {
            Some(b) => Some(b),
            None if !self.could_keep_another(size) => self.take_free(size, false),
            None => None,
        };
        if let Some(b) = busy {
            return self.lend_free(b);
        }
        // Portable: copies between devices stage through these blocks from the other
        // device's context too. Mapped: small batches' kernels read and write them in place.
        let flags = PinnedFlags {
            portable: true,
            device_mapped: self.mapped,
            ..PinnedFlags::default()
        };
        match PinnedMemory::new(size, flags) {
            Ok(mem) => {
                self.misses.fetch_add(1, Relaxed);
                self.lent.fetch_add(size, Relaxed);
                Ok(PinnedBlock {
                    mem,
                    pending: None,
                    lent: Some(self.lent.clone()),
                })
            }
            Err(e) => match self.take_free(size, false) {
                Some(b) => self.lend_free(b),
                None => Err(e),
            },
        }
    }

    /// Whether a new block of `size` bytes would be kept when given back, beside the blocks
    /// the pool holds and those it has lent.
    fn could_keep_another(&self, size: usize) -> bool {
        let held = self.free.lock().1 + self.lent.load(Relaxed);
        held.saturating_add(size) <= self.limit
    }

    /// Lends a block taken from the free list, once its last copy is done.
    fn lend_free(&self, mut b: PinnedBlock) -> Result<PinnedBlock> {
        self.hits.fetch_add(1, Relaxed);
        self.lent.fetch_add(b.mem.len(), Relaxed);
        b.lent = Some(self.lent.clone());
        b.settle()?;
        Ok(b)
    }

    /// A free block of `size` bytes: with `idle_only`, one whose last copy has completed
    /// (the newest such); else an idle one if any, or the oldest.
    fn take_free(&self, size: usize, idle_only: bool) -> Option<PinnedBlock> {
        let mut free = self.free.lock();
        let idle = free
            .0
            .iter_mut()
            .rposition(|b| b.mem.len() == size && b.is_idle());
        let pos = match idle {
            Some(i) => i,
            None if idle_only => return None,
            None => free.0.iter().position(|b| b.mem.len() == size)?,
        };
        free.1 -= size;
        Some(free.0.remove(pos))
    }

    /// [`PinnedPool::give`] for a block that the copy `done` marks the end of still uses: the
    /// pool reuses or frees it only once `done` completes (known with no event query once
    /// the host has waited for the stream `done` was recorded on since).
    pub(crate) fn give_after(&self, mut block: PinnedBlock, done: Arc<Event>) {
        block.pending = Some(done);
        self.give(block);
    }

    /// Returns a block; its pending copy is waited for before reuse or release. Where it
    /// does not fit beside the blocks kept, idle blocks of other sizes are freed to make
    /// room, the oldest first, if that makes room: a prover whose sizes change keeps blocks
    /// of the sizes it uses now, rather than pinning and freeing one on every call. Blocks
    /// more than [`EVICT_RATIO`] times its size are not freed for it: making the small block
    /// again costs less than making the large one again, should its size come back.
    pub(crate) fn give(&self, mut block: PinnedBlock) {
        let size = block.mem.len();
        if let Some(lent) = block.lent.take() {
            lent.fetch_sub(size, Relaxed);
        }
        if block.mem.kept_forever() {
            // A copy may still use it: never reused (dropped, it is leaked).
            return;
        }
        let mut evicted = Vec::new();
        let mut free = self.free.lock();
        if size <= self.limit && free.1 + size > self.limit {
            let evictable = |b: &mut PinnedBlock| {
                let other = b.mem.len();
                other != size && other <= EVICT_RATIO * size && b.is_idle()
            };
            let room: usize = (free.0.iter_mut())
                .map(|b| if evictable(b) { b.mem.len() } else { 0 })
                .sum();
            if free.1 - room + size <= self.limit {
                let mut i = 0;
                while free.1 + size > self.limit && i < free.0.len() {
                    if evictable(&mut free.0[i]) {
                        let b = free.0.remove(i);
                        free.1 -= b.mem.len();
                        evicted.push(b);
                    } else {
                        i += 1;
                    }
                }
            }
        }
        if free.1 + size <= self.limit {
            free.1 += size;
            free.0.push(block);
            drop(free);
        } else {
            drop(free);
            if let Err(e) = block.settle() {
                log::warn!("waiting for a pinned block's last copy: {e}");
            }
        }
        // Freed outside the lock (the evicted blocks are idle).
        drop(evicted);
    }

    pub(crate) fn stats(&self) -> PinnedPoolStats {
        PinnedPoolStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            cached_bytes: self.free.lock().1 as u64,
        }
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        for b in self.free.get_mut().0.iter_mut() {
            if let Err(e) = b.settle() {
                log::warn!("waiting for a pinned block's last copy: {e}");
            }
        }
    }
}

/// Existing host memory page-locked with `cuMemHostRegister` while a closure of
/// [`CudaHal::with_registered_host`] runs, so copies to and from it run at pinned speed
/// with no staging. Registering costs about 3 ms per 64 MiB: it pays off for a host buffer
/// that is transferred many times.
///
/// The closure gets the registration by reference: it cannot be leaked (`mem::forget`)
/// past the memory's borrow, which would leave the addresses registered after the memory
/// is freed (a later registration of them refused, and copies through them taking stale
/// pages; found by review of the guard it replaced).
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut rows = vec![0u64; 4096];
/// let dev = hal.copy_from("rows", &vec![9u64; 4096]).unwrap();
/// hal.with_registered_host(&mut rows, |host| {
///     for _ in 0..4 {
///         dev.copy_to_registered(host).unwrap(); // no staging copy
///     }
/// })
/// .unwrap(); // unregistered as the closure returned
/// assert_eq!(rows[4095], 9);
/// ```
pub struct RegisteredHost<'a, T> {
    hal: Arc<HalInner>,
    data: &'a mut [T],
}

impl CudaHal {
    /// Page-locks `data` while `f` runs, and gives `f` the registration. An error where
    /// `data` is empty or the driver refuses the registration; `f`'s value otherwise
    /// (a failure to unregister after it is logged).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut trace = vec![5u32; 1 << 16];
    /// let dev = hal.alloc::<u32>("trace", 1 << 16).unwrap();
    /// hal.with_registered_host(&mut trace, |host| {
    ///     dev.copy_from_registered(host)?;
    ///     host.as_mut_slice().fill(0);
    ///     dev.copy_to_registered(host)
    /// })
    /// .unwrap()
    /// .unwrap();
    /// assert_eq!(trace[100], 5);
    /// ```
    pub fn with_registered_host<T: Pod, R>(
        &self,
        data: &mut [T],
        f: impl FnOnce(&mut RegisteredHost<'_, T>) -> R,
    ) -> Result<R> {
        if std::mem::size_of_val(data) == 0 {
            return Err(Error::ZeroLength {
                name: "registered host memory".into(),
            });
        }
        self.inner.enter()?;
        // SAFETY: data is valid for its length while the guard lives, and the guard is
        // unregistered in its Drop, which runs before this call returns (or unwinds): `f`
        // gets it by reference only, and cannot keep or forget it. The guard holds the only
        // borrow, so the memory cannot move or be freed meanwhile.
        self.inner.guard(
            unsafe {
                api()?.cuMemHostRegister(
                    data.as_mut_ptr().cast(),
                    std::mem::size_of_val(data),
                    cuda_sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            }
            .map_err(Error::from),
        )?;
        let mut host = RegisteredHost {
            hal: self.inner.clone(),
            data,
        };
        Ok(f(&mut host))
    }
}

impl<T: Pod> RegisteredHost<'_, T> {
    /// The registered elements.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut data = vec![1u8, 2, 3];
    /// hal.with_registered_host(&mut data, |host| assert_eq!(host.as_slice(), &[1, 2, 3]))
    ///     .unwrap();
    /// ```
    pub fn as_slice(&self) -> &[T] {
        self.data
    }

    /// The registered elements, for writing.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut data = vec![0u32; 8];
    /// let dev = hal.alloc::<u32>("dev", 8).unwrap();
    /// hal.with_registered_host(&mut data, |host| {
    ///     host.as_mut_slice()[0] = 42;
    ///     dev.copy_from_registered(host).unwrap();
    /// })
    /// .unwrap();
    /// assert_eq!(dev.get_at(0).unwrap(), 42);
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T> Drop for RegisteredHost<'_, T> {
    fn drop(&mut self) {
        // Unregistered even if the bind fails: a registration left behind outlives the
        // memory, and a later one of the same addresses is refused.
        let bound = self.hal.ctx.bind();
        let r = api().and_then(|d| {
            // SAFETY: the pointer was registered by `with_registered_host`; every copy that used
            // it completed before the copy call returned.
            unsafe { d.cuMemHostUnregister(self.data.as_mut_ptr().cast())? };
            Ok(())
        });
        let r = bound.and(r);
        if let Err(e) = r {
            log::warn!("cuMemHostUnregister failed: {e}");
        }
    }
}

impl<T: Pod> Buffer<T> {
    /// `LengthMismatch` unless `n` is the buffer's length.
    pub(crate) fn check_len(&self, n: usize) -> Result<()> {
        if n != self.len() {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len(),
                actual: n,
            });
        }
        Ok(())
    }

    /// Queues a copy from pinned memory on the main stream; returns at once. `src` cannot
    /// be written on the host until the copy is done (`host_mut` waits).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut src = hal.alloc_pinned::<f32>("src", 3, PinnedFlags::default()).unwrap();
    /// src.host_mut().unwrap().copy_from_slice(&[0.5, 1.5, 2.5]);
    /// let dev = hal.alloc::<f32>("dev", 3).unwrap();
    /// dev.copy_from_pinned(&src).unwrap();
    /// assert_eq!(dev.to_vec().unwrap(), vec![0.5, 1.5, 2.5]);
    /// let short = hal.alloc::<f32>("short", 2).unwrap();
    /// assert!(short.copy_from_pinned(&src).is_err(), "lengths must match");
    /// ```
    pub fn copy_from_pinned(&self, src: &PinnedBuffer<T>) -> Result<()> {
        self.copy_from_pinned_on(src, &self.hal_internal().main_stream())
    }

    /// As [`Buffer::copy_from_pinned`], on `stream`.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let copies = hal.create_stream().unwrap();
    /// let mut src = hal.alloc_pinned::<u32>("src", 1 << 20, PinnedFlags::default()).unwrap();
    /// src.host_mut().unwrap().fill(8);
    /// let dev = hal.alloc::<u32>("dev", 1 << 20).unwrap();
    /// dev.copy_from_pinned_on(&src, &copies).unwrap(); // overlaps main-stream work
    /// assert_eq!(dev.get_at(1 << 19).unwrap(), 8, "main-stream reads wait for it");
    /// ```
    pub fn copy_from_pinned_on(&self, src: &PinnedBuffer<T>, stream: &HalStream) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("copy_from_pinned {}", self.name()));
        self.copy_pinned_on(src, stream, true)
    }

    /// Queues a copy into pinned memory on the main stream; returns at once. Reading `dst`
    /// on the host (`host`) waits for it.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let dev = hal.copy_from("dev", &[1u64, 2, 3]).unwrap();
    /// let mut dst = hal.alloc_pinned::<u64>("dst", 3, PinnedFlags::default()).unwrap();
    /// dev.copy_to_pinned(&mut dst).unwrap();
    /// assert_eq!(dst.host().unwrap(), &[1, 2, 3]);
    /// ```
    pub fn copy_to_pinned(&self, dst: &mut PinnedBuffer<T>) -> Result<()> {
        self.copy_to_pinned_on(dst, &self.hal_internal().main_stream())
    }

    /// As [`Buffer::copy_to_pinned`], on `stream`.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, PinnedFlags};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// let dev = hal.copy_from("dev", &[5u32; 1024]).unwrap();
    /// let mut dst = hal.alloc_pinned::<u32>("dst", 1024, PinnedFlags::default()).unwrap();
    /// dev.copy_to_pinned_on(&mut dst, &side).unwrap();
    /// assert_eq!(dst.host().unwrap()[1023], 5);
    /// ```
    pub fn copy_to_pinned_on(&self, dst: &mut PinnedBuffer<T>, stream: &HalStream) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("copy_to_pinned {}", self.name()));
        self.copy_pinned_on(dst, stream, false)
    }

    /// Queues the copy between this buffer and `pinned` on `stream`: into this buffer when
    /// `into_device`, out of it otherwise.
    fn copy_pinned_on(
        &self,
        pinned: &PinnedBuffer<T>,
        stream: &HalStream,
        into_device: bool,
    ) -> Result<()> {
        self.check_len(pinned.len())?;
        let h = self.raw().hal().clone();
        if !Arc::ptr_eq(&h, pinned.hal()) {
            return Err(Error::InvalidArgument(format!(
                "`{}`: pinned memory of another HAL",
                self.name()
            )));
        }
        if !Arc::ptr_eq(&h, &stream.hal) {
            return Err(Error::InvalidArgument("stream of another HAL".into()));
        }
        h.enter()?;
        let r = self.byte_range();
        self.access_on(stream, r.clone(), into_device)?;
        let ev = h.event()?;
        // The copy waits for earlier copies of `pinned` on the device, not on the host.
        pinned.queue_after_pending(&h, &stream.stream, || {
            let (api, bytes) = (api()?, self.size_bytes());
            // SAFETY: `pinned` holds size_bytes() bytes and is not touched by the host until
            // `ev` completes (host, host_mut and Drop wait for it; copy_to_pinned holds it
            // mutably), nor by the device before the copies pending on it (the stream waits
            // for them); the device range is this buffer's.
            let queued = stream.stream.queue(|st| unsafe {
                if into_device {
                    api.cuMemcpyHtoDAsync(self.raw_ptr(), pinned.ptr().cast(), bytes, st)
                } else {
                    api.cuMemcpyDtoHAsync(pinned.ptr().cast(), self.raw_ptr(), bytes, st)
                }
            });
            h.guard(queued.map_err(Error::from))?;
            let dir = if into_device { Dir::H2D } else { Dir::D2H };
            h.ledger.copy(dir, bytes);
            h.record_use(&ev, &stream.stream)?;
            Ok(ev.clone())
        })?;
        self.after_on(stream, ev, r, into_device);
        Ok(())
    }

    /// Copies from registered host memory at pinned speed; returns when done.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut data: Vec<u32> = (0..1024).collect();
    /// let dev = hal.alloc::<u32>("dev", 1024).unwrap();
    /// hal.with_registered_host(&mut data, |host| dev.copy_from_registered(host))
    ///     .unwrap()
    ///     .unwrap();
    /// assert_eq!(dev.get_at(1000).unwrap(), 1000);
    /// ```
    pub fn copy_from_registered(&self, src: &RegisteredHost<'_, T>) -> Result<()> {
        self.check_len(src.data.len())?;
        let h = self.raw().hal().clone();
        h.enter()?;
        let r = self.byte_range();
        self.raw().prepare_device_access(r.clone(), true)?;
        // SAFETY: src is registered (pinned) and borrowed for the whole call, which waits
        // for the copy to complete.
        let d = h.guard(api())?;
        let (from, bytes) = (src.data.as_ptr().cast(), self.size_bytes());
        let queued = h
            .stream
            .queue(|st| unsafe { d.cuMemcpyHtoDAsync(self.raw_ptr(), from, bytes, st) });
        h.guard(queued.map_err(Error::from))?;
        h.ledger.copy(Dir::H2D, self.size_bytes());
        let synced = h.guard(h.stream.synchronize());
        // Even where the wait failed: the copy is queued.
        self.raw().invalidate_host(r);
        synced?;
        Ok(())
    }

    /// Copies into registered host memory at pinned speed; returns when done.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let dev = hal.copy_from("dev", &[7u8; 300]).unwrap();
    /// let mut data = vec![0u8; 300];
    /// hal.with_registered_host(&mut data, |host| dev.copy_to_registered(host))
    ///     .unwrap()
    ///     .unwrap();
    /// assert!(data.iter().all(|&x| x == 7));
    /// ```
    pub fn copy_to_registered(&self, dst: &mut RegisteredHost<'_, T>) -> Result<()> {
        self.check_len(dst.data.len())?;
        let h = self.raw().hal().clone();
        h.enter()?;
        self.raw().prepare_device_access(self.byte_range(), false)?;
        // SAFETY: dst is registered and mutably borrowed for the whole call, which waits
        // for the copy to complete.
        let d = h.guard(api())?;
        let (into, bytes) = (dst.data.as_mut_ptr().cast(), self.size_bytes());
        let queued = h
            .stream
            .queue(|st| unsafe { d.cuMemcpyDtoHAsync(into, self.raw_ptr(), bytes, st) });
        h.guard(queued.map_err(Error::from))?;
        h.ledger.copy(Dir::D2H, self.size_bytes());
        h.guard(h.stream.synchronize())
    }

    /// Orders `stream` for an access to `r` of this buffer (see [`HalStream`]).
    pub(crate) fn access_on(
        &self,
        stream: &HalStream,
        r: std::ops::Range<usize>,
        write: bool,
    ) -> Result<()> {
        if stream.is_main() {
            self.raw().prepare_device_access(r, write)
        } else {
            self.raw().prepare_side_access(r, write, stream)
        }
    }

    /// Records `ev` (on `stream`) as a use of this buffer, and for a write that the host copy
    /// of `r` is stale.
    pub(crate) fn after_on(
        &self,
        stream: &HalStream,
        ev: Arc<Event>,
        r: std::ops::Range<usize>,
        write: bool,
    ) {
        if !stream.is_main() {
            self.raw().side.add(stream.id, ev, write);
        }
        if write {
            self.raw().invalidate_host(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PinnedBuffers, PinnedPool, PinnedTicket};
    use std::borrow::Cow;

    const MIB: usize = 1 << 20;

    #[test]
    fn two_blocks_are_kept_up_to_the_bound_worked_out_once() {
        const KIB: usize = 1 << 10;
        for limit in [
            0,
            1,
            64 * KIB - 1,
            64 * KIB,
            100 * KIB,
            128 * KIB,
            3 * MIB,
            256 * MIB,
        ] {
            let pool = PinnedPool::new(limit, false);
            let mut sizes: Vec<usize> = (0..40)
                .flat_map(|k| {
                    let p = 1usize << k;
                    [p - 1, p, p + 1, 3 * p]
                })
                .collect();
            sizes.extend([limit / 2, limit / 2 + 1, limit, limit + 1, usize::MAX]);
            for bytes in sizes.into_iter().filter(|&b| b > 0) {
                assert_eq!(
                    pool.keeps_two(bytes),
                    pool.block_size(bytes).saturating_mul(2) <= limit,
                    "{bytes} bytes under a limit of {limit}"
                );
            }
        }
    }

    #[test]
    fn blocks_the_pool_can_keep_are_powers_of_two_and_larger_ones_fit_their_bytes() {
        let pool = PinnedPool::new(256 * MIB, true);
        assert_eq!(pool.block_size(1), 64 << 10);
        assert_eq!(
            pool.block_size(3 * MIB),
            4 * MIB,
            "a class the pool can keep"
        );
        assert_eq!(pool.block_size(256 * MIB), 256 * MIB);
        assert_eq!(pool.block_size(256 * MIB + 1), 256 * MIB + (64 << 10));
        for bytes in [(4usize << 30) + 4096, 33 << 30, 65 << 30] {
            let size = pool.block_size(bytes);
            assert!(
                size >= bytes && size - bytes < 64 << 10,
                "{bytes} B -> {size} B"
            );
        }
        assert_eq!(pool.block_size(usize::MAX), usize::MAX, "no overflow");
        // A pool that keeps nothing sizes every block by its bytes.
        assert_eq!(PinnedPool::new(0, false).block_size(3 * MIB), 3 * MIB);
    }

    #[test]
    fn pinned_buffers_are_counted_by_name_until_untracked() {
        let buffers = PinnedBuffers::default();
        let a = buffers.track(&Cow::Borrowed("in"), 4096);
        let b = buffers.track(&Cow::Owned("out-1".to_string()), 100);
        let c = buffers.track(&Cow::Borrowed("in"), 8192);
        let r = buffers.report();
        let live: Vec<_> = r.live.iter().map(|l| (l.name.as_str(), l.bytes)).collect();
        assert_eq!(live, [("in", 8192), ("in", 4096), ("out-1", 100)]);
        assert_eq!((r.current_bytes, r.peak_bytes), (12388, 12388));
        buffers.untrack(c, 8192);
        buffers.untrack(a, 4096);
        let r = buffers.report();
        assert_eq!((r.current_bytes, r.peak_bytes), (100, 12388));
        let input = r.by_name.iter().find(|n| n.name == "in").unwrap();
        assert_eq!(
            (
                input.live,
                input.current_bytes,
                input.peak_bytes,
                input.allocations
            ),
            (0, 0, 12288, 2)
        );
        // A slot freed is taken again, under the new name.
        let d = buffers.track(&Cow::Borrowed("again"), 7);
        let live = buffers.report().live;
        let live: Vec<_> = live.iter().map(|l| (l.name.as_str(), l.bytes)).collect();
        assert_eq!(live, [("out-1", 100), ("again", 7)]);
        buffers.untrack(b, 100);
        buffers.untrack(d, 7);
        assert!(buffers.report().live.is_empty());
        // A ticket past what the tracker counts is ignored.
        buffers.untrack(PinnedTicket(None), 1);
        assert_eq!(buffers.report().current_bytes, 0);
    }
}
