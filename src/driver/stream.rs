use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};
use std::sync::Arc;

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
    /// How far the host's waits for the stream have come.
    syncs: Arc<SyncCounts>,
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
        Ok(Stream {
            raw,
            syncs: Arc::default(),
            _ctx: ctx,
        })
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
        let ticket = self.syncs.begin();
        // SAFETY: raw is a live stream.
        unsafe { api()?.cuStreamSynchronize(self.raw)? };
        self.syncs.returned(ticket);
        Ok(())
    }

    /// A mark of the work queued on this stream so far (taken after queuing it), which
    /// tells it done with no driver call once a [`Stream::synchronize`] begun after the
    /// mark has returned.
    pub(crate) fn mark(&self) -> StreamMark {
        StreamMark {
            mark: self.syncs.mark(),
            syncs: self.syncs.clone(),
        }
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

/// How far the host's waits for one stream ([`Stream::synchronize`]) have come: the work
/// queued on the stream before a mark was taken is done once a wait begun after it has
/// returned.
#[derive(Debug, Default)]
struct SyncCounts {
    /// Waits begun.
    begun: AtomicU64,
    /// One more than the number of the latest-begun wait that returned without error.
    returned: AtomicU64,
}

impl SyncCounts {
    /// A mark of the work queued on the stream so far (taken after queuing it).
    fn mark(&self) -> u64 {
        // A read-modify-write that adds nothing, not a load: a wait that then counts
        // itself after it is ordered after it, and so after the work queued before it.
        self.begun.fetch_add(0, SeqCst)
    }

    /// Whether a wait begun after `mark` has returned: the work before it is done.
    fn passed(&self, mark: u64) -> bool {
        self.returned.load(Acquire) > mark
    }

    /// Counts a wait about to begin: its number.
    fn begin(&self) -> u64 {
        self.begun.fetch_add(1, SeqCst)
    }

    /// Counts the wait numbered `ticket` as returned.
    fn returned(&self, ticket: u64) {
        self.returned.fetch_max(ticket + 1, Release);
    }
}

/// A point in a stream's queue ([`Stream::mark`]). Asking whether the work before it is
/// done costs no driver call, where an event query costs about 1 us; it is known only
/// once the host has waited for the stream since.
#[derive(Clone, Debug)]
pub(crate) struct StreamMark {
    syncs: Arc<SyncCounts>,
    mark: u64,
}

impl StreamMark {
    /// Whether a wait for the stream begun after the mark has returned: the work queued
    /// before the mark is done.
    pub(crate) fn known_done(&self) -> bool {
        self.syncs.passed(self.mark)
    }
}

#[cfg(test)]
mod tests {
    use super::SyncCounts;

    #[test]
    fn a_mark_is_passed_only_by_a_wait_begun_after_it_that_returned() {
        let s = SyncCounts::default();
        let early = s.begin(); // a wait begun before the work was queued
        let mark = s.mark(); // the work queued, then marked
        s.returned(early);
        assert!(
            !s.passed(mark),
            "a wait begun before the mark shows nothing"
        );
        let _failed = s.begin(); // a wait that fails is never counted returned
        assert!(!s.passed(mark));
        let (late, later) = (s.begin(), s.begin());
        s.returned(later);
        assert!(s.passed(mark), "a wait begun after the mark returned");
        s.returned(late); // back after a later-begun one: the count stays
        assert!(s.passed(mark));
        let next = s.mark();
        assert!(!s.passed(next), "work queued since the last wait");
    }
}
