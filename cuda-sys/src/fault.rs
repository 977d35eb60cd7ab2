//! Fault injection, for tests of error paths (feature `fault-injection`, off by default).
//!
//! Once armed (`fault::arm`), every call of a driver entry point that returns a `CUresult`
//! is counted, and the `n`-th fails with the code the caller chooses *before* the driver is
//! called, as if the driver had refused it: nothing it would have made exists. Without the
//! feature, the check every entry point makes is empty and compiles away.
//!
//! ```
//! # #[cfg(feature = "fault-injection")]
//! # {
//! use cuda_sys::{fault, CUresult};
//! fault::arm(1, |_| CUresult::CUDA_ERROR_OUT_OF_MEMORY);
//! if let Ok(d) = cuda_sys::driver() {
//!     let mut version = 0;
//!     // SAFETY: `version` is a valid place for an int; the call fails before the driver.
//!     let r = unsafe { d.cuDriverGetVersion(&mut version) };
//!     assert!(r.is_err());
//! }
//! let injected = fault::disarm();
//! assert!(injected.failed.is_none() || injected.calls >= 1);
//! # }
//! ```

use crate::error::Error;

/// The check each entry point makes before it calls the driver.
#[inline(always)]
pub(crate) fn before(symbol: &'static str) -> Result<(), Error> {
    #[cfg(feature = "fault-injection")]
    imp::before(symbol)?;
    let _ = symbol;
    Ok(())
}

#[cfg(feature = "fault-injection")]
pub use imp::{arm, disarm, Injected};

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::Mutex;

    use crate::bindings::CUresult;
    use crate::error::Error;

    struct State {
        armed: bool,
        calls: u64,
        fail_at: u64,
        code: fn(&'static str) -> CUresult,
        failed: Option<&'static str>,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        armed: false,
        calls: 0,
        fail_at: 0,
        code: |_| CUresult::CUDA_ERROR_UNKNOWN,
        failed: None,
    });

    fn state() -> std::sync::MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What an armed run saw: the calls counted, and the entry point that was made to fail.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Injected {
        /// Calls of fallible entry points, on every thread, since [`arm`].
        pub calls: u64,
        /// The entry point whose call failed, if the run reached call `fail_at`.
        pub failed: Option<&'static str>,
    }

    /// Counts calls from now on; call `fail_at` (1 for the next; 0 for none) fails with
    /// `code(symbol)`, unless that is `CUDA_SUCCESS` (a call left alone goes ahead).
    pub fn arm(fail_at: u64, code: fn(&'static str) -> CUresult) {
        *state() = State {
            armed: true,
            calls: 0,
            fail_at,
            code,
            failed: None,
        };
    }

    /// Stops counting; what the run saw.
    pub fn disarm() -> Injected {
        let mut s = state();
        s.armed = false;
        Injected {
            calls: s.calls,
            failed: s.failed,
        }
    }

    pub(super) fn before(symbol: &'static str) -> Result<(), Error> {
        let mut s = state();
        if !s.armed {
            return Ok(());
        }
        s.calls += 1;
        if s.calls != s.fail_at {
            return Ok(());
        }
        let code = (s.code)(symbol);
        if code == CUresult::CUDA_SUCCESS {
            // A call the caller leaves alone: it goes ahead.
            return Ok(());
        }
        s.failed = Some(symbol);
        Err(Error::from_code(code, symbol))
    }
}
