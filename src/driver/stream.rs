use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
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
    /// The work queued on the stream, and how far the host's waits for it have come.
    counts: Arc<QueueCounts>,
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
            counts: Arc::default(),
            _ctx: ctx,
        })
    }

    /// The raw handle. Work queued through it is not counted, so once it has been handed
    /// out the crate no longer tells the stream idle without asking the driver.
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
        self.counts.escaped.store(true, Relaxed);
        self.raw
    }

    /// Queues work on the stream: runs `queue` with the raw handle, then counts it (whether
    /// or not the call succeeded), so that [`Stream::known_idle`] and the marks cover it.
    #[inline]
    pub(crate) fn queue<R>(&self, queue: impl FnOnce(CUstream) -> R) -> R {
        let queued = queue(self.raw);
        self.counts.count_queued();
        queued
    }

    /// [`Stream::queue`], and a mark of the work queued so far, this call's included: it
    /// tells that work done with no driver call once a [`Stream::synchronize`] (or an
    /// [`Stream::is_idle`] that found the stream idle) begun after it has returned.
    pub(super) fn queue_marked<R>(&self, queue: impl FnOnce(CUstream) -> R) -> (R, StreamMark) {
        let before = self.counts.begin_wait();
        let queued = queue(self.raw);
        let mark = StreamMark::new(self.counts.clone(), before, self.counts.count_queued());
        (queued, mark)
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
        let d = api()?;
        // SAFETY: both handles are live.
        self.queue(|raw| unsafe { d.cuStreamWaitEvent(raw, event.handle(), 0) })?;
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
        let d = api()?;
        let ticket = self.counts.begin_wait();
        // SAFETY: raw is a live stream.
        match unsafe { d.cuStreamQuery(self.raw) } {
            Ok(()) => {
                self.counts.waited(ticket);
                Ok(true)
            }
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
        let d = api()?;
        let ticket = self.counts.begin_wait();
        // SAFETY: raw is a live stream.
        unsafe { d.cuStreamSynchronize(self.raw)? };
        self.counts.waited(ticket);
        Ok(())
    }

    /// Whether all work queued on the stream before this call is known done, with no
    /// driver call: the host has waited for the stream (or found it idle) since the crate
    /// last queued work on it, and the raw handle was never handed out (work queued
    /// through it is not counted). False does not mean busy: ask [`Stream::is_idle`].
    pub(crate) fn known_idle(&self) -> bool {
        self.counts.all_done()
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

/// The work queued on one stream, counted, and how far the host's waits for it have come:
/// the work counted before a wait began is done once the wait has returned.
#[derive(Debug, Default)]
struct QueueCounts {
    /// Work queued (counted after it is queued); a mark is this count.
    queued: AtomicU64,
    /// The count a wait that returned saw as it began (the largest of them): the work up
    /// to it is done.
    done: AtomicU64,
    /// The raw handle was handed out: work may be queued that is not counted.
    escaped: AtomicBool,
}

impl QueueCounts {
    /// Counts work just queued: its mark.
    fn count_queued(&self) -> u64 {
        // A read-modify-write: a wait that reads the count after it (also a
        // read-modify-write) is ordered after it, and so after the work queued before it.
        self.queued.fetch_add(1, SeqCst) + 1
    }

    /// A wait about to begin: the count of the work it will cover.
    fn begin_wait(&self) -> u64 {
        self.queued.fetch_add(0, SeqCst)
    }

    /// The wait begun with `ticket` returned without error (or found the stream idle).
    fn waited(&self, ticket: u64) {
        self.done.fetch_max(ticket, Release);
    }

    /// Whether the work counted up to `mark` is done.
    fn passed(&self, mark: u64) -> bool {
        self.done.load(Acquire) >= mark
    }

    /// Whether all the work counted so far is done, and none was queued uncounted.
    fn all_done(&self) -> bool {
        !self.escaped.load(Relaxed) && self.passed(self.queued.load(SeqCst))
    }
}

/// A point in a stream's queue ([`Stream::queue_marked`]). Asking whether the work before it is
/// done costs no driver call, where an event query costs about 1 us; it is known only
/// once the host has waited for the stream since.
#[derive(Clone, Debug)]
pub(super) struct StreamMark {
    counts: Arc<QueueCounts>,
    mark: u64,
    /// The count up to which work was queued before the marked call: what the call's
    /// completion covers ([`StreamMark::reached`]).
    covers: u64,
}

impl StreamMark {
    /// The mark `mark` of a call queued when the stream's count was `before`. Work counted
    /// between the two, by other threads, may have been queued after the call (each count
    /// follows its queueing), so the call's completion covers only the work up to
    /// `before`, or, with none counted between, its own count too.
    fn new(counts: Arc<QueueCounts>, before: u64, mark: u64) -> Self {
        let covers = if mark == before + 1 { mark } else { before };
        StreamMark {
            counts,
            mark,
            covers,
        }
    }

    /// Whether a wait for the stream begun after the mark has returned: the work queued
    /// before the mark is done.
    pub(crate) fn known_done(&self) -> bool {
        self.counts.passed(self.mark)
    }

    /// Whether `other` is this same point of this same stream.
    pub(super) fn same_point(&self, other: &StreamMark) -> bool {
        Arc::ptr_eq(&self.counts, &other.counts) && self.mark == other.mark
    }

    /// The marked call is done (an event recorded by it was found complete), and so the
    /// work queued before it: as a wait for the stream that returned, begun when the call
    /// was queued. Work counted by other threads while the call was queued is left out,
    /// since it may have been queued after it.
    pub(super) fn reached(&self) {
        self.counts.waited(self.covers);
    }
}

#[cfg(test)]
mod tests {
    use super::QueueCounts;

    #[test]
    fn a_mark_is_passed_only_by_a_wait_begun_after_it_that_returned() {
        let s = QueueCounts::default();
        let early = s.begin_wait(); // a wait begun before the work was queued
        let mark = s.count_queued(); // the work queued, then marked
        s.waited(early);
        assert!(
            !s.passed(mark),
            "a wait begun before the mark shows nothing"
        );
        let _failed = s.begin_wait(); // a wait that fails is never counted as returned
        assert!(!s.passed(mark));
        let (late, later) = (s.begin_wait(), s.begin_wait());
        s.waited(later);
        assert!(s.passed(mark), "a wait begun after the mark returned");
        s.waited(late); // back after a later-begun one: the count stays
        assert!(s.passed(mark));
        let next = s.count_queued();
        assert!(!s.passed(next), "work queued since the last wait");
    }

    #[test]
    fn a_mark_reached_covers_the_work_up_to_it_and_no_more() {
        use super::StreamMark;
        use std::sync::Arc;
        let counts = Arc::new(QueueCounts::default());
        let mark_at = |mark| StreamMark::new(counts.clone(), mark - 1, mark);
        let (first, second) = (counts.count_queued(), counts.count_queued());
        let (a, b) = (mark_at(first), mark_at(second));
        assert!(a.same_point(&mark_at(first)) && !a.same_point(&b));
        let elsewhere = StreamMark::new(Arc::new(QueueCounts::default()), first - 1, first);
        assert!(!a.same_point(&elsewhere), "another stream's point");
        a.reached();
        assert!(a.known_done() && !b.known_done(), "later work not covered");
        assert!(!counts.all_done());
        b.reached();
        assert!(
            counts.all_done(),
            "the last work reached: the stream is idle"
        );
        a.reached(); // an earlier point found again: nothing goes back
        assert!(b.known_done());
    }

    #[test]
    fn a_mark_reached_leaves_out_work_counted_while_its_call_was_queued() {
        use super::StreamMark;
        use std::sync::Arc;
        let counts = Arc::new(QueueCounts::default());
        let earlier = counts.count_queued();
        // Thread A reads the count and queues an event record; thread B queues work after
        // the record and counts it; A counts its record.
        let before = counts.begin_wait();
        let other = counts.count_queued();
        let record = StreamMark::new(counts.clone(), before, counts.count_queued());
        record.reached();
        assert!(
            counts.passed(earlier),
            "work counted before the record is covered"
        );
        assert!(
            !counts.passed(other),
            "work another thread counted meanwhile may follow the record"
        );
        assert!(!record.known_done() && !counts.all_done());
        // A wait begun after both covers them.
        counts.waited(counts.begin_wait());
        assert!(record.known_done() && counts.all_done());
    }

    #[test]
    fn a_stream_is_known_idle_only_after_a_wait_that_covers_all_its_work() {
        let s = QueueCounts::default();
        assert!(s.all_done(), "nothing queued yet");
        s.count_queued();
        assert!(!s.all_done(), "work queued, never waited for");
        let ticket = s.begin_wait();
        s.count_queued(); // queued while the wait runs: not covered by it
        s.waited(ticket);
        assert!(!s.all_done());
        let ticket = s.begin_wait();
        s.waited(ticket);
        assert!(s.all_done(), "a wait begun after the last work returned");
        s.escaped.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            !s.all_done(),
            "once the raw handle is out, uncounted work may be queued"
        );
    }

    #[test]
    fn waits_on_many_threads_never_cover_work_queued_after_they_began() {
        use std::sync::Arc;
        let s = Arc::new(QueueCounts::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let ticket = s.begin_wait();
                        let mark = s.count_queued();
                        s.waited(ticket);
                        assert!(
                            ticket < mark,
                            "a wait's ticket is below every mark taken after it began"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            !s.all_done(),
            "the last mark of some thread came after every wait began"
        );
        let ticket = s.begin_wait();
        s.waited(ticket);
        assert!(s.all_done());
    }
}
