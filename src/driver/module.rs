use std::ffi::CString;
use std::marker::PhantomData;

use cuda_sys::{CUfunction, CUfunctionLoadingState, CUmodule, CUmoduleLoadingMode};

use super::{api, PrimaryContext, Stream};
use crate::{Error, Result};

/// A loaded module (fatbin, cubin or PTX image), unloaded on drop.
///
/// ```
/// use cuda_hal::driver::{Module, PrimaryContext};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// if !cuda_hal::kernels_available() {
///     return println!("built without nvcc");
/// }
/// let m = Module::load(cuda_hal::FATBIN).unwrap(); // the crate's own kernels
/// assert!(m.function("fill_u32").is_ok());
/// ```
pub struct Module {
    raw: CUmodule,
    /// Keeps the context, and so the module, alive.
    _ctx: PrimaryContext,
}

// SAFETY: module handles may be used from any thread with their context current.
unsafe impl Send for Module {}
// SAFETY: see `Send`.
unsafe impl Sync for Module {}

/// A kernel of a [`Module`], borrowed from it: the handle cannot outlive the module that
/// holds the kernel's code (a handle of an unloaded module is a dangling pointer to the
/// driver).
///
/// ```
/// use cuda_hal::driver::{Module, PrimaryContext, Stream};
/// use std::ffi::c_void;
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// if !cuda_hal::kernels_available() {
///     return println!("built without nvcc");
/// }
/// let m = Module::load(cuda_hal::FATBIN).unwrap();
/// let fill = m.function("fill_u32").unwrap();
/// let stream = Stream::new_non_blocking().unwrap();
/// let d = cuda_hal::cuda_sys::driver().unwrap();
/// let (mut out, mut value, mut n) = (0u64, 7u32, 256u64);
/// let mut host = [0u32; 256];
/// // SAFETY: `out` is a live allocation of n u32s for the launch and the copy, freed once
/// // the stream is done; the parameters match fill_u32(uint32_t*, uint32_t, uint64_t).
/// unsafe {
///     d.cuMemAlloc(&mut out, 1024).unwrap();
///     let mut params = [&mut out as *mut u64 as *mut c_void, &mut value as *mut u32 as *mut c_void, &mut n as *mut u64 as *mut c_void];
///     fill.launch((1, 1, 1), (256, 1, 1), 0, &stream, &mut params).unwrap();
///     stream.synchronize().unwrap();
///     d.cuMemcpyDtoH(host.as_mut_ptr().cast(), out, 1024).unwrap();
///     d.cuMemFree(out).unwrap();
/// }
/// assert!(host.iter().all(|&x| x == 7));
/// ```
///
/// A handle does not outlive its module:
///
/// ```compile_fail,E0597
/// use cuda_hal::driver::Module;
/// let fill = {
///     let m = Module::load(cuda_hal::FATBIN).unwrap();
///     m.function("fill_u32").unwrap()
/// }; // error: `m` does not live long enough
/// fill.is_loaded().unwrap();
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Function<'m> {
    raw: CUfunction,
    module: PhantomData<&'m Module>,
}

// SAFETY: function handles are immutable driver objects usable from any thread.
unsafe impl Send for Function<'_> {}
// SAFETY: see `Send`.
unsafe impl Sync for Function<'_> {}

impl Module {
    /// Loads an image with `cuModuleLoadData` into the primary context current on the
    /// thread, which it retains.
    /// PTX text needs no terminating NUL: one is added.
    ///
    /// ```
    /// use cuda_hal::driver::{Module, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// // Not a module image: a typed error, not a crash.
    /// assert!(Module::load(b"definitely not a fatbin").is_err());
    /// ```
    pub fn load(image: &[u8]) -> Result<Self> {
        let ctx = PrimaryContext::retain_current()?;
        let aligned = aligned_image(image);
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: `aligned` holds the whole image and a NUL after it (the driver reads PTX
        // up to its NUL), and outlives the call; the driver copies what it needs.
        unsafe { api()?.cuModuleLoadData(&mut raw, aligned.as_ptr().cast())? };
        Ok(Module { raw, _ctx: ctx })
    }

    /// Looks up a kernel by its (unmangled, `extern "C"`) name.
    ///
    /// ```
    /// use cuda_hal::driver::{Module, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// if !cuda_hal::kernels_available() {
    ///     return println!("built without nvcc");
    /// }
    /// let m = Module::load(cuda_hal::FATBIN).unwrap();
    /// assert!(m.function("eltwise_add_u32").is_ok());
    /// assert!(m.function("no_such_kernel").is_err());
    /// ```
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let c_name = CString::new(name).map_err(|_| Error::KernelNotFound {
            name: name.to_string(),
            reason: "name contains a NUL byte".into(),
        })?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: out-pointer is valid; c_name is a C string; raw module is live.
        unsafe { api()?.cuModuleGetFunction(&mut raw, self.raw, c_name.as_ptr()) }.map_err(
            |e| match e.is_sticky() {
                // A broken context, not a missing kernel.
                true => Error::from(e),
                false => Error::KernelNotFound {
                    name: name.to_string(),
                    reason: e.to_string(),
                },
            },
        )?;
        Ok(Function {
            raw,
            module: PhantomData,
        })
    }

    /// Loads every kernel of the module now, rather than at its first use; returns how
    /// many it loaded (0 where the driver loads modules whole already,
    /// `CUDA_MODULE_LOADING=EAGER`).
    ///
    /// With lazy loading, the driver's default since CUDA 12.2, a kernel is loaded when
    /// it is first looked up, and loading it may wait for the whole context: the first
    /// launch of each kernel then waits for the work queued on every stream, and a kernel
    /// that waits for another's progress (a queue between two kernels) may never end.
    /// Needs a driver of CUDA 12.4 or later: an older one gives [`Error::Cuda`] for the
    /// missing symbol.
    ///
    /// ```
    /// use cuda_hal::driver::{Module, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// if !cuda_hal::kernels_available() {
    ///     return println!("built without nvcc");
    /// }
    /// let m = Module::load(cuda_hal::FATBIN).unwrap();
    /// let loaded = m.load_all_functions().unwrap();
    /// assert!(m.function("fill_u64").unwrap().is_loaded().unwrap());
    /// println!("{loaded} kernels loaded");
    /// ```
    pub fn load_all_functions(&self) -> Result<usize> {
        let d = api()?;
        let mut mode = CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING;
        // SAFETY: an out-pointer to a local.
        unsafe { d.cuModuleGetLoadingMode(&mut mode)? };
        if mode == CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING {
            return Ok(0);
        }
        let mut count = 0;
        // SAFETY: an out-pointer to a local; the module is live.
        unsafe { d.cuModuleGetFunctionCount(&mut count, self.raw)? };
        let mut functions: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: room for `count` handles; the module is live.
        unsafe { d.cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, self.raw)? };
        for &f in &functions {
            // SAFETY: a handle of this live module.
            unsafe { d.cuFuncLoad(f)? };
        }
        Ok(functions.len())
    }
}

impl<'m> Function<'m> {
    /// Whether the kernel's code is loaded on the device (with lazy loading, not before
    /// its first use or [`Module::load_all_functions`]; on an H200 with driver 580.159.04,
    /// looking it up with [`Module::function`] loaded it).
    ///
    /// ```
    /// use cuda_hal::driver::{Module, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// if !cuda_hal::kernels_available() {
    ///     return println!("built without nvcc");
    /// }
    /// let m = Module::load(cuda_hal::FATBIN).unwrap();
    /// let fill = m.function("fill_u32").unwrap();
    /// println!("fill_u32 loaded: {}", fill.is_loaded().unwrap());
    /// ```
    pub fn is_loaded(&self) -> Result<bool> {
        let mut state = CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_UNLOADED;
        // SAFETY: an out-pointer to a local; the handle's module is live (it borrows it).
        unsafe { api()?.cuFuncIsLoaded(&mut state, self.raw)? };
        Ok(state == CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED)
    }

    /// The raw handle, for calling `cuLaunchKernel` directly (as the benches' floors do).
    ///
    /// ```
    /// use cuda_hal::driver::{Module, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// if !cuda_hal::kernels_available() {
    ///     return println!("built without nvcc");
    /// }
    /// let m = Module::load(cuda_hal::FATBIN).unwrap();
    /// assert!(!m.function("fill_u32").unwrap().raw().is_null());
    /// ```
    pub fn raw(&self) -> CUfunction {
        self.raw
    }

    /// The handle without its borrow of the module, for a table that keeps the module
    /// alive beside it.
    ///
    /// # Safety
    /// The module must stay loaded while the handle, or a copy of it, is used.
    pub(crate) unsafe fn unbound(self) -> Function<'static> {
        Function {
            raw: self.raw,
            module: PhantomData,
        }
    }

    /// Launches the kernel on `stream`.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each pointing to a value of the
    /// parameter's type, and every device pointer among them must be valid for the accesses
    /// the kernel makes.
    pub unsafe fn launch(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        stream: &Stream,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        let d = api()?;
        stream.queue(|raw| {
            // SAFETY: the caller's promise (above) for the parameters; raw is a live stream.
            unsafe {
                d.cuLaunchKernel(
                    self.raw,
                    grid.0,
                    grid.1,
                    grid.2,
                    block.0,
                    block.1,
                    block.2,
                    shared_bytes,
                    raw,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
        })?;
        Ok(())
    }
}

/// `image` copied to 8-byte aligned memory (the driver reads fatbins and cubins through an
/// aligned pointer) with at least one NUL byte after it (PTX is read as a C string).
fn aligned_image(image: &[u8]) -> Vec<u64> {
    let mut aligned = vec![0u64; (image.len() + 1).div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
    aligned
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: raw is a live module unloaded once.
            if let Err(e) = unsafe { d.cuModuleUnload(self.raw) } {
                log::warn!("cuModuleUnload failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_copied_whole_with_a_nul_after_it() {
        for len in [0, 1, 7, 8, 9, 16, 23] {
            let image: Vec<u8> = (1..=len as u8).collect();
            let aligned = aligned_image(&image);
            let bytes: &[u8] = bytemuck::cast_slice(&aligned);
            assert!(
                bytes.len() > image.len(),
                "room for the NUL at length {len}"
            );
            assert_eq!(&bytes[..len], &image[..]);
            assert_eq!(bytes[len], 0, "NUL right after the image at length {len}");
        }
    }
}
