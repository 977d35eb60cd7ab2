//! Which contexts a device fault broke. A sticky driver error (an illegal address and the
//! like) breaks the context for the whole process, so every HAL on it shares one
//! [`Poisoning`]: the first sticky error any of them meets, on whatever path, refuses the
//! next operation of each of them before it reaches the driver. A context is known here
//! while a HAL on it lives; one retained after they are all gone starts clean, and the
//! driver then says whether it still works.

use std::convert::Infallible;
use std::sync::Arc;

use cuda_sys::CUcontext;
use once_cell::sync::OnceCell;

use super::api;
use super::per_context::PerContext;

/// The poisoning of one context, shared by the HALs on it.
#[derive(Debug, Default)]
pub(crate) struct Poisoning {
    /// The sticky error that broke the context: the first one is kept (a later one is its
    /// consequence).
    cause: OnceCell<cuda_sys::Error>,
}

/// The poisoning of each context HALs live on.
static CONTEXTS: PerContext<Poisoning> = PerContext::new();

impl Poisoning {
    /// The poisoning of context `ctx`, shared with every live HAL on it.
    pub(crate) fn of(ctx: CUcontext) -> Arc<Poisoning> {
        match CONTEXTS.get_or_make(ctx, || Ok::<_, Infallible>(Poisoning::default())) {
            Ok(p) => p,
            Err(never) => match never {},
        }
    }

    /// The error that broke the context, if one did.
    #[inline]
    pub(crate) fn cause(&self) -> Option<&cuda_sys::Error> {
        self.cause.get()
    }

    /// Records `e` as breaking the context, unless an earlier error did; true if it is the
    /// first.
    pub(crate) fn set(&self, e: &cuda_sys::Error) -> bool {
        self.cause.set(e.clone()).is_ok()
    }
}

/// Records sticky error `e`, just returned by a call made in the context current on this
/// thread (the crate binds a HAL's context for every call it makes), as breaking that
/// context for the HALs on it.
#[cold]
pub(crate) fn note_sticky(e: &cuda_sys::Error) {
    let Ok(d) = api() else { return };
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a valid place for the driver to write a handle.
    if unsafe { d.cuCtxGetCurrent(&mut current) }.is_err() || current.is_null() {
        return;
    }
    if let Some(p) = CONTEXTS.get(current) {
        if p.set(e) {
            log::error!("CUDA context {current:?} poisoned: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_sys::CUresult;

    fn fault() -> cuda_sys::Error {
        cuda_sys::Error::from_code(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize")
    }

    #[test]
    fn the_hals_of_one_context_share_its_poisoning_while_one_lives() {
        let (a, b) = (0x1000 as CUcontext, 0x2000 as CUcontext);
        let (a1, a2, b1) = (Poisoning::of(a), Poisoning::of(a), Poisoning::of(b));
        assert!(a1.set(&fault()));
        assert!(!a2.set(&fault()), "the first error is kept");
        assert_eq!(a2.cause(), Some(&fault()));
        assert!(b1.cause().is_none(), "another context is not touched");
        drop((a1, a2));
        // Every HAL on `a` gone: a context retained again starts clean.
        assert!(Poisoning::of(a).cause().is_none());
    }
}
