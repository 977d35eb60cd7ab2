use cuda_sys::{
    CUmemAllocationType, CUmemLocationType, CUmemPoolProps, CUmemPool_attribute, CUmemoryPool,
};

use super::api;
use crate::Result;

/// A memory pool of one device, created with `cuMemPoolCreate` (never the device's default
/// pool, so other libraries' settings are not disturbed). Destroyed on drop.
pub struct MemPool {
    raw: CUmemoryPool,
}

// SAFETY: pool handles may be used from any thread.
unsafe impl Send for MemPool {}
// SAFETY: see `Send`.
unsafe impl Sync for MemPool {}

/// The pool's byte counts, read from the driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes the pool holds from the OS now.
    pub reserved_current: u64,
    /// Most bytes the pool has held.
    pub reserved_high: u64,
    /// Bytes handed out and not yet freed.
    pub used_current: u64,
    /// Most bytes handed out at once.
    pub used_high: u64,
}

impl MemPool {
    /// Creates a pool on device `ordinal` that keeps up to `release_threshold` bytes
    /// reserved across synchronisations (`u64::MAX`: keep everything).
    pub fn new(ordinal: usize, release_threshold: u64) -> Result<Self> {
        let d = api()?;
        let mut props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            ..Default::default()
        };
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ordinal as i32;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: props is fully initialised (zeroed reserved bytes); out-pointer valid.
        unsafe { d.cuMemPoolCreate(&mut raw, &props)? };
        let pool = MemPool { raw };
        pool.set_release_threshold(release_threshold)?;
        Ok(pool)
    }

    /// The raw handle.
    #[inline]
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// Sets how many reserved bytes the pool keeps when the stream synchronises.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let mut v = bytes;
        // SAFETY: this attribute takes a cuuint64_t.
        unsafe {
            api()?.cuMemPoolSetAttribute(
                self.raw,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut v as *mut u64).cast(),
            )?
        };
        Ok(())
    }

    fn attr(&self, a: CUmemPool_attribute) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the four statistics attributes are cuuint64_t.
        unsafe { api()?.cuMemPoolGetAttribute(self.raw, a, (&mut v as *mut u64).cast())? };
        Ok(v)
    }

    /// Bytes the pool holds from the OS now: one driver call, where [`MemPool::stats`]
    /// makes four.
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.attr(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// Reads reserved and used bytes, current and high-water.
    pub fn stats(&self) -> Result<PoolStats> {
        use CUmemPool_attribute as A;
        Ok(PoolStats {
            reserved_current: self.attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_current: self.attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: self.attr(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    /// Lets device `ordinal` read and write this pool's allocations (peer access).
    pub fn grant_access(&self, ordinal: usize) -> Result<()> {
        let desc = cuda_sys::CUmemAccessDesc {
            location: cuda_sys::CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            flags: cuda_sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid access descriptor.
        unsafe { api()?.cuMemPoolSetAccess(self.raw, &desc, 1)? };
        Ok(())
    }

    /// Returns reserved memory above `keep_bytes` to the OS (after the frees have completed).
    pub fn trim_to(&self, keep_bytes: usize) -> Result<()> {
        // SAFETY: raw is a live pool.
        unsafe { api()?.cuMemPoolTrimTo(self.raw, keep_bytes)? };
        Ok(())
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: raw is a live pool destroyed once; the driver defers the release of
            // memory whose frees are still pending.
            if let Err(e) = unsafe { d.cuMemPoolDestroy(self.raw) } {
                log::warn!("cuMemPoolDestroy failed: {e}");
            }
        }
    }
}
