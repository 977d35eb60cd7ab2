use cuda_sys::{CUevent, CUevent_flags, CUresult};

use super::{api, Stream};
use crate::Result;

/// An event used for ordering (timing disabled, so recording is cheap), destroyed on drop.
pub struct Event {
    raw: CUevent,
}

// SAFETY: event handles may be used from any thread with their context current.
unsafe impl Send for Event {}
// SAFETY: see `Send`.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event without timing. The caller has made the owning context current.
    pub fn new() -> Result<Self> {
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuEventCreate(&mut raw, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)? };
        Ok(Event { raw })
    }

    /// Creates an event that records timestamps, for [`Event::elapsed_ms`].
    pub fn new_timing() -> Result<Self> {
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        unsafe { api()?.cuEventCreate(&mut raw, CUevent_flags::CU_EVENT_DEFAULT.0)? };
        Ok(Event { raw })
    }

    /// Milliseconds of device time between `start` and `self` (both timing events, both
    /// complete).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: out-pointer is a valid local; both events are live.
        unsafe { api()?.cuEventElapsedTime(&mut ms, start.raw, self.raw)? };
        Ok(ms)
    }

    /// The raw handle.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live.
        unsafe { api()?.cuEventRecord(self.raw, stream.raw())? };
        Ok(())
    }

    /// Blocks until the work before the last record is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live event.
        unsafe { api()?.cuEventSynchronize(self.raw)? };
        Ok(())
    }

    /// Whether the work before the last record is done, without blocking.
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
