use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_sys::CUdeviceptr;

use super::{api, PrimaryContext};
use crate::host_pages::{self, Mapping};
use crate::Result;

/// Flags for [`PinnedMemory`]. The default is plain page-locked memory that the CPU reads
/// and writes at full speed (cudarc hard-codes write-combined, which makes CPU reads slow).
///
/// ```
/// use cuda_hal::PinnedFlags;
/// let f = PinnedFlags::default();
/// assert!(!f.write_combined && !f.portable && !f.device_mapped);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedFlags {
    /// Pinned for every context, not just the current one.
    pub portable: bool,
    /// Mapped into the device address space.
    pub device_mapped: bool,
    /// Write-combined: fast for the CPU to write and the GPU to read, very slow for CPU reads.
    pub write_combined: bool,
}

impl PinnedFlags {
    fn bits(self) -> u32 {
        let mut f = 0;
        if self.portable {
            f |= cuda_sys::CU_MEMHOSTALLOC_PORTABLE;
        }
        if self.device_mapped {
            f |= cuda_sys::CU_MEMHOSTALLOC_DEVICEMAP;
        }
        if self.write_combined {
            f |= cuda_sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        f
    }

    /// The flags of `cuMemHostRegister` for memory that is not write-combined.
    fn register_bits(self) -> u32 {
        let mut f = 0;
        if self.portable {
            f |= cuda_sys::CU_MEMHOSTREGISTER_PORTABLE;
        }
        if self.device_mapped {
            f |= cuda_sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        }
        f
    }
}

/// Page-locked host memory, freed on drop: a new anonymous mapping registered with
/// `cuMemHostRegister`, or for write-combined memory (which only the driver allocates) a
/// `cuMemHostAlloc`.
///
/// The mapping is faulted in by the crate's copy threads (never the rayon pool, whose
/// threads may all be waiting for a buffer's lock that the caller holds), in 2 MiB pages
/// where the kernel gives them, before the driver pins it: on the H200 host 256 MiB took 10.8 ms to allocate and
/// 4.6 ms to free so, against 135 ms and 39 ms for `cuMemHostAlloc` and `cuMemFreeHost`
/// (1 GiB: 48 ms and 22 ms, against 519 ms and 149 ms).
///
/// ```
/// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// let mut m = PinnedMemory::new(4096, PinnedFlags::default()).unwrap();
/// m.as_mut_slice().fill(0xab);
/// assert_eq!(m.as_slice()[4095], 0xab);
/// ```
pub struct PinnedMemory {
    ptr: *mut u8,
    len: usize,
    /// The registered mapping `ptr` points to, or `None` for memory of `cuMemHostAlloc`.
    mapping: Option<Mapping>,
    /// The device's address of the memory, when allocated `device_mapped`.
    device_ptr: Option<CUdeviceptr>,
    /// Keeps the context alive: the driver frees pinned memory with its context (and
    /// unregisters a mapping in it).
    ctx: PrimaryContext,
    /// Never freed: a copy may still use the memory ([`PinnedMemory::keep_forever`]).
    kept: AtomicBool,
}

// SAFETY: the allocation is owned exclusively by this value; the driver allows freeing it
// from any thread.
unsafe impl Send for PinnedMemory {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// Allocates `len` bytes (at least 1) in the primary context current on the thread,
    /// which it retains.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let portable = PinnedFlags { portable: true, ..PinnedFlags::default() };
    /// let m = PinnedMemory::new(1 << 20, portable).unwrap(); // usable by every context
    /// assert_eq!(m.len(), 1 << 20);
    /// ```
    pub fn new(len: usize, flags: PinnedFlags) -> Result<Self> {
        let ctx = PrimaryContext::retain_current()?;
        let d = api()?;
        // (Where the OS refuses a mapping, the driver is asked.)
        if let Some(mut mapping) = (!flags.write_combined).then(|| Mapping::new(len)).flatten() {
            let bytes = mapping.as_mut_slice();
            if bytes.len() >= host_pages::HUGE_PAGES_MIN {
                // Smaller ones the driver faults in as it pins them, about as fast.
                host_pages::advise_huge_pages(bytes);
                // (Not on the rayon pool: see `prefault_off_pool`.)
                host_pages::prefault_off_pool(bytes);
            }
            // SAFETY: the mapping's bytes are this process's, and stay mapped until the
            // drop has unregistered them (a failed registration drops the mapping).
            unsafe {
                d.cuMemHostRegister(
                    bytes.as_mut_ptr().cast(),
                    bytes.len(),
                    flags.register_bits(),
                )?
            };
            let mem = PinnedMemory {
                ptr: mapping.as_ptr(),
                len,
                mapping: Some(mapping),
                device_ptr: None,
                ctx,
                kept: AtomicBool::new(false),
            };
            return mem.mapped_if(flags);
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { d.cuMemHostAlloc(&mut ptr, len.max(1), flags.bits())? };
        // SAFETY: the driver returned `len.max(1)` writable bytes at `ptr`, whose contents
        // it does not specify: zeroed, since `as_slice` hands them out as initialised.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, len.max(1)) };
        PinnedMemory {
            ptr: ptr.cast(),
            len,
            mapping: None,
            device_ptr: None,
            ctx,
            kept: AtomicBool::new(false),
        }
        .mapped_if(flags)
    }

    /// With `device_mapped`, looks up the device's address of the memory (a failure frees
    /// it).
    fn mapped_if(mut self, flags: PinnedFlags) -> Result<Self> {
        if flags.device_mapped {
            let mut dptr: CUdeviceptr = 0;
            // SAFETY: `ptr` is page-locked memory mapped for the device (the flag); the
            // out-pointer is a valid local.
            unsafe { api()?.cuMemHostGetDevicePointer(&mut dptr, self.ptr.cast(), 0)? };
            self.device_ptr = Some(dptr);
        }
        Ok(self)
    }

    /// The device's address of the memory, for kernels that read or write it in place
    /// over the bus: `Some` when allocated `device_mapped`.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let mapped = PinnedFlags { device_mapped: true, ..PinnedFlags::default() };
    /// assert!(PinnedMemory::new(4096, mapped).unwrap().device_ptr().is_some());
    /// assert!(PinnedMemory::new(4096, PinnedFlags::default()).unwrap().device_ptr().is_none());
    /// ```
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.device_ptr
    }

    /// Length in bytes.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert_eq!(PinnedMemory::new(100, PinnedFlags::default()).unwrap().len(), 100);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert!(PinnedMemory::new(0, PinnedFlags::default()).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw host pointer.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let m = PinnedMemory::new(64, PinnedFlags::default()).unwrap();
    /// assert_eq!(m.as_ptr() as *const u8, m.as_slice().as_ptr());
    /// ```
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes, for reading.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let m = PinnedMemory::new(16, PinnedFlags::default()).unwrap();
    /// assert_eq!(m.as_slice().len(), 16);
    /// ```
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing.
    ///
    /// ```
    /// use cuda_hal::driver::{PinnedFlags, PinnedMemory, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let mut m = PinnedMemory::new(4, PinnedFlags::default()).unwrap();
    /// m.as_mut_slice().copy_from_slice(&[1, 2, 3, 4]);
    /// assert_eq!(m.as_slice(), &[1, 2, 3, 4]);
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl PinnedMemory {
    /// Marks the memory as never to be freed: a wait for the copies that use it failed
    /// without breaking the context, so the device may still run them (the rule of
    /// device memory in the same case). Dropping it then leaks it, with a warning.
    pub(crate) fn keep_forever(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }

    /// Whether [`PinnedMemory::keep_forever`] marked the memory.
    pub(crate) fn kept_forever(&self) -> bool {
        self.kept.load(Ordering::Relaxed)
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.kept_forever() {
            log::warn!(
                "{} bytes of pinned memory a copy may still use are leaked",
                self.len
            );
            std::mem::forget(self.mapping.take());
            return;
        }
        let Ok(d) = api() else { return };
        let Some(mapping) = self.mapping.take() else {
            // SAFETY: ptr came from cuMemHostAlloc and is freed once.
            if let Err(e) = unsafe { d.cuMemFreeHost(self.ptr.cast()) } {
                log::warn!("cuMemFreeHost failed: {e}");
            }
            return;
        };
        // Unregistered in its context, pushed for the call: the thread's own current
        // context stays as it was. Where the push fails, the context current on the thread
        // is tried (often this one): a registration left behind is never undone.
        // SAFETY: the context is retained, so alive.
        let pushed = unsafe { d.cuCtxPushCurrent(self.ctx.raw()) };
        // SAFETY: `ptr` is the mapping `new` registered. (Waiting for copies that still use
        // the memory is its owner's part, as it was before `cuMemFreeHost`.)
        let unregistered = unsafe { d.cuMemHostUnregister(self.ptr.cast()) };
        if pushed.is_ok() {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops the context pushed above, into a local.
            if let Err(e) = unsafe { d.cuCtxPopCurrent(&mut popped) } {
                log::warn!("restoring the thread's context after unregistering pinned memory: {e}");
            }
        }
        if let Err(e) = unregistered {
            // Left mapped: the driver may still take its pages for registered memory.
            log::warn!(
                "cuMemHostUnregister failed: {e}; {} bytes are leaked",
                mapping.len()
            );
            std::mem::forget(mapping);
        }
    }
}

/// Whether all of `bytes` lies in one page-locked host range: an allocation of
/// `cuMemHostAlloc` or a registration of `cuMemHostRegister`. Only such memory can be
/// copied asynchronously; the driver refuses an async copy of a slice that runs past its
/// page-locked range (into memory registered in part, say) with `CUDA_ERROR_INVALID_VALUE`.
///
/// Asks `cuPointerGetAttributes` for the first byte's memory type and range (pageable
/// memory answers "unknown", not an error); any failure answers false.
pub(crate) fn is_page_locked(bytes: &[u8]) -> bool {
    use cuda_sys::CUpointer_attribute as A;
    let Ok(d) = api() else { return false };
    let addr = bytes.as_ptr() as u64;
    let (mut kind, mut start, mut size) = (0u32, 0u64, 0usize);
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut values: [*mut c_void; 3] = [
        (&mut kind as *mut u32).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: three attributes, each value pointer to a local of the attribute's type (an
    // unsigned int, a CUdeviceptr and a size_t).
    let asked =
        unsafe { d.cuPointerGetAttributes(3, attrs.as_mut_ptr(), values.as_mut_ptr(), addr) };
    // Where the slice ends within the range, if it starts in it.
    let end = addr
        .checked_sub(start)
        .and_then(|offset| offset.checked_add(bytes.len() as u64));
    asked.is_ok()
        && kind == cuda_sys::CUmemorytype::CU_MEMORYTYPE_HOST.0
        && end.is_some_and(|end| end <= size as u64)
}
