use cuda_sys::{CUcontext, CUdevice};

use super::api;
use crate::{Error, Result};

/// A retained primary context of one device, released on drop.
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
    pub fn retain(ordinal: usize) -> Result<Self> {
        let d = api()?;
        let mut device: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointers are valid locals.
        unsafe { d.cuDeviceGet(&mut device, ordinal as i32)? };
        // SAFETY: as above.
        match unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, device) } {
            Ok(()) => {}
            Err(e) if e.is_sticky() => {
                // A device fault poisoned the primary context for the whole process; every
                // HAL on it already reports ContextPoisoned. Reset it and retain a fresh one.
                log::warn!("primary context of device {ordinal} is poisoned ({e}); resetting it");
                // SAFETY: the device handle is valid; the reset destroys the faulted context.
                unsafe {
                    d.cuDevicePrimaryCtxReset(device)?;
                    d.cuDevicePrimaryCtxRetain(&mut ctx, device)
                }
                .map_err(|e| match e.is_sticky() {
                    // The driver keeps the fault for the life of the process.
                    true => Error::ContextPoisoned { cause: e },
                    false => e.into(),
                })?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok(PrimaryContext { ctx, device })
    }

    /// Makes this context current on the calling thread if it is not already.
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
    pub fn raw(&self) -> CUcontext {
        self.ctx
    }

    /// The driver's device handle.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// Waits for all work in the context.
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
