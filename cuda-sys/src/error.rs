//! Typed errors for every way a driver call can fail.

use std::fmt;

use crate::bindings::CUresult;

/// Why a driver call did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No driver library could be opened.
    DriverNotFound {
        /// The library names or paths that were tried, in order.
        tried: Vec<String>,
        /// Why each of them failed, in order (what `dlerror` said, or that it lacks
        /// `cuInit`), joined with "; ".
        reason: String,
    },
    /// The loaded driver does not export this entry point (it is older than the header).
    MissingSymbol {
        /// The versioned symbol name, such as `cuMemAlloc_v2`.
        symbol: &'static str,
    },
    /// The driver returned a code other than `CUDA_SUCCESS`.
    Driver {
        /// The entry point that failed.
        call: &'static str,
        /// The raw `CUresult` code.
        code: u32,
        /// The header's name for the code, such as `CUDA_ERROR_OUT_OF_MEMORY`.
        name: &'static str,
        /// The header's description of the code.
        description: &'static str,
    },
}

impl Error {
    /// Builds the error for a failing `CUresult` returned by `call`.
    ///
    /// ```
    /// use cuda_sys::{Error, CUresult};
    /// let e = Error::from_code(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2");
    /// assert!(e.is_out_of_memory());
    /// assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
    /// ```
    pub fn from_code(code: CUresult, call: &'static str) -> Self {
        let (name, description) = crate::driver_api::error_info(code.0).unwrap_or((
            "CUDA_ERROR_UNRECOGNIZED",
            "a code this header does not know",
        ));
        Error::Driver {
            call,
            code: code.0,
            name,
            description,
        }
    }

    /// The driver's code, if the driver returned one.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            Error::Driver { code, .. } => Some(CUresult(*code)),
            _ => None,
        }
    }

    /// Whether the driver ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Whether the error leaves the context unusable (a sticky error: every later call in
    /// this context fails the same way until the process or primary context is reset).
    pub fn is_sticky(&self) -> bool {
        matches!(
            self.code(),
            Some(
                CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
                    | CUresult::CUDA_ERROR_LAUNCH_FAILED
                    | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
                    | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
                    | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
                    | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
                    | CUresult::CUDA_ERROR_INVALID_PC
                    | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
                    | CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE
                    | CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED
                    | CUresult::CUDA_ERROR_ASSERT
                    | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
                    | CUresult::CUDA_ERROR_CONTAINED
                    | CUresult::CUDA_ERROR_TENSOR_MEMORY_LEAK
                    | CUresult::CUDA_ERROR_EXTERNAL_DEVICE
                    | CUresult::CUDA_ERROR_MPS_CLIENT_TERMINATED
            )
        )
    }

    /// The header's name and description of a code, without a driver.
    ///
    /// ```
    /// let (name, _) = cuda_sys::Error::describe(2).unwrap();
    /// assert_eq!(name, "CUDA_ERROR_OUT_OF_MEMORY");
    /// ```
    pub fn describe(code: u32) -> Option<(&'static str, &'static str)> {
        crate::driver_api::error_info(code)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::DriverNotFound { tried, reason } => write!(
                f,
                "CUDA driver not found (tried {}): {reason}",
                tried.join(", ")
            ),
            Error::MissingSymbol { symbol } => write!(
                f,
                "the loaded CUDA driver has no entry point {symbol} (driver older than the CUDA 13.0 header)"
            ),
            Error::Driver {
                call,
                code,
                name,
                description,
            } => write!(f, "{call} failed with {name} ({code}): {description}"),
        }
    }
}

impl std::error::Error for Error {}

/// Turns a `CUresult` from `call` into a `Result`.
///
/// ```
/// use cuda_sys::{check, CUresult};
/// assert!(check(CUresult::CUDA_SUCCESS, "cuInit").is_ok());
/// assert!(check(CUresult::CUDA_ERROR_INVALID_VALUE, "cuInit").is_err());
/// ```
#[inline]
pub fn check(code: CUresult, call: &'static str) -> Result<(), Error> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::from_code(code, call))
    }
}
