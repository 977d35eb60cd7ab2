//! Asynchronous reads, explicit staged uploads and coalesced transfers.

use std::borrow::Cow;
use std::sync::Arc;

use bytemuck::Pod;
use cuda_sys::CUdeviceptr;

use crate::buffer::RawBuffer;
use crate::driver::{api, Event, Stream};
use crate::hal::HalInner;
use crate::host_pages;
use crate::kept_threads::{self, Task};
use crate::ledger::Dir;
use crate::pinned::{keep_if_still_used, PinnedBlock};
use crate::{Buffer, CudaHal, Error, HalStream, LaunchDims, Result, PHASES};

/// The name the device snapshot of a read past the pinned pool is tracked under while the
/// read is in flight (see [`PendingRead`]).
///
/// ```
/// use cuda_hal::{CudaHal, HalConfig, READ_SNAPSHOT_NAME};
/// let config = HalConfig { pinned_pool_bytes: 1 << 20, ..HalConfig::default() };
/// let Ok(hal) = CudaHal::with_config(0, config) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.alloc::<u32>("trace", 1 << 20).unwrap(); // 4 MiB: past a 1 MiB pool
/// b.fill(7).unwrap();
/// let pending = b.read_async().unwrap();
/// b.fill(8).unwrap(); // queued after the read: not in its result
/// drop(b);
/// assert!(pending.wait().unwrap().iter().all(|&x| x == 7));
/// let live = hal.memory_report().live;
/// assert!(live.iter().all(|a| a.name != READ_SNAPSHOT_NAME), "gone with the read");
/// ```
pub const READ_SNAPSHOT_NAME: &str = "read_async snapshot";

/// The device scratch of a `gather`, where the pinned block is not mapped.
pub(crate) const GATHER_SCRATCH: &str = "gather-scratch";
/// The device scratch of an `upload_batch` group, where the pinned block is not mapped.
pub(crate) const UPLOAD_BATCH_SCRATCH: &str = "upload-batch-scratch";
/// The device scratch of a `download_batch` group, where the pinned block is not mapped.
pub(crate) const DOWNLOAD_BATCH_SCRATCH: &str = "download-batch-scratch";

/// A device-to-host read in flight (seed 003's async GPU result).
///
/// `is_ready` never blocks; `try_get` fetches the data if it has arrived; `wait` blocks
/// for it. Errors of the copy surface here. Dropping the handle early is safe: the pinned
/// destination goes back to the HAL's pool and is reused only after the copy completes.
///
/// A read larger than the pinned pool keeps two blocks of (`HalConfig::pinned_pool_bytes`,
/// 256 MiB by default, so above 128 MiB) goes through the staging slots, as
/// [`Buffer::copy_to_slice`] copies, into a new result in 2 MiB pages. With phase 4 the
/// buffer's bytes are first copied on the device into a snapshot, in the stream's order
/// (tracked as [`READ_SNAPSHOT_NAME`]; work queued later may change or free the buffer),
/// and `read_async` returns at once while a kept thread (`cuda-hal-read`, started once and
/// reused) copies the snapshot out; the snapshot is freed as the copy ends, and dropping
/// the handle waits for that. Where the snapshot would not fit easily (past the HAL's
/// limit; or more than half the device's free memory, where neither a cached block of its
/// size nor the pool's spare reserve serves it), or without phase 4, the read is copied
/// before `read_async` returns and the handle is ready at once. On the H200 host 256 MiB took 9-10 ms so, against 20-22 ms
/// for a result registered with `cuMemHostRegister` for the copy (the design before: the
/// registration alone took 8 ms and the unregistration 4 ms) and 5 ms for the device's
/// copy alone. A pinned block of the read's own size would take longer still (48 ms to
/// pin and free 256 MiB), and would fill the pool.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.copy_from("b", &[1u32, 2, 3]).unwrap();
/// let pending = b.read_async().unwrap();
/// // ... other CPU work ...
/// assert_eq!(pending.wait().unwrap(), vec![1, 2, 3]);
/// ```
pub struct PendingRead<T> {
    state: ReadState<T>,
}

enum ReadState<T> {
    Ready(Vec<T>),
    /// A read past the pinned pool: a kept thread copies the device's snapshot of the
    /// bytes into the result through the staging slots.
    Staging(Task<Result<PodVec<T>>>),
    InFlight {
        hal: Arc<HalInner>,
        /// The pinned pool block the copy lands in, copied out when the read is taken.
        landing: Option<PinnedBlock>,
        done: Arc<Event>,
        len: usize,
    },
    Taken,
}

impl<T: Pod> PendingRead<T> {
    /// Whether `try_get` would return the data (or an error) without blocking.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 1 << 20).unwrap();
    /// b.fill(1).unwrap();
    /// let pending = b.read_async().unwrap();
    /// while !pending.is_ready() {
    ///     std::hint::spin_loop(); // other CPU work would go here
    /// }
    /// assert_eq!(pending.wait().unwrap()[0], 1); // returns at once now
    /// ```
    pub fn is_ready(&self) -> bool {
        match &self.state {
            ReadState::Staging(task) => task.is_finished(),
            ReadState::InFlight { hal, done, .. } => hal
                .ctx
                .bind()
                .and_then(|()| done.is_complete())
                .unwrap_or(true),
            _ => true,
        }
    }

    fn finish(&mut self) -> Result<Vec<T>> {
        match std::mem::replace(&mut self.state, ReadState::Taken) {
            ReadState::Ready(v) => Ok(v),
            ReadState::Staging(task) => joined(task).map(|v| v.0),
            ReadState::InFlight {
                hal,
                mut landing,
                done,
                len,
            } => {
                // The result's pages are faulted in while the copy completes.
                let (v, taken) = host_pages::faulted_while::<T, _>(len, |pages| {
                    let r = hal.enter().and_then(|()| hal.guard(done.synchronize()));
                    match (r, landing.take()) {
                        (Ok(()), Some(b)) => {
                            let src = &b.mem.as_slice()[..len * size_of::<T>()];
                            host_pages::copy(pages.wait(), src);
                            hal.pinned.give(b);
                            Ok(())
                        }
                        // (The landing is taken only here and on drop.)
                        (Ok(()), None) => Err(Error::InvalidArgument(
                            "the read's data was already taken".into(),
                        )),
                        (Err(e), landing) => {
                            // The copy may still run: the pool reuses the block only after it.
                            if let Some(b) = landing {
                                hal.pinned.give_after(b, done.clone());
                            }
                            Err(e)
                        }
                    }
                });
                taken.map(|()| v)
            }
            ReadState::Taken => Err(Error::InvalidArgument(
                "the read's data was already taken".into(),
            )),
        }
    }

    /// The data if the copy is done, `None` if it is still in flight.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("commitment", &[7u32; 1024]).unwrap();
    /// let mut pending = b.read_async().unwrap();
    /// let data = loop {
    ///     if let Some(v) = pending.try_get().unwrap() {
    ///         break v;
    ///     }
    ///     std::thread::yield_now(); // or other CPU work
    /// };
    /// assert_eq!(data[1023], 7);
    /// ```
    pub fn try_get(&mut self) -> Result<Option<Vec<T>>> {
        if !self.is_ready() {
            return Ok(None);
        }
        self.finish().map(Some)
    }

    /// Blocks until the data arrives.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[1u64, 2]).unwrap();
    /// assert_eq!(b.read_async().unwrap().wait().unwrap(), vec![1, 2]);
    /// ```
    pub fn wait(mut self) -> Result<Vec<T>> {
        let _range = crate::nvtx::range(|| "read_async wait".to_string());
        self.finish()
    }
}

/// A result the read's thread built. Its elements are plain bytes (`Pod`: no pointers,
/// nothing tied to a thread).
struct PodVec<T>(Vec<T>);

// SAFETY: `PodVec` is built only of `Pod` elements, plain bytes that any thread may own.
unsafe impl<T: Pod> Send for PodVec<T> {}

/// What the read's task returned; a task that panicked is an error.
fn joined<T>(task: Task<Result<T>>) -> Result<T> {
    task.join()
        .unwrap_or_else(|_| Err(Error::InvalidArgument("the read's thread panicked".into())))
}

impl<T> Drop for PendingRead<T> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, ReadState::Taken) {
            // The read's task holds a device snapshot and staging slots: they are given
            // back before the handle is gone, so that nothing of the read outlives it.
            ReadState::Staging(task) => {
                if let Err(e) = joined(task) {
                    log::warn!("dropping a pending read: {e}");
                }
            }
            ReadState::InFlight {
                hal,
                landing: Some(b),
                done,
                ..
            } => {
                // The pool waits for `done` before the block is reused or freed, and frees
                // it (past its limit) on this thread: its context must be current here.
                if let Err(e) = hal.ctx.bind() {
                    log::warn!("dropping a pending read: {e}");
                }
                hal.pinned.give_after(b, done);
            }
            _ => {}
        }
    }
}

impl<T: Pod> Buffer<T> {
    /// Starts copying the buffer to the host on the main stream. With phase 2 and a valid
    /// host copy the result is ready at once and nothing moves.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let cols: Vec<_> = (0..4u32).map(|c| hal.copy_from(format!("col-{c}"), &[c; 1024]).unwrap()).collect();
    /// // Start every download, then collect them: the copies overlap the host's work.
    /// let pending: Vec<_> = cols.iter().map(|c| c.read_async().unwrap()).collect();
    /// let firsts: Vec<u32> = pending.into_iter().map(|p| p.wait().unwrap()[0]).collect();
    /// assert_eq!(firsts, vec![0, 1, 2, 3]);
    /// ```
    pub fn read_async(&self) -> Result<PendingRead<T>> {
        self.read_async_on(&self.hal_internal().main_stream())
    }

    /// As [`Buffer::read_async`], on `stream`.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// let b = hal.copy_from("b", &[9u16; 4096]).unwrap();
    /// let pending = b.read_async_on(&side).unwrap(); // waits for the upload, then runs beside the main stream
    /// assert!(pending.wait().unwrap().iter().all(|&x| x == 9));
    /// ```
    pub fn read_async_on(&self, stream: &HalStream) -> Result<PendingRead<T>> {
        let _range = crate::nvtx::range(|| format!("read_async {}", self.name()));
        let h = self.raw().hal().clone();
        if !Arc::ptr_eq(&h, &stream.hal) {
            return Err(Error::InvalidArgument("stream of another HAL".into()));
        }
        h.enter()?;
        if PHASES.host_cache {
            if let Some(v) = self.cached_copy() {
                return Ok(PendingRead {
                    state: ReadState::Ready(v),
                });
            }
            h.ledger.cache(false);
        }
        let r = self.byte_range();
        let bytes = self.size_bytes();
        if !h.pinned.keeps_two(bytes) {
            // Past the pinned pool: with phase 4, a snapshot on the device and a thread that
            // copies it out.
            if PHASES.async_copy {
                if let Some(read) = self.read_snapshot_on(stream)? {
                    return Ok(read);
                }
            }
            // Else copied now, through the staging slots, into a new result (after the main
            // stream waits for the buffer's uses on `stream` and others).
            let mut v = host_pages::zeroed::<T>(self.len());
            self.raw().prepare_device_access(r, false)?;
            h.download(bytemuck::cast_slice_mut(&mut v), self.raw_ptr())?;
            return Ok(PendingRead {
                state: ReadState::Ready(v),
            });
        }
        self.access_on(stream, r.clone(), false)?;
        let (d, done) = (api()?, h.event()?);
        let landing = h.guard(h.pinned.take(bytes))?;
        // SAFETY: the block has room for size_bytes(); the pool hands it out again or frees
        // it only after `done` completes.
        let into = landing.mem.as_ptr().cast();
        let queued = stream
            .stream
            .queue(|st| unsafe { d.cuMemcpyDtoHAsync(into, self.raw_ptr(), bytes, st) })
            .map_err(Error::from)
            .and_then(|()| h.record_use(&done, &stream.stream));
        if let Err(e) = queued {
            // Waits for `done` only if it was recorded (an unrecorded event is complete).
            h.pinned.give_after(landing, done.clone());
            return h.guard(Err(e));
        }
        h.ledger.copy(Dir::D2H, bytes);
        self.after_on(stream, done.clone(), r, false);
        Ok(PendingRead {
            state: ReadState::InFlight {
                hal: h,
                landing: Some(landing),
                done,
                len: self.len(),
            },
        })
    }

    /// A read past the pinned pool that returns at once: the bytes are copied on the device
    /// into a snapshot, in `stream`'s order (so later work may change or free the buffer),
    /// and a kept thread copies the snapshot out through the staging slots, on a stream of
    /// its own, into a new result in 2 MiB pages. `None` where the snapshot would
    /// not fit easily ([`HalInner::fits_easily`]) or no thread starts: the caller copies
    /// the buffer now instead.
    fn read_snapshot_on(&self, stream: &HalStream) -> Result<Option<PendingRead<T>>> {
        let h = self.raw().hal().clone();
        let (r, bytes) = (self.byte_range(), self.size_bytes());
        if !h.fits_easily(bytes)? {
            return Ok(None);
        }
        // Allocated on the main stream, before `stream` waits for it (`access_on`).
        let snapshot = match RawBuffer::allocate(&h, Cow::Borrowed(READ_SNAPSHOT_NAME), bytes) {
            Ok(s) => s,
            Err(Error::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.access_on(stream, r.clone(), false)?;
        let (d, ready) = (api()?, h.event()?);
        // SAFETY: both ranges hold `bytes`: the buffer's, and the snapshot's own allocation,
        // which lives until the thread below has copied it out.
        let into = snapshot.base_ptr();
        let queued = stream
            .stream
            .queue(|st| unsafe { d.cuMemcpyDtoDAsync(into, self.raw_ptr(), bytes, st) })
            .map_err(Error::from)
            .and_then(|()| h.record_use(&ready, &stream.stream));
        h.guard(queued)?;
        h.ledger.copy(Dir::D2D, bytes);
        self.after_on(stream, ready.clone(), r, false);
        if !stream.is_main() {
            // However the snapshot goes (a thread that fails, or none), its free waits for
            // its copy on `stream`.
            snapshot.side.add(stream.id, ready.clone(), true);
        }
        let len = self.len();
        let task = kept_threads::run(move || {
            h.enter()?;
            // The snapshot is read on a stream of its own, not behind the main stream's
            // later work; its free (on the main stream, as it goes) follows the copies,
            // which `download_on` waits for.
            let own = h.guard(Stream::new_non_blocking())?;
            h.guard(own.wait_event(&ready))?;
            let mut v = host_pages::zeroed::<T>(len);
            let copied = h.download_on(&own, bytemuck::cast_slice_mut(&mut v), snapshot.base_ptr());
            if copied.is_err() {
                // Copies queued before the failure may still read the snapshot, which
                // is freed next.
                let _ = own.synchronize();
            }
            copied.map(|()| PodVec(v))
        });
        match task {
            Ok(task) => Ok(Some(PendingRead {
                state: ReadState::Staging(task),
            })),
            Err(e) => {
                // (The snapshot went with the closure.)
                log::debug!("read_async `{}`: no thread ({e}); copying now", self.name());
                Ok(None)
            }
        }
    }

    /// Uploads `src` through pinned staging whatever the phase features: returns once the
    /// caller's slice is free (the data is in pinned memory and its copy queued).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("witness", 4096).unwrap();
    /// let mut host = vec![3u32; 4096];
    /// b.upload_async(&host).unwrap();
    /// host.fill(0); // the slice is free at once: the copy reads pinned staging
    /// assert_eq!(b.get_at(4095).unwrap(), 3);
    /// ```
    pub fn upload_async(&self, src: &[T]) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("upload_async {}", self.name()));
        if src.len() != self.len() {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len(),
                actual: src.len(),
            });
        }
        let h = self.raw().hal();
        h.enter()?;
        let r = self.byte_range();
        self.raw().prepare_device_access(r.clone(), true)?;
        let uploaded = h.upload_staged(self.raw_ptr(), bytemuck::cast_slice(src));
        // Even where the upload failed: some of its chunks may be queued.
        self.raw().invalidate_host(r);
        uploaded
    }

    /// Uploads `len` bytes at byte `offset` of this buffer that `fill(at, out)` writes
    /// (`out` stands for bytes `at..at + out.len()` of the `len`; `fill` writes every one:
    /// the pinned memory is reused, not zeroed), with no device allocation. Bytes the
    /// staging slots would take in one chunk, filled by the calling thread alone, go from
    /// one block of the pinned pool with one copy (where the pool keeps two blocks of that
    /// size). Larger uploads go chunk by chunk through the staging slots: their workers
    /// fill chunks side by side while earlier chunks are copied (an arena batch of 8 x 256
    /// KiB took 192 us from one block that one thread filled, against 164 us for eight
    /// staged uploads of its views, on an H200 host), and no such upload pins memory of
    /// its own (pinning 1 GiB takes tens of milliseconds, and as long again to free).
    pub(crate) fn upload_layout(
        &self,
        offset: usize,
        len: usize,
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) -> Result<()> {
        let h = self.raw().hal().clone();
        h.enter()?;
        let r = self.byte_range().start + offset..self.byte_range().start + offset + len;
        if r.end > self.byte_range().end {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {offset} overrun `{}`",
                self.name()
            )));
        }
        self.raw().prepare_device_access(r.clone(), true)?;
        let dst = self.raw().base_ptr() + r.start as u64;
        if h.stages_in_one_chunk(len) && h.pinned.keeps_two(len) {
            let mut block = h.guard(h.pinned.take(len))?;
            fill(0, &mut block.mem.as_mut_slice()[..len]);
            let done = h.event()?;
            // SAFETY: the block holds `len` staged bytes and is reused only after `done`;
            // the destination range lies inside this buffer (checked above).
            let (d, from) = (api()?, block.mem.as_ptr().cast());
            let res = h
                .stream
                .queue(|st| unsafe { d.cuMemcpyHtoDAsync(dst, from, len, st) })
                .map_err(Error::from)
                .and_then(|()| h.record_use(&done, &h.stream));
            h.ledger.copy(Dir::H2D, len);
            h.pinned.give_after(block, done);
            // (The host copy is stale even where recording the use failed.)
            self.raw().invalidate_host(r.clone());
            h.guard(res)?;
        } else {
            let uploaded = h.upload_staged_filled(dst, len, fill);
            // Even where the upload failed: some of its chunks may be queued.
            self.raw().invalidate_host(r.clone());
            uploaded?;
        }
        self.raw().invalidate_host(r);
        if !PHASES.async_copy {
            h.guard(h.stream.synchronize())?;
        }
        Ok(())
    }

    /// Elements at `indices`, read with one gather kernel and one copy (a batched
    /// `get_at`). With phase 2, elements whose host copy is valid are read from it.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let evals = hal.copy_from("evals", &(0..1000u32).map(|i| i * i).collect::<Vec<_>>()).unwrap();
    /// // FRI queries: one gather kernel and one copy instead of one copy each.
    /// assert_eq!(evals.get_many(&[3, 999, 10]).unwrap(), vec![9, 998_001, 100]);
    /// ```
    pub fn get_many(&self, indices: &[usize]) -> Result<Vec<T>> {
        let items: Vec<(&Buffer<T>, usize)> = indices.iter().map(|i| (self, *i)).collect();
        self.hal_internal().gather(&items)
    }
}

impl CudaHal {
    /// Reads one element from each `(buffer, index)` with a single gather kernel, instead
    /// of one copy per element. The kernel writes the elements into a pinned block in place
    /// (`HalConfig::mapped_batches`), or into a device scratch then copied back.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.copy_from("a", &[10u32, 11, 12]).unwrap();
    /// let b = hal.copy_from("b", &[20u32, 21]).unwrap();
    /// assert_eq!(hal.gather(&[(&a, 2), (&b, 0), (&a, 0)]).unwrap(), vec![12, 20, 10]);
    /// ```
    pub fn gather<T: Pod>(&self, items: &[(&Buffer<T>, usize)]) -> Result<Vec<T>> {
        let _range = crate::nvtx::range(|| {
            let names = crate::nvtx::name_list(items.iter().map(|(b, _)| b.name()));
            format!("gather {} elements from {names}", items.len())
        });
        let h = &self.inner;
        if items.is_empty() {
            return Err(Error::ZeroLength {
                name: "gather".into(),
            });
        }
        h.enter()?;
        let sz = std::mem::size_of::<T>();
        for (buf, i) in items {
            if !self.same(buf.raw().hal()) {
                return Err(Error::ForeignBuffer {
                    name: buf.name().to_string(),
                });
            }
            if *i >= buf.len() {
                return Err(Error::OutOfRange {
                    name: buf.name().to_string(),
                    start: *i,
                    end: i.saturating_add(1),
                    len: buf.len(),
                });
            }
        }
        // Those the host copies do not serve, their device reads prepared, consecutive
        // elements of one allocation together: every buffer is this HAL's (checked above),
        // whose context `enter` bound.
        let mut out = vec![T::zeroed(); items.len()];
        let mut todo: Vec<(usize, u64)> = Vec::with_capacity(items.len());
        let mut start = 0;
        for run in items.chunk_by(|(a, _), (b, _)| Arc::ptr_eq(a.raw(), b.raw())) {
            let outs = &mut out[start..start + run.len()];
            let reads = run
                .iter()
                .zip(outs)
                .map(|((buf, i), v)| (buf.element_range(*i), bytemuck::bytes_of_mut(v)));
            run[0].0.raw().read_host_or_prepare_bound(reads, |j| {
                let (buf, i) = run[j];
                todo.push((start + j, buf.raw_ptr() + (i * sz) as u64));
            })?;
            start += run.len();
        }
        if PHASES.host_cache {
            h.ledger.cache_reads(items.len() - todo.len(), todo.len());
        }
        if todo.is_empty() {
            return Ok(out);
        }
        let n = todo.len();
        let table_bytes = n * 8;
        let out_off = table_bytes.next_multiple_of(16);
        let total = out_off + n * sz;
        let mut block = h.guard(h.pinned.take(total))?;
        {
            let host = block.mem.as_mut_slice();
            for (j, (_, addr)) in todo.iter().enumerate() {
                host[j * 8..j * 8 + 8].copy_from_slice(&addr.to_ne_bytes());
            }
        }
        // Queues the gather of the table at `table` into `outputs`.
        let launch = |table: CUdeviceptr, outputs: CUdeviceptr| -> Result<()> {
            let _range = crate::nvtx::range(|| {
                let names = crate::nvtx::name_list(items.iter().map(|(b, _)| b.name()));
                format!("launch gather_elements out=(host) in={names}")
            });
            let f = h.function("gather_elements", true)?;
            let dims = LaunchDims::for_elements(n, h.info_sms());
            let (mut t, mut o, mut c, mut e) = (table, outputs, n as u64, sz as u32);
            let mut params = [
                (&mut t as *mut u64).cast(),
                (&mut o as *mut u64).cast(),
                (&mut c as *mut u64).cast(),
                (&mut e as *mut u32).cast(),
            ];
            // SAFETY: the parameters match gather_elements(const u64*, u8*, u64, u32); the
            // table holds `n` addresses, each an in-bounds element of a live buffer, and
            // `outputs` has room for `n` elements.
            unsafe { f.launch(dims.grid, dims.block, 0, &h.stream, &mut params)? };
            h.ledger.launch();
            Ok(())
        };
        // The pool maps its blocks for the device with `HalConfig::mapped_batches`.
        let result = if let Some(mapped) = block.mem.device_ptr() {
            // The kernel reads the table and writes the elements in place.
            launch(mapped, mapped + out_off as u64)
                .map(|()| h.ledger.copy(Dir::D2H, n * sz))
                // Waited for even where the launch failed: nothing queued may still use
                // the block when it goes back to the pool.
                .and(waited_for_block(&h.stream, &block))
        } else {
            let scratch_alloc = match h.alloc_raw(&Cow::Borrowed(GATHER_SCRATCH), total) {
                Ok(scratch) => scratch,
                Err(e) => {
                    h.pinned.give(block);
                    return Err(e);
                }
            };
            let scratch = scratch_alloc.ptr;
            let result = h
                .gather_through_scratch(scratch, &block, table_bytes, out_off, total, |scratch| {
                    launch(scratch, scratch + out_off as u64)
                })
                // Waited for even where a step failed, as above.
                .and(waited_for_block(&h.stream, &block));
            h.free_raw(GATHER_SCRATCH, scratch_alloc);
            result
        };
        let result = h.guard(result);
        if result.is_ok() {
            let host = &block.mem.as_slice()[out_off..out_off + n * sz];
            for (j, (k, _)) in todo.iter().enumerate() {
                out[*k] = bytemuck::pod_read_unaligned(&host[j * sz..(j + 1) * sz]);
            }
        }
        h.pinned.give(block);
        result.map(|()| out)
    }

    /// Uploads many host slices into many buffers (or slices) with one scatter kernel,
    /// instead of one copy each: the slices are packed into a pinned block, which the
    /// kernel reads in place (`HalConfig::mapped_batches`, slices of up to 64 KiB) or from a
    /// device scratch it is copied to. Destinations must not overlap. A batch larger than
    /// the pinned pool keeps two blocks of (`HalConfig::pinned_pool_bytes`) goes in groups
    /// of consecutive slices that fit, a scatter each, and a
    /// slice too large alone goes through the staging slots: no batch pins memory of its
    /// own.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.alloc::<u32>("a", 2).unwrap();
    /// let b = hal.alloc::<u32>("b", 3).unwrap();
    /// hal.upload_batch(&[(&a, &[1, 2][..]), (&b, &[3, 4, 5][..])]).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![3, 4, 5]);
    /// ```
    pub fn upload_batch<T: Pod>(&self, items: &[(&Buffer<T>, &[T])]) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let names = crate::nvtx::name_list(items.iter().map(|(b, _)| b.name()));
            format!("upload_batch {} slices to {names}", items.len())
        });
        let h = &self.inner;
        self.check_batch(
            "upload_batch",
            items.iter().map(|(buf, data)| (*buf, data.len())),
        )?;
        let ranges: Vec<_> = items
            .iter()
            .map(|(buf, _)| (Arc::as_ptr(buf.raw()) as usize, buf.byte_range()))
            .collect();
        if let Some((k, other)) = first_overlap(&ranges) {
            return Err(Error::Aliasing {
                output: items[k].0.name().to_string(),
                other: items[other].0.name().to_string(),
            });
        }
        h.enter()?;
        // Every buffer is this HAL's (checked above), whose context `enter` bound.
        for (buf, _) in items {
            buf.raw()
                .prepare_device_access_bound(buf.byte_range(), true)?;
        }
        // Consecutive slices in groups whose staged bytes the pinned pool keeps two blocks
        // of, each group with one copy and one scatter; a slice past that alone goes
        // through the staging slots (it gains nothing from sharing a copy), so no batch
        // pins memory of its own size or needs a device scratch of it.
        let (mut start, mut staged) = (0, false);
        while start < items.len() {
            let mut end = self.batch_group_end(items.len(), start, |k| items[k].0.size_bytes());
            if end == start {
                let (buf, data) = &items[start];
                let r = h.upload_staged(buf.raw_ptr(), bytemuck::cast_slice(data));
                // (A failed upload may have queued some of its chunks.)
                buf.raw().invalidate_host(buf.byte_range());
                r?;
                staged = true;
                end += 1;
            } else {
                self.upload_group(&items[start..end])?;
            }
            start = end;
        }
        if staged && !PHASES.async_copy {
            h.guard(h.stream.synchronize())?;
        }
        Ok(())
    }

    /// Uploads `items` (checked, their device access prepared) with one scatter kernel
    /// reading a pinned block in place, or from a device scratch the block is copied to;
    /// where memory does not hold the scratch, each slice is copied from the block to its
    /// buffer.
    fn upload_group<T: Pod>(&self, items: &[(&Buffer<T>, &[T])]) -> Result<()> {
        let h = &self.inner;
        let names = || crate::nvtx::name_list(items.iter().map(|(b, _)| b.name()));
        let (offsets, total) = batch_layout(items.iter().map(|(buf, _)| buf.size_bytes()));
        let data_start = (items.len() * SEGMENT_BYTES).next_multiple_of(16);
        let mut block = h.guard(h.pinned.take(total))?;
        {
            // Only the device reads the block: the slices go in with streaming stores (as
            // one slice's upload does), a large group's on the rayon pool.
            let streaming = h.streams_upload(total);
            let host = block.mem.as_mut_slice();
            for (k, ((buf, _), off)) in items.iter().zip(&offsets).enumerate() {
                put_segment(host, k, off - data_start, buf.raw_ptr(), buf.size_bytes());
            }
            let ranges = items.iter().zip(&offsets);
            let dsts = host_pages::pieces_mut(
                host,
                ranges.map(|((b, _), &off)| off..off + b.size_bytes()),
            );
            let srcs = items.iter().map(|(_, data)| bytemuck::cast_slice(data));
            host_pages::copy_pairs(dsts.zip(srcs), total - data_start, streaming);
        }
        // Before the scratch allocation, which no early return below may leave live.
        let d = api()?;
        let done = h.event()?;
        let segments = u32::try_from(items.len())
            .map_err(|_| Error::InvalidArgument(format!("{} slices in one batch", items.len())));
        // The pool maps its blocks for the device with `HalConfig::mapped_batches`.
        let largest = items.iter().map(|(buf, _)| buf.size_bytes()).max();
        let in_place = largest.is_some_and(|b| b <= MAPPED_UPLOAD_SLICE_MAX);
        if let Some(mapped) = block.mem.device_ptr().filter(|_| in_place) {
            // The kernel reads the table and the slices in place.
            let result = segments.and_then(|segments| {
                self.launch_segments(false, mapped, data_start, segments, &names)?;
                h.ledger.copy(Dir::H2D, total);
                Ok(())
            });
            return self.end_upload_batch(items, block, done, result);
        }
        let scratch_alloc = match h.alloc_raw(&Cow::Borrowed(UPLOAD_BATCH_SCRATCH), total) {
            Ok(scratch) => scratch,
            // Where memory does not hold the scratch (as large as the group), each
            // slice is copied from the staged block to its buffer.
            Err(Error::OutOfMemory { .. }) => {
                let result = (|| -> Result<()> {
                    for ((buf, _), off) in items.iter().zip(&offsets) {
                        // SAFETY: the block holds the slice's staged bytes at `off` and is
                        // reused only after `done`; the buffer's range is live.
                        let (from, bytes) = (
                            block.mem.as_ptr().wrapping_add(*off).cast(),
                            buf.size_bytes(),
                        );
                        h.stream.queue(|st| unsafe {
                            d.cuMemcpyHtoDAsync(buf.raw_ptr(), from, bytes, st)
                        })?;
                        h.ledger.copy(Dir::H2D, buf.size_bytes());
                    }
                    Ok(())
                })();
                return self.end_upload_batch(items, block, done, result);
            }
            Err(e) => return Err(e),
        };
        let scratch = scratch_alloc.ptr;
        let result = (|| -> Result<()> {
            let segments = segments?;
            // SAFETY: the block holds `total` staged bytes and is reused only after `done`;
            // scratch has `total` bytes.
            let from = block.mem.as_ptr().cast();
            h.stream
                .queue(|st| unsafe { d.cuMemcpyHtoDAsync(scratch, from, total, st) })?;
            h.ledger.copy(Dir::H2D, total);
            self.launch_segments(false, scratch, data_start, segments, &names)
        })();
        // Stream-ordered after the kernel (pooled), or after a stream sync (driver).
        h.free_raw(UPLOAD_BATCH_SCRATCH, scratch_alloc);
        self.end_upload_batch(items, block, done, result)
    }

    /// The end of [`CudaHal::upload_batch`], whose copies out of `block` were queued, all
    /// or some (`result`): `done` is recorded after them, the block goes back to the pool
    /// to be reused once it is done, and the buffers' host copies are stale.
    fn end_upload_batch<T: Pod>(
        &self,
        items: &[(&Buffer<T>, &[T])],
        block: PinnedBlock,
        done: Arc<Event>,
        result: Result<()>,
    ) -> Result<()> {
        let h = &self.inner;
        // Whatever `result` says: some of the copies may be queued.
        let recorded = h.record_use(&done, &h.stream);
        h.pinned.give_after(block, done);
        // Even where a step failed: some of the copies may be queued, and a host copy read
        // meanwhile would be older than them.
        for (buf, _) in items {
            buf.raw().invalidate_host(buf.byte_range());
        }
        h.guard(result.and(recorded))?;
        if !PHASES.async_copy {
            h.guard(h.stream.synchronize())?;
        }
        Ok(())
    }

    /// Checks a batch (`what` names it in errors) of buffers, each with the length of its
    /// host slice: not empty, every buffer this HAL's and as long as its slice.
    fn check_batch<'b, T: Pod + 'b>(
        &self,
        what: &str,
        items: impl ExactSizeIterator<Item = (&'b Buffer<T>, usize)>,
    ) -> Result<()> {
        if items.len() == 0 {
            return Err(Error::ZeroLength { name: what.into() });
        }
        for (buf, len) in items {
            if !self.same(buf.raw().hal()) {
                return Err(Error::ForeignBuffer {
                    name: buf.name().to_string(),
                });
            }
            buf.check_len(len)?;
        }
        Ok(())
    }

    /// Launches `scatter_segments` (or, with `gather`, `gather_segments`) on the main
    /// stream over the `segments` entries of the segment table at `scratch`, whose data
    /// region starts `data_start` bytes in: one block per segment. `buffers` names the
    /// segments' buffers, for the launch's NVTX range.
    fn launch_segments(
        &self,
        gather: bool,
        scratch: CUdeviceptr,
        data_start: usize,
        segments: u32,
        buffers: &dyn Fn() -> String,
    ) -> Result<()> {
        let h = &self.inner;
        let name = if gather {
            "gather_segments"
        } else {
            "scatter_segments"
        };
        let _range = crate::nvtx::range(|| match gather {
            true => format!("launch {name} out=(staged) in={}", buffers()),
            false => format!("launch {name} out={} in=(staged)", buffers()),
        });
        let f = h.function(name, true)?;
        let blocks = segments.min(h.info_sms() * 8).max(1);
        let (mut t, mut dat, mut c) = (scratch, scratch + data_start as u64, segments);
        let mut params = [
            (&mut t as *mut u64).cast(),
            (&mut dat as *mut u64).cast(),
            (&mut c as *mut u32).cast(),
        ];
        // SAFETY: parameters match both kernels' (const Segment*, u8*, u32); the caller's
        // table holds `segments` entries, each a live device range of a buffer of this HAL
        // and a range of the data region as long, which the kernel copies one to the other.
        unsafe { f.launch((blocks, 1, 1), (256, 1, 1), 0, &h.stream, &mut params)? };
        h.ledger.launch();
        Ok(())
    }

    /// The end of the group of consecutive slices from `start` (of `n`) whose staged bytes
    /// (as [`batch_layout`] lays them out, `size(k)` bytes for slice `k`) the pinned pool
    /// keeps two blocks of: `start` itself when that slice is too large alone.
    fn batch_group_end(&self, n: usize, start: usize, size: impl Fn(usize) -> usize) -> usize {
        let (mut end, mut data) = (start, 0usize);
        while end < n {
            let more = data.saturating_add(size(end).next_multiple_of(16));
            let table = ((end + 1 - start) * SEGMENT_BYTES).next_multiple_of(16);
            if !self.inner.pinned.keeps_two(table.saturating_add(more)) {
                break;
            }
            (end, data) = (end + 1, more);
        }
        end
    }

    /// Downloads many buffers (or slices) into host slices of the same lengths with one
    /// gather kernel, instead of one copy each: the reverse of [`CudaHal::upload_batch`].
    /// The kernel writes a pinned block in place (`HalConfig::mapped_batches`), or a device
    /// scratch then copied back. Returns once every slice is written. With phase 2 a
    /// buffer whose host copy is valid is read from it. A batch larger than the pinned pool
    /// keeps two blocks of goes in groups of consecutive buffers that fit, a gather each,
    /// and a buffer too large alone is downloaded on its own (as
    /// [`Buffer::copy_to_slice`] does): no batch pins memory of its own.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.copy_from("a", &[1u32, 2]).unwrap();
    /// let b = hal.copy_from("b", &[3u32, 4, 5]).unwrap();
    /// let (mut x, mut y) = (vec![0; 2], vec![0; 3]);
    /// hal.download_batch(&mut [(&a, &mut x[..]), (&b.slice(1, 2).unwrap(), &mut y[..2])])
    ///     .unwrap();
    /// assert_eq!((x, y), (vec![1, 2], vec![4, 5, 0]));
    /// ```
    pub fn download_batch<T: Pod>(&self, items: &mut [(&Buffer<T>, &mut [T])]) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let names = crate::nvtx::name_list(items.iter().map(|(b, _)| b.name()));
            format!("download_batch {} slices from {names}", items.len())
        });
        let h = &self.inner;
        self.check_batch(
            "download_batch",
            items.iter().map(|(buf, dst)| (*buf, dst.len())),
        )?;
        h.enter()?;
        // Those the host copies do not serve, in order, their device reads prepared,
        // consecutive slices of one allocation together. Every buffer is this HAL's
        // (checked above), whose context `enter` bound.
        let mut todo: Vec<usize> = Vec::with_capacity(items.len());
        let mut start = 0;
        for run in items.chunk_by_mut(|(a, _), (b, _)| Arc::ptr_eq(a.raw(), b.raw())) {
            let (first, len) = (run[0].0, run.len());
            let reads = run
                .iter_mut()
                .map(|(buf, dst)| (buf.byte_range(), bytemuck::cast_slice_mut(dst)));
            first
                .raw()
                .read_host_or_prepare_bound(reads, |j| todo.push(start + j))?;
            start += len;
        }
        if PHASES.host_cache {
            h.ledger.cache_reads(items.len() - todo.len(), todo.len());
        }
        let mut start = 0;
        while start < todo.len() {
            let end = self.batch_group_end(todo.len(), start, |j| items[todo[j]].0.size_bytes());
            if end == start {
                let (buf, dst) = &mut items[todo[start]];
                h.download(bytemuck::cast_slice_mut(dst), buf.raw_ptr())?;
                start += 1;
            } else {
                self.download_group(items, &todo[start..end])?;
                start = end;
            }
        }
        Ok(())
    }

    /// Downloads `items[k]` for each `k` of `group` (checked, their device access
    /// prepared) with one gather kernel writing a pinned block in place; or with one copy
    /// of the segment table into a device scratch, the gather there, and one copy of the
    /// gathered bytes into the block, where memory holds the scratch (else each buffer is
    /// downloaded on its own).
    fn download_group<T: Pod>(
        &self,
        items: &mut [(&Buffer<T>, &mut [T])],
        group: &[usize],
    ) -> Result<()> {
        let h = &self.inner;
        // (Gathered only for a recorded range: `items` is borrowed mutably below.)
        let buffers: Vec<&Buffer<T>> = match crate::nvtx::enabled() {
            true => group.iter().map(|&k| items[k].0).collect(),
            false => Vec::new(),
        };
        let names = || crate::nvtx::name_list(buffers.iter().map(|b| b.name()));
        let (offsets, total) = batch_layout(group.iter().map(|&k| items[k].0.size_bytes()));
        let data_start = (group.len() * SEGMENT_BYTES).next_multiple_of(16);
        let mut block = h.guard(h.pinned.take(total))?;
        {
            let host = block.mem.as_mut_slice();
            for (j, (&k, off)) in group.iter().zip(&offsets).enumerate() {
                let buf = items[k].0;
                put_segment(host, j, off - data_start, buf.raw_ptr(), buf.size_bytes());
            }
        }
        let segments = u32::try_from(group.len())
            .map_err(|_| Error::InvalidArgument(format!("{} slices in one batch", group.len())));
        // The pool maps its blocks for the device with `HalConfig::mapped_batches`.
        let result = if let Some(mapped) = block.mem.device_ptr() {
            // The kernel reads the table and writes the slices in place.
            segments
                .and_then(|segments| {
                    self.launch_segments(true, mapped, data_start, segments, &names)?;
                    h.ledger.copy(Dir::D2H, total - data_start);
                    Ok(())
                })
                // Waited for even where a step failed: nothing queued may still use the
                // block when it goes back to the pool.
                .and(waited_for_block(&h.stream, &block))
        } else {
            let scratch_alloc = match h.alloc_raw(&Cow::Borrowed(DOWNLOAD_BATCH_SCRATCH), total) {
                Ok(scratch) => scratch,
                // Where memory does not hold the scratch (as large as the group), each
                // buffer is downloaded on its own.
                Err(Error::OutOfMemory { .. }) => {
                    h.pinned.give(block);
                    return group.iter().try_for_each(|&k| {
                        let (buf, dst) = &mut items[k];
                        h.download(bytemuck::cast_slice_mut(dst), buf.raw_ptr())
                    });
                }
                Err(e) => {
                    h.pinned.give(block);
                    return Err(e);
                }
            };
            let scratch = scratch_alloc.ptr;
            let result = segments
                .and_then(|segments| {
                    h.gather_through_scratch(scratch, &block, data_start, data_start, total, |s| {
                        self.launch_segments(true, s, data_start, segments, &names)
                    })
                })
                // Waited for even where a step failed, as above.
                .and(waited_for_block(&h.stream, &block));
            // Stream-ordered after the copy (pooled), or after a stream sync (driver).
            h.free_raw(DOWNLOAD_BATCH_SCRATCH, scratch_alloc);
            result
        };
        let result = h.guard(result);
        if result.is_ok() {
            // The group's slices out of the block, a large group's on the rayon pool.
            let host = block.mem.as_slice();
            // The group's indices rise: each item is split off the rest in turn.
            debug_assert!(group.is_sorted_by(|a, b| a < b));
            let (mut rest, mut at) = (&mut items[..], 0);
            let pairs = group.iter().zip(&offsets).map_while(|(&k, &off)| {
                let ((_, dst), tail) = std::mem::take(&mut rest)
                    .get_mut(k - at..)?
                    .split_first_mut()?;
                (rest, at) = (tail, k + 1);
                let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
                let len = dst.len();
                Some((dst, &host[off..off + len]))
            });
            host_pages::copy_pairs(pairs, total - data_start, false);
        }
        h.pinned.give(block);
        result
    }
}

impl HalInner {
    /// The copied route of a gather into `block`, on the main stream: the table in the
    /// block's first `table` bytes goes up to `scratch` (`total` bytes), `launch(scratch)`
    /// queues the kernel that writes the output from `out_off` on, and the output comes
    /// back into the block at `out_off`. The caller waits for the stream before it touches
    /// the block or gives it back.
    fn gather_through_scratch(
        &self,
        scratch: CUdeviceptr,
        block: &PinnedBlock,
        table: usize,
        out_off: usize,
        total: usize,
        launch: impl FnOnce(CUdeviceptr) -> Result<()>,
    ) -> Result<()> {
        debug_assert!(table <= out_off && out_off <= total && total <= block.mem.len());
        let d = api()?;
        // SAFETY: the block holds the table and is left unchanged until the stream has
        // passed the copy (the caller's part); scratch, the caller's allocation, has room.
        let from = block.mem.as_ptr().cast();
        self.stream
            .queue(|st| unsafe { d.cuMemcpyHtoDAsync(scratch, from, table, st) })?;
        self.ledger.copy(Dir::H2D, table);
        launch(scratch)?;
        // SAFETY: block and scratch both have `total` bytes; the host leaves the block alone
        // until the stream is done (the caller's part).
        let (into, bytes) = (
            block.mem.as_ptr().wrapping_add(out_off).cast(),
            total - out_off,
        );
        self.stream.queue(|st| unsafe {
            d.cuMemcpyDtoHAsync(into, scratch + out_off as u64, bytes, st)
        })?;
        self.ledger.copy(Dir::D2H, total - out_off);
        Ok(())
    }
}

/// Two of `ranges` (allocation, byte range) that share bytes of one allocation, as (the
/// later index, the earlier), if any. None where every allocation appears once (O(n)).
/// Otherwise, sorted by allocation and start, the ranges before the first overlap are
/// disjoint, so a range overlaps one of them exactly when it starts before the end of the
/// one just before it (O(n log n), for batches of many thousand slices).
fn first_overlap(ranges: &[(usize, std::ops::Range<usize>)]) -> Option<(usize, usize)> {
    // Ranges of distinct allocations share nothing (the common batch: one buffer each).
    let mut allocs = rustc_hash::FxHashSet::default();
    allocs.reserve(ranges.len());
    let mut nonempty = ranges.iter().filter(|(_, r)| !r.is_empty());
    if nonempty.all(|(alloc, _)| allocs.insert(*alloc)) {
        return None;
    }
    // Sorted by (allocation, start) as one integer: no lookup per comparison.
    let key = |alloc: usize, start: usize| (alloc as u128) << 64 | start as u128;
    let mut order: Vec<(u128, usize, usize)> = ranges
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| !r.is_empty()) // no bytes to share
        .map(|(i, (alloc, r))| (key(*alloc, r.start), r.end, i))
        .collect();
    order.sort_unstable_by_key(|&(k, ..)| k);
    order.windows(2).find_map(|w| {
        let ((key_b, end_b, b), (k, _, i)) = (w[0], w[1]);
        let (start, same_alloc) = (k as u64 as usize, k >> 64 == key_b >> 64);
        (same_alloc && start < end_b).then_some((i.max(b), i.min(b)))
    })
}

/// Bytes of one entry of `upload_batch`'s segment table: source offset, destination, length.
const SEGMENT_BYTES: usize = 24;

/// Writes entry `k` of the segment table at the start of `table`, as `kernels/transfer.cu`
/// lays out its `Segment`: the slice's offset in the data region, the device address of its
/// buffer (or slice) and its length in bytes.
fn put_segment(table: &mut [u8], k: usize, data_offset: usize, device: CUdeviceptr, len: usize) {
    let seg: [u64; 3] = [data_offset as u64, device, len as u64];
    table[k * SEGMENT_BYTES..(k + 1) * SEGMENT_BYTES].copy_from_slice(bytemuck::cast_slice(&seg));
}

/// The largest slice `upload_batch` moves in place through the pinned block's device
/// mapping (`HalConfig::mapped_batches`). Its kernel reads each slice with one block of
/// threads, which waits a bus round trip for each 16 KiB it has in flight; past this size
/// the copy engine is as fast (on an H200: 32 slices of 64 KiB 180 us in place against 184
/// us copied, 4 of 1 MiB 406 us against 397 us). Downloads and gathers have no such bound:
/// their kernels' writes to host memory wait for nothing.
const MAPPED_UPLOAD_SLICE_MAX: usize = 64 << 10;

/// Layout of a batch's staged bytes (`upload_batch`, `download_batch`) for slices of
/// `sizes` bytes: the segment table, then each slice 16-byte aligned. The offset of each
/// slice, and the total.
fn batch_layout(sizes: impl ExactSizeIterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut cursor = (sizes.len() * SEGMENT_BYTES).next_multiple_of(16);
    for size in sizes {
        offsets.push(cursor);
        cursor = (cursor + size).next_multiple_of(16);
    }
    (offsets, cursor)
}

/// Waits for `stream`, whose copies and kernels use `block`: where the wait fails without
/// breaking the context, the block is never reused nor freed ([`keep_if_still_used`]).
fn waited_for_block(stream: &Stream, block: &PinnedBlock) -> Result<()> {
    let waited = stream.synchronize();
    keep_if_still_used(&block.mem, &waited);
    waited
}

#[cfg(test)]
mod tests {
    use super::{first_overlap, put_segment, SEGMENT_BYTES};
    use proptest::prelude::*;
    use std::ops::Range;

    /// Whether two ranges share bytes of one allocation.
    fn share(a: &(usize, Range<usize>), b: &(usize, Range<usize>)) -> bool {
        let ((a, ra), (b, rb)) = (a, b);
        a == b && ra.start.max(rb.start) < ra.end.min(rb.end)
    }

    /// Whether any two ranges share bytes, pair by pair.
    fn any_overlap(ranges: &[(usize, Range<usize>)]) -> bool {
        let pairs = |k| (0..k).map(move |j| (j, k));
        (0..ranges.len())
            .flat_map(pairs)
            .any(|(j, k)| share(&ranges[j], &ranges[k]))
    }

    #[test]
    fn segment_entries_follow_the_kernels_layout() {
        // `Segment` in kernels/transfer.cu: three u64 (offset in the data, device address,
        // length), 24 bytes apart; entries around the one written stay as they were.
        let mut table = vec![0xffu8; 3 * SEGMENT_BYTES];
        put_segment(&mut table, 1, 48, 0x7f00_dead_beef, 1024);
        let words: Vec<u64> = table
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
            .collect();
        assert_eq!(&words[3..6], &[48, 0x7f00_dead_beef, 1024]);
        assert!(words[..3].iter().chain(&words[6..]).all(|&w| w == u64::MAX));
    }

    #[test]
    fn overlaps_are_found_across_unsorted_ranges() {
        let r = |alloc, start, end| (alloc, start..end);
        assert_eq!(first_overlap(&[r(1, 0, 8), r(1, 8, 16)]), None, "adjacent");
        assert_eq!(
            first_overlap(&[r(1, 0, 8), r(2, 0, 8)]),
            None,
            "two allocations"
        );
        assert_eq!(first_overlap(&[r(1, 4, 12), r(1, 0, 8)]), Some((1, 0)));
        // Out of order: the pair found is the first in sorted order, named by index.
        let long = [r(1, 0, 100), r(1, 50, 60), r(1, 10, 20)];
        assert_eq!(first_overlap(&long), Some((2, 0)));
        assert_eq!(first_overlap(&[r(1, 0, 8), r(1, 4, 4)]), None, "no bytes");
        assert_eq!(first_overlap(&[]), None);
    }

    proptest! {
        /// Against the pair-by-pair check: found exactly when there is one, and the pair
        /// named does overlap.
        #[test]
        fn first_overlap_matches_the_pairwise_check(
            raw in prop::collection::vec((0usize..3, 0usize..64, 0usize..16), 0..24)
        ) {
            let ranges: Vec<_> = raw.iter().map(|&(a, s, l)| (a, s..s + l)).collect();
            let found = first_overlap(&ranges);
            prop_assert_eq!(found.is_some(), any_overlap(&ranges));
            if let Some((later, earlier)) = found {
                prop_assert!(earlier < later);
                prop_assert!(share(&ranges[later], &ranges[earlier]));
            }
        }
    }
}
