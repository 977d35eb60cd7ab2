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
    /// PTX text needs no terminating NUL: one is added. The driver is given no length, and
    /// finds a fatbin's or a cubin's extent in its headers: an image whose headers reach
    /// past its end (a truncated file) is refused with [`Error::InvalidArgument`] before
    /// the driver sees it.
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
        check_image(image)?;
        let ctx = PrimaryContext::retain_current()?;
        let aligned = aligned_image(image);
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: `aligned` holds the whole image and a NUL after it (the driver reads PTX
        // up to its NUL, a fatbin or cubin as far as its headers say, which `check_image`
        // found within it), and outlives the call; the driver copies what it needs.
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

/// A fatbin's magic number (little-endian at its start).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// Checks that the headers of a fatbin or an ELF image (a cubin) lie within `image`, with
/// what they say the image holds: the driver reads as far as they say. A fatbin's entries
/// are checked one by one (each a header and its payload); an ELF image's program and
/// section header tables, and every segment and section with bytes in the file. Anything
/// else is taken as PTX text, which the NUL after the copy bounds.
fn check_image(image: &[u8]) -> Result<()> {
    let past = |what: &str| {
        Err(Error::InvalidArgument(format!(
            "module image of {} bytes: its {what} lies past its end (a truncated file?)",
            image.len()
        )))
    };
    let bytes = |at: usize, n: usize| image.get(at..at.checked_add(n)?);
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?));
    // `len` bytes from `at` lie within the image.
    let within = |at: u64, len: u64| {
        at.checked_add(len)
            .is_some_and(|end| end <= image.len() as u64)
    };
    if u32_at(0) == Some(FATBIN_MAGIC) {
        let (Some(header), Some(size)) = (u16_at(6), u64_at(8)) else {
            return past("header");
        };
        let (header, end) = (u64::from(header), u64::from(header).checked_add(size));
        if header < 16 || !end.is_some_and(|end| within(0, end)) {
            return past("header or the entries it counts");
        }
        let end = end.unwrap_or_default();
        // Each entry: a header (its size at +4, its payload's at +8) and the payload.
        let mut at = header;
        while at < end {
            let entry = usize::try_from(at).unwrap_or(usize::MAX);
            let (Some(entry_header), Some(payload)) = (
                u32_at(entry.saturating_add(4)),
                u64_at(entry.saturating_add(8)),
            ) else {
                return past("entry header");
            };
            let Some(next) = at
                .checked_add(u64::from(entry_header))
                .and_then(|a| a.checked_add(payload))
                .filter(|&next| next <= end && u64::from(entry_header) >= 16)
            else {
                return past("entry");
            };
            at = next;
        }
        return Ok(());
    }
    if image.starts_with(b"\x7fELF") {
        // ELF64, little-endian: cubins are.
        if image.get(4) != Some(&2) || image.get(5) != Some(&1) {
            return Err(Error::InvalidArgument(
                "module image: an ELF image that is not 64-bit little-endian".into(),
            ));
        }
        let fields = (
            u64_at(0x20),
            u64_at(0x28),
            u16_at(0x36),
            u16_at(0x38),
            u16_at(0x3A),
            u16_at(0x3C),
        );
        let (Some(phoff), Some(shoff), Some(phent), Some(phnum), Some(shent), Some(shnum)) = fields
        else {
            return past("ELF header");
        };
        let (phent, phnum, shent, shnum) = (
            u64::from(phent),
            u64::from(phnum),
            u64::from(shent),
            u64::from(shnum),
        );
        if !within(phoff, phent * phnum) || !within(shoff, shent * shnum) {
            return past("program or section header table");
        }
        if (phnum > 0 && phent < 0x38) || (shnum > 0 && shent < 0x40) {
            return Err(Error::InvalidArgument(
                "module image: ELF header tables with entries too small".into(),
            ));
        }
        for k in 0..phnum {
            let p = (phoff + k * phent) as usize;
            let (Some(offset), Some(size)) = (u64_at(p + 0x08), u64_at(p + 0x20)) else {
                return past("program header");
            };
            if !within(offset, size) {
                return past("segment");
            }
        }
        const SHT_NOBITS: u32 = 8;
        for k in 0..shnum {
            let h = (shoff + k * shent) as usize;
            let (Some(kind), Some(offset), Some(size)) =
                (u32_at(h + 0x04), u64_at(h + 0x18), u64_at(h + 0x20))
            else {
                return past("section header");
            };
            if kind != SHT_NOBITS && !within(offset, size) {
                return past("section");
            }
        }
    }
    Ok(())
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

    fn refused(image: &[u8]) -> bool {
        matches!(check_image(image), Err(Error::InvalidArgument(_)))
    }

    #[test]
    fn a_fatbin_is_loaded_whole_and_a_truncated_one_is_refused() {
        if crate::FATBIN.is_empty() {
            return println!("built without nvcc: no fatbin to check");
        }
        let f = crate::FATBIN;
        assert!(check_image(f).is_ok(), "the crate's own fatbin");
        for cut in [f.len() - 1, f.len() / 2, 100, 17, 16, 15, 8] {
            assert!(refused(&f[..cut]), "cut to {cut} bytes");
        }
        // A header that claims more than there is.
        let mut big = f.to_vec();
        big[8..16].copy_from_slice(&(1u64 << 30).to_le_bytes());
        assert!(refused(&big));
        // An entry whose payload runs past the fatbin's end.
        let mut entry = f.to_vec();
        entry[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(refused(&entry));
        // Refused before the driver is asked (so here, with none).
        assert!(matches!(
            Module::load(&f[..f.len() / 2]),
            Err(Error::InvalidArgument(_))
        ));
    }

    /// A 64-bit little-endian ELF header with one section header table of `shnum` entries
    /// at `shoff`, and `len` bytes in all.
    fn elf(len: usize, shoff: u64, shnum: u16) -> Vec<u8> {
        let mut e = vec![0u8; len.max(64)];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2; // 64-bit
        e[5] = 1; // little-endian
        e[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        e[0x3A..0x3C].copy_from_slice(&0x40u16.to_le_bytes());
        e[0x3C..0x3E].copy_from_slice(&shnum.to_le_bytes());
        e.truncate(len);
        e
    }

    #[test]
    fn an_elf_image_whose_tables_or_sections_lie_past_its_end_is_refused() {
        assert!(check_image(&elf(64, 0, 0)).is_ok(), "a header alone");
        assert!(check_image(&elf(128, 64, 1)).is_ok(), "one empty section");
        assert!(
            refused(&elf(100, 64, 1)),
            "the section header table cut short"
        );
        assert!(
            refused(&elf(64, u64::MAX - 8, 1)),
            "a table offset that wraps"
        );
        let mut section = elf(128, 64, 1);
        section[64 + 0x18..64 + 0x20].copy_from_slice(&100u64.to_le_bytes());
        section[64 + 0x20..64 + 0x28].copy_from_slice(&64u64.to_le_bytes());
        assert!(refused(&section), "a section's bytes past the end");
        section[64 + 0x04..64 + 0x08].copy_from_slice(&8u32.to_le_bytes());
        assert!(
            check_image(&section).is_ok(),
            "a NOBITS section has no bytes in the file"
        );
        assert!(refused(&elf(40, 0, 0)), "a header cut short");
        let mut elf32 = elf(64, 0, 0);
        elf32[4] = 1;
        assert!(refused(&elf32));
    }

    #[test]
    fn other_images_are_left_to_the_driver_as_ptx() {
        assert!(check_image(b"").is_ok());
        assert!(check_image(b".version 8.0\n.target sm_90\n").is_ok());
        assert!(check_image(b"definitely not a fatbin").is_ok());
    }
}
