//! Typed device buffers over a shared `RawBuffer` (allocation + phase-2 host cache).

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use cuda_sys::CUdeviceptr;
use parking_lot::{Mutex, MutexGuard};

use crate::hal::{DeviceAlloc, HalInner};
use crate::host_cache::{BorrowKind, CacheState};
use crate::host_copies::{HostBytes, HOST_ALIGN};
use crate::host_pages;
use crate::kernels::DevicePtr;
use crate::streams::{HalStream, SideUses};
use crate::{CudaHal, Error, Result, PHASES};

/// An allocation's host copy: what it holds, and its bytes once a host access needed them.
struct HostCopy {
    state: CacheState,
    bytes: Option<HostBytes>,
}

impl HostCopy {
    /// Copies bytes `r` into `dst` (as long) when the host copy holds them all, valid
    /// (true); else leaves `dst` untouched (false). The caller holds the lock.
    fn read_valid(&self, r: &Range<usize>, dst: &mut [u8]) -> bool {
        // (No host copy, the common case of a result the device wrote, is known before
        // the state is planned.)
        let Some(host) = self.bytes.as_ref() else {
            return false;
        };
        if !self
            .state
            .plan_read(r)
            .is_ok_and(|misses| misses.is_empty())
        {
            return false;
        }
        // SAFETY: r is readable and no exclusive view covers it (plan_read), and the
        // caller's lock keeps one from starting during the copy.
        let src = unsafe { std::slice::from_raw_parts(host.ptr.add(r.start), r.len()) };
        dst.copy_from_slice(src);
        true
    }
}

/// One device allocation: its name, pointer, size and (phase 2) host copy. Freed through
/// its HAL when the last buffer or slice over it is dropped.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let col = hal.alloc::<u32>("column", 1024).unwrap();
/// let half = col.slice(512, 512).unwrap(); // the same allocation
/// drop(col);
/// assert_eq!(hal.memory_report().live.len(), 1, "the slice keeps it alive");
/// drop(half);
/// assert!(hal.memory_report().live.is_empty(), "freed with the last view");
/// ```
pub struct RawBuffer {
    hal: Arc<HalInner>,
    name: Cow<'static, str>,
    alloc: DeviceAlloc,
    ptr: CUdeviceptr,
    bytes: usize,
    cache: Mutex<HostCopy>,
    /// Side-stream work that may still use the allocation.
    pub(crate) side: SideUses,
}

impl RawBuffer {
    /// A new allocation of `bytes` (> 0) on `hal`. Not generic, so that the allocation path
    /// is compiled once, with [`HalInner::alloc_with`] inlined into it.
    #[inline(never)]
    pub(crate) fn allocate(
        hal: &Arc<HalInner>,
        name: Cow<'static, str>,
        bytes: usize,
    ) -> Result<Arc<Self>> {
        hal.alloc_with(name, bytes, |alloc, name| {
            Arc::new(RawBuffer {
                hal: hal.clone(),
                name,
                ptr: alloc.ptr,
                bytes,
                alloc,
                cache: Mutex::new(HostCopy {
                    state: CacheState::for_new_allocation(),
                    bytes: None,
                }),
                side: SideUses::default(),
            })
        })
    }

    pub(crate) fn hal(&self) -> &Arc<HalInner> {
        &self.hal
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Device address of the allocation's first byte.
    pub(crate) fn base_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }

    fn borrowed(&self) -> Error {
        Error::BufferBorrowed {
            name: self.name.to_string(),
        }
    }

    /// Before the main stream reads or writes `r`: orders it after the pending side-stream
    /// uses it must follow (for a read, the writes), uploads host-newer bytes, and for a
    /// write marks the host copy of `r` stale.
    pub(crate) fn prepare_device_access(&self, r: Range<usize>, write: bool) -> Result<()> {
        // The caller may have another HAL's context current (copies between devices).
        self.hal.ctx.bind()?;
        self.prepare_device_access_bound(r, write)
    }

    /// [`RawBuffer::prepare_device_access`] for a caller that has bound the context of the
    /// buffer's HAL (`HalInner::enter`), preparing many of its buffers in a row.
    pub(crate) fn prepare_device_access_bound(&self, r: Range<usize>, write: bool) -> Result<()> {
        self.side.wait_on(&self.hal.stream, 0, write, true)?;
        self.flush_host(r, write)
    }

    /// A batch's reads of this buffer, for a caller that has bound the context of the
    /// buffer's HAL: each `(r, dst)` of `reads` (`dst` as long as `r`) is copied from a
    /// valid host copy (phase 2) where there is one; otherwise the main stream's read of
    /// `r` is prepared as [`RawBuffer::prepare_device_access_bound`] prepares it, and
    /// `missed` is told the read's index. Where the buffer has no open view and no host
    /// edits, the common case, all the reads take one lock section together.
    #[inline]
    pub(crate) fn read_host_or_prepare_bound<'d>(
        &self,
        reads: impl ExactSizeIterator<Item = (Range<usize>, &'d mut [u8])>,
        mut missed: impl FnMut(usize),
    ) -> Result<()> {
        let mut c = self.cache.lock();
        if !c.state.idle_for_device() {
            return self.read_each_host_or_prepare_bound(c, reads, missed);
        }
        let n = reads.len();
        let mut served = 0;
        if PHASES.host_cache && c.bytes.is_some() {
            for (j, (r, dst)) in reads.enumerate() {
                if c.read_valid(&r, dst) {
                    served += 1;
                } else {
                    missed(j);
                }
            }
        } else {
            (0..n).for_each(&mut missed);
        }
        if served < n {
            // What `flush_host` does for such a buffer, without taking the lock again.
            c.state.mark_idle_device_read();
            drop(c);
            self.side.wait_on(&self.hal.stream, 0, false, true)?;
        }
        Ok(())
    }

    /// [`RawBuffer::read_host_or_prepare_bound`] for a buffer with an open view or host
    /// edits (locked in `c`): each read the host copy does not serve is prepared on its
    /// own, the lock let go meanwhile.
    #[cold]
    #[inline(never)]
    fn read_each_host_or_prepare_bound<'d>(
        &self,
        mut c: MutexGuard<'_, HostCopy>,
        reads: impl Iterator<Item = (Range<usize>, &'d mut [u8])>,
        mut missed: impl FnMut(usize),
    ) -> Result<()> {
        for (j, (r, dst)) in reads.enumerate() {
            if PHASES.host_cache && c.read_valid(&r, dst) {
                continue;
            }
            missed(j);
            MutexGuard::unlocked(&mut c, || self.prepare_device_access_bound(r, false))?;
        }
        Ok(())
    }

    /// Before side stream `stream` reads or writes `r`: host-newer bytes are uploaded (on
    /// the main stream), then `stream` waits for the main stream and for other streams'
    /// pending uses.
    pub(crate) fn prepare_side_access(
        &self,
        r: Range<usize>,
        write: bool,
        stream: &HalStream,
    ) -> Result<()> {
        self.flush_for_side(r, write)?;
        stream.after_main()?;
        self.wait_side_uses(stream, write)
    }

    /// The first step of [`RawBuffer::prepare_side_access`]: host-newer bytes of `r` are
    /// uploaded on the main stream. A launch with several buffers takes this step for each,
    /// then orders its stream after the main stream once, then takes the last step for each.
    pub(crate) fn flush_for_side(&self, r: Range<usize>, write: bool) -> Result<()> {
        // The caller may have another HAL's context current (user code between steps).
        self.hal.ctx.bind()?;
        self.flush_host(r, write)
    }

    /// The last step of [`RawBuffer::prepare_side_access`]: `stream` waits for other
    /// streams' pending uses that its access must follow (for a read, their writes).
    pub(crate) fn wait_side_uses(&self, stream: &HalStream, write: bool) -> Result<()> {
        self.side.wait_on(&stream.stream, stream.id, write, false)
    }

    /// The host-cache half of a device access: uploads host-newer bytes, and for a write
    /// marks the host copy of `r` stale. A no-op without phase 2. Before an upload, the
    /// main stream waits for every pending side-stream use: the upload overwrites bytes
    /// they may still read, even where the access itself only reads.
    fn flush_host(&self, r: Range<usize>, write: bool) -> Result<()> {
        let mut c = self.cache.lock();
        // The common case, a buffer with no open view and no host edits: nothing to check
        // or upload.
        if c.state.idle_for_device() {
            c.state.mark_device_access(r, write);
            return Ok(());
        }
        if !PHASES.host_cache {
            // Only an open `view_mut` (a detached view) can stand in the way. A write is
            // still marked: a view that began meanwhile then leaves these bytes to it.
            if c.state.plan_device_access(&r).is_err() {
                return Err(self.borrowed());
            }
            c.state.mark_device_access(r, write);
            return Ok(());
        }
        let uploads = c
            .state
            .plan_device_access(&r)
            .map_err(|_| self.borrowed())?;
        if let Some(host) = &c.bytes {
            if !uploads.is_empty() {
                self.side.wait_on(&self.hal.stream, 0, true, true)?;
            }
            for u in uploads {
                // SAFETY: the planned uploads lie outside every exclusive view
                // (plan_device_access leaves the bytes a view is editing dirty), and the
                // cache lock keeps new views out during the upload; shared views only read.
                let src = unsafe { host.range(u.clone()) };
                self.hal.upload(self.ptr + u.start as u64, src)?;
            }
        }
        c.state.mark_device_access(r, write);
        Ok(())
    }

    /// Marks the host copy of `r` stale after a device write of it was queued (prepared
    /// with [`RawBuffer::prepare_device_access`] or its side-stream form): host edits made
    /// since to other bytes stay to be uploaded. Without phase 2 it tells an open
    /// `view_mut` that the device wrote these bytes.
    pub(crate) fn invalidate_host(&self, r: Range<usize>) {
        self.cache.lock().state.mark_device_written(r);
    }

    /// Runs `f` over the host copy of `r` (phase 2), downloading what is missing.
    fn with_host<R>(
        &self,
        r: Range<usize>,
        kind: BorrowKind,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R> {
        let (base, id) = {
            let mut c = self.cache.lock();
            let mut missing = c.state.plan_read(&r).map_err(|_| self.borrowed())?;
            if c.bytes.is_none() {
                c.bytes = Some(self.hal.aside.host_copies.take(self.bytes)?);
            }
            // A new allocation's bytes are unspecified: a mutable view starts from zeros,
            // with no download.
            if kind == BorrowKind::Exclusive && c.state.adopt_fresh(&r) {
                if let Some(host) = &c.bytes {
                    // SAFETY: a fresh allocation has no view, and the lock keeps new ones
                    // out until this one is registered.
                    unsafe { host.zero(r.clone()) };
                }
                missing.clear();
            }
            if !missing.is_empty() {
                self.side.wait_on(&self.hal.stream, 0, false, true)?;
                // A download that fails part way leaves device bytes in the host copy
                // (the allocation still fresh): a mutable view adopting it zeroes them.
                if let Some(host) = c.bytes.as_mut() {
                    host.mark_written();
                }
            }
            self.hal.ledger.cache(missing.is_empty());
            for m in missing {
                let host = c.bytes.as_ref().ok_or_else(|| self.borrowed())?;
                // SAFETY: plan_read guarantees no view overlaps the missing bytes, and the
                // lock keeps new views out until the download is done.
                let dst = unsafe { host.range_mut(m.clone()) };
                self.hal.download(dst, self.ptr + m.start as u64)?;
                c.state.mark_downloaded(m);
            }
            let id = c.state.begin_borrow(r, kind).map_err(|_| self.borrowed())?;
            (c.bytes.as_ref().map_or(std::ptr::null_mut(), |h| h.ptr), id)
        };
        let _end = EndBorrow(self, id);
        Ok(f(base))
    }
}

/// Ends a borrow of a host copy (registered with `CacheState::begin_borrow`) as it goes,
/// on unwinding too.
pub(crate) struct EndBorrow<'a>(pub(crate) &'a RawBuffer, pub(crate) u64);

impl Drop for EndBorrow<'_> {
    fn drop(&mut self) {
        self.0.cache.lock().state.end_borrow(self.1);
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // No stream may still be using the memory when it is freed or reused. With no
        // side-stream use there is nothing to order, and no driver call: a block the cache
        // keeps is then freed without binding the context (`free_raw` binds it for the
        // driver's free).
        let ordered = match self.side.pending() {
            false => Ok(()),
            true => self.hal.ctx.bind().and_then(|()| {
                if self.alloc.pooled {
                    self.side.wait_on(&self.hal.stream, 0, true, true)
                } else {
                    self.side.wait_host()
                }
            }),
        };
        // The host copy's pages, faulted in already, serve the next buffer of this size.
        if let Some(host) = self.cache.get_mut().bytes.take() {
            self.hal.aside.host_copies.give(host);
        }
        if let Err(e) = ordered {
            // The side streams may still use the memory: the whole context is waited for
            // before the block is freed or handed out again. (If that fails too, the
            // context is broken and runs no more work.)
            let synced = self.hal.ctx.synchronize();
            log::warn!(
                "ordering the free of `{}` after its side-stream uses: {e}; waited for the \
                 context instead: {synced:?}",
                self.name
            );
        }
        self.hal.free_raw(&self.name, self.alloc);
    }
}

/// A typed device buffer, or a slice of one. Clones and slices share the allocation.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let col = hal.copy_from("column", &[5u32, 6, 7, 8]).unwrap();
/// let tail = col.slice(2, 2).unwrap();
/// assert_eq!(tail.to_vec().unwrap(), vec![7, 8]);
/// tail.view_mut(|s| s[0] = 70).unwrap();
/// assert_eq!(col.get_at(2).unwrap(), 70);
/// ```
pub struct Buffer<T> {
    raw: Arc<RawBuffer>,
    /// Offset in elements from the start of the allocation.
    offset: usize,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for Buffer<T> {
    fn clone(&self) -> Self {
        Buffer {
            raw: self.raw.clone(),
            offset: self.offset,
            len: self.len,
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.raw.name)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// Ends a view of a build without phase 2 (`CacheState::begin_detached_borrow`) when
/// dropped, on every path out of it.
struct EndDetachedView<'a>(&'a RawBuffer, u64);

impl Drop for EndDetachedView<'_> {
    fn drop(&mut self) {
        self.0.cache.lock().state.end_detached_borrow(self.1);
    }
}

impl<T: Pod> Buffer<T> {
    pub(crate) fn new(hal: &CudaHal, name: Cow<'static, str>, len: usize) -> Result<Self> {
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Err(Error::ZeroLength {
                name: name.into_owned(),
            });
        }
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| hal.inner.oom(&name, usize::MAX, None))?;
        Ok(Buffer {
            raw: RawBuffer::allocate(&hal.inner, name, bytes)?,
            offset: 0,
            len,
            _t: PhantomData,
        })
    }

    pub(crate) fn raw(&self) -> &Arc<RawBuffer> {
        &self.raw
    }

    /// Number of elements.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u64>("b", 100).unwrap();
    /// assert_eq!(b.len(), 100);
    /// assert_eq!(b.slice(10, 20).unwrap().len(), 20);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one element.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u8>("b", 1).unwrap();
    /// assert!(!b.is_empty());
    /// assert!(b.slice(0, 0).is_err(), "no empty slices either");
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The name given at creation (slices keep their parent's).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("quotient", 64).unwrap();
    /// assert_eq!(b.slice(8, 8).unwrap().name(), "quotient");
    /// ```
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// Size in bytes of this buffer or slice.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 64).unwrap();
    /// assert_eq!(b.size_bytes(), 256);
    /// assert_eq!(b.slice(0, 16).unwrap().size_bytes(), 64);
    /// ```
    pub fn size_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The HAL the buffer belongs to.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.copy_from("a", &[1u32, 2]).unwrap();
    /// // A helper that gets only a buffer can allocate beside it on the same device.
    /// let b = a.hal().alloc::<u32>("b", a.len()).unwrap();
    /// b.copy_from_buffer(&a).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![1, 2]);
    /// ```
    pub fn hal(&self) -> CudaHal {
        CudaHal::from_inner(self.raw.hal.clone())
    }

    /// The HAL for the library's own use within one call: not counted as a user's handle
    /// (see [`CudaHal::internal`]).
    pub(crate) fn hal_internal(&self) -> CudaHal {
        CudaHal::internal(&self.raw.hal)
    }

    /// Byte range within the allocation.
    pub(crate) fn byte_range(&self) -> Range<usize> {
        let sz = std::mem::size_of::<T>();
        self.offset * sz..(self.offset + self.len) * sz
    }

    /// Whether this and `other` share bytes of one allocation.
    pub(crate) fn overlaps<U: Pod>(&self, other: &Buffer<U>) -> bool {
        let (a, b) = (self.byte_range(), other.byte_range());
        Arc::ptr_eq(&self.raw, &other.raw) && a.start < b.end && b.start < a.end
    }

    /// The allocation's bytes holding element `i` of this buffer or slice.
    pub(crate) fn element_range(&self, i: usize) -> Range<usize> {
        let sz = std::mem::size_of::<T>();
        (self.offset + i) * sz..(self.offset + i + 1) * sz
    }

    /// Device address of the first element.
    pub(crate) fn raw_ptr(&self) -> CUdeviceptr {
        self.raw.ptr + (self.offset * std::mem::size_of::<T>()) as u64
    }

    /// Views of the host copy need `T` aligned at most as the copy is (a page).
    fn check_host_align(&self) -> Result<()> {
        if std::mem::align_of::<T>() > HOST_ALIGN {
            return Err(Error::InvalidArgument(format!(
                "a view of `{}` needs {}-byte alignment; the host copy has {HOST_ALIGN}",
                self.name(),
                std::mem::align_of::<T>()
            )));
        }
        Ok(())
    }

    fn out_of_range(&self, start: usize, end: usize) -> Error {
        Error::OutOfRange {
            name: self.name().to_string(),
            start,
            end,
            len: self.len,
        }
    }

    /// A view of elements `offset..offset + len`, sharing the allocation.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[0u32, 1, 2, 3, 4, 5]).unwrap();
    /// let mid = b.slice(2, 3).unwrap();
    /// assert_eq!(mid.to_vec().unwrap(), vec![2, 3, 4]);
    /// assert_eq!(mid.slice(1, 1).unwrap().get_at(0).unwrap(), 3, "slices of slices");
    /// assert!(matches!(b.slice(4, 3), Err(Error::OutOfRange { start: 4, end: 7, len: 6, .. })));
    /// ```
    pub fn slice(&self, offset: usize, len: usize) -> Result<Buffer<T>> {
        if len == 0 {
            return Err(Error::ZeroLength {
                name: self.name().to_string(),
            });
        }
        let end = offset.checked_add(len).filter(|e| *e <= self.len);
        let Some(_) = end else {
            return Err(self.out_of_range(offset, offset.saturating_add(len)));
        };
        Ok(Buffer {
            raw: self.raw.clone(),
            offset: self.offset + offset,
            len,
            _t: PhantomData,
        })
    }

    /// A view of `len` elements of type `U` starting `byte_offset` bytes into this buffer,
    /// sharing the allocation (and its host copy). The offset must be a multiple of
    /// `size_of::<U>()` from the start of the allocation.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let words = hal.copy_from("words", &[0x0000_0002_0000_0001u64, 3]).unwrap();
    /// let halves = words.reinterpret::<u32>(0, 4).unwrap(); // the same bytes as u32
    /// assert_eq!(halves.to_vec().unwrap(), vec![1, 2, 3, 0]);
    /// assert!(words.reinterpret::<u32>(2, 1).is_err(), "not aligned for u32");
    /// ```
    pub fn reinterpret<U: Pod>(&self, byte_offset: usize, len: usize) -> Result<Buffer<U>> {
        let su = std::mem::size_of::<U>();
        if len == 0 || su == 0 {
            return Err(Error::ZeroLength {
                name: self.name().to_string(),
            });
        }
        let start = self.byte_range().start.saturating_add(byte_offset);
        let end = len.checked_mul(su).and_then(|b| b.checked_add(start));
        if end.is_none_or(|e| e > self.byte_range().end) || byte_offset > self.size_bytes() {
            // The elements of `T` the request covers, the last one in part.
            let st = std::mem::size_of::<T>();
            let end_bytes = len.saturating_mul(su).saturating_add(byte_offset);
            return Err(self.out_of_range(byte_offset / st, end_bytes.div_ceil(st)));
        }
        if start % su != 0 {
            return Err(Error::InvalidArgument(format!(
                "byte offset {start} of `{}` is not a multiple of {su}",
                self.name()
            )));
        }
        Ok(Buffer {
            raw: self.raw.clone(),
            offset: start / su,
            len,
            _t: PhantomData,
        })
    }

    /// Element `i`. Phase 2 reads a valid host copy; phase 1 copies only this element;
    /// the baseline copies the whole buffer.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("evals", &[4u32, 5, 6]).unwrap();
    /// assert_eq!(b.get_at(2).unwrap(), 6);
    /// match b.get_at(3) {
    ///     Err(Error::OutOfRange { name, start, len, .. }) => assert_eq!((name.as_str(), start, len), ("evals", 3, 3)),
    ///     other => panic!("expected OutOfRange, got {other:?}"),
    /// }
    /// assert_eq!(b.get_at(0).unwrap(), 4); // the HAL is as usable as before
    /// ```
    pub fn get_at(&self, i: usize) -> Result<T> {
        let _range = crate::nvtx::range(|| format!("get_at {}[{i}]", self.name()));
        if i >= self.len {
            return Err(self.out_of_range(i, i.saturating_add(1)));
        }
        let h = &self.raw.hal;
        h.enter()?;
        let r = self.element_range(i);
        if PHASES.host_cache {
            let c = self.raw.cache.lock();
            if let (true, Some(host)) = (c.state.readable().contains(&r), c.bytes.as_ref()) {
                h.ledger.cache(true);
                // SAFETY: r lies inside the host copy; readable bytes are only written under
                // an exclusive view, which `contains` + no-exclusive-borrow rules out below.
                if c.state.plan_read(&r).is_ok() {
                    return Ok(unsafe {
                        std::ptr::read_unaligned(host.ptr.add(r.start).cast::<T>())
                    });
                }
                return Err(self.raw.borrowed());
            }
            drop(c);
            if PHASES.offset_get_at {
                h.ledger.cache(false);
            }
        }
        if !PHASES.offset_get_at {
            // As the original: the whole buffer is read (with phase 2 into the host copy,
            // then read from it). Where another part of it is under a `view_mut`, only the
            // element is read, as with phase 1: its bytes alone decide whether it is
            // borrowed.
            let whole = if PHASES.host_cache && self.check_host_align().is_ok() {
                self.view(|s| s[i])
            } else {
                self.download_vec().map(|v| v[i])
            };
            if !matches!(whole, Err(Error::BufferBorrowed { .. })) {
                return whole;
            }
        }
        self.raw.prepare_device_access(r.clone(), false)?;
        let mut v = T::zeroed();
        h.download(
            bytemuck::bytes_of_mut(&mut v),
            self.raw.ptr + r.start as u64,
        )?;
        Ok(v)
    }

    /// The elements from a valid host copy (phase 2), or `None`.
    ///
    /// The copy is made under a shared borrow of the bytes, not under the buffer's lock: a
    /// large one runs on the rayon pool, whose threads may be waiting for that lock (a
    /// prover's `par_iter` reading the buffer), and would then never take its tasks.
    pub(crate) fn cached_copy(&self) -> Option<Vec<T>> {
        let r = self.byte_range();
        let (base, id) = {
            let mut c = self.raw.cache.lock();
            let base = c.bytes.as_ref()?.ptr;
            if !c.state.plan_read(&r).is_ok_and(|m| m.is_empty()) {
                return None;
            }
            (
                base,
                c.state.begin_borrow(r.clone(), BorrowKind::Shared).ok()?,
            )
        };
        let _end = EndBorrow(&self.raw, id);
        self.raw.hal.ledger.cache(true);
        // SAFETY: r is readable with no exclusive view (plan_read), and the shared borrow
        // keeps exclusive views and downloads out of it until the copy is done; the host
        // copy stays with the allocation while `self` lives.
        let bytes = unsafe { std::slice::from_raw_parts(base.add(r.start), r.len()) };
        Some(host_pages::copied(bytes))
    }

    /// A new `Vec` with this buffer's elements, copied synchronously (baseline path).
    fn download_vec(&self) -> Result<Vec<T>> {
        let h = &self.raw.hal;
        h.enter()?;
        self.raw.prepare_device_access(self.byte_range(), false)?;
        // Faulted in by the rayon pool: the driver would fault it in one thread.
        let mut v = host_pages::prefaulted::<T>(self.len);
        h.download(bytemuck::cast_slice_mut(&mut v), self.raw_ptr())?;
        Ok(v)
    }

    /// `view` without phase 2: a downloaded `Vec`. The view is registered for its length,
    /// so that a `view_mut` of the same elements meanwhile is refused, as with the host
    /// cache (the device may still read and write them).
    fn view_detached<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.raw.hal.enter()?;
        let id = self
            .raw
            .cache
            .lock()
            .state
            .begin_detached_borrow(self.byte_range(), BorrowKind::Shared)
            .map_err(|_| self.raw.borrowed())?;
        let _end = EndDetachedView(&self.raw, id);
        Ok(f(&self.download_vec()?))
    }

    /// `view_mut` without phase 2: the edits live in a downloaded `Vec` until they are
    /// uploaded. The view is registered before the download, so the device neither writes
    /// these bytes meanwhile (the upload would undo it) nor reads them (stale): device
    /// accesses to them are refused, as with the host cache. A device write checked before
    /// the view began may still be queued while it is open: the view's edits of those
    /// bytes are dropped then, and the device's bytes win, as with the host cache.
    fn view_mut_detached<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let (h, r) = (&self.raw.hal, self.byte_range());
        h.enter()?;
        let (id, fresh) = {
            let mut c = self.raw.cache.lock();
            let id = c
                .state
                .begin_detached_borrow(r.clone(), BorrowKind::Exclusive)
                .map_err(|_| self.raw.borrowed())?;
            // A new allocation's bytes are unspecified: the view starts from zeros.
            let fresh = c.state.adopt_fresh(&r);
            // Cleared by a device write queued from now on.
            c.state.mark_downloaded(r.clone());
            (id, fresh)
        };
        let _end = EndDetachedView(&self.raw, id);
        let mut v = host_pages::prefaulted::<T>(self.len);
        if !fresh {
            self.raw.side.wait_on(&h.stream, 0, false, true)?;
            h.download(bytemuck::cast_slice_mut(&mut v), self.raw_ptr())?;
        }
        // A panicking `f` leaves its edits too, as with the host cache (and any `&mut [T]`).
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut v)));
        let uploaded = self.upload_detached_edits(&v, r);
        match out {
            Ok(out) => uploaded.map(|()| out),
            Err(panic) => {
                if let Err(e) = uploaded {
                    log::warn!(
                        "uploading the edits of a panicking view of {}: {e}",
                        self.name()
                    );
                }
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The end of [`Buffer::view_mut_detached`]: uploads its edits `v` of the bytes `r`.
    fn upload_detached_edits(&self, v: &[T], r: Range<usize>) -> Result<()> {
        let h = &self.raw.hal;
        // The view's closure may have left another context current.
        h.enter()?;
        // After side-stream work queued since (such a write), and only the bytes no device
        // write has made stale.
        self.raw.side.wait_on(&h.stream, 0, true, true)?;
        let kept = self.raw.cache.lock().state.readable().within(&r);
        let bytes: &[u8] = bytemuck::cast_slice(v);
        for k in kept {
            h.upload(
                self.raw.ptr + k.start as u64,
                &bytes[k.start - r.start..k.end - r.start],
            )?;
        }
        Ok(())
    }

    /// Runs `f` over the elements on the host. Phase 2 reads the cached host copy (no
    /// transfer while it is valid); otherwise the buffer is copied into a new `Vec`.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("column", &(1..=100u32).collect::<Vec<_>>()).unwrap();
    /// let sum = b.view(|s| s.iter().sum::<u32>()).unwrap();
    /// let max = b.view(|s| *s.iter().max().unwrap()).unwrap(); // phase 2: no second transfer
    /// assert_eq!((sum, max), (5050, 100));
    /// ```
    pub fn view<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let _range = crate::nvtx::range(|| format!("view {} ({} elements)", self.name(), self.len));
        if !PHASES.host_cache {
            return self.view_detached(f);
        }
        self.check_host_align()?;
        self.raw.hal.enter()?;
        let len = self.len;
        let mut f = Some(f);
        let r = self
            .raw
            .with_host(self.byte_range(), BorrowKind::Shared, |base| {
                let start = self.byte_range().start;
                // SAFETY: the host copy holds the newest data for these bytes, a page-aligned
                // base plus a multiple of size_of::<T>() keeps T's alignment (checked above to
                // be at most a page), and the shared view keeps writers out until `f`
                // returns.
                let bytes = unsafe {
                    std::slice::from_raw_parts(base.add(start), len * std::mem::size_of::<T>())
                };
                f.take().map(|f| f(bytemuck::cast_slice(bytes)))
            });
        match (r, f) {
            (Ok(Some(v)), _) => Ok(v),
            // The host copy could not be brought up to date: bytes to download lie under
            // another shared view (a device write since it began), which reads them. The
            // view reads a download of its own instead, as without phase 2; an exclusive
            // view in the way still refuses it.
            (Err(Error::BufferBorrowed { .. }), Some(f)) => self.view_detached(f),
            (Err(e), _) => Err(e),
            (Ok(None), _) => Err(self.raw.borrowed()),
        }
    }

    /// Runs `f` over the elements on the host with write access. Phase 2 edits the host
    /// copy, which is uploaded before the device next uses the buffer; otherwise the
    /// buffer is downloaded into a `Vec` and written back at once. The first view of a
    /// new buffer that nothing has used yet downloads nothing, and `f` sees zeros: the
    /// contents of [`CudaHal::alloc`]'s buffers are unspecified, and
    /// [`CudaHal::alloc_zeroed`]'s are zeros.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[1u32, 2, 3]).unwrap();
    /// let total = b.view_mut(|s| {
    ///     s.iter_mut().for_each(|x| *x *= 10);
    ///     s.iter().sum::<u32>()
    /// }).unwrap();
    /// assert_eq!(total, 60);
    /// assert_eq!(b.to_vec().unwrap(), vec![10, 20, 30]);
    /// ```
    pub fn view_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let _range =
            crate::nvtx::range(|| format!("view_mut {} ({} elements)", self.name(), self.len));
        if !PHASES.host_cache {
            return self.view_mut_detached(f);
        }
        self.check_host_align()?;
        self.raw.hal.enter()?;
        let len = self.len;
        self.raw
            .with_host(self.byte_range(), BorrowKind::Exclusive, |base| {
                let start = self.byte_range().start;
                // SAFETY: as in `view`; the exclusive view keeps every other reader and writer
                // of these bytes out until `f` returns.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(base.add(start), len * std::mem::size_of::<T>())
                };
                f(bytemuck::cast_slice_mut(bytes))
            })
    }

    /// The elements of this buffer or slice (only those: not the parent's).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[1.5f32, 2.5, 3.5]).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![1.5, 2.5, 3.5]);
    /// assert_eq!(b.slice(1, 1).unwrap().to_vec().unwrap(), vec![2.5]);
    /// ```
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let _range = crate::nvtx::range(|| format!("to_vec {}", self.name()));
        // Elements aligned past a page cannot be viewed in the host copy: downloaded as
        // without phase 2.
        if PHASES.host_cache && self.check_host_align().is_ok() {
            // The result's pages are faulted in while the host copy downloads.
            let (v, copied) = host_pages::faulted_while::<T, _>(self.len, |pages| {
                self.view(|s| host_pages::copy(pages.wait(), bytemuck::cast_slice(s)))
            });
            copied.map(|()| v)
        } else {
            self.download_vec()
        }
    }

    /// Copies the elements into `dst`, which must have the same length. Phase 2 serves a
    /// valid host copy; otherwise the data goes straight into `dst` (no cache fill).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("row", &[1u16, 2, 3]).unwrap();
    /// let mut out = [0u16; 3];
    /// b.copy_to_slice(&mut out).unwrap();
    /// assert_eq!(out, [1, 2, 3]);
    /// let mut short = [0u16; 2];
    /// assert!(matches!(b.copy_to_slice(&mut short), Err(Error::LengthMismatch { expected: 3, actual: 2, .. })));
    /// ```
    pub fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("copy_to_slice {}", self.name()));
        if dst.len() != self.len {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len,
                actual: dst.len(),
            });
        }
        let h = &self.raw.hal;
        h.enter()?;
        if PHASES.host_cache && self.copy_from_host_copy(dst) {
            return Ok(());
        }
        self.raw.prepare_device_access(self.byte_range(), false)?;
        h.download(bytemuck::cast_slice_mut(dst), self.raw_ptr())
    }

    /// Phase 2's part of [`Buffer::copy_to_slice`]: copies the elements into `dst` (of the
    /// same length) from the host copy when it is valid for all of them, counted in the
    /// ledger as a cache hit or miss. False, with `dst` untouched, when it is not.
    pub(crate) fn copy_from_host_copy(&self, dst: &mut [T]) -> bool {
        let r = self.byte_range();
        let served = self
            .raw
            .cache
            .lock()
            .read_valid(&r, bytemuck::cast_slice_mut(dst));
        self.raw.hal.ledger.cache(served);
        served
    }

    /// Overwrites the buffer with `src`, which must have the same length.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 4).unwrap();
    /// b.copy_from_slice(&[4, 3, 2, 1]).unwrap();
    /// assert_eq!(b.get_at(0).unwrap(), 4);
    /// b.slice(2, 2).unwrap().copy_from_slice(&[7, 7]).unwrap(); // part of it
    /// assert_eq!(b.to_vec().unwrap(), vec![4, 3, 7, 7]);
    /// assert!(matches!(b.copy_from_slice(&[1, 2]), Err(Error::LengthMismatch { .. })));
    /// ```
    pub fn copy_from_slice(&self, src: &[T]) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("copy_from_slice {}", self.name()));
        if src.len() != self.len {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len,
                actual: src.len(),
            });
        }
        let h = &self.raw.hal;
        h.enter()?;
        let r = self.byte_range();
        self.raw.prepare_device_access(r.clone(), true)?;
        let uploaded = h.upload(self.raw_ptr(), bytemuck::cast_slice(src));
        // Even where the upload failed: some of its chunks may be queued, and a host copy
        // read meanwhile would be older than them.
        self.raw.invalidate_host(r);
        uploaded
    }

    /// Copies `src` (same length, any buffer of the same HAL) into this buffer on the device.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let src = hal.copy_from("src", &[1u32, 2, 3, 4]).unwrap();
    /// let dst = hal.alloc_zeroed::<u32>("dst", 8).unwrap();
    /// dst.slice(4, 4).unwrap().copy_from_buffer(&src).unwrap(); // device to device
    /// assert_eq!(dst.to_vec().unwrap(), vec![0, 0, 0, 0, 1, 2, 3, 4]);
    /// ```
    pub fn copy_from_buffer(&self, src: &Buffer<T>) -> Result<()> {
        let _range =
            crate::nvtx::range(|| format!("copy_from_buffer {} <- {}", self.name(), src.name()));
        if src.len != self.len {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len,
                actual: src.len,
            });
        }
        if !Arc::ptr_eq(&self.raw.hal, &src.raw.hal) {
            return Err(Error::ForeignBuffer {
                name: src.name().to_string(),
            });
        }
        if self.overlaps(src) {
            return Err(Error::Aliasing {
                output: self.name().to_string(),
                other: src.name().to_string(),
            });
        }
        let (rd, rs) = (self.byte_range(), src.byte_range());
        let h = &self.raw.hal;
        h.enter()?;
        src.raw.prepare_device_access(rs, false)?;
        self.raw.prepare_device_access(rd.clone(), true)?;
        h.copy_d2d(self.raw_ptr(), src.raw_ptr(), self.size_bytes())?;
        self.raw.invalidate_host(rd);
        Ok(())
    }

    /// Device address for reading in your own kernels: host-newer data is uploaded first.
    /// Queue the kernel on [`CudaHal::stream_handle`]'s stream, or synchronise first.
    /// Side-stream work that reads the buffer may still run: write through
    /// [`Buffer::device_ptr_mut`], which orders your work after it.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[1u32; 64]).unwrap();
    /// let p = b.device_ptr().unwrap();
    /// assert_eq!(p.bytes, 256);
    /// let tail = b.slice(16, 16).unwrap().device_ptr().unwrap();
    /// assert_eq!(tail.addr, p.addr + 64, "a slice starts inside its parent");
    /// ```
    pub fn device_ptr(&self) -> Result<DevicePtr> {
        self.raw.hal.enter()?;
        self.raw.prepare_device_access(self.byte_range(), false)?;
        Ok(DevicePtr {
            addr: self.raw_ptr(),
            bytes: self.size_bytes(),
        })
    }

    /// Device address for writing in your own kernels: marks the host copy stale. A host
    /// read before your write is queued caches the bytes as they are then: take the address
    /// again once the write is queued, to mark the copy stale after it.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[0u32; 256]).unwrap();
    /// let p = b.device_ptr_mut().unwrap();
    /// // Your own work on the HAL's stream; here a driver memset.
    /// // SAFETY: `p` is the buffer's live range, and the memset is queued on the HAL's stream.
    /// unsafe {
    ///     let d = cuda_hal::cuda_sys::driver().unwrap();
    ///     d.cuMemsetD32Async(p.addr, 9, p.bytes / 4, hal.stream_handle()).unwrap();
    /// }
    /// assert_eq!(b.get_at(255).unwrap(), 9); // the host copy was marked stale
    /// ```
    pub fn device_ptr_mut(&self) -> Result<DevicePtr> {
        self.raw.hal.enter()?;
        self.raw.prepare_device_access(self.byte_range(), true)?;
        Ok(DevicePtr {
            addr: self.raw_ptr(),
            bytes: self.size_bytes(),
        })
    }
}
