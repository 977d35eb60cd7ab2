use cuda_sys::{CUevent, CUevent_flags, CUresult};

use super::{api, PrimaryContext, Stream};
use crate::Result;

/// An event used for ordering (timing disabled, so recording is cheap), destroyed on drop.
///
/// ```
/// use cuda_hal::driver::{Event, PrimaryContext, Stream};
/// let Ok(ctx) = PrimaryContext::retain(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// ctx.bind().unwrap();
/// let stream = Stream::new_non_blocking().unwrap();
/// let done = Event::new().unwrap();
/// done.record(&stream).unwrap();
/// done.synchronize().unwrap();
/// assert!(done.is_complete().unwrap());
/// ```
pub struct Event {
    raw: CUevent,
    /// Keeps the context, and so the event, alive.
    _ctx: PrimaryContext,
}

// SAFETY: event handles may be used from any thread with their context current.
unsafe impl Send for Event {}
// SAFETY: see `Send`.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event without timing, in the primary context current on the thread,
    /// which it retains.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let e = Event::new().unwrap();
    /// assert!(e.is_complete().unwrap(), "never recorded: nothing to wait for");
    /// ```
    pub fn new() -> Result<Self> {
        let ctx = PrimaryContext::retain_current()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuEventCreate(&mut raw, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)? };
        Ok(Event { raw, _ctx: ctx })
    }

    /// Creates an event that records timestamps, for [`Event::elapsed_ms`].
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// let (a, b) = (Event::new_timing().unwrap(), Event::new_timing().unwrap());
    /// a.record(&s).unwrap();
    /// b.record(&s).unwrap();
    /// b.synchronize().unwrap();
    /// assert!(b.elapsed_ms(&a).unwrap() >= 0.0);
    /// ```
    pub fn new_timing() -> Result<Self> {
        let ctx = PrimaryContext::retain_current()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuEventCreate(&mut raw, CUevent_flags::CU_EVENT_DEFAULT.0)? };
        Ok(Event { raw, _ctx: ctx })
    }

    /// Milliseconds of device time between `start` and `self` (both timing events, both
    /// complete).
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// let (untimed, timed) = (Event::new().unwrap(), Event::new_timing().unwrap());
    /// untimed.record(&s).unwrap();
    /// timed.record(&s).unwrap();
    /// s.synchronize().unwrap();
    /// assert!(timed.elapsed_ms(&untimed).is_err(), "both ends need timing");
    /// ```
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: out-pointer is a valid local; both events are live.
        unsafe { api()?.cuEventElapsedTime(&mut ms, start.raw, self.raw)? };
        Ok(ms)
    }

    /// The raw handle.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// assert!(!Event::new().unwrap().raw().is_null());
    /// ```
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// Records the event at the current end of `stream`.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let (producer, consumer) = (Stream::new_non_blocking().unwrap(), Stream::new_non_blocking().unwrap());
    /// let ready = Event::new().unwrap();
    /// ready.record(&producer).unwrap();
    /// consumer.wait_event(&ready).unwrap();
    /// consumer.synchronize().unwrap();
    /// ```
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live.
        unsafe { api()?.cuEventRecord(self.raw, stream.raw())? };
        Ok(())
    }

    /// Blocks until the work before the last record is done.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// let e = Event::new().unwrap();
    /// e.record(&s).unwrap();
    /// e.synchronize().unwrap();
    /// assert!(s.is_idle().unwrap());
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live event.
        unsafe { api()?.cuEventSynchronize(self.raw)? };
        Ok(())
    }

    /// Whether the work before the last record is done, without blocking.
    ///
    /// ```
    /// use cuda_hal::driver::{Event, PrimaryContext, Stream};
    /// let Ok(ctx) = PrimaryContext::retain(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// ctx.bind().unwrap();
    /// let s = Stream::new_non_blocking().unwrap();
    /// let e = Event::new().unwrap();
    /// e.record(&s).unwrap();
    /// while !e.is_complete().unwrap() {
    ///     std::hint::spin_loop();
    /// }
    /// ```
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: raw is a live event.
        match unsafe { api()?.cuEventQuery(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(d) = api() {
            // SAFETY: raw is a live event destroyed once.
            if let Err(e) = unsafe { d.cuEventDestroy(self.raw) } {
                log::warn!("cuEventDestroy failed: {e}");
            }
        }
    }
}
