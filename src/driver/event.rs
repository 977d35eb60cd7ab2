use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use cuda_sys::{CUevent, CUevent_flags, CUresult};
use parking_lot::Mutex;

use super::{api, PrimaryContext, Stream, StreamMark};
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
    /// Where the event was last recorded.
    recorded: Mutex<Recorded>,
    /// The raw handle was handed out: it may be recorded where the crate cannot see.
    escaped: AtomicBool,
    /// Keeps the context, and so the event, alive.
    _ctx: PrimaryContext,
}

/// Where an [`Event`] was last recorded.
enum Recorded {
    /// Nowhere: the event is complete.
    Never,
    /// At this point of its stream's queue: complete once that point is known done.
    At(StreamMark),
    /// A record that failed: the event may hold an earlier record of a stream it no
    /// longer knows.
    Unknown,
}

// SAFETY: event handles may be used from any thread with their context current.
unsafe impl Send for Event {}
// SAFETY: see `Send`.
unsafe impl Sync for Event {}

impl Event {
    /// A new event's wrapper: never recorded.
    fn from_raw(raw: CUevent, ctx: PrimaryContext) -> Self {
        Event {
            raw,
            recorded: Mutex::new(Recorded::Never),
            escaped: AtomicBool::new(false),
            _ctx: ctx,
        }
    }

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
        Ok(Event::from_raw(raw, ctx))
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
        Ok(Event::from_raw(raw, ctx))
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

    /// The raw handle. Once it is out, the event may be recorded where the crate cannot
    /// see, so the crate asks the driver whether it is complete.
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
        self.escaped.store(true, Relaxed);
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
        let d = api()?;
        let mut recorded = self.recorded.lock();
        // SAFETY: both handles are live.
        match stream.queue_marked(|raw| unsafe { d.cuEventRecord(self.raw, raw) }) {
            (Ok(()), mark) => {
                *recorded = Recorded::At(mark);
                Ok(())
            }
            (Err(e), _) => {
                *recorded = Recorded::Unknown;
                Err(e.into())
            }
        }
    }

    /// Whether the work before the last record is known done with no driver call: the
    /// host has waited for (or found idle) the stream it was recorded on since, or it was
    /// never recorded. False does not mean running: ask [`Event::is_complete`].
    pub(crate) fn known_done(&self) -> bool {
        if self.escaped.load(Relaxed) {
            return false;
        }
        match &*self.recorded.lock() {
            Recorded::Never => true,
            Recorded::At(mark) => mark.known_done(),
            Recorded::Unknown => false,
        }
    }

    /// Whether the work before the last record is done: known with no driver call where
    /// it can be ([`Event::known_done`]), else asked. An error of the query counts as not
    /// done (a wait on the event then reports it).
    pub(crate) fn done_now(&self) -> bool {
        self.known_done() || matches!(self.is_complete(), Ok(true))
    }

    /// The handle, for the crate's own calls that do not record the event.
    pub(super) fn handle(&self) -> CUevent {
        self.raw
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
        let last = self.last_record();
        // SAFETY: raw is a live event.
        unsafe { api()?.cuEventSynchronize(self.raw)? };
        self.found_complete(last);
        Ok(())
    }

    /// Where the event was last recorded, if this crate knows (no record through the
    /// handed-out handle, no failed record).
    fn last_record(&self) -> Option<StreamMark> {
        if self.escaped.load(Relaxed) {
            return None;
        }
        match &*self.recorded.lock() {
            Recorded::At(mark) => Some(mark.clone()),
            Recorded::Never | Recorded::Unknown => None,
        }
    }

    /// A wait for the event (or a query), begun when its last record was `last`, found it
    /// complete: the work queued on that stream up to the record is done, and the stream
    /// learns so ([`Stream::known_idle`], the marks), sparing later queries. Unless the
    /// event was recorded again meanwhile: the driver may have waited for the newer
    /// record, on another stream.
    fn found_complete(&self, last: Option<StreamMark>) {
        let Some(last) = last else { return };
        let unchanged = !self.escaped.load(Relaxed)
            && matches!(&*self.recorded.lock(), Recorded::At(now) if now.same_point(&last));
        if unchanged {
            last.reached();
        }
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
        let last = self.last_record();
        // SAFETY: raw is a live event.
        match unsafe { api()?.cuEventQuery(self.raw) } {
            Ok(()) => {
                self.found_complete(last);
                Ok(true)
            }
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
