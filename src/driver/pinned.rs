use std::ffi::c_void;

use super::api;
use crate::Result;

/// Flags for [`PinnedMemory`]. The default is plain page-locked memory that the CPU reads
/// and writes at full speed (cudarc hard-codes write-combined, which makes CPU reads slow).
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
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
pub struct PinnedMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is owned exclusively by this value; the driver allows freeing it
// from any thread.
unsafe impl Send for PinnedMemory {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// Allocates `len` bytes (at least 1). The caller has made a context current.
    pub fn new(len: usize, flags: PinnedFlags) -> Result<Self> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuMemHostAlloc(&mut ptr, len.max(1), flags.bits())? };
        Ok(PinnedMemory {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw host pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes, for reading.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: ptr came from cuMemHostAlloc and is freed once.
            if let Err(e) = unsafe { d.cuMemFreeHost(self.ptr.cast()) } {
                log::warn!("cuMemFreeHost failed: {e}");
            }
        }
    }
}
