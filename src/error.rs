//! The crate's error type: every runtime failure is one of these, never a panic.

use std::fmt;

/// Result alias used throughout the crate.
///
/// ```
/// fn first_element(hal: &cuda_hal::CudaHal) -> cuda_hal::Result<u32> {
///     let b = hal.copy_from("b", &[42u32])?;
///     b.get_at(0)
/// }
/// if let Ok(hal) = cuda_hal::CudaHal::new(0) {
///     assert_eq!(first_element(&hal).unwrap(), 42);
/// }
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a HAL operation failed. The HAL stays usable after every variant except
/// [`Error::ContextPoisoned`].
///
/// ```
/// use cuda_hal::{CudaHal, Error};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let b = hal.copy_from("column-3", &[1u32, 2, 3]).unwrap();
/// match b.get_at(3) {
///     Err(Error::OutOfRange { name, start, len, .. }) => {
///         assert_eq!((name.as_str(), start, len), ("column-3", 3, 3));
///     }
///     other => panic!("expected OutOfRange, got {other:?}"),
/// }
/// // The message names the buffer, and the HAL is still usable.
/// assert!(b.get_at(3).unwrap_err().to_string().contains("column-3"));
/// assert_eq!(b.get_at(2).unwrap(), 3);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The driver could not be loaded, lacks an entry point, or returned an error code.
    Cuda(cuda_sys::Error),
    /// No device has this ordinal.
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// An index or range lies outside a buffer.
    OutOfRange {
        /// The buffer's name.
        name: String,
        /// First element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// The buffer's length in elements.
        len: usize,
    },
    /// Two lengths that must agree do not.
    LengthMismatch {
        /// The buffer's name.
        name: String,
        /// The length the operation needs.
        expected: usize,
        /// The length it was given.
        actual: usize,
    },
    /// A buffer, slice or transfer of zero elements was asked for.
    ZeroLength {
        /// The buffer's name.
        name: String,
    },
    /// The device (or the HAL's limit) cannot hold the allocation.
    OutOfMemory {
        /// The buffer's name.
        name: String,
        /// Bytes requested.
        requested: usize,
        /// Bytes this HAL had allocated when the request came; where it does not track
        /// allocations (`track_allocations: false` and no limit), its managed memory only.
        in_use: usize,
        /// The HAL's limit, if one is set.
        limit: Option<usize>,
        /// Bytes the device has in all.
        device_total: usize,
        /// The largest live allocations of this HAL, by name (where it does not track
        /// allocations, of its managed memory only).
        largest: Vec<(String, usize)>,
        /// The driver's error, when the driver was asked and refused.
        driver: Option<Box<cuda_sys::Error>>,
    },
    /// The crate was built without nvcc, so no kernel module is embedded.
    KernelsUnavailable,
    /// The kernel module has no function of this name, or failed to load.
    KernelNotFound {
        /// The kernel's name.
        name: String,
        /// What the driver said.
        reason: String,
    },
    /// The operation does not support elements of this size.
    UnsupportedElementSize {
        /// The operation.
        op: &'static str,
        /// `size_of::<T>()`.
        size: usize,
    },
    /// A host view of this buffer is active over the bytes the operation needs.
    BufferBorrowed {
        /// The buffer's name.
        name: String,
    },
    /// A buffer of another HAL was passed to this one.
    ForeignBuffer {
        /// The buffer's name.
        name: String,
    },
    /// The same bytes were passed as a kernel output and as another argument.
    Aliasing {
        /// The output buffer's name.
        output: String,
        /// The other buffer's name.
        other: String,
    },
    /// A kernel fault (illegal address and the like) left the context unusable. The driver
    /// keeps the fault for the rest of the process (on driver 580, in the other devices'
    /// contexts too): a usable HAL needs a new process.
    ContextPoisoned {
        /// The error that poisoned the context.
        cause: cuda_sys::Error,
    },
    /// A batch arena (or one of its slots) cannot hold the request.
    ArenaFull {
        /// The view or slot asked for.
        view: String,
        /// Bytes requested.
        requested: usize,
        /// Bytes of the batch (or slot) already used.
        used: usize,
        /// Bytes of the arena (or slot).
        capacity: usize,
    },
    /// An argument is invalid for another reason, stated here.
    InvalidArgument(String),
}

impl Error {
    /// The driver error inside, if any.
    ///
    /// ```
    /// use cuda_hal::Error;
    /// let e = Error::InvalidArgument("log_n must be at most 27".into());
    /// assert!(e.driver_error().is_none(), "an argument error never reached the driver");
    /// if let Err(e) = cuda_hal::CudaHal::new(0) {
    ///     // No driver or no device: the driver's own code and message are inside.
    ///     println!("{e}; driver said: {:?}", e.driver_error());
    /// }
    /// ```
    pub fn driver_error(&self) -> Option<&cuda_sys::Error> {
        match self {
            Error::Cuda(e) | Error::ContextPoisoned { cause: e } => Some(e),
            Error::OutOfMemory { driver, .. } => driver.as_deref(),
            _ => None,
        }
    }

    /// The sticky driver error inside, when the error says the context is broken.
    pub(crate) fn poisoning(&self) -> Option<&cuda_sys::Error> {
        match self {
            Error::ContextPoisoned { cause } => Some(cause),
            Error::Cuda(e) if e.is_sticky() => Some(e),
            _ => None,
        }
    }
}

/// A driver error as the crate reports it: a sticky one (a device fault that broke the
/// context for the process) is [`Error::ContextPoisoned`] wherever it surfaces, any other
/// [`Error::Cuda`].
///
/// ```
/// use cuda_hal::cuda_sys::{self, CUresult};
/// use cuda_hal::Error;
/// let fault = cuda_sys::Error::from_code(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamCreate");
/// assert!(matches!(Error::from(fault), Error::ContextPoisoned { .. }));
/// let refused = cuda_sys::Error::from_code(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemsetD8_v2");
/// assert!(matches!(Error::from(refused), Error::Cuda(_)));
/// ```
impl From<cuda_sys::Error> for Error {
    fn from(e: cuda_sys::Error) -> Self {
        if e.is_sticky() {
            // Every HAL on the context refuses its next operation from now on.
            crate::driver::note_sticky(&e);
            Error::ContextPoisoned { cause: e }
        } else {
            Error::Cuda(e)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuda(e) => write!(f, "{e}"),
            Error::NoDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal}: the driver reports {count}")
            }
            Error::OutOfRange { name, start, end, len } => write!(
                f,
                "elements {start}..{end} are out of range for buffer `{name}` of {len} elements"
            ),
            Error::LengthMismatch { name, expected, actual } => write!(
                f,
                "buffer `{name}` needs {expected} elements but was given {actual}"
            ),
            Error::ZeroLength { name } => write!(f, "buffer `{name}`: zero-length request"),
            Error::OutOfMemory {
                name,
                requested,
                in_use,
                limit,
                device_total,
                largest,
                driver,
            } => {
                write!(
                    f,
                    "out of device memory allocating `{name}`: {requested} bytes requested, {in_use} in use"
                )?;
                match limit {
                    Some(l) => write!(f, ", limit {l}")?,
                    None => write!(f, ", device has {device_total}")?,
                }
                if !largest.is_empty() {
                    let l: Vec<String> = largest.iter().map(|(n, b)| format!("{n} {b} B")).collect();
                    write!(f, "; largest live: {}", l.join(", "))?;
                }
                if let Some(d) = driver {
                    write!(f, " ({d})")?;
                }
                Ok(())
            }
            Error::KernelsUnavailable => write!(
                f,
                "cuda-hal was built without nvcc, so it has no kernels (install the toolchain, e.g. scripts/install-cuda-toolchain.sh, and rebuild; `cargo clean -p cuda-hal` if the build predates it)"
            ),
            Error::KernelNotFound { name, reason } => write!(f, "kernel `{name}`: {reason}"),
            Error::UnsupportedElementSize { op, size } => {
                write!(f, "{op} does not support {size}-byte elements")
            }
            Error::BufferBorrowed { name } => {
                write!(f, "buffer `{name}` has an active host view over these elements")
            }
            Error::ForeignBuffer { name } => write!(f, "buffer `{name}` belongs to another HAL"),
            Error::Aliasing { output, other } => write!(
                f,
                "kernel output `{output}` overlaps argument `{other}`"
            ),
            Error::ContextPoisoned { cause } => write!(
                f,
                "the CUDA context is unusable after a device fault ({cause}); create a new HAL"
            ),
            Error::ArenaFull { view, requested, used, capacity } => write!(
                f,
                "arena cannot hold `{view}`: {requested} bytes requested, {used} of {capacity} used"
            ),
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.driver_error().map(|e| e as _)
    }
}
