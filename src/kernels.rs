//! The embedded kernel module and the launch builder.
//!
//! A launch names which buffers the kernel reads and which it writes, so the phase-2 host
//! cache stays right without any mark-dirty call: host-newer data is uploaded before the
//! kernel runs, and the host copy of every output is invalidated.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cuda_sys::{CUcontext, CUdeviceptr};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::buffer::{Buffer, RawBuffer};
use crate::driver::{Function, Module, PerContext};
use crate::streams::HalStream;
use crate::{CudaHal, Error, Result};

/// The fatbin compiled by `build.rs` from `kernels/*.cu` (empty when built without nvcc).
pub static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernels.fatbin"));

/// Whether this build embeds kernels.
///
/// ```
/// // Built without nvcc, the crate still works for memory and transfers; kernels then fail
/// // with a typed error.
/// use cuda_hal::{kernels_available, CudaHal, Error};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.alloc::<u32>("b", 16).unwrap();
/// match b.fill(1) {
///     Ok(()) => assert!(kernels_available()),
///     Err(e) => assert!(!kernels_available() && e == Error::KernelsUnavailable),
/// }
/// ```
pub fn kernels_available() -> bool {
    !FATBIN.is_empty()
}

pub(crate) struct KernelTable {
    /// The embedded module, shared by the HALs of the context, or why it is not there (a
    /// failure that may pass is tried again at the next lookup: [`KernelTable::get`]).
    embedded: RwLock<Result<Arc<EmbeddedModule>>>,
    /// Load every kernel of the module as it loads (`HalConfig::preload_kernels`).
    preload: bool,
    /// Modules of [`CudaHal::load_module`], searched after the embedded one in load order.
    loaded: RwLock<Vec<Module>>,
    /// Kernels found so far, by name, and whether the embedded module has them. Their
    /// modules are this table's: [`KernelTable::get`] lends them out bound to it.
    functions: RwLock<FxHashMap<String, (Function<'static>, bool)>>,
}

impl KernelTable {
    /// The embedded module of context `ctx`, current on the calling thread: the one the
    /// context's live HALs share, else loaded now ([`EmbeddedModule::of`]); with `preload`
    /// each of its kernels loaded too, unless they all are ([`preload`]). A failure to load
    /// the module does not fail the HAL: memory operations work, and kernel lookups return
    /// the error, or load the module then where the failure may pass
    /// ([`load_may_succeed_later`]).
    pub(crate) fn load(ctx: CUcontext, preload: bool) -> Self {
        KernelTable {
            embedded: RwLock::new(embedded_module(ctx, preload)),
            preload,
            loaded: RwLock::new(Vec::new()),
            functions: RwLock::new(FxHashMap::default()),
        }
    }

    /// The embedded module, loaded again now if its load failed in a way that may pass
    /// (context `ctx` current on the calling thread). One thread loads; the others wait and
    /// take its answer.
    fn embedded(&self, ctx: CUcontext) -> Result<Arc<EmbeddedModule>> {
        let retry = match &*self.embedded.read() {
            Ok(m) => return Ok(m.clone()),
            Err(e) if !load_may_succeed_later(e) => return Err(e.clone()),
            Err(e) => e.clone(),
        };
        let mut embedded = self.embedded.write();
        if matches!(&*embedded, Err(e) if *e == retry) {
            *embedded = embedded_module(ctx, self.preload);
        }
        embedded.clone()
    }

    /// The kernel `name`: the embedded one, else (unless `embedded_only`) the first loaded
    /// module's. A name found in no module gives the embedded module's answer (not found,
    /// or no kernels built). The crate's own operations pass `embedded_only`: they pass
    /// the arguments of the embedded kernels, which a user's kernel of the same name need
    /// not take.
    ///
    /// Context `ctx` is current on the calling thread: where the embedded module's load
    /// failed in a way that may pass, it is loaded again here.
    pub(crate) fn get(
        &self,
        ctx: CUcontext,
        name: &str,
        embedded_only: bool,
    ) -> Result<Function<'_>> {
        if let Some(&(f, embedded)) = self.functions.read().get(name) {
            if embedded || !embedded_only {
                return Ok(f);
            }
        }
        // Whether the embedded module's answer is final: loaded, or failed for good.
        let (not_embedded, settled) = match self.embedded(ctx) {
            Ok(embedded) => match embedded.module.function(name) {
                Ok(f) => return Ok(self.remember(name, f, true, true)),
                Err(e) => (e, true),
            },
            Err(e) => {
                let settled = !load_may_succeed_later(&e);
                (e, settled)
            }
        };
        if embedded_only {
            return Err(not_embedded);
        }
        let loaded = self.loaded.read();
        match loaded.iter().find_map(|m| m.function(name).ok()) {
            // Kept only once the embedded module's answer is final: a module loaded later
            // may hold a kernel of the same name, which comes first.
            Some(f) => Ok(self.remember(name, f, false, settled)),
            None => Err(not_embedded),
        }
    }

    /// Lends `f`, a kernel of one of this table's modules, bound to the table, and with
    /// `keep` keeps it under `name`.
    fn remember(&self, name: &str, f: Function<'_>, embedded: bool, keep: bool) -> Function<'_> {
        // SAFETY: `f`'s module is this table's (the embedded module, kept once loaded, or
        // one of `loaded`, never removed) and lives as long as the table; the table lends
        // the handle out bound to itself.
        let f = unsafe { f.unbound() };
        if keep {
            self.functions
                .write()
                .insert(name.to_string(), (f, embedded));
        }
        f
    }

    /// Adds a module whose kernels [`KernelTable::get`] finds from now on.
    pub(crate) fn add(&self, module: Module) {
        self.loaded.write().push(module);
    }
}

/// The embedded module of context `ctx` (current on the calling thread), with its kernels
/// loaded where `preload` asks, or why it is not there (logged).
fn embedded_module(ctx: CUcontext, preload: bool) -> Result<Arc<EmbeddedModule>> {
    if !kernels_available() {
        return Err(Error::KernelsUnavailable);
    }
    let module = EmbeddedModule::of(ctx);
    match &module {
        Ok(m) if preload => m.preload_once(),
        Ok(_) => {}
        Err(e) if load_may_succeed_later(e) => {
            log::warn!("kernels not loaded, tried again at the next kernel lookup: {e}")
        }
        Err(e) => log::warn!("kernels unavailable: {e}"),
    }
    module
}

/// Whether a failed load of the embedded module may succeed if tried again: a driver error
/// other than one that says the image cannot run on this device or driver (no code for the
/// GPU, an image or PTX the driver rejects, no JIT compiler) or that broke the context. A
/// build without kernels, a missing entry point or a poisoned context never pass.
pub(crate) fn load_may_succeed_later(e: &Error) -> bool {
    use cuda_sys::CUresult as R;
    let Error::Cuda(e) = e else { return false };
    match e.code() {
        None => false,
        Some(code) => !matches!(
            code,
            R::CUDA_ERROR_NO_BINARY_FOR_GPU
                | R::CUDA_ERROR_INVALID_IMAGE
                | R::CUDA_ERROR_INVALID_PTX
                | R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                | R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
                | R::CUDA_ERROR_JIT_COMPILATION_DISABLED
                | R::CUDA_ERROR_INVALID_SOURCE
                | R::CUDA_ERROR_NOT_SUPPORTED
                | R::CUDA_ERROR_INVALID_DEVICE
                | R::CUDA_ERROR_NO_DEVICE
                | R::CUDA_ERROR_DEINITIALIZED
        ),
    }
}

/// Loads every kernel of `module` now (`HalConfig::preload_kernels`); true if it did.
/// Where the driver cannot, the kernels load at their first use, as they would without:
/// logged, not an error (a sticky error is noted for the context all the same, by the
/// conversion).
pub(crate) fn preload(module: &Module) -> bool {
    match module.load_all_functions() {
        Ok(n) => {
            log::debug!("{n} kernels loaded");
            true
        }
        Err(e) => {
            log::warn!("kernels load at their first use: {e}");
            false
        }
    }
}

/// The embedded module of one context, shared by the HALs on it: loading it is most of a
/// HAL's start (about 6 ms on an H200, 9.5 ms with its kernels loaded, against 0.05 ms for
/// the rest), so a second HAL on a device starts without loading it again. The module
/// holds the context, so the handle a [`SHARED_MODULES`] entry is keyed by stays that
/// context's while the module lives; it is unloaded when the last HAL holding it drops.
pub(crate) struct EmbeddedModule {
    module: Module,
    /// Every kernel loaded ([`preload`]): a HAL that preloads after one that did skips it.
    all_loaded: AtomicBool,
}

/// The embedded module of each context a HAL holds it on.
static SHARED_MODULES: PerContext<EmbeddedModule> = PerContext::new();

impl EmbeddedModule {
    /// The embedded module of context `ctx` (current on the calling thread): the one a live
    /// HAL on it holds, else loaded now. A failed load is not kept: the next HAL tries
    /// again.
    fn of(ctx: CUcontext) -> Result<Arc<EmbeddedModule>> {
        SHARED_MODULES.get_or_make(ctx, || {
            Ok(EmbeddedModule {
                module: Module::load(FATBIN)?,
                all_loaded: AtomicBool::new(false),
            })
        })
    }

    /// Loads every kernel ([`preload`]) unless a HAL already did.
    fn preload_once(&self) {
        if !self.all_loaded.load(Ordering::Acquire) && preload(&self.module) {
            self.all_loaded.store(true, Ordering::Release);
        }
    }
}

/// Grid, block and dynamic shared memory of a launch.
///
/// ```
/// use cuda_hal::LaunchDims;
/// // A 2-D launch over a 1024 x 512 matrix in 32 x 8 tiles with 4 KiB of shared memory each.
/// let dims = LaunchDims { grid: (1024 / 32, 512 / 8, 1), block: (32, 8, 1), shared_bytes: 4096 };
/// assert_eq!(dims.grid.0 * dims.block.0, 1024);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks per grid.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// A 1-D launch for grid-stride kernels over `n` elements: 256 threads a block and
    /// enough blocks to fill `sms` multiprocessors, never more than the elements need nor
    /// than a grid holds (2^31 - 1 blocks).
    ///
    /// ```
    /// let d = cuda_hal::LaunchDims::for_elements(1000, 132);
    /// assert_eq!(d.block.0, 256);
    /// assert_eq!(d.grid.0, 4);
    /// let most = cuda_hal::LaunchDims::for_elements(usize::MAX, u32::MAX);
    /// assert_eq!(most.grid.0, i32::MAX as u32);
    /// ```
    pub fn for_elements(n: usize, sms: u32) -> Self {
        const BLOCK: usize = 256;
        /// The most blocks a grid's x dimension holds.
        const MAX_GRID_X: usize = i32::MAX as usize;
        let needed = n.div_ceil(BLOCK).max(1);
        let cap = (sms.max(1) as usize).saturating_mul(32).min(MAX_GRID_X);
        LaunchDims {
            grid: (needed.min(cap) as u32, 1, 1),
            block: (BLOCK as u32, 1, 1),
            shared_bytes: 0,
        }
    }
}

/// How a launch uses a buffer argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    /// Whether the kernel may write the buffer.
    fn writes(self) -> bool {
        self != Access::Read
    }
}

/// A kernel launch being assembled: arguments in the kernel's parameter order.
///
/// ```
/// use cuda_hal::{CudaHal, LaunchDims};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.copy_from("a", &[1u32, 2, 3]).unwrap();
/// let b = hal.copy_from("b", &[10u32, 20, 30]).unwrap();
/// let out = hal.alloc::<u32>("out", 3).unwrap();
/// // SAFETY: eltwise_add_u32(out, a, b, n) over the 3 elements of each.
/// unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(3, hal.info().multiprocessors))
///     .output(&out)
///     .input(&a)
///     .input(&b)
///     .scalar(3u64)
///     .run() }
///     .unwrap();
/// assert_eq!(out.to_vec().unwrap(), vec![11, 22, 33]);
/// ```
#[must_use = "a launch does nothing until `run` is called"]
pub struct Launch<'h> {
    hal: &'h CudaHal,
    kernel: &'h str,
    /// Only the embedded module's kernel (the crate's own operations).
    embedded_only: bool,
    dims: LaunchDims,
    /// Each argument's value, in 16-byte slots (8-byte aligned) so any scalar up to 16
    /// bytes fits; the driver copies each parameter by its size from wherever it lies.
    /// (Inline up to `INLINE_ARGS`: a launch allocates nothing on the host.)
    values: SmallVec<[[u64; 2]; INLINE_ARGS]>,
    buffers: SmallVec<[BufferArg; INLINE_BUFFERS]>,
    stream: Option<HalStream>,
    /// The first bad argument (boxed: the builder moves at every call).
    error: Option<Box<Error>>,
}

/// Arguments a launch keeps without allocating.
const INLINE_ARGS: usize = 8;
/// Buffer arguments a launch keeps without allocating.
const INLINE_BUFFERS: usize = 4;

/// A buffer argument: the allocation, the byte range the kernel gets, and how it uses it.
type BufferArg = (Arc<RawBuffer>, Range<usize>, Access);

impl CudaHal {
    /// Loads a module of your own kernels (a fatbin, cubin or PTX image) into the HAL's
    /// context, so that [`CudaHal::launch`] runs them by name with the same argument
    /// checks, host-cache upkeep and NVTX ranges as the embedded kernels. A name is looked
    /// up in the embedded kernels first, then in the loaded modules in the order they were
    /// loaded. Modules stay loaded until the HAL is dropped. Kernels must be `extern "C"`.
    ///
    /// A bad image gives the driver's error and leaves the HAL as it was.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// // PTX of `extern "C" __global__ void twice_u32(unsigned *x)` on 32 threads.
    /// let ptx = r#"
    /// .version 7.0
    /// .target sm_80
    /// .address_size 64
    /// .visible .entry twice_u32(.param .u64 x) {
    ///     .reg .b32 %r<4>;
    ///     .reg .b64 %rd<4>;
    ///     ld.param.u64 %rd1, [x];
    ///     cvta.to.global.u64 %rd2, %rd1;
    ///     mov.u32 %r1, %tid.x;
    ///     mul.wide.u32 %rd3, %r1, 4;
    ///     add.s64 %rd2, %rd2, %rd3;
    ///     ld.global.u32 %r2, [%rd2];
    ///     shl.b32 %r3, %r2, 1;
    ///     st.global.u32 [%rd2], %r3;
    ///     ret;
    /// }
    /// "#;
    /// hal.load_module(ptx.as_bytes()).unwrap();
    /// let x = hal.copy_from("x", &(0..32u32).collect::<Vec<_>>()).unwrap();
    /// let dims = LaunchDims { grid: (1, 1, 1), block: (32, 1, 1), shared_bytes: 0 };
    /// // SAFETY: twice_u32 doubles x[tid] for 32 threads; x has 32 elements.
    /// unsafe { hal.launch("twice_u32", dims).inout(&x).run() }.unwrap();
    /// assert_eq!(x.get_at(5).unwrap(), 10);
    /// ```
    pub fn load_module(&self, image: &[u8]) -> Result<()> {
        let h = &self.inner;
        h.enter()?;
        let module = h.guard(Module::load(image))?;
        if h.config.preload_kernels {
            preload(&module);
        }
        h.kernels.add(module);
        Ok(())
    }

    /// The kernel `name` as the driver's [`Function`]: an embedded one, else one of a
    /// module loaded with [`CudaHal::load_module`], as [`CudaHal::launch`] finds it; to ask
    /// the driver about it, or to launch it on a stream of your own. The handle borrows the
    /// HAL, which keeps its module loaded. The HALs of one device share the embedded
    /// kernels, so they get the same handles.
    ///
    /// ```
    /// use cuda_hal::{kernels_available, CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// if !kernels_available() {
    ///     return println!("built without nvcc");
    /// }
    /// let fill = hal.kernel("fill_u32").unwrap();
    /// // Loaded as the HAL started (`HalConfig::preload_kernels`), where the driver can.
    /// println!("fill_u32 loaded: {}", fill.is_loaded().unwrap());
    /// let beside = CudaHal::new(0).unwrap();
    /// assert_eq!(beside.kernel("fill_u32").unwrap().raw(), fill.raw());
    /// assert!(matches!(hal.kernel("no_such_kernel"), Err(Error::KernelNotFound { .. })));
    /// ```
    ///
    /// The handle does not outlive the HAL:
    ///
    /// ```compile_fail,E0597
    /// let fill = {
    ///     let hal = cuda_hal::CudaHal::new(0).unwrap();
    ///     hal.kernel("fill_u32").unwrap()
    /// }; // error: `hal` does not live long enough
    /// fill.is_loaded().unwrap();
    /// ```
    pub fn kernel(&self, name: &str) -> Result<Function<'_>> {
        let h = &self.inner;
        h.enter()?;
        h.guard(h.function(name, false))
    }

    /// Starts a launch of the kernel `kernel`: an embedded one, or one of a module loaded
    /// with [`CudaHal::load_module`].
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let x = hal.copy_from("x", &[1u32, 2, 3]).unwrap();
    /// // fill_u32(out, value, n)
    /// // SAFETY: fill_u32(out, value, n) writes x's 3 elements.
    /// unsafe { hal.launch("fill_u32", LaunchDims::for_elements(3, hal.info().multiprocessors))
    ///     .output(&x)
    ///     .scalar(7u32)
    ///     .scalar(3u64)
    ///     .run() }
    ///     .unwrap();
    /// assert_eq!(x.to_vec().unwrap(), vec![7, 7, 7]);
    /// // A kernel that is not there is an error when the launch runs.
    /// // SAFETY: a kernel that is not there is refused before anything is queued.
    /// let err = unsafe { hal.launch("no_such_kernel", LaunchDims::for_elements(1, 1)).run() };
    /// assert!(err.is_err());
    /// ```
    #[inline]
    pub fn launch<'h>(&'h self, kernel: &'h str, dims: LaunchDims) -> Launch<'h> {
        Launch {
            hal: self,
            kernel,
            embedded_only: false,
            dims,
            values: SmallVec::new(),
            buffers: SmallVec::new(),
            stream: None,
            error: None,
        }
    }

    /// [`CudaHal::launch`] of a kernel of the embedded module only, for the crate's own
    /// operations: a module the user loaded is never searched.
    #[inline]
    pub(crate) fn launch_embedded<'h>(&'h self, kernel: &'h str, dims: LaunchDims) -> Launch<'h> {
        Launch {
            embedded_only: true,
            ..self.launch(kernel, dims)
        }
    }
}

impl<'h> Launch<'h> {
    #[inline]
    fn buffer<T: bytemuck::Pod>(mut self, b: &Buffer<T>, access: Access) -> Self {
        if self.error.is_none() && !self.hal.same(b.raw().hal()) {
            self.error = Some(Box::new(Error::ForeignBuffer {
                name: b.name().to_string(),
            }));
        }
        self.values.push([b.raw_ptr(), 0]);
        self.buffers.push((b.raw().clone(), b.byte_range(), access));
        self
    }

    /// Runs the kernel on `stream` instead of the HAL's main stream. The launch waits for
    /// the main stream's work so far and for other streams' pending uses of its buffers,
    /// and its buffers are not freed or reused until it is done.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// let x = hal.alloc::<u32>("x", 1 << 20).unwrap();
    /// // SAFETY: fill_u32(out, value, n) writes x's n elements.
    /// unsafe { hal.launch("fill_u32", LaunchDims::for_elements(x.len(), hal.info().multiprocessors))
    ///     .on(&side)
    ///     .output(&x)
    ///     .scalar(4u32)
    ///     .scalar(x.len() as u64)
    ///     .run() }
    ///     .unwrap();
    /// // Reading on the main stream waits for the side stream's fill.
    /// assert_eq!(x.get_at(x.len() - 1).unwrap(), 4);
    /// ```
    pub fn on(mut self, stream: &HalStream) -> Self {
        if self.error.is_none() && !self.hal.same(&stream.hal) {
            self.error = Some(Box::new(Error::InvalidArgument(
                "stream of another HAL".into(),
            )));
        }
        self.stream = Some(stream.clone());
        self
    }

    /// Next parameter: a buffer the kernel only reads.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.copy_from("a", &[2.0f32, 3.0]).unwrap();
    /// let out = hal.alloc::<f32>("out", 2).unwrap();
    /// // eltwise_mul_f32(out, a, b, n): a read twice
    /// // SAFETY: eltwise_mul_f32(out, a, b, n) over the 2 elements of each.
    /// unsafe { hal.launch("eltwise_mul_f32", LaunchDims::for_elements(2, 1))
    ///     .output(&out).input(&a).input(&a).scalar(2u64)
    ///     .run() }
    ///     .unwrap();
    /// assert_eq!(out.to_vec().unwrap(), vec![4.0, 9.0]);
    /// ```
    #[inline]
    pub fn input<T: bytemuck::Pod>(self, b: &Buffer<T>) -> Self {
        self.buffer(b, Access::Read)
    }

    /// Next parameter: a buffer the kernel writes (and may not read).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = hal.copy_from("a", &[1u32, 2, 3, 4]).unwrap();
    /// // An output may not overlap an input: the launch is refused before it is queued.
    /// // SAFETY: refused before anything is queued: the output overlaps an input.
    /// let err = unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(4, 1))
    ///     .output(&a).input(&a).input(&a).scalar(4u64)
    ///     .run() };
    /// assert!(matches!(err, Err(Error::Aliasing { .. })));
    /// assert_eq!(a.to_vec().unwrap(), vec![1, 2, 3, 4]);
    /// ```
    #[inline]
    pub fn output<T: bytemuck::Pod>(self, b: &Buffer<T>) -> Self {
        self.buffer(b, Access::Write)
    }

    /// Next parameter: a buffer the kernel reads and writes in place.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// // An accumulator edited on the host, then used as a read-write parameter: its
    /// // host edits go to the device before the kernel runs.
    /// let acc = hal.alloc_zeroed::<u32>("acc", 4).unwrap();
    /// acc.view_mut(|s| s[0] = 5).unwrap();
    /// let (a, b) = (hal.copy_from("a", &[1u32; 4]).unwrap(), hal.copy_from("b", &[2u32; 4]).unwrap());
    /// // eltwise_add_u32(out, a, b, n) writes every element of `acc`.
    /// // SAFETY: eltwise_add_u32(out, a, b, n) over the 4 elements of each.
    /// unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(4, 1))
    ///     .inout(&acc).input(&a).input(&b).scalar(4u64)
    ///     .run() }
    ///     .unwrap();
    /// assert_eq!(acc.to_vec().unwrap(), vec![3; 4]);
    /// // The same buffer as a second parameter is refused: an output may not alias.
    /// // SAFETY: refused before anything is queued: the output overlaps an input.
    /// let twice = unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(4, 1))
    ///     .inout(&acc).input(&acc).input(&b).scalar(4u64)
    ///     .run() };
    /// assert!(twice.is_err());
    /// ```
    #[inline]
    pub fn inout<T: bytemuck::Pod>(self, b: &Buffer<T>) -> Self {
        self.buffer(b, Access::ReadWrite)
    }

    /// Next parameter: a value of at most 16 bytes.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let x = hal.alloc::<u64>("x", 8).unwrap();
    /// // fill_u64(out, value, n): two 8-byte scalars
    /// // SAFETY: fill_u64(out, value, n) writes x's 8 elements.
    /// unsafe { hal.launch("fill_u64", LaunchDims::for_elements(8, 1))
    ///     .output(&x).scalar(u64::MAX).scalar(8u64)
    ///     .run() }
    ///     .unwrap();
    /// assert_eq!(x.get_at(7).unwrap(), u64::MAX);
    /// // SAFETY: refused before anything is queued: a scalar over 16 bytes.
    /// let too_big = unsafe { hal.launch("fill_u64", LaunchDims::for_elements(8, 1)).output(&x).scalar([0u64; 3]).run() };
    /// assert!(matches!(too_big, Err(Error::InvalidArgument(_))));
    /// ```
    #[inline]
    pub fn scalar<V: bytemuck::Pod>(mut self, v: V) -> Self {
        let bytes = bytemuck::bytes_of(&v);
        if bytes.len() > 16 {
            self.error
                .get_or_insert(Box::new(Error::InvalidArgument(format!(
                    "kernel scalar of {} bytes (at most 16)",
                    bytes.len()
                ))));
        }
        let mut slot = [0u64; 2];
        let n = bytes.len().min(16);
        bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..n].copy_from_slice(&bytes[..n]);
        self.values.push(slot);
        self
    }

    /// Checks the arguments, brings host-newer inputs to the device, invalidates the host
    /// copies of the outputs and queues the kernel on the HAL's stream.
    ///
    /// The checks cover what the HAL can see: buffers of this HAL, no output overlapping
    /// another argument, scalars of at most 16 bytes. They cannot see the kernel's code,
    /// so running it is `unsafe`, as any foreign function is. The safe operations of
    /// [`crate::ops`] and of the [`crate::Hal`] trait wrap the embedded kernels with their
    /// arguments checked.
    ///
    /// # Safety
    /// - The arguments match the kernel's parameters: their number, order and sizes.
    /// - The kernel reads and writes only within the buffers passed to it, as declared
    ///   (`input` read, `output` and `inout` written), and within any memory whose address
    ///   is passed as a scalar, which must stay allocated until the kernel is done.
    /// - No host reference to memory the kernel writes (a managed buffer's or pinned
    ///   buffer's host slice) is alive while the kernel runs, and none to memory it reads
    ///   is mutable.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let x = hal.copy_from("x", &[0u32; 4]).unwrap();
    /// assert_eq!(x.get_at(0).unwrap(), 0); // the host copy is now cached (phase 2)
    /// // SAFETY: fill_u32(out, value, n) writes x's 4 elements.
    /// unsafe { hal.launch("fill_u32", LaunchDims::for_elements(4, 1))
    ///     .output(&x).scalar(1u32).scalar(4u64)
    ///     .run() }
    ///     .unwrap();
    /// assert_eq!(x.get_at(0).unwrap(), 1, "the cached host copy was invalidated");
    /// // A buffer of another HAL is refused before anything is queued.
    /// let other = CudaHal::new(0).unwrap();
    /// let foreign = other.alloc::<u32>("foreign", 4).unwrap();
    /// // SAFETY: refused before anything is queued: a buffer of another HAL.
    /// let err = unsafe { hal.launch("fill_u32", LaunchDims::for_elements(4, 1)).output(&foreign).scalar(1u32).scalar(4u64).run() };
    /// assert!(matches!(err, Err(Error::ForeignBuffer { .. })));
    /// ```
    pub unsafe fn run(mut self) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let names = |want: &[Access]| -> String {
                let v: Vec<&str> = self
                    .buffers
                    .iter()
                    .filter(|b| want.contains(&b.2))
                    .map(|b| b.0.name())
                    .collect();
                v.join(",")
            };
            format!(
                "launch {} out={} in={}",
                self.kernel,
                names(&[Access::Write, Access::ReadWrite]),
                names(&[Access::Read, Access::ReadWrite])
            )
        });
        if let Some(e) = self.error.take() {
            return Err(*e);
        }
        check_aliasing(&self.buffers)?;
        let h = &self.hal.inner;
        h.enter()?;
        let f = h.function(self.kernel, self.embedded_only)?;
        let side = self.stream.take().filter(|s| !s.is_main());
        match &side {
            Some(s) => {
                // Every buffer's host edits are uploaded on the main stream first, then the
                // side stream waits for the main stream once (not once per buffer).
                for (raw, range, access) in &self.buffers {
                    raw.flush_for_side(range.clone(), access.writes())?;
                }
                s.after_main()?;
                for (raw, _, access) in &self.buffers {
                    raw.wait_side_uses(s, access.writes())?;
                }
            }
            None => {
                for (raw, range, access) in &self.buffers {
                    raw.prepare_device_access(range.clone(), access.writes())?;
                }
            }
        }
        let mut params: SmallVec<[*mut c_void; INLINE_ARGS]> = self
            .values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast())
            .collect();
        let d = self.dims;
        let stream = side.as_ref().map_or(&h.stream, |s| &s.stream);
        // Taken before the launch: once the kernel is queued, its buffers must get the
        // event that orders their later uses and frees after it.
        let done = side.as_ref().map(|_| h.event()).transpose()?;
        // SAFETY: one pointer per argument, each to a 16-byte slot holding the value (the
        // driver copies as many bytes as the kernel's parameter has from each pointer);
        // buffer arguments are live allocations kept alive by `self.buffers` until the
        // kernel is queued, and by their owners (which free in stream order) afterwards.
        let r = unsafe { f.launch(d.grid, d.block, d.shared_bytes, stream, &mut params) };
        if r.is_ok() {
            h.ledger.launch();
        }
        h.guard(r)?;
        let recorded = match (&side, done) {
            (Some(s), Some(done)) => h.record_use(&done, &s.stream).map(|()| {
                for (raw, _, access) in &self.buffers {
                    raw.side.add(s.id, done.clone(), access.writes());
                }
            }),
            _ => Ok(()),
        };
        // A concurrent host read may have refilled an output's host copy from the old data
        // between the checks above and the launch: invalidate again now the kernel is queued
        // (where recording its use failed too).
        for (raw, range, access) in &self.buffers {
            if access.writes() {
                raw.invalidate_host(range.clone());
            }
        }
        recorded
    }
}

/// Rejects an output whose bytes overlap any other buffer argument.
fn check_aliasing(buffers: &[BufferArg]) -> Result<()> {
    for (i, (a, ra, acc_a)) in buffers.iter().enumerate() {
        for (b, rb, acc_b) in &buffers[i + 1..] {
            let writes = acc_a.writes() || acc_b.writes();
            if writes && Arc::ptr_eq(a, b) && ra.start < rb.end && rb.start < ra.end {
                let (out, other) = if acc_a.writes() { (a, b) } else { (b, a) };
                return Err(Error::Aliasing {
                    output: out.name().to_string(),
                    other: other.name().to_string(),
                });
            }
        }
    }
    Ok(())
}

/// A device address for users' own kernels, with the bytes it covers.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.alloc::<u16>("b", 100).unwrap();
/// let p = b.device_ptr().unwrap();
/// assert_eq!(p.bytes, 200);
/// assert_ne!(p.addr, 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr {
    /// The address of the first element.
    pub addr: CUdeviceptr,
    /// Bytes from `addr` that belong to the buffer.
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_sys::CUresult as R;

    fn driver(code: R) -> Error {
        Error::Cuda(cuda_sys::Error::from_code(code, "cuModuleLoadData"))
    }

    #[test]
    fn a_failed_module_load_is_tried_again_only_where_it_may_pass() {
        // A refusal that may pass: memory, a call refused for now, the OS.
        for code in [
            R::CUDA_ERROR_OUT_OF_MEMORY,
            R::CUDA_ERROR_INVALID_VALUE,
            R::CUDA_ERROR_OPERATING_SYSTEM,
            R::CUDA_ERROR_UNKNOWN,
        ] {
            assert!(load_may_succeed_later(&driver(code)), "{code:?}");
        }
        // The image cannot run here, whenever it is tried.
        for code in [
            R::CUDA_ERROR_NO_BINARY_FOR_GPU,
            R::CUDA_ERROR_INVALID_IMAGE,
            R::CUDA_ERROR_INVALID_PTX,
            R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
        ] {
            assert!(!load_may_succeed_later(&driver(code)), "{code:?}");
        }
        // No kernels built, no entry point, a broken context.
        let missing = cuda_sys::Error::MissingSymbol {
            symbol: "cuModuleLoadData",
        };
        let fault = cuda_sys::Error::from_code(R::CUDA_ERROR_ILLEGAL_ADDRESS, "cuModuleLoadData");
        for e in [
            Error::KernelsUnavailable,
            Error::Cuda(missing),
            Error::ContextPoisoned { cause: fault },
        ] {
            assert!(!load_may_succeed_later(&e), "{e}");
        }
    }
}
