//! Fault injection, for tests of error paths (feature `fault-injection`, off by default).
//!
//! Once armed (`fault::arm`), every call of a driver entry point that returns a `CUresult`
//! is counted, and the `n`-th fails as the caller chooses by entry point (`FailOnce`); or,
//! armed with `fault::arm_nth`, the `n`-th call of one entry point, which stays the same
//! call when other calls come and go between runs (a query skipped because its stream's
//! work was already known done). `fault::called` lists the entry points called, in order:
//! a run made with nothing failing names every call a later run can pick. The call is
//! refused *before* the driver is called, as if the driver had refused it (nothing it would
//! have made exists), or made and then reported as failed (a release whose memory is gone
//! all the same). Without the feature, the checks every entry point makes are empty and
//! compile away.
//!
//! `fault::pause` and `fault::resume` leave out the calls made in between (a test's own
//! checks), and the count goes on after them.
//!
//! `fault::arm_sticky` plays a sticky error instead (a device fault): from the `n`-th call
//! on, every call fails, as in a context the fault broke. How each call fails is the
//! caller's choice (`OnceStuck`): device work fails before the driver sees it, while waits
//! and releases are made and then reported as failed (a broken context finishes no new
//! work, and its memory goes with it), so a test process keeps a working context
//! underneath.
//!
//! ```
//! # #[cfg(feature = "fault-injection")]
//! # {
//! use cuda_sys::{fault, CUresult};
//! fault::arm(1, |_| fault::FailOnce::Refused(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
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

/// The check each entry point makes of the driver's answer `result`.
#[inline(always)]
pub(crate) fn after(symbol: &'static str, result: Result<(), Error>) -> Result<(), Error> {
    #[cfg(feature = "fault-injection")]
    return imp::after(symbol, result);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = symbol;
        result
    }
}

#[cfg(feature = "fault-injection")]
pub use imp::{
    arm, arm_nth, arm_sticky, called, disarm, pause, resume, FailOnce, Injected, OnceStuck,
};

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use crate::bindings::CUresult;
    use crate::error::Error;

    struct State {
        armed: bool,
        calls: u64,
        fail_at: u64,
        /// With [`arm_nth`]: the entry point whose call `fail_at` (counting its calls
        /// alone) fails; else `fail_at` counts every call.
        only: Option<&'static str>,
        /// Calls of `only` so far.
        only_calls: u64,
        /// The entry points called, in order, since the last arm.
        called: Vec<&'static str>,
        how: fn(&'static str) -> FailOnce,
        failed: Option<&'static str>,
        /// With [`arm`]: the call made to fail after the driver answers, on its thread, and
        /// the code it then fails with.
        late: Option<(ThreadId, &'static str, CUresult)>,
        /// With [`arm_sticky`]: the sticky failure's code, and how each call behaves once
        /// it struck.
        sticky: Option<(CUresult, Classify)>,
        /// Whether the sticky failure struck.
        stuck: bool,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        armed: false,
        calls: 0,
        fail_at: 0,
        only: None,
        only_calls: 0,
        called: Vec::new(),
        how: |_| FailOnce::LeftAlone,
        failed: None,
        late: None,
        sticky: None,
        stuck: false,
    });

    /// How a call behaves once a sticky failure struck, by entry point.
    type Classify = fn(&'static str) -> OnceStuck;

    /// What a driver call does once a sticky failure struck (see [`arm_sticky`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum OnceStuck {
        /// Fails before the driver is called: what it would do never happens (device work,
        /// allocations, copies, launches).
        Fails,
        /// Is made, then reported as failed: waits and releases (a broken context finishes
        /// no new work, and what it held goes with it).
        RunsThenFails,
        /// Goes ahead as if nothing had happened (calls outside the context's work, such as
        /// the thread's context stack); it does not strike the failure either.
        Unaffected,
    }

    /// How the call [`arm`] picks fails, by entry point.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FailOnce {
        /// Refused before the driver is called, with this code: what it would do never
        /// happens (for a release, what it releases leaks).
        Refused(CUresult),
        /// Made, then reported as failed with this code: a release whose memory is gone
        /// all the same, as a caller that treats the error as "maybe not released" would
        /// double-free.
        RunsThenFails(CUresult),
        /// Goes ahead: no call fails in this run.
        LeftAlone,
    }

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

    /// Counts calls from now on; call `fail_at` (1 for the next; 0 for none) fails as
    /// `how(symbol)` says.
    pub fn arm(fail_at: u64, how: fn(&'static str) -> FailOnce) {
        arm_only(fail_at, how, None);
    }

    /// [`arm`], counting only the calls of `only` where given: in one lock section, so
    /// that no call of another thread is counted in between.
    fn arm_only(fail_at: u64, how: fn(&'static str) -> FailOnce, only: Option<&'static str>) {
        *state() = State {
            armed: true,
            calls: 0,
            fail_at,
            only,
            only_calls: 0,
            called: Vec::new(),
            how,
            failed: None,
            late: None,
            sticky: None,
            stuck: false,
        };
    }

    /// Counts calls from now on; the `nth` call (1 for the next) of entry point `symbol`
    /// fails as `how(symbol)` says. Calls of other entry points, however many, do not move
    /// it.
    pub fn arm_nth(symbol: &'static str, nth: u64, how: fn(&'static str) -> FailOnce) {
        arm_only(nth, how, Some(symbol));
    }

    /// The entry points called (and counted) since the last arm, in order. The `k`-th
    /// call's place among the calls of its entry point is what [`arm_nth`] takes.
    pub fn called() -> Vec<&'static str> {
        state().called.clone()
    }

    /// Counts calls from now on; the first call from call `fail_at` on (1 for the next; 0
    /// for none) that `once_stuck` does not leave [`OnceStuck::Unaffected`] strikes a
    /// sticky failure with `code`: it and every later call fail as `once_stuck` says, on
    /// every thread, until [`disarm`].
    pub fn arm_sticky(fail_at: u64, code: CUresult, once_stuck: fn(&'static str) -> OnceStuck) {
        *state() = State {
            armed: true,
            calls: 0,
            fail_at,
            only: None,
            only_calls: 0,
            called: Vec::new(),
            how: |_| FailOnce::LeftAlone,
            failed: None,
            late: None,
            sticky: Some((code, once_stuck)),
            stuck: false,
        };
    }

    /// Stops counting for a while (calls made meanwhile neither count nor fail), until
    /// [`resume`]; what the run saw so far.
    pub fn pause() -> Injected {
        stop_counting(&mut state())
    }

    /// Counts again after [`pause`], from where it stopped.
    pub fn resume() {
        state().armed = true;
    }

    /// Stops counting; what the run saw.
    pub fn disarm() -> Injected {
        let mut s = state();
        s.late = None;
        stop_counting(&mut s)
    }

    /// Stops counting; what the run saw so far.
    fn stop_counting(s: &mut State) -> Injected {
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
        s.called.push(symbol);
        if let Some((code, once_stuck)) = s.sticky {
            let how = once_stuck(symbol);
            if !s.stuck && s.fail_at != 0 && s.calls >= s.fail_at && how != OnceStuck::Unaffected {
                s.stuck = true;
                s.failed = Some(symbol);
            }
            return match how {
                OnceStuck::Fails if s.stuck => Err(Error::from_code(code, symbol)),
                _ => Ok(()),
            };
        }
        let picked = match s.only {
            Some(only) if only == symbol => {
                s.only_calls += 1;
                s.only_calls == s.fail_at
            }
            Some(_) => false,
            None => s.calls == s.fail_at,
        };
        if !picked {
            return Ok(());
        }
        match (s.how)(symbol) {
            FailOnce::Refused(code) => {
                s.failed = Some(symbol);
                Err(Error::from_code(code, symbol))
            }
            FailOnce::RunsThenFails(code) => {
                s.failed = Some(symbol);
                s.late = Some((std::thread::current().id(), symbol, code));
                Ok(())
            }
            FailOnce::LeftAlone => Ok(()),
        }
    }

    pub(super) fn after(symbol: &'static str, result: Result<(), Error>) -> Result<(), Error> {
        let mut s = state();
        if let Some((thread, late, code)) = s.late {
            if late == symbol && thread == std::thread::current().id() {
                s.late = None;
                return Err(Error::from_code(code, symbol));
            }
        }
        match s.sticky {
            Some((code, once_stuck)) if s.armed && s.stuck => match once_stuck(symbol) {
                OnceStuck::RunsThenFails => Err(Error::from_code(code, symbol)),
                _ => result,
            },
            _ => result,
        }
    }
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;
    use crate::bindings::CUresult;

    fn how(symbol: &'static str) -> OnceStuck {
        match symbol {
            "cuCtxGetCurrent" => OnceStuck::Unaffected,
            "cuStreamSynchronize" => OnceStuck::RunsThenFails,
            _ => OnceStuck::Fails,
        }
    }

    // The state is global: one test walks through every mode.
    #[test]
    fn calls_fail_as_the_armed_mode_says() {
        // Once: call 2 alone fails, before the driver.
        arm(2, |_| FailOnce::Refused(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(before("cuMemAlloc_v2").is_ok());
        let e = before("cuMemAlloc_v2").unwrap_err();
        assert_eq!(e.code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(before("cuMemAlloc_v2").is_ok());
        assert_eq!(after("cuStreamSynchronize", Ok(())), Ok(()));
        let seen = disarm();
        assert_eq!((seen.calls, seen.failed), (3, Some("cuMemAlloc_v2")));

        // Sticky from call 2: an unaffected call there does not strike, the next call does,
        // and every later one fails as it is classified.
        arm_sticky(2, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, how);
        assert!(before("cuMemcpyHtoD_v2").is_ok());
        assert!(before("cuCtxGetCurrent").is_ok());
        assert_eq!(after("cuCtxGetCurrent", Ok(())), Ok(()));
        // Made (not refused before the driver), then reported as failed.
        assert!(before("cuStreamSynchronize").is_ok());
        let e = after("cuStreamSynchronize", Ok(())).unwrap_err();
        assert_eq!(e.code(), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(before("cuMemcpyHtoD_v2").is_err());
        assert!(before("cuCtxGetCurrent").is_ok());
        assert!(after("cuStreamSynchronize", Ok(())).is_err());
        let seen = disarm();
        assert_eq!((seen.calls, seen.failed), (5, Some("cuStreamSynchronize")));

        // Once, made then failed: call 2 reaches the driver, and its answer alone fails
        // (another entry point's answer, or a later one's, does not).
        arm(2, |s| match s {
            "cuMemFree_v2" => FailOnce::RunsThenFails(CUresult::CUDA_ERROR_INVALID_VALUE),
            _ => FailOnce::Refused(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        });
        assert!(before("cuMemFree_v2").is_ok());
        assert_eq!(after("cuMemFree_v2", Ok(())), Ok(()));
        assert!(before("cuMemFree_v2").is_ok());
        assert_eq!(after("cuMemcpyHtoD_v2", Ok(())), Ok(()));
        let e = after("cuMemFree_v2", Ok(())).unwrap_err();
        assert_eq!(e.code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(after("cuMemFree_v2", Ok(())), Ok(()));
        assert_eq!(disarm().failed, Some("cuMemFree_v2"));

        // Left alone: the call picked goes ahead, and nothing fails.
        arm(1, |_| FailOnce::LeftAlone);
        assert!(before("cuMemAlloc_v2").is_ok());
        assert_eq!(after("cuMemAlloc_v2", Ok(())), Ok(()));
        assert_eq!(
            disarm(),
            Injected {
                calls: 1,
                failed: None
            }
        );

        // Paused: calls meanwhile neither count nor fail; resumed, the count goes on.
        arm(2, |_| FailOnce::Refused(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(before("cuMemAlloc_v2").is_ok());
        assert_eq!(pause().calls, 1);
        assert!(before("cuMemAlloc_v2").is_ok());
        resume();
        assert!(before("cuMemAlloc_v2").is_err());
        assert_eq!(disarm().calls, 2);

        // By entry point: the second call of cuMemFree_v2 fails, however many other calls
        // come first; the calls are listed in order.
        arm_nth("cuMemFree_v2", 2, |_| {
            FailOnce::Refused(CUresult::CUDA_ERROR_INVALID_VALUE)
        });
        assert!(before("cuMemFree_v2").is_ok());
        assert!(before("cuMemAlloc_v2").is_ok());
        assert!(before("cuMemAlloc_v2").is_ok());
        assert!(before("cuMemFree_v2").is_err());
        assert!(before("cuMemFree_v2").is_ok());
        assert_eq!(
            called(),
            [
                "cuMemFree_v2",
                "cuMemAlloc_v2",
                "cuMemAlloc_v2",
                "cuMemFree_v2",
                "cuMemFree_v2"
            ]
        );
        assert_eq!(disarm().failed, Some("cuMemFree_v2"));
        arm_nth("cuMemFree_v2", 3, |_| {
            FailOnce::Refused(CUresult::CUDA_ERROR_INVALID_VALUE)
        });
        assert!(before("cuMemFree_v2").is_ok());
        assert!(before("cuMemFree_v2").is_ok());
        assert_eq!(disarm().failed, None);
        assert_eq!(called().len(), 2);

        // Disarmed: nothing fails.
        assert!(before("cuMemcpyHtoD_v2").is_ok());
        assert_eq!(after("cuStreamSynchronize", Ok(())), Ok(()));
    }
}
