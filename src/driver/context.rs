use cuda_sys::{CUcontext, CUdevice};

use super::api;
use crate::{Error, Result};

/// A retained primary context of one device, released on drop.
///
/// ```
/// use cuda_hal::driver::{PrimaryContext, Stream};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// // Driver objects are made in the context current on the thread.
/// let stream = Stream::new_non_blocking().unwrap();
/// stream.synchronize().unwrap();
/// ctx.synchronize().unwrap();
/// ```
pub struct PrimaryContext {
    ctx: CUcontext,
    device: CUdevice,
}

// SAFETY: a CUcontext handle may be made current on any thread; the driver serialises
// access to it internally.
unsafe impl Send for PrimaryContext {}
// SAFETY: see `Send`; the handle itself is never mutated.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the primary context of device `ordinal` (a valid ordinal, checked by the caller).
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// // Retaining again gives the same context: the HALs of one device share it.
    /// let again = PrimaryContext::retain(0).unwrap();
    /// assert_eq!(again.raw(), ctx.raw());
    /// ```
    pub fn retain(ordinal: usize) -> Result<Self> {
        let d = api()?;
        let mut device: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        let ordinal = i32::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal}")))?;
        // SAFETY: out-pointers are valid locals.
        unsafe { d.cuDeviceGet(&mut device, ordinal)? };
        // SAFETY: as above.
        // (A device fault that poisoned the primary context is `ContextPoisoned` here, as
        // everywhere: the driver keeps the fault for the life of the process, no reset
        // brings it back (measured on the H100, driver 13.0), and resetting a context other
        // holders still use would pull it out from under them.)
        unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, device)? };
        Ok(PrimaryContext { ctx, device })
    }

    /// Retains the primary context current on the calling thread, so that a driver object
    /// made in it keeps it alive: the driver destroys a primary context, and every object
    /// in it, when its last reference is released. An error if no context is current or
    /// the current one is not its device's primary context.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert_eq!(PrimaryContext::retain_current().unwrap().raw(), ctx.raw());
    /// ```
    pub fn retain_current() -> Result<Self> {
        let d = api()?;
        let (mut current, mut device): (CUcontext, CUdevice) = (std::ptr::null_mut(), 0);
        // SAFETY: out-pointers are valid locals.
        unsafe { d.cuCtxGetCurrent(&mut current)? };
        if current.is_null() {
            return Err(Error::InvalidArgument(
                "no CUDA context is current on this thread (bind a PrimaryContext first)".into(),
            ));
        }
        // SAFETY: as above; a context is current.
        unsafe { d.cuCtxGetDevice(&mut device)? };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local; the device handle came from the driver.
        unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, device)? };
        let retained = PrimaryContext { ctx, device };
        if ctx != current {
            // (Dropping `retained` releases what was just retained.)
            return Err(Error::InvalidArgument(
                "the current CUDA context is not its device's primary context".into(),
            ));
        }
        Ok(retained)
    }

    /// Whether device `ordinal`'s primary context is active: retained by someone in this
    /// process (a HAL, a driver object made in it, a [`PrimaryContext`], or another library
    /// such as the CUDA runtime). Once every HAL of the device and everything made in it
    /// are dropped, nothing the crate made holds it.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(PrimaryContext::is_active(0).unwrap());
    /// drop(ctx); // inactive now, unless something else in the process holds it
    /// ```
    pub fn is_active(ordinal: usize) -> Result<bool> {
        let d = api()?;
        let ordinal = i32::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal}")))?;
        let (mut device, mut flags, mut active): (CUdevice, u32, i32) = (0, 0, 0);
        // SAFETY: out-pointers are valid locals.
        unsafe { d.cuDeviceGet(&mut device, ordinal)? };
        // SAFETY: as above; the device handle came from the driver.
        unsafe { d.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)? };
        Ok(active != 0)
    }

    /// One more reference to this same context, released when the result drops. A context
    /// the driver no longer gives back (reset by someone else) is an error.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let again = ctx.retain_again().unwrap();
    /// drop(ctx);
    /// again.bind().unwrap(); // still alive: `again` holds it
    /// ```
    pub fn retain_again(&self) -> Result<Self> {
        let d = api()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local; the device handle is valid.
        unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, self.device)? };
        let again = PrimaryContext {
            ctx,
            device: self.device,
        };
        if ctx != self.ctx {
            // (Dropping `again` releases what was just retained.)
            return Err(Error::InvalidArgument(
                "the device's primary context was reset".into(),
            ));
        }
        Ok(again)
    }

    /// Makes this context current on the calling thread if it is not already.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// std::thread::scope(|s| {
    ///     s.spawn(|| ctx.bind().unwrap()); // each thread binds before its driver calls
    /// });
    /// ```
    #[inline]
    pub fn bind(&self) -> Result<()> {
        let d = api()?;
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local; ctx is a live retained context.
        unsafe {
            d.cuCtxGetCurrent(&mut current)?;
            if current != self.ctx {
                d.cuCtxSetCurrent(self.ctx)?;
            }
        }
        Ok(())
    }

    /// The raw handle.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert!(!ctx.raw().is_null());
    /// ```
    pub fn raw(&self) -> CUcontext {
        self.ctx
    }

    /// The driver's device handle.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert_eq!(ctx.device(), 0, "device handles are ordinals on current drivers");
    /// ```
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// Waits for all work in the context.
    ///
    /// ```
    /// use cuda_hal::driver::PrimaryContext;
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// ctx.synchronize().unwrap();
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        unsafe { api()?.cuCtxSynchronize()? };
        Ok(())
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: the context was retained once by `retain` and is released once here.
            if let Err(e) = unsafe { d.cuDevicePrimaryCtxRelease(self.device) } {
                log::warn!("cuDevicePrimaryCtxRelease failed: {e}");
            }
        }
    }
}
