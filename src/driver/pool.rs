use cuda_sys::{
    CUmemAllocationType, CUmemLocationType, CUmemPoolProps, CUmemPool_attribute, CUmemoryPool,
};

use super::{api, PrimaryContext};
use crate::Result;

/// A memory pool of one device, created with `cuMemPoolCreate` (never the device's default
/// pool, so other libraries' settings are not disturbed). Destroyed on drop.
///
/// ```
/// use cuda_hal::driver::{MemPool, PrimaryContext, Stream};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// let pool = MemPool::new(0, u64::MAX).unwrap();
/// let stream = Stream::new_non_blocking().unwrap();
/// let d = cuda_hal::cuda_sys::driver().unwrap();
/// let mut ptr = 0;
/// // SAFETY: a valid out-pointer, the pool and stream are live; the block is freed below on
/// // the same stream, before the pool is dropped.
/// unsafe {
///     d.cuMemAllocFromPoolAsync(&mut ptr, 1 << 20, pool.raw(), stream.raw()).unwrap();
///     stream.synchronize().unwrap();
///     assert_eq!(pool.stats().unwrap().used_current, 1 << 20);
///     d.cuMemFreeAsync(ptr, stream.raw()).unwrap();
/// }
/// stream.synchronize().unwrap();
/// let s = pool.stats().unwrap();
/// assert_eq!(s.used_current, 0);
/// assert!(s.reserved_current >= 1 << 20, "kept for the next allocation");
/// ```
pub struct MemPool {
    raw: CUmemoryPool,
    /// Keeps the device's primary context alive while the pool is.
    _ctx: PrimaryContext,
}

// SAFETY: pool handles may be used from any thread.
unsafe impl Send for MemPool {}
// SAFETY: see `Send`.
unsafe impl Sync for MemPool {}

/// The pool's byte counts, read from the driver.
///
/// ```
/// use cuda_hal::driver::{MemPool, PrimaryContext};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// let s = MemPool::new(0, 0).unwrap().stats().unwrap();
/// assert_eq!((s.reserved_current, s.used_current), (0, 0), "a new pool holds nothing");
/// ```
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
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let keep_64_mib = MemPool::new(0, 64 << 20).unwrap();
    /// assert_eq!(keep_64_mib.reserved_bytes().unwrap(), 0);
    /// ```
    pub fn new(ordinal: usize, release_threshold: u64) -> Result<Self> {
        let ctx = PrimaryContext::retain(ordinal)?;
        let d = api()?;
        let mut props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            ..Default::default()
        };
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ordinal as i32; // (in range: `retain` checked it)
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: props is fully initialised (zeroed reserved bytes); out-pointer valid.
        unsafe { d.cuMemPoolCreate(&mut raw, &props)? };
        let pool = MemPool { raw, _ctx: ctx };
        pool.set_release_threshold(release_threshold)?;
        Ok(pool)
    }

    /// The raw handle.
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert!(!MemPool::new(0, 0).unwrap().raw().is_null());
    /// ```
    #[inline]
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// Sets how many reserved bytes the pool keeps when the stream synchronises.
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let pool = MemPool::new(0, u64::MAX).unwrap();
    /// pool.set_release_threshold(0).unwrap(); // give everything back at each synchronisation
    /// ```
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
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let pool = MemPool::new(0, u64::MAX).unwrap();
    /// assert_eq!(pool.reserved_bytes().unwrap(), pool.stats().unwrap().reserved_current);
    /// ```
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.attr(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// Reserved bytes no allocation uses (two attribute reads): what allocations can take
    /// without the pool growing, fragmentation aside.
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let pool = MemPool::new(0, u64::MAX).unwrap();
    /// assert_eq!(pool.spare_bytes().unwrap(), 0); // nothing reserved yet
    /// ```
    pub fn spare_bytes(&self) -> Result<u64> {
        use CUmemPool_attribute as A;
        let reserved = self.attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let used = self.attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        Ok(reserved.saturating_sub(used))
    }

    /// Reads reserved and used bytes, current and high-water.
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = MemPool::new(0, u64::MAX).unwrap().stats().unwrap();
    /// assert!(s.reserved_high >= s.reserved_current && s.used_high >= s.used_current);
    /// ```
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
    ///
    /// ```
    /// use cuda_hal::driver::{device_count, MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let pool = MemPool::new(0, u64::MAX).unwrap();
    /// if device_count().unwrap() > 1 {
    ///     // Fails unless device 1 can access device 0 (see `CudaHal::enable_peer_access`).
    ///     println!("device 1 granted: {:?}", pool.grant_access(1).is_ok());
    /// }
    /// ```
    pub fn grant_access(&self, ordinal: usize) -> Result<()> {
        let ordinal = i32::try_from(ordinal)
            .map_err(|_| crate::Error::InvalidArgument(format!("device ordinal {ordinal}")))?;
        let desc = cuda_sys::CUmemAccessDesc {
            location: cuda_sys::CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: cuda_sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid access descriptor.
        unsafe { api()?.cuMemPoolSetAccess(self.raw, &desc, 1)? };
        Ok(())
    }

    /// Returns reserved memory above `keep_bytes` to the OS (after the frees have completed).
    ///
    /// ```
    /// use cuda_hal::driver::{MemPool, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let pool = MemPool::new(0, u64::MAX).unwrap();
    /// pool.trim_to(0).unwrap();
    /// assert_eq!(pool.reserved_bytes().unwrap(), 0);
    /// ```
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
