//! Extra streams and events of a HAL, and the cross-stream bookkeeping that keeps a buffer
//! from being freed, reused or read while another stream may still be using it.
//!
//! Rules, applied by every operation that touches a buffer:
//! - work on a side stream first waits for everything queued on the HAL's main stream so
//!   far (allocations, uploads of host-newer data) and for the buffer's pending side uses
//!   it must follow;
//! - after the work, an event recorded on the side stream is attached to the buffer, with
//!   whether the work writes it;
//! - main-stream work on the buffer, and its free, first wait for those events.
//!
//! A write waits for every other stream's pending use of the buffer; a read waits only for
//! their writes, so that reads of one buffer (a table of twiddles read by kernels on
//! several streams and by the main stream) run side by side.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::driver::{Event, Stream};
use crate::hal::HalInner;
use crate::{CudaHal, Error, Result};

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// A new id for a stream's uses of allocations ([`SideUses`]), never 0 (a HAL's own main
/// stream) and never given twice in a process.
pub(crate) fn new_stream_id() -> u64 {
    NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed)
}

/// A non-blocking stream of a HAL, for transfers or kernels that should overlap the HAL's
/// main stream. Keeps the HAL alive.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let copies = hal.create_stream().unwrap();
/// let done = hal.create_event().unwrap();
/// done.record(&copies).unwrap();
/// hal.main_stream().wait_event(&done).unwrap();
/// ```
#[derive(Clone)]
pub struct HalStream {
    // Declared (so dropped) before the HAL, whose context it needs.
    pub(crate) stream: Arc<Stream>,
    pub(crate) hal: Arc<HalInner>,
    /// 0 for the HAL's main stream.
    pub(crate) id: u64,
}

/// An event of a HAL: record it on one stream, wait for it on another or on the host.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let side = hal.create_stream().unwrap();
/// let ready = hal.create_event().unwrap();
/// let x = hal.alloc::<u32>("x", 1 << 20).unwrap();
/// x.fill(1).unwrap(); // main stream
/// ready.record(&hal.main_stream()).unwrap();
/// side.wait_event(&ready).unwrap(); // the side stream's later work sees the fill
/// ready.synchronize().unwrap();
/// assert!(ready.is_complete().unwrap());
/// ```
pub struct HalEvent {
    // Declared (so dropped) before the HAL, whose context it needs.
    event: Event,
    hal: Arc<HalInner>,
}

impl CudaHal {
    /// A new non-blocking stream on this HAL's device.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// let b = hal.copy_from("b", &[1u32; 64]).unwrap();
    /// b.read_async_on(&side).unwrap().wait().unwrap(); // a download beside the main stream
    /// assert!(!side.is_main() && hal.main_stream().is_main());
    /// ```
    pub fn create_stream(&self) -> Result<HalStream> {
        self.inner.enter()?;
        Ok(HalStream {
            hal: self.inner.clone(),
            stream: Arc::new(Stream::new_non_blocking()?),
            id: new_stream_id(),
        })
    }

    /// The stream the HAL's own operations run on.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let main = hal.main_stream();
    /// assert!(main.is_main());
    /// assert_eq!(main.raw(), hal.stream_handle());
    /// ```
    pub fn main_stream(&self) -> HalStream {
        HalStream {
            hal: self.inner.clone(),
            stream: self.inner.stream.clone(),
            id: 0,
        }
    }

    /// A new event (with timing, so [`HalEvent::elapsed_ms`] works).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let e = hal.create_event().unwrap();
    /// e.record(&hal.main_stream()).unwrap();
    /// e.synchronize().unwrap();
    /// ```
    pub fn create_event(&self) -> Result<HalEvent> {
        self.inner.enter()?;
        Ok(HalEvent {
            hal: self.inner.clone(),
            event: Event::new_timing()?,
        })
    }
}

impl HalStream {
    /// Whether this is the HAL's main stream.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(hal.main_stream().is_main());
    /// assert!(!hal.create_stream().unwrap().is_main());
    /// ```
    pub fn is_main(&self) -> bool {
        self.id == 0
    }

    /// The raw handle, for your own launches.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// assert_ne!(side.raw(), hal.main_stream().raw());
    /// ```
    pub fn raw(&self) -> cuda_sys::CUstream {
        self.stream.raw()
    }

    /// Blocks until the work queued on this stream is done.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let side = hal.create_stream().unwrap();
    /// let x = hal.alloc::<u32>("x", 1 << 20).unwrap();
    /// // SAFETY: fill_u32(out, value, n) writes x's n elements.
    /// unsafe { hal.launch("fill_u32", LaunchDims::for_elements(x.len(), hal.info().multiprocessors))
    ///     .on(&side).output(&x).scalar(2u32).scalar(x.len() as u64)
    ///     .run() }
    ///     .unwrap();
    /// side.synchronize().unwrap();
    /// assert_eq!(x.get_at(0).unwrap(), 2);
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let _range = crate::nvtx::range(|| "stream synchronize".to_string());
        self.hal.enter()?;
        self.hal.guard(self.stream.synchronize())
    }

    /// Later work on this stream waits until `event` completes.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let (a, b) = (hal.create_stream().unwrap(), hal.create_stream().unwrap());
    /// let e = hal.create_event().unwrap();
    /// e.record(&a).unwrap();
    /// b.wait_event(&e).unwrap(); // b's next work starts after a's work so far
    /// b.synchronize().unwrap();
    /// assert!(e.is_complete().unwrap());
    /// ```
    pub fn wait_event(&self, event: &HalEvent) -> Result<()> {
        let _range = crate::nvtx::range(|| "stream wait_event".to_string());
        self.hal.enter()?;
        self.hal.guard(self.stream.wait_event(&event.event))
    }

    /// Orders this (side) stream after everything queued on the main stream so far.
    pub(crate) fn after_main(&self) -> Result<()> {
        if self.is_main() {
            return Ok(());
        }
        let ev = self.hal.event()?;
        ev.record(&self.hal.stream)?;
        self.stream.wait_event(&ev)
    }
}

impl HalEvent {
    /// Records the event at the current end of `stream`, a stream of a HAL of the same
    /// device (`InvalidArgument` for another device's: the driver records an event only
    /// in its own context).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let e = hal.create_event().unwrap();
    /// hal.alloc::<u32>("x", 1 << 20).unwrap().fill(0).unwrap();
    /// e.record(&hal.main_stream()).unwrap(); // after the fill
    /// e.synchronize().unwrap();
    /// ```
    pub fn record(&self, stream: &HalStream) -> Result<()> {
        let _range = crate::nvtx::range(|| "event record".to_string());
        if !self.hal.same_device(&stream.hal) {
            return Err(Error::InvalidArgument(format!(
                "an event of device {} recorded on a stream of device {}",
                self.hal.info().ordinal,
                stream.hal.info().ordinal
            )));
        }
        self.hal.enter()?;
        self.hal.guard(self.event.record(&stream.stream))
    }

    /// Blocks until the recorded work is done.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let e = hal.create_event().unwrap();
    /// e.record(&hal.main_stream()).unwrap();
    /// e.synchronize().unwrap();
    /// assert!(e.is_complete().unwrap());
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let _range = crate::nvtx::range(|| "event synchronize".to_string());
        self.hal.enter()?;
        self.hal.guard(self.event.synchronize())
    }

    /// Whether the recorded work is done, without blocking.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let e = hal.create_event().unwrap();
    /// hal.alloc::<u32>("x", 1 << 24).unwrap().fill(0).unwrap();
    /// e.record(&hal.main_stream()).unwrap();
    /// while !e.is_complete().unwrap() {
    ///     std::hint::spin_loop(); // or do host work meanwhile
    /// }
    /// ```
    pub fn is_complete(&self) -> Result<bool> {
        self.hal.enter()?;
        self.hal.guard(self.event.is_complete())
    }

    /// Device milliseconds from `start` to this event (both recorded and complete, both of
    /// HALs of one device: `InvalidArgument` otherwise).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u32>("b", 1 << 20).unwrap();
    /// let (start, end) = (hal.create_event().unwrap(), hal.create_event().unwrap());
    /// let main = hal.main_stream();
    /// start.record(&main).unwrap();
    /// b.fill(1).unwrap();
    /// end.record(&main).unwrap();
    /// end.synchronize().unwrap();
    /// println!("fill: {:.3} ms on the device", end.elapsed_ms(&start).unwrap());
    /// ```
    pub fn elapsed_ms(&self, start: &HalEvent) -> Result<f32> {
        if !self.hal.same_device(&start.hal) {
            return Err(Error::InvalidArgument(format!(
                "time between events of devices {} and {}",
                start.hal.info().ordinal,
                self.hal.info().ordinal
            )));
        }
        self.hal.enter()?;
        self.hal.guard(self.event.elapsed_ms(&start.event))
    }
}

/// Something a [`SideUses`] list keeps, to ask whether the work before it is done: a
/// driver [`Event`] (a stand-in in unit tests).
pub(crate) trait Completion {
    /// Whether the work is known to be done with no driver call (the host has waited for
    /// its stream since): [`Event::known_done`].
    fn known_done(&self) -> bool;

    /// Whether the work is done, the driver asked where it must be: `false` when the
    /// driver cannot tell ([`Event::done_now`]; an event of another context may not be
    /// queryable from this one, and is then kept).
    fn done_now(&self) -> bool;
}

impl Completion for Event {
    fn known_done(&self) -> bool {
        Event::known_done(self)
    }

    fn done_now(&self) -> bool {
        Event::done_now(self)
    }
}

/// Events of side-stream work that may still use one allocation.
pub(crate) struct SideUses<E = Event> {
    uses: Mutex<Vec<SideUse<E>>>,
    /// Whether `uses` may hold a use (set under its lock; read without it for the fast
    /// path of an access that has nothing to wait for).
    any: AtomicBool,
    /// Whether `uses` may hold a write.
    any_write: AtomicBool,
    /// The length at which the uses of every stream are next pruned (changed under the
    /// lock of `uses`).
    prune_all_at: AtomicUsize,
}

impl<E> Default for SideUses<E> {
    fn default() -> Self {
        SideUses {
            uses: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            any_write: AtomicBool::new(false),
            prune_all_at: AtomicUsize::new(PRUNE_ALL_AT),
        }
    }
}

/// One side use: work on stream `id` up to `ev`, which reads the allocation or writes it.
struct SideUse<E> {
    id: u64,
    write: bool,
    /// (An event of another HAL keeps that HAL's context alive itself: see
    /// [`crate::driver::Event`].)
    ev: Arc<E>,
}

/// Past this many events of one stream, the completed ones are dropped when another comes.
const PRUNE_AT: usize = 4;

/// Past this many events in all (of many streams: a table read by kernels on a new stream
/// each time, which neither the main stream nor the host touches), the completed ones of
/// every stream are dropped when another comes, so that the list stays short. The next
/// such pass comes at twice what was still running (and at least this many), so that
/// uses that all run long are asked about once per doubling, not at every new one.
const PRUNE_ALL_AT: usize = 16;

impl<E> SideUses<E> {
    /// Whether side-stream work may still use the allocation.
    pub(crate) fn pending(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether side-stream work that an access must follow may still be pending: for a
    /// write any use, for a read a write.
    #[inline]
    fn pending_for(&self, write: bool) -> bool {
        match write {
            true => self.any.load(Ordering::Acquire),
            false => self.any_write.load(Ordering::Acquire),
        }
    }

    /// Forgets the uses the main stream has just been ordered after: all of them before a
    /// write (or a free), the writes before a read. Its later work, and every side stream
    /// that waits for it, comes after them.
    fn forget_followed(&self, uses: &mut Vec<SideUse<E>>, write: bool) {
        if write {
            uses.clear();
        } else {
            uses.retain(|u| !u.write);
        }
        self.any.store(!uses.is_empty(), Ordering::Release);
        self.any_write.store(false, Ordering::Release);
        if uses.is_empty() {
            self.prune_all_at.store(PRUNE_ALL_AT, Ordering::Relaxed);
        }
    }

    /// Events kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.uses.lock().len()
    }
}

impl<E: Completion> SideUses<E> {
    /// Orders an access of stream `own_id` (0: the main stream) after the pending uses it
    /// must follow: `wait` is called for each use of another stream, not known done, that
    /// writes (or, for a `write`, that reads or writes). With `clear` (the main stream, or
    /// the free), those uses are forgotten.
    fn order_after(
        &self,
        own_id: u64,
        write: bool,
        clear: bool,
        mut wait: impl FnMut(&E) -> Result<()>,
    ) -> Result<()> {
        let mut uses = self.uses.lock();
        for u in uses.iter() {
            if (write || u.write) && u.id != own_id && !u.ev.known_done() {
                wait(&u.ev)?;
            }
        }
        if clear {
            self.forget_followed(&mut uses, write);
        }
        Ok(())
    }
}

impl SideUses<Event> {
    /// Makes `stream` (of id `own_id`) wait for the pending side uses an access that
    /// `write`s (or reads) must follow ([`SideUses::order_after`]), but those known done
    /// (the host has waited for their stream since: no wait queued, so that `stream` stays
    /// known idle where it was); with `clear`, forgets them (the caller is the main stream
    /// or the free).
    #[inline]
    pub(crate) fn wait_on(
        &self,
        stream: &Stream,
        own_id: u64,
        write: bool,
        clear: bool,
    ) -> Result<()> {
        if !self.pending_for(write) {
            return Ok(());
        }
        self.wait_on_pending(stream, own_id, write, clear)
    }

    /// [`SideUses::wait_on`] where side uses may be pending.
    #[inline(never)]
    fn wait_on_pending(
        &self,
        stream: &Stream,
        own_id: u64,
        write: bool,
        clear: bool,
    ) -> Result<()> {
        self.order_after(own_id, write, clear, |ev| stream.wait_event(ev))
    }

    /// Blocks the host until every pending side use is done, and forgets them.
    pub(crate) fn wait_host(&self) -> Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        self.order_after(0, true, true, Event::synchronize)
    }
}

/// Drops the completed events of `only` (or of every stream). One stream's work completes
/// in order, so each stream's events are asked from the oldest, and none of its later ones
/// once one is still running: work that keeps running costs a question per stream, not one
/// per use still queued.
fn prune_completed<E: Completion>(uses: &mut Vec<SideUse<E>>, only: Option<u64>) {
    let mut running: SmallVec<[u64; 8]> = SmallVec::new();
    uses.retain(|u| {
        if only.is_some_and(|id| id != u.id) || running.contains(&u.id) {
            return true;
        }
        let done = u.ev.done_now();
        if !done {
            running.push(u.id);
        }
        !done
    });
}

impl<E: Completion> SideUses<E> {
    /// Records that work on stream `id` up to `ev` may use the allocation: reads it, or
    /// with `write` writes it.
    ///
    /// Every event is kept, not only the last one added per stream: two threads that share
    /// a stream record their events and add them in two steps, so the one added last may
    /// be the older.
    pub(crate) fn add(&self, id: u64, ev: Arc<E>, write: bool) {
        let mut uses = self.uses.lock();
        let pruned = if uses.len() >= self.prune_all_at.load(Ordering::Relaxed) {
            prune_completed(&mut uses, None);
            let next = (2 * uses.len()).max(PRUNE_ALL_AT);
            self.prune_all_at.store(next, Ordering::Relaxed);
            true
        } else if uses.iter().filter(|u| u.id == id).count() >= PRUNE_AT {
            // Events of this stream (whose context is current) that have completed.
            prune_completed(&mut uses, Some(id));
            true
        } else {
            false
        };
        uses.push(SideUse { id, write, ev });
        self.any.store(true, Ordering::Release);
        if write || pruned {
            let any_write = write || uses.iter().any(|u| u.write);
            self.any_write.store(any_write, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// Work that is done once `done` is set, and known done with no question once
    /// `waited` is (the host has waited for its stream).
    struct Work {
        done: AtomicBool,
        waited: AtomicBool,
    }

    thread_local! {
        // Questions asked of any `Work` so far, per test thread.
        static ASKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    impl Completion for Work {
        fn known_done(&self) -> bool {
            self.waited.load(Ordering::Relaxed)
        }

        fn done_now(&self) -> bool {
            ASKED.with(|a| a.set(a.get() + 1));
            self.done.load(Ordering::Relaxed)
        }
    }

    fn work(done: bool) -> Arc<Work> {
        Arc::new(Work {
            done: AtomicBool::new(done),
            waited: AtomicBool::new(false),
        })
    }

    /// The uses `order_after` waits for, as indices into `all`.
    fn waited_for(
        uses: &SideUses<Work>,
        all: &[Arc<Work>],
        own_id: u64,
        write: bool,
        clear: bool,
    ) -> Vec<usize> {
        let mut waited = Vec::new();
        uses.order_after(own_id, write, clear, |ev| {
            waited.push(all.iter().position(|w| std::ptr::eq(&**w, ev)).unwrap());
            Ok(())
        })
        .unwrap();
        waited
    }

    /// Reads by streams 1 and 3, writes by streams 2 and 1.
    fn two_reads_two_writes() -> (SideUses<Work>, Vec<Arc<Work>>) {
        let uses = SideUses::<Work>::default();
        let all: Vec<_> = (0..4).map(|_| work(false)).collect();
        for (i, (id, write)) in [(1, false), (2, true), (3, false), (1, true)]
            .into_iter()
            .enumerate()
        {
            uses.add(id, all[i].clone(), write);
        }
        (uses, all)
    }

    /// Two reads of a buffer on two streams run side by side: a read waits for the other
    /// streams' writes only, and the main stream's read forgets just those.
    #[test]
    fn a_read_waits_for_the_writes_of_other_streams_only() {
        let (uses, all) = two_reads_two_writes();
        assert_eq!(waited_for(&uses, &all, 1, false, false), vec![1]);
        assert_eq!(waited_for(&uses, &all, 3, false, false), vec![1, 3]);
        assert_eq!(uses.len(), 4, "a side stream forgets nothing");
        assert_eq!(waited_for(&uses, &all, 0, false, true), vec![1, 3]);
        assert_eq!(uses.len(), 2, "the reads stay");
        assert!(uses.pending() && !uses.pending_for(false) && uses.pending_for(true));
        assert_eq!(waited_for(&uses, &all, 0, false, true), Vec::<usize>::new());
        // A later write of the main stream (or the free) still waits for the reads.
        assert_eq!(waited_for(&uses, &all, 0, true, true), vec![0, 2]);
        assert!(!uses.pending() && uses.len() == 0);
    }

    /// A write waits for every other stream's use, read or write, but those known done.
    #[test]
    fn a_write_waits_for_every_use_of_other_streams() {
        let (uses, all) = two_reads_two_writes();
        assert_eq!(waited_for(&uses, &all, 2, true, false), vec![0, 2, 3]);
        all[0].waited.store(true, Ordering::Relaxed);
        assert_eq!(waited_for(&uses, &all, 3, true, false), vec![1, 3]);
        assert_eq!(waited_for(&uses, &all, 0, true, true), vec![1, 2, 3]);
        assert!(!uses.pending() && !uses.pending_for(true) && !uses.pending_for(false));
    }

    /// Once the completed writes are pruned, a read has nothing to wait for again: it
    /// takes no lock.
    #[test]
    fn pruned_writes_leave_reads_nothing_to_wait_for() {
        let uses = SideUses::<Work>::default();
        uses.add(1, work(true), true);
        assert!(uses.pending_for(false));
        for _ in 0..=PRUNE_AT {
            uses.add(1, work(false), false);
        }
        assert!(uses.pending() && !uses.pending_for(false));
    }

    /// Kernels on one stream reading a buffer, queued faster than they run: each new use
    /// asks about the oldest still running only, not about every use still queued. (Before,
    /// 1,000 uses that kept running asked 499,494 questions.)
    #[test]
    fn uses_queued_on_one_stream_are_asked_about_oldest_first() {
        let uses = SideUses::<Work>::default();
        let queued: Vec<_> = (0..1000).map(|_| work(false)).collect();
        ASKED.with(|a| a.set(0));
        for w in &queued {
            uses.add(7, w.clone(), false);
        }
        let asked = ASKED.with(|a| a.get());
        assert!(asked < 1100, "{asked} questions for 1000 uses");
        // The first half completes: the next use drops exactly those.
        for w in &queued[..500] {
            w.done.store(true, Ordering::Relaxed);
        }
        uses.add(7, work(false), false);
        assert_eq!(uses.len(), 501);
        assert!(uses.pending());
    }

    /// A table read by kernels on a new stream each time, never touched by the main stream
    /// or the host: the list of its uses stays short once the work completes. (Before,
    /// only the uses of the stream being added were pruned, and the list grew by one per
    /// stream, each launch waiting on all of them.)
    #[test]
    fn uses_on_many_streams_are_pruned_once_complete() {
        let uses = SideUses::<Work>::default();
        for id in 1..=1000 {
            uses.add(id, work(true), false);
            assert!(
                uses.len() <= PRUNE_ALL_AT,
                "{} uses after {id} streams",
                uses.len()
            );
        }
        assert!(uses.pending());
    }

    #[test]
    fn uses_still_running_are_kept() {
        let uses = SideUses::<Work>::default();
        let running: Vec<_> = (0..40).map(|_| work(false)).collect();
        for (id, w) in running.iter().enumerate() {
            uses.add(id as u64 + 1, w.clone(), false);
        }
        assert_eq!(uses.len(), 40, "none may be dropped while running");
        for w in &running[..30] {
            w.done.store(true, Ordering::Relaxed);
        }
        // The next pass over every stream comes at twice the 32 running at the last one.
        for id in 100..124 {
            uses.add(id, work(false), false);
        }
        assert_eq!(uses.len(), 64);
        uses.add(999, work(false), false);
        assert_eq!(
            uses.len(),
            35,
            "the ten still running, the 24 new, and this one"
        );
    }

    /// Uses that all keep running are asked about once per doubling of the list, not
    /// at every new use: in all a small multiple of the uses added.
    #[test]
    fn uses_that_keep_running_are_not_asked_about_at_every_add() {
        let uses = SideUses::<Work>::default();
        let before = ASKED.with(|a| a.get());
        for id in 1..=1000 {
            uses.add(id, work(false), false);
        }
        let asked = ASKED.with(|a| a.get()) - before;
        assert_eq!(uses.len(), 1000);
        assert!(asked < 3 * 1000, "{asked} questions for 1000 uses");
    }

    #[test]
    fn one_stream_keeps_few_uses() {
        let uses = SideUses::<Work>::default();
        for _ in 0..100 {
            uses.add(7, work(true), false);
        }
        assert!(uses.len() <= PRUNE_AT, "{} uses of one stream", uses.len());
        let other = work(false);
        uses.add(8, other.clone(), false);
        for _ in 0..10 {
            uses.add(7, work(true), false);
        }
        assert!(
            uses.uses.lock().iter().any(|u| u.id == 8),
            "another stream's running use stays"
        );
    }

    /// A step of [`side_uses_match_a_model_of_the_streams`].
    #[derive(Debug, Clone)]
    enum Step {
        /// Work on side stream `id` that reads (or writes) the allocation.
        Use { id: u64, write: bool },
        /// The device finishes the oldest running work of stream `id`.
        Finish { id: u64 },
        /// The host waits for stream `id`: its work is done, and known done.
        HostWaits { id: u64 },
        /// An access by stream `own` (0: the main stream, which forgets what it follows).
        Access { own: u64, write: bool },
        /// The free of an allocation outside the pool: the host waits for every use.
        HostFree,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1..5u64, any::<bool>()).prop_map(|(id, write)| Step::Use { id, write }),
            2 => (1..5u64).prop_map(|id| Step::Finish { id }),
            1 => (1..5u64).prop_map(|id| Step::HostWaits { id }),
            3 => (0..5u64, any::<bool>()).prop_map(|(own, write)| Step::Access { own, write }),
            1 => Just(Step::HostFree),
        ]
    }

    proptest::proptest! {
        /// Any mix of side uses, device progress, host waits and accesses: an access waits
        /// (or the free blocks) for every unfinished use of another stream it must follow
        /// (for a read, the writes), and for nothing else but such uses not known done;
        /// its fast path is taken only where there is none. The model keeps every use
        /// until an access of the main stream (or the free) follows it.
        #[test]
        fn side_uses_match_a_model_of_the_streams(
            steps in proptest::collection::vec(step(), 1..200)
        ) {
            let uses = SideUses::<Work>::default();
            let mut model: Vec<(u64, bool, Arc<Work>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Use { id, write } => {
                        let w = work(false);
                        uses.add(id, w.clone(), write);
                        model.push((id, write, w));
                    }
                    Step::Finish { id } => {
                        let oldest = model
                            .iter()
                            .find(|(i, _, w)| *i == id && !w.done.load(Ordering::Relaxed));
                        if let Some((_, _, w)) = oldest {
                            w.done.store(true, Ordering::Relaxed);
                        }
                    }
                    Step::HostWaits { id } => {
                        for (_, _, w) in model.iter().filter(|(i, _, _)| *i == id) {
                            w.done.store(true, Ordering::Relaxed);
                            w.waited.store(true, Ordering::Relaxed);
                        }
                    }
                    Step::Access { own, write } => {
                        let follows = |(i, wr, _): &(u64, bool, Arc<Work>)| {
                            *i != own && (write || *wr)
                        };
                        let mut waited: Vec<*const Work> = Vec::new();
                        // `wait_on`: its fast path, else `order_after`.
                        if uses.pending_for(write) {
                            uses.order_after(own, write, own == 0, |ev| {
                                waited.push(ev);
                                Ok(())
                            })
                            .unwrap();
                        }
                        for u in model.iter().filter(|u| follows(u)) {
                            let unfinished = !u.2.done.load(Ordering::Relaxed);
                            let ptr = Arc::as_ptr(&u.2);
                            proptest::prop_assert!(
                                !unfinished || waited.contains(&ptr),
                                "stream {own} ({}) did not wait for an unfinished {} of \
                                 stream {}", if write { "write" } else { "read" },
                                if u.1 { "write" } else { "read" }, u.0
                            );
                        }
                        for ptr in &waited {
                            let Some(u) = model.iter().find(|u| Arc::as_ptr(&u.2) == *ptr) else {
                                return Err(proptest::test_runner::TestCaseError::fail(
                                    "waited for a use it forgot",
                                ));
                            };
                            proptest::prop_assert!(follows(u), "waited for a use it need not");
                            proptest::prop_assert!(
                                !u.2.waited.load(Ordering::Relaxed),
                                "waited for a use known done"
                            );
                        }
                        if own == 0 {
                            model.retain(|u| !follows(u));
                        }
                    }
                    Step::HostFree => {
                        let mut blocked: Vec<*const Work> = Vec::new();
                        if uses.pending() {
                            uses.order_after(0, true, true, |ev| {
                                blocked.push(ev);
                                Ok(())
                            })
                            .unwrap();
                        }
                        for (_, _, w) in &model {
                            let unfinished = !w.done.load(Ordering::Relaxed);
                            proptest::prop_assert!(
                                !unfinished || blocked.contains(&Arc::as_ptr(w)),
                                "the free did not wait for an unfinished use"
                            );
                        }
                        model.clear();
                        proptest::prop_assert!(!uses.pending());
                    }
                }
                let unfinished = |write_only: bool| {
                    model
                        .iter()
                        .any(|(_, wr, w)| (*wr || !write_only) && !w.done.load(Ordering::Relaxed))
                };
                proptest::prop_assert!(!unfinished(false) || uses.pending());
                proptest::prop_assert!(!unfinished(true) || uses.pending_for(false));
            }
        }
    }
}
