//! Phase 4: host<->device copies staged through reused pinned memory.
//!
//! A transfer is cut into chunks of `chunk_bytes`, or, for a medium one, smaller chunks
//! (down to `min_chunk_bytes`) that give each worker two. Workers (the calling thread plus
//! the process's copy threads, see `copy_threads`) take chunks round-robin; each owns up to
//! two pinned slots and double-buffers: while the copy engine moves one slot, the worker
//! fills or drains the other with a host memcpy. Slots come from a bounded pool allocated
//! once and reused, so no pinned allocation happens per copy. Each slot carries an event
//! recorded after its last copy, so an upload returns as soon as the caller's bytes are in
//! pinned memory.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use cuda_sys::CUdeviceptr;
use parking_lot::{Condvar, Mutex};

use crate::driver::{Event, PinnedFlags, PinnedMemory, PrimaryContext, Stream};
use crate::pinned::keep_if_still_used;
use crate::Result;

/// Sizes of the staging pool.
///
/// ```
/// use cuda_hal::{CudaHal, HalConfig, StagingConfig};
/// // A host with few cores to spare for copies: two workers, 8 MiB slots.
/// let staging = StagingConfig { workers: 2, chunk_bytes: 8 << 20, max_slots: 8, ..StagingConfig::default() };
/// let Ok(hal) = CudaHal::with_config(0, HalConfig { staging, ..HalConfig::default() }) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.copy_from("b", &vec![1u8; 32 << 20]).unwrap();
/// assert_eq!(b.get_at((32 << 20) - 1).unwrap(), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per pinned slot, the largest unit of one DMA: 4 KiB to 1 GiB (a value
    /// outside is taken as the nearest bound).
    pub chunk_bytes: usize,
    /// The smallest chunk a transfer is cut into so that each worker has two: a transfer
    /// of `len` bytes uses chunks of `len / (2 * workers)` bytes, within `min_chunk_bytes`
    /// and `chunk_bytes`, and as many workers as that gives two chunks each (an upload
    /// gives each worker past two at least 4 MiB). A transfer of at most `min_chunk_bytes`
    /// is one chunk, copied by the calling thread alone.
    pub min_chunk_bytes: usize,
    /// Most workers (threads) one transfer uses: 1 to 256 (a value outside is taken as
    /// the nearest bound).
    pub workers: usize,
    /// Most slots the pool allocates, 1 to 65536 (a value outside is taken as the nearest
    /// bound); transfers wait for a free slot beyond that.
    pub max_slots: usize,
    /// Uploads of one host slice (`upload_async`, `copy_from_slice`, `copy_from`) of up to
    /// this many bytes fill the pinned slots with streaming (non-temporal) stores on
    /// x86_64; larger ones use plain stores (`0`: never stream, `usize::MAX`: always). An
    /// arena batch packs each run of its views (one copy), and `upload_batch` each group of
    /// slices, by the same rule. Only the copy
    /// engine reads those bytes, and skipping the read-for-ownership of each line saved
    /// 13-33% of uploads of 1-64 MiB back to back and 31-40% after 2 ms of idle time on an
    /// H200 host (2026-11-26: 4 MiB 196 against 278 us, and 295 against 429 us); at 256
    /// MiB, where sixteen workers run at the host's memory bandwidth, streaming stores were
    /// 3-9% slower. 64 MiB by default.
    pub streaming_upload_max_bytes: usize,
    /// Copy a download out of the slots into the caller's memory with streaming stores on
    /// x86_64. Off by default: the caller usually reads what it downloaded next, and plain
    /// stores leave it in the cache (a 4 MiB download back to back took 241 us plain and
    /// 264 us streaming on that host).
    pub streaming_downloads: bool,
    /// [`CudaHal::pipeline`](crate::CudaHal::pipeline) copies pageable input into its
    /// pinned blocks, and its pinned blocks out into pageable output, with streaming stores
    /// on x86_64. On by default: the copy engine alone reads the blocks, and a pipeline's
    /// output outgrows the caches as it is written. On an H200 host (2026-11-26), the
    /// pipeline bench's 256 MiB in 16 MiB chunks took 12.6-13.6 ms overlapped against
    /// 14.5-14.9 ms with plain stores, and each upload from a block the host had just
    /// written with plain stores ran at half the speed of one from a streamed block
    /// (11.8 against 5.0 ms for the 256 MiB).
    pub streaming_pipeline: bool,
}

impl Default for StagingConfig {
    fn default() -> Self {
        // Measured on an H100 host (16 cores): 2 MiB chunks with one worker per core reach
        // 45-48 GB/s each way from a pageable Vec, the host's own memcpy ceiling; streaming
        // stores made no consistent difference there at 256 MiB, and save 13-40% of an
        // upload of 1-64 MiB (`streaming_upload_max_bytes`). Medium transfers are cut finer
        // (`StagingPool::cut`): 512 KiB chunks took a 4 MiB download in 225-259 us with
        // four workers, against 267-310 us with two of 1 MiB (H200 and H100 hosts,
        // 2026-11-26); uploads are held to fewer workers by `UPLOAD_SHARE`.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = cores.clamp(1, 16);
        StagingConfig {
            chunk_bytes: 2 << 20,
            min_chunk_bytes: 512 << 10,
            workers,
            max_slots: 4 * workers,
            streaming_upload_max_bytes: 64 << 20,
            streaming_downloads: false,
            streaming_pipeline: true,
        }
    }
}

/// Counters of the staging pool.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let data = vec![3u32; 16 << 20]; // 64 MiB, pageable
/// let b = hal.copy_from("b", &data).unwrap();
/// b.copy_from_slice(&data).unwrap();
/// let s = hal.stats().unwrap().staging;
/// if cuda_hal::PHASES.async_copy {
///     assert!(s.slot_reuses > 0, "the second upload reuses the first one's slots: {s:?}");
///     assert_eq!(s.pinned_bytes, s.slots_allocated * hal.config().staging.chunk_bytes as u64);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Pinned slots allocated so far (each `chunk_bytes`).
    pub slots_allocated: u64,
    /// Pinned bytes held.
    pub pinned_bytes: u64,
    /// Times a transfer reused a slot instead of allocating one.
    pub slot_reuses: u64,
    /// Times a transfer waited because every slot was taken.
    pub waits: u64,
}

/// An upload's workers past two each have at least this many bytes of it. Uploads gain
/// less from more workers than downloads: on two H100 hosts and an H200 (2026-11-26),
/// 16 MiB went up in 605-808 us with four workers of two 2 MiB chunks, against 662-1115 us
/// with eight of 1 MiB and 800-1362 us with sixteen of 512 KiB, while downloads were
/// fastest with eight or sixteen workers.
const UPLOAD_SHARE: usize = 4 << 20;

/// One chunk of a pinned block: slots allocated together share one pinned allocation.
struct Slot {
    block: Arc<PinnedMemory>,
    offset: usize,
    len: usize,
    /// Recorded after the last copy that reads or writes the slot.
    done: Event,
    /// While that copy may still run (`done` shows it done with no event query once the
    /// host has waited for its stream since).
    in_flight: bool,
    /// A copy of the slot may still run with no event to wait for (its record and the wait
    /// for its stream failed): the slot leaves the pool, and its block is never freed.
    lost: bool,
}

impl Slot {
    fn as_ptr(&self) -> *mut u8 {
        // SAFETY: offset + len lies inside the block (set by `take`).
        unsafe { self.block.as_ptr().add(self.offset) }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot's bytes lie inside the live block and no other slot overlaps
        // them; the host touches them only after `settle`.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, with the slot borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
}

impl Slot {
    /// Whether no queued copy uses the slot any more (known from a wait for its stream, or
    /// asked of the event, without waiting). An error of the event counts as busy:
    /// `settle` then reports it.
    fn is_idle(&mut self) -> bool {
        if self.in_flight && self.done.done_now() {
            self.in_flight = false;
        }
        !self.in_flight
    }

    /// Waits until the copy engine no longer uses the slot.
    fn settle(&mut self) -> Result<()> {
        if self.in_flight {
            if !self.done.known_done() {
                let waited = self.done.synchronize();
                keep_if_still_used(&self.block, &waited);
                waited?;
            }
            self.in_flight = false;
        }
        Ok(())
    }

    /// Marks the slot in use by the copy just queued on `stream`, until its event. If the
    /// event cannot be recorded, the stream is waited for instead: the copy may still run,
    /// and the slot must not go back to the pool before it ends.
    fn queued_on(&mut self, stream: &Stream) -> Result<()> {
        if let Err(e) = self.done.record(stream) {
            let waited = stream.synchronize();
            keep_if_still_used(&self.block, &waited);
            if let Err(sync) = waited {
                log::warn!("waiting for a staging copy whose event failed ({e}): {sync}");
                self.lost = sync.poisoning().is_none();
            }
            return Err(e);
        }
        self.in_flight = true;
        Ok(())
    }
}

/// The largest [`StagingConfig::chunk_bytes`].
const MAX_CHUNK_BYTES: usize = 1 << 30;
/// The most [`StagingConfig::workers`].
const MAX_WORKERS: usize = 256;
/// The most [`StagingConfig::max_slots`].
const MAX_SLOTS: usize = 1 << 16;

/// The bounded pool of pinned slots of one HAL.
pub(crate) struct StagingPool {
    cfg: StagingConfig,
    free: Mutex<(Vec<Slot>, usize)>,
    returned: Condvar,
    reuses: AtomicU64,
    waits: AtomicU64,
}

impl StagingPool {
    pub(crate) fn new(cfg: StagingConfig) -> Self {
        // Bounded so that no count of slots' bytes can overflow: at most 2^46 bytes of
        // slots (an unbounded `chunk_bytes` wrapped `chunk * slots` to a small block whose
        // slots overlapped and ran past it: found by review).
        let chunk_bytes = cfg.chunk_bytes.clamp(4096, MAX_CHUNK_BYTES);
        StagingPool {
            cfg: StagingConfig {
                chunk_bytes,
                min_chunk_bytes: cfg.min_chunk_bytes.clamp(4096, chunk_bytes),
                workers: cfg.workers.clamp(1, MAX_WORKERS),
                max_slots: cfg.max_slots.clamp(1, MAX_SLOTS),
                // (The streaming settings as given.)
                ..cfg
            },
            free: Mutex::new((Vec::new(), 0)),
            returned: Condvar::new(),
            reuses: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    #[cfg(test)]
    pub(crate) fn config(&self) -> StagingConfig {
        self.cfg
    }

    pub(crate) fn stats(&self) -> StagingStats {
        let allocated = self.free.lock().1 as u64;
        StagingStats {
            slots_allocated: allocated,
            pinned_bytes: allocated * self.cfg.chunk_bytes as u64,
            slot_reuses: self.reuses.load(Relaxed),
            waits: self.waits.load(Relaxed),
        }
    }

    /// Takes between 1 and `want` slots: idle free ones first (no copy of theirs still
    /// queued), then for an upload (`upload`) new ones while under the bound before free
    /// ones whose copies are still queued (oldest first: the worker waits for them), for a
    /// download the other way round; else waits for one to come back.
    ///
    /// An upload writes a slot on the host, so it must wait for the slot's last copy, which
    /// may sit behind a long kernel: taking a busy slot would make it wait for the device's
    /// whole backlog. A download's copies into its slots queue on the same stream after
    /// those copies anyway: a busy slot costs it nothing, and new pinned memory would.
    /// The context is current.
    fn take(&self, want: usize, upload: bool) -> Result<Vec<Slot>> {
        let mut got = Vec::with_capacity(want);
        let mut guard = self.free.lock();
        loop {
            // Idle slots, asked about from the oldest: a slot comes back still busy only
            // from an upload, on the HAL's main stream (a download, on whatever stream,
            // waits for each of its slots before reading it), so they complete about in
            // the order the slots came back, and the first still busy ends the questions
            // (a deep backlog costs one, not one a slot, under the lock).
            let idle = guard.0.iter_mut().position(|s| !s.is_idle());
            let idle = idle.unwrap_or(guard.0.len());
            let n = idle.min(want - got.len());
            if n > 0 {
                self.reuses.fetch_add(n as u64, Relaxed);
                got.extend(guard.0.drain(..n));
            }
            if !upload {
                self.take_busy(&mut guard, &mut got, want);
            }
            let can_grow = (want - got.len()).min(self.cfg.max_slots - guard.1);
            if can_grow > 0 {
                guard.1 += can_grow;
                drop(guard);
                // Allocate outside the lock, and all new slots in one block: pinning takes
                // milliseconds, and costs per call and per page.
                let chunk = self.cfg.chunk_bytes;
                let made =
                    PinnedMemory::new(chunk * can_grow, PinnedFlags::default()).and_then(|mem| {
                        let block = Arc::new(mem);
                        (0..can_grow)
                            .map(|i| {
                                Ok(Slot {
                                    block: block.clone(),
                                    offset: i * chunk,
                                    len: chunk,
                                    done: Event::new()?,
                                    in_flight: false,
                                    lost: false,
                                })
                            })
                            .collect::<Result<Vec<Slot>>>()
                    });
                match made {
                    Ok(slots) => got.extend(slots),
                    Err(e) => {
                        self.free.lock().1 -= can_grow;
                        // The room given back may be what a waiting transfer needs.
                        self.returned.notify_all();
                        if got.is_empty() {
                            return Err(e);
                        }
                    }
                }
                return Ok(got);
            }
            self.take_busy(&mut guard, &mut got, want);
            if !got.is_empty() {
                return Ok(got);
            }
            self.waits.fetch_add(1, Relaxed);
            self.returned.wait(&mut guard);
        }
    }

    /// Moves free slots (whose copies may still be queued) into `got`, up to `want`, the
    /// oldest first: slots given back are appended, so the first were queued earliest.
    fn take_busy(&self, free: &mut (Vec<Slot>, usize), got: &mut Vec<Slot>, want: usize) {
        let busy = want.saturating_sub(got.len()).min(free.0.len());
        if busy > 0 {
            self.reuses.fetch_add(busy as u64, Relaxed);
            got.extend(free.0.drain(..busy));
        }
    }

    fn give_back(&self, slots: Vec<Slot>) {
        let mut guard = self.free.lock();
        let before = guard.0.len() + slots.len();
        // (A lost slot's block is kept forever: dropped, the slot leaks it.)
        guard.0.extend(slots.into_iter().filter(|s| !s.lost));
        // Room for new slots in place of the lost ones.
        guard.1 -= before - guard.0.len();
        drop(guard);
        self.returned.notify_all();
    }

    /// Uploads `src` to `dst` on `stream`. Returns once every byte is in pinned memory and
    /// its copy is queued; the caller's slice is then free.
    pub(crate) fn upload(
        &self,
        ctx: &PrimaryContext,
        stream: &Stream,
        dst: CUdeviceptr,
        src: &[u8],
        on_start: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let streaming = self.streams_upload(src.len());
        let fill = |at: usize, out: &mut [u8]| {
            crate::fastcopy::copy(out, &src[at..at + out.len()], streaming);
        };
        self.upload_filled(ctx, stream, dst, src.len(), &fill, on_start)
    }

    /// Uploads `len` bytes to `dst` on `stream` that `fill(at, out)` writes, chunk by
    /// chunk: `out` stands for bytes `at..at + out.len()`, and `fill` writes every one of
    /// them (slots are reused pinned memory). Chunks are filled by several threads at once.
    /// Returns once every chunk is filled and its copy queued.
    pub(crate) fn upload_filled(
        &self,
        ctx: &PrimaryContext,
        stream: &Stream,
        dst: CUdeviceptr,
        len: usize,
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
        on_start: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let (chunk, workers) = self.cut(len, true);
        self.run(
            ctx,
            len,
            (chunk, workers),
            true,
            on_start,
            |slots, chunks| upload_worker(stream, dst, len, fill, chunk, slots, chunks),
        )
    }

    /// Downloads `src` into `dst` on `stream`; returns when `dst` holds the data.
    pub(crate) fn download(
        &self,
        ctx: &PrimaryContext,
        stream: &Stream,
        dst: &mut [u8],
        src: CUdeviceptr,
        on_start: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        // Split dst into per-chunk pieces so each worker owns the chunks it writes.
        let len = dst.len();
        let (chunk, workers) = self.cut(len, false);
        let pieces: Vec<&mut [u8]> = dst.chunks_mut(chunk).collect();
        let pieces = Mutex::new(pieces.into_iter().map(Some).collect::<Vec<_>>());
        let streaming = self.cfg.streaming_downloads;
        self.run(
            ctx,
            len,
            (chunk, workers),
            false,
            on_start,
            |slots, chunks| {
                let mine: Vec<(usize, &mut [u8])> = {
                    let mut all = pieces.lock();
                    chunks
                        .filter_map(|c| Some((c, all.get_mut(c)?.take()?)))
                        .collect()
                };
                download_worker(stream, src, chunk, streaming, slots, mine)
            },
        )
    }

    /// Whether an upload of `len` bytes fills pinned memory with streaming stores
    /// ([`StagingConfig::streaming_upload_max_bytes`]).
    pub(crate) fn streams_upload(&self, len: usize) -> bool {
        len <= self.cfg.streaming_upload_max_bytes
    }

    /// Whether a transfer of `len` bytes is one chunk, copied by the calling thread alone.
    pub(crate) fn one_chunk(&self, len: usize) -> bool {
        len <= self.cfg.min_chunk_bytes
    }

    /// How a transfer of `len` bytes is cut (`upload`: host to device): its chunk size and
    /// how many workers share the chunks. Two chunks a worker where there are enough, so
    /// that each worker's host copy of one overlaps the DMA of the other: chunks of
    /// `len / (2 * workers)`, within `min_chunk_bytes` and `chunk_bytes`, in whole pages;
    /// an upload's workers past two have [`UPLOAD_SHARE`] bytes each.
    fn cut(&self, len: usize, upload: bool) -> (usize, usize) {
        let most = if upload {
            (len / UPLOAD_SHARE).max(2)
        } else {
            usize::MAX
        };
        let workers = self.cfg.workers.min(most);
        let share = len.div_ceil(2 * workers).next_multiple_of(4096);
        let chunk = share.clamp(self.cfg.min_chunk_bytes, self.cfg.chunk_bytes);
        let chunks = len.div_ceil(chunk).max(1);
        (chunk, workers.min(chunks.div_ceil(2)))
    }

    /// Splits `bytes` into chunks of `chunk` for `workers` (as [`StagingPool::cut`] gave
    /// them) and runs `work` for each worker with its slots and its chunk indices (worker
    /// w gets chunks w, w + n, w + 2n, ...). `upload`: the slots are written on the host
    /// (see [`StagingPool::take`]).
    fn run<F>(
        &self,
        ctx: &PrimaryContext,
        bytes: usize,
        (chunk, workers): (usize, usize),
        upload: bool,
        on_start: &dyn Fn() -> Result<()>,
        work: F,
    ) -> Result<()>
    where
        F: Fn(&mut [Slot], std::iter::StepBy<std::ops::Range<usize>>) -> Result<()> + Sync,
    {
        let chunks = bytes.div_ceil(chunk).max(1);
        // Two slots a worker to double-buffer when it has several chunks.
        let per_worker = if chunks > workers { 2 } else { 1 };
        // New slots are made in the current context, and this thread runs a worker.
        ctx.bind()?;
        let mut slots = self.take(workers * per_worker, upload)?;
        if let Err(e) = on_start() {
            self.give_back(slots);
            return Err(e);
        }
        let workers = workers.min(slots.len()).max(1);
        let per_worker = slots.len() / workers;
        // Each worker's slots, taken by the thread that runs it.
        let groups: Vec<Mutex<Option<&mut [Slot]>>> = slots
            .chunks_mut(per_worker)
            .take(workers)
            .map(|g| Mutex::new(Some(g)))
            .collect();
        let result = crate::copy_threads::run_each(workers, &|w| {
            let Some(group) = groups[w].lock().take() else {
                return Ok(());
            };
            if w > 0 {
                ctx.bind()?;
            }
            work(group, (w..chunks).step_by(workers))
        });
        drop(groups);
        self.give_back(slots);
        result
    }
}

fn upload_worker(
    stream: &Stream,
    dst: CUdeviceptr,
    len: usize,
    fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    chunk: usize,
    slots: &mut [Slot],
    chunks: impl Iterator<Item = usize>,
) -> Result<()> {
    let d = crate::driver::api()?;
    for (i, c) in chunks.enumerate() {
        let start = c * chunk;
        if start >= len {
            break;
        }
        let part = chunk.min(len - start);
        let slot = &mut slots[i % slots.len()];
        slot.settle()?;
        fill(start, &mut slot.as_mut_slice()[..part]);
        // SAFETY: the slot holds `part` bytes `fill` wrote and stays untouched by the host
        // until its event completes; dst + start is inside the destination allocation.
        let from = slot.as_ptr().cast();
        stream.queue(|st| unsafe { d.cuMemcpyHtoDAsync(dst + start as u64, from, part, st) })?;
        slot.queued_on(stream)?;
    }
    Ok(())
}

fn download_worker(
    stream: &Stream,
    src: CUdeviceptr,
    chunk: usize,
    streaming: bool,
    slots: &mut [Slot],
    mine: Vec<(usize, &mut [u8])>,
) -> Result<()> {
    let d = crate::driver::api()?;
    let n = slots.len();
    let enqueue = |slot: &mut Slot, c: usize, len: usize| -> Result<()> {
        slot.settle()?;
        // SAFETY: the slot has room for `len <= chunk` bytes and is not read by the host
        // until its event completes; src + c*chunk is inside the source allocation.
        let into = slot.as_ptr().cast();
        stream
            .queue(|st| unsafe { d.cuMemcpyDtoHAsync(into, src + (c * chunk) as u64, len, st) })?;
        slot.queued_on(stream)?;
        Ok(())
    };
    // Keep up to `n` chunks in flight; drain them in order.
    for (i, (c, piece)) in mine.iter().enumerate().take(n) {
        enqueue(&mut slots[i % n], *c, piece.len())?;
    }
    let total = mine.len();
    let mut mine = mine;
    for i in 0..total {
        let slot = &mut slots[i % n];
        slot.settle()?;
        let piece = &mut mine[i].1;
        let len = piece.len();
        crate::fastcopy::copy(piece, &slot.as_slice()[..len], streaming);
        if i + n < total {
            let (c, len) = (mine[i + n].0, mine[i + n].1.len());
            enqueue(slot, c, len)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_bounded_and_double_buffered() {
        let c = StagingConfig::default();
        assert!(c.workers >= 1 && c.workers <= 16);
        assert!(
            c.max_slots >= 2 * c.workers,
            "every worker can double-buffer"
        );
        assert_eq!(c.chunk_bytes % 4096, 0);
    }

    #[test]
    fn pool_clamps_degenerate_config() {
        let p = StagingPool::new(StagingConfig {
            chunk_bytes: 1,
            min_chunk_bytes: 1 << 30,
            workers: 0,
            max_slots: 0,
            streaming_upload_max_bytes: 0,
            streaming_downloads: false,
            streaming_pipeline: false,
        });
        let c = p.config();
        assert_eq!((c.chunk_bytes, c.workers, c.max_slots), (4096, 1, 1));
        assert_eq!(c.min_chunk_bytes, 4096, "no larger than a chunk");
        assert_eq!(p.stats(), StagingStats::default());
    }

    #[test]
    fn settings_past_their_bounds_are_taken_as_the_bounds() {
        let p = StagingPool::new(StagingConfig {
            chunk_bytes: 1 << 63,
            min_chunk_bytes: usize::MAX,
            workers: usize::MAX,
            max_slots: usize::MAX,
            ..StagingConfig::default()
        });
        let c = p.config();
        assert_eq!(
            (c.chunk_bytes, c.min_chunk_bytes, c.workers, c.max_slots),
            (MAX_CHUNK_BYTES, MAX_CHUNK_BYTES, MAX_WORKERS, MAX_SLOTS)
        );
        // Every slot the pool may make, in bytes, and the work one transfer asks for.
        assert!(c
            .chunk_bytes
            .checked_mul(c.max_slots)
            .is_some_and(|b| b <= isize::MAX as usize));
        assert!(c.workers.checked_mul(2).is_some());
    }

    #[test]
    fn medium_transfers_give_each_worker_two_chunks_and_large_ones_whole_slots() {
        let p = StagingPool::new(StagingConfig {
            chunk_bytes: 2 << 20,
            min_chunk_bytes: 256 << 10,
            workers: 16,
            max_slots: 64,
            streaming_upload_max_bytes: 0,
            streaming_downloads: false,
            streaming_pipeline: false,
        });
        // (len, chunk, workers): one chunk up to the minimum; two chunks a worker between;
        // whole slots past that.
        const K: usize = 1 << 10;
        const M: usize = 1 << 20;
        for (len, chunk, workers) in [
            (1, 256 * K, 1),
            (256 * K, 256 * K, 1),
            (256 * K + 1, 256 * K, 1),
            (M, 256 * K, 2),
            (4 * M, 256 * K, 8),
            (8 * M, 256 * K, 16),
            (8 * M + 1, 256 * K + 4 * K, 16),
            (16 * M, 512 * K, 16),
            (64 * M, 2 * M, 16),
            (256 * M, 2 * M, 16),
        ] {
            assert_eq!(p.cut(len, false), (chunk, workers), "len {len}");
            let chunks = len.div_ceil(chunk);
            assert!(chunks <= 2 * workers || chunk == 2 * M, "len {len}");
        }
        // An upload: two workers, then one more for each 4 MiB.
        for (len, chunk, workers) in [
            (256 * K, 256 * K, 1),
            (M, 256 * K, 2),
            (4 * M, M, 2),
            (8 * M, 2 * M, 2),
            (12 * M, 2 * M, 3),
            (16 * M, 2 * M, 4),
            (64 * M, 2 * M, 16),
            (256 * M, 2 * M, 16),
        ] {
            assert_eq!(p.cut(len, true), (chunk, workers), "upload of {len}");
        }
    }
}
