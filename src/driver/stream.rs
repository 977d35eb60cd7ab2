use cuda_sys::{CUstream, CUstream_flags};

use super::{api, PrimaryContext};
use crate::Result;

/// A non-blocking stream, destroyed on drop. The owner keeps its context current.
///
/// ```
/// use cuda_hal::driver::{PrimaryContext, Stream};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// let s = Stream::new_non_blocking().unwrap();
/// s.synchronize().unwrap();
/// assert!(s.is_idle().unwrap());
/// ```
pub struct Stream {
    raw: CUstream,
    /// Keeps the context, and so the stream, alive.
    _ctx: PrimaryContext,
}

// SAFETY: stream handles may be used from any thread with their context current.
unsafe impl Send for Stream {}
// SAFETY: see `Send`; the handle is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream, in the
    /// primary context current on the thread, which it retains.
    ///
    /// ```
    /// use cuda_hal::driver::{PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let (a, b) = (Stream::new_non_blocking().unwrap(), Stream::new_non_blocking().unwrap());
    /// assert_ne!(a.raw(), b.raw());
    /// ```
    pub fn new_non_blocking() -> Result<Self> {
        let ctx = PrimaryContext::retain_current()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuStreamCreate(&mut raw, CUstream_flags::CU_STREAM_NON_BLOCKING.0)? };
        Ok(Stream { raw, _ctx: ctx })
    }

    /// The raw handle.
    ///
    /// ```
    /// use cuda_hal::driver::{PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert!(!Stream::new_non_blocking().unwrap().raw().is_null());
    /// ```
    #[inline]
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// Makes later work on this stream wait until `event` (as last recorded) completes.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let (a, b) = (Stream::new_non_blocking().unwrap(), Stream::new_non_blocking().unwrap());
    /// let e = Event::new().unwrap();
    /// e.record(&a).unwrap();
    /// b.wait_event(&e).unwrap();
    /// b.synchronize().unwrap();
    /// assert!(e.is_complete().unwrap(), "b waited for it");
    /// ```
    pub fn wait_event(&self, event: &super::Event) -> Result<()> {
        // SAFETY: both handles are live.
        unsafe { api()?.cuStreamWaitEvent(self.raw, event.raw(), 0)? };
        Ok(())
    }

    /// Whether all work queued on the stream so far is done, without blocking.
    ///
    /// ```
    /// use cuda_hal::driver::{PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// assert!(s.is_idle().unwrap(), "nothing queued yet");
    /// ```
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: raw is a live stream.
        match unsafe { api()?.cuStreamQuery(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(cuda_sys::CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Blocks until all work queued on the stream is done.
    ///
    /// ```
    /// use cuda_hal::driver::{PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// s.synchronize().unwrap();
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live stream.
        unsafe { api()?.cuStreamSynchronize(self.raw)? };
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: raw is a live stream destroyed once; pending work completes first.
            if let Err(e) = unsafe { d.cuStreamDestroy(self.raw) } {
                log::warn!("cuStreamDestroy failed: {e}");
            }
        }
    }
}
