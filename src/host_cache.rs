//! The phase-2 host cache of one allocation: which bytes the host copy holds newest data
//! for, which of those the device has not seen yet, and which host views are active.
//!
//! Pure bookkeeping, no driver calls: the buffer layer asks it what to download or upload
//! and tells it what happened. All ranges are byte ranges within the allocation.

use std::ops::Range;

/// A set of disjoint, non-adjacent, sorted byte ranges.
///
/// ```
/// use cuda_hal::host_cache::IntervalSet;
/// let mut s = IntervalSet::new();
/// s.insert(0..10);
/// s.insert(10..20); // adjacent: merged
/// s.insert(40..50);
/// assert_eq!(s.ranges(), &[0..20, 40..50]);
/// s.remove(5..45);
/// assert_eq!(s.ranges(), &[0..5, 45..50]);
/// assert_eq!(s.missing(&(0..50)), vec![5..45]);
/// assert!(s.contains(&(1..4)) && !s.overlaps(&(10..20)) && s.total() == 10);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntervalSet {
    ranges: Vec<Range<usize>>,
}

impl IntervalSet {
    /// The empty set.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let s = IntervalSet::new();
    /// assert!(s.is_empty() && s.ranges().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The ranges, sorted and disjoint.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(30..40);
    /// s.insert(0..10);
    /// assert_eq!(s.ranges(), &[0..10, 30..40]);
    /// ```
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Whether the set holds no bytes.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(5..5); // an empty range adds nothing
    /// assert!(s.is_empty());
    /// s.insert(5..6);
    /// assert!(!s.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Total bytes in the set.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..10);
    /// s.insert(5..15); // overlaps: counted once
    /// s.insert(100..101);
    /// assert_eq!(s.total(), 16);
    /// ```
    pub fn total(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).sum()
    }

    /// Adds `r`, merging with overlapping or adjacent ranges.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..10);
    /// s.insert(20..30);
    /// s.insert(10..20); // fills the gap: one range
    /// assert_eq!(s.ranges(), &[0..30]);
    /// ```
    pub fn insert(&mut self, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        // First range that ends at or after `start` (could merge).
        let lo = self.ranges.partition_point(|x| x.end < start);
        // First range that starts after `end` (cannot merge).
        let hi = self.ranges.partition_point(|x| x.start <= end);
        if lo < hi {
            start = start.min(self.ranges[lo].start);
            end = end.max(self.ranges[hi - 1].end);
        }
        self.ranges.splice(lo..hi, std::iter::once(start..end));
    }

    /// Removes `r` from the set. Allocates nothing unless a range is split in two.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..30);
    /// s.remove(10..20);
    /// assert_eq!(s.ranges(), &[0..10, 20..30]);
    /// s.remove(0..100);
    /// assert!(s.is_empty());
    /// ```
    pub fn remove(&mut self, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        // The ranges lo..hi overlap `r` (the ranges are sorted and disjoint).
        let lo = self.ranges.partition_point(|x| x.end <= r.start);
        let hi = self.ranges.partition_point(|x| x.start < r.end);
        if lo >= hi {
            return;
        }
        let (first, last) = (self.ranges[lo].start, self.ranges[hi - 1].end);
        let left = (first < r.start).then_some(first..r.start);
        let right = (last > r.end).then_some(r.end..last);
        self.ranges.splice(lo..hi, left.into_iter().chain(right));
    }

    /// Whether every byte of `r` is in the set.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..10);
    /// s.insert(20..30);
    /// assert!(s.contains(&(2..8)));
    /// assert!(!s.contains(&(5..25)), "10..20 is missing");
    /// assert!(s.contains(&(50..50)), "an empty range is always contained");
    /// ```
    pub fn contains(&self, r: &Range<usize>) -> bool {
        if r.is_empty() {
            return true;
        }
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges
            .get(i)
            .is_some_and(|x| x.start <= r.start && x.end >= r.end)
    }

    /// The parts of `r` not in the set, in order.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(10..20);
    /// assert_eq!(s.missing(&(0..30)), vec![0..10, 20..30]);
    /// assert!(s.missing(&(12..18)).is_empty());
    /// ```
    pub fn missing(&self, r: &Range<usize>) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut cursor = r.start;
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        for x in &self.ranges[i..] {
            if x.start >= r.end {
                break;
            }
            if x.start > cursor {
                out.push(cursor..x.start);
            }
            cursor = cursor.max(x.end);
        }
        if cursor < r.end {
            out.push(cursor..r.end);
        }
        out
    }

    /// The parts of `r` in the set, in order.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..10);
    /// s.insert(20..30);
    /// assert_eq!(s.within(&(5..25)), vec![5..10, 20..25]);
    /// assert!(s.within(&(10..20)).is_empty());
    /// ```
    pub fn within(&self, r: &Range<usize>) -> Vec<Range<usize>> {
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges[i..]
            .iter()
            .take_while(|x| x.start < r.end)
            .map(|x| x.start.max(r.start)..x.end.min(r.end))
            .filter(|x| !x.is_empty())
            .collect()
    }

    /// Whether any byte of `r` is in the set.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(10..20);
    /// assert!(s.overlaps(&(15..25)));
    /// assert!(!s.overlaps(&(20..30)), "ranges are half-open");
    /// assert!(!s.overlaps(&(15..15)), "an empty range holds no byte");
    /// ```
    pub fn overlaps(&self, r: &Range<usize>) -> bool {
        if r.is_empty() {
            return false;
        }
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges.get(i).is_some_and(|x| x.start < r.end)
    }

    /// Empties the set.
    ///
    /// ```
    /// use cuda_hal::host_cache::IntervalSet;
    /// let mut s = IntervalSet::new();
    /// s.insert(0..10);
    /// s.clear();
    /// assert_eq!(s.total(), 0);
    /// ```
    pub fn clear(&mut self) {
        self.ranges.clear();
    }
}

/// Kind of an active host view.
///
/// Two shared views may overlap; an exclusive one overlaps nothing:
/// ```
/// use cuda_hal::host_cache::{BorrowKind, CacheState};
/// let mut c = CacheState::default();
/// c.mark_downloaded(0..100);
/// let a = c.begin_borrow(0..60, BorrowKind::Shared).unwrap();
/// let b = c.begin_borrow(40..100, BorrowKind::Shared).unwrap();
/// assert!(c.begin_borrow(50..70, BorrowKind::Exclusive).is_err());
/// c.end_borrow(a);
/// c.end_borrow(b);
/// assert!(c.begin_borrow(50..70, BorrowKind::Exclusive).is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BorrowKind {
    /// `view`: reads the host copy.
    Shared,
    /// `view_mut`: writes the host copy.
    Exclusive,
}

/// An active view was in the way of an operation.
///
/// ```
/// use cuda_hal::host_cache::{BorrowKind, CacheState, Conflict};
/// let mut c = CacheState::default();
/// c.mark_downloaded(0..10);
/// let _view = c.begin_borrow(0..10, BorrowKind::Exclusive).unwrap();
/// assert_eq!(c.plan_read(&(0..10)), Err(Conflict));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conflict;

/// Bookkeeping of one allocation's host copy: the steps a buffer of 100 bytes takes for a
/// `view_mut` of its first half, then a kernel that reads it all.
///
/// ```
/// use cuda_hal::host_cache::{BorrowKind, CacheState};
/// let mut c = CacheState::default();
/// // The host reads 0..50: nothing is cached yet, so all of it is downloaded.
/// assert_eq!(c.plan_read(&(0..50)).unwrap(), vec![0..50]);
/// c.mark_downloaded(0..50);
/// let view = c.begin_borrow(0..50, BorrowKind::Exclusive).unwrap();
/// assert!(c.plan_device_access(&(0..100)).is_err(), "no kernel while the view is open");
/// c.end_borrow(view);
/// // The kernel reads 0..100: the edited half goes up first.
/// assert_eq!(c.plan_device_access(&(0..100)).unwrap(), vec![0..50]);
/// c.mark_device_access(0..100, false);
/// assert!(c.dirty().is_empty());
/// assert_eq!(c.plan_read(&(0..50)).unwrap(), vec![], "still cached: no transfer");
/// ```
#[derive(Clone, Debug, Default)]
pub struct CacheState {
    readable: IntervalSet,
    dirty: IntervalSet,
    borrows: Vec<(u64, BorrowKind, Range<usize>)>,
    next_borrow: u64,
    /// Nothing has touched the allocation since it was made: no device access, download
    /// or view. Its device bytes are unspecified then (or zeros, for a zeroed
    /// allocation), and its host copy holds nothing of it (the buffer layer zeroes what
    /// a view adopts: a reused host copy holds an earlier buffer's bytes).
    fresh: bool,
}

/// Whether `a` and `b` share a byte (an empty range shares none).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}

impl CacheState {
    /// The state of a new allocation, whose device bytes are unspecified: a first mutable
    /// view may start from zeros in the host copy instead of downloading
    /// ([`CacheState::adopt_fresh`]). (`CacheState::default()` is a state that knows
    /// nothing of the device's bytes.)
    ///
    /// ```
    /// use cuda_hal::host_cache::CacheState;
    /// let mut c = CacheState::for_new_allocation();
    /// assert!(c.adopt_fresh(&(0..64)), "nothing to download");
    /// assert_eq!(c.readable().ranges(), &[0..64]);
    /// assert!(!c.adopt_fresh(&(64..128)), "only once: 64..128 is downloaded as usual");
    /// ```
    pub fn for_new_allocation() -> Self {
        CacheState {
            fresh: true,
            ..CacheState::default()
        }
    }

    /// For a mutable view of `r`: if nothing has touched the allocation since it was made
    /// (its device bytes are unspecified), zeros in the host copy stand for them (the
    /// caller writes them). Then `r` is marked readable with no download and this returns
    /// true; the view's end makes it host-newer as usual, so the device gets the view's
    /// bytes. Any device access, download or view before ends this.
    ///
    /// ```
    /// use cuda_hal::host_cache::CacheState;
    /// let mut c = CacheState::for_new_allocation();
    /// c.mark_device_access(0..8, true); // a kernel writes first
    /// assert!(!c.adopt_fresh(&(0..64)), "the kernel's bytes are downloaded");
    /// ```
    pub fn adopt_fresh(&mut self, r: &Range<usize>) -> bool {
        if !std::mem::take(&mut self.fresh) {
            return false;
        }
        self.readable.insert(r.clone());
        true
    }

    /// Bytes where the host copy holds the newest data.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..64);
    /// assert_eq!(c.readable().ranges(), &[0..64]);
    /// c.mark_device_access(32..64, true); // a kernel writes the upper half
    /// assert_eq!(c.readable().ranges(), &[0..32]);
    /// ```
    pub fn readable(&self) -> &IntervalSet {
        &self.readable
    }

    /// Bytes where the host copy is newer than the device.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..64);
    /// let v = c.begin_borrow(8..16, BorrowKind::Exclusive).unwrap();
    /// assert!(c.dirty().is_empty(), "dirty once the view ends");
    /// c.end_borrow(v);
    /// assert_eq!(c.dirty().ranges(), &[8..16]);
    /// ```
    pub fn dirty(&self) -> &IntervalSet {
        &self.dirty
    }

    /// Number of active views.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..64);
    /// let v = c.begin_borrow(0..64, BorrowKind::Shared).unwrap();
    /// assert_eq!(c.active_borrows(), 1);
    /// c.end_borrow(v);
    /// assert_eq!(c.active_borrows(), 0);
    /// ```
    pub fn active_borrows(&self) -> usize {
        self.borrows.len()
    }

    fn conflicts(&self, r: &Range<usize>, with_shared: bool) -> bool {
        self.borrows
            .iter()
            .any(|(_, k, b)| (with_shared || *k == BorrowKind::Exclusive) && overlap(b, r))
    }

    /// What must be downloaded so the host can read `r`. Fails if a mutable view covers
    /// `r`, or if a download would write under an active view.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..32);
    /// // Only what the host lacks is downloaded.
    /// assert_eq!(c.plan_read(&(0..64)).unwrap(), vec![32..64]);
    /// // A download must not write under an open view.
    /// let v = c.begin_borrow(0..32, BorrowKind::Shared).unwrap();
    /// c.mark_device_access(16..32, true); // (bookkeeping only: the device wrote 16..32)
    /// assert!(c.plan_read(&(0..64)).is_err());
    /// c.end_borrow(v);
    /// assert_eq!(c.plan_read(&(0..64)).unwrap(), vec![16..64]);
    /// ```
    pub fn plan_read(&self, r: &Range<usize>) -> Result<Vec<Range<usize>>, Conflict> {
        if self.conflicts(r, false) {
            return Err(Conflict);
        }
        let missing = self.readable.missing(r);
        if missing.iter().any(|m| self.conflicts(m, true)) {
            return Err(Conflict);
        }
        Ok(missing)
    }

    /// Records that `r` was downloaded from the device.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..16);
    /// assert!(c.plan_read(&(0..16)).unwrap().is_empty());
    /// ```
    pub fn mark_downloaded(&mut self, r: Range<usize>) {
        self.fresh = false;
        self.readable.insert(r);
    }

    /// Starts a view of `r`; `plan_read` for it has succeeded and its downloads are done.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// assert!(c.begin_borrow(0..8, BorrowKind::Shared).is_err(), "not downloaded yet");
    /// c.mark_downloaded(0..8);
    /// let id = c.begin_borrow(0..8, BorrowKind::Shared).unwrap();
    /// c.end_borrow(id);
    /// ```
    pub fn begin_borrow(&mut self, r: Range<usize>, kind: BorrowKind) -> Result<u64, Conflict> {
        let with_shared = kind == BorrowKind::Exclusive;
        if self.conflicts(&r, with_shared) || !self.readable.contains(&r) {
            return Err(Conflict);
        }
        self.fresh = false;
        self.next_borrow += 1;
        self.borrows.push((self.next_borrow, kind, r));
        Ok(self.next_borrow)
    }

    /// Starts a view of `r` whose bytes live outside the host copy (builds without phase 2
    /// read a downloaded `Vec`, and edit one and upload it after): only its conflicts
    /// count. An exclusive one keeps the device from reading or writing `r` meanwhile; as
    /// with [`CacheState::begin_borrow`], an exclusive view and any other view of the same
    /// bytes exclude each other. Ended with [`CacheState::end_detached_borrow`]. It leaves
    /// a new allocation fresh, for the view's [`CacheState::adopt_fresh`].
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// let v = c.begin_detached_borrow(0..8, BorrowKind::Exclusive).unwrap();
    /// assert!(c.plan_device_access(&(4..12)).is_err(), "the device waits for the view");
    /// assert!(c.begin_detached_borrow(0..4, BorrowKind::Exclusive).is_err(), "one editor at a time");
    /// assert!(c.begin_detached_borrow(4..12, BorrowKind::Shared).is_err(), "no reader meanwhile");
    /// c.end_detached_borrow(v);
    /// assert!(c.plan_device_access(&(4..12)).unwrap().is_empty(), "nothing host-newer");
    /// let r = c.begin_detached_borrow(0..8, BorrowKind::Shared).unwrap();
    /// assert!(c.begin_detached_borrow(0..8, BorrowKind::Shared).is_ok(), "readers share");
    /// assert!(c.begin_detached_borrow(4..5, BorrowKind::Exclusive).is_err(), "no editor meanwhile");
    /// assert!(c.plan_device_access(&(0..8)).is_ok(), "the device may use it");
    /// c.end_detached_borrow(r);
    /// ```
    pub fn begin_detached_borrow(
        &mut self,
        r: Range<usize>,
        kind: BorrowKind,
    ) -> Result<u64, Conflict> {
        if self.conflicts(&r, kind == BorrowKind::Exclusive) {
            return Err(Conflict);
        }
        self.next_borrow += 1;
        self.borrows.push((self.next_borrow, kind, r));
        Ok(self.next_borrow)
    }

    /// Ends detached view `id`: its edits were uploaded already, so nothing is marked
    /// newer on the host.
    pub fn end_detached_borrow(&mut self, id: u64) {
        if let Some(pos) = self.borrows.iter().position(|(i, _, _)| *i == id) {
            self.borrows.swap_remove(pos);
        }
    }

    /// Ends view `id`; an exclusive view leaves its range newer on the host, but for bytes
    /// a device write queued meanwhile made stale (one prepared before the view began,
    /// [`CacheState::mark_device_written`]): the device's bytes win there, as if the view
    /// had come first.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..8);
    /// let shared = c.begin_borrow(0..8, BorrowKind::Shared).unwrap();
    /// c.end_borrow(shared);
    /// assert!(c.dirty().is_empty());
    /// let exclusive = c.begin_borrow(0..8, BorrowKind::Exclusive).unwrap();
    /// c.end_borrow(exclusive);
    /// assert_eq!(c.dirty().ranges(), &[0..8]);
    /// ```
    pub fn end_borrow(&mut self, id: u64) {
        if let Some(pos) = self.borrows.iter().position(|(i, _, _)| *i == id) {
            let (_, kind, r) = self.borrows.swap_remove(pos);
            if kind == BorrowKind::Exclusive {
                for k in self.readable.within(&r) {
                    self.dirty.insert(k);
                }
            }
        }
    }

    /// Before the device reads (or, with `write`, writes) `r`: the host-newer ranges to
    /// upload first, all of them but those a mutable view is editing (they stay newer on
    /// the host until a later access). Fails while a mutable view covers `r`.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..8);
    /// let v = c.begin_borrow(0..4, BorrowKind::Exclusive).unwrap();
    /// assert!(c.plan_device_access(&(0..8)).is_err());
    /// c.end_borrow(v);
    /// assert_eq!(c.plan_device_access(&(0..8)).unwrap(), vec![0..4]);
    /// // Bytes outside an open view are reachable; its own edits wait for it to end.
    /// let v = c.begin_borrow(0..2, BorrowKind::Exclusive).unwrap();
    /// assert_eq!(c.plan_device_access(&(4..8)).unwrap(), vec![2..4]);
    /// c.mark_device_access(4..8, false);
    /// assert_eq!(c.dirty().ranges(), &[0..2]);
    /// c.end_borrow(v);
    /// ```
    pub fn plan_device_access(&self, r: &Range<usize>) -> Result<Vec<Range<usize>>, Conflict> {
        if self.conflicts(r, false) {
            return Err(Conflict);
        }
        if !self.any_editing() {
            return Ok(self.dirty.ranges().to_vec());
        }
        let editing = self.editing();
        Ok(self
            .dirty
            .ranges()
            .iter()
            .flat_map(|d| editing.missing(d))
            .collect())
    }

    /// Whether a device access has nothing to plan: no view is open and nothing is
    /// host-newer, so [`CacheState::plan_device_access`] would find no conflict and no
    /// upload.
    pub(crate) fn idle_for_device(&self) -> bool {
        self.borrows.is_empty() && self.dirty.is_empty()
    }

    /// [`CacheState::mark_device_access`] of a read, for a state
    /// [idle for the device](CacheState::idle_for_device): nothing is host-newer to clear.
    #[inline]
    pub(crate) fn mark_idle_device_read(&mut self) {
        debug_assert!(self.idle_for_device());
        self.fresh = false;
    }

    /// Whether a mutable view is open.
    fn any_editing(&self) -> bool {
        self.borrows
            .iter()
            .any(|(_, k, _)| *k == BorrowKind::Exclusive)
    }

    /// The bytes under mutable views.
    fn editing(&self) -> IntervalSet {
        let mut set = IntervalSet::new();
        for (_, kind, r) in &self.borrows {
            if *kind == BorrowKind::Exclusive {
                set.insert(r.clone());
            }
        }
        set
    }

    /// Records that the planned uploads are done and, with `write`, that the device is about
    /// to change `r`, so the host copy of `r` is stale.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..8);
    /// c.mark_device_access(0..8, false); // a kernel only read it
    /// assert!(c.plan_read(&(0..8)).unwrap().is_empty());
    /// c.mark_device_access(0..8, true); // a kernel wrote it
    /// assert_eq!(c.plan_read(&(0..8)).unwrap(), vec![0..8]);
    /// ```
    pub fn mark_device_access(&mut self, r: Range<usize>, write: bool) {
        self.fresh = false;
        // What was uploaded is no longer newer on the host: all of it but what mutable
        // views are editing (see `plan_device_access`).
        if !self.any_editing() {
            self.dirty.clear();
            if write {
                self.readable.remove(r);
            }
            return;
        }
        let mut kept = IntervalSet::new();
        for e in self.editing().ranges() {
            for d in self.dirty.ranges() {
                let (start, end) = (d.start.max(e.start), d.end.min(e.end));
                if start < end {
                    kept.insert(start..end);
                }
            }
        }
        self.dirty = kept;
        if write {
            self.readable.remove(r);
        }
    }

    /// Records that a device write of `r`, prepared earlier with
    /// [`CacheState::mark_device_access`], was queued: the host copy of `r` is stale. Host
    /// edits made since elsewhere stay dirty, to be uploaded by the next device access.
    ///
    /// ```
    /// use cuda_hal::host_cache::{BorrowKind, CacheState};
    /// let mut c = CacheState::default();
    /// c.mark_downloaded(0..100);
    /// c.mark_device_access(0..50, true); // a kernel on 0..50 is being queued
    /// let v = c.begin_borrow(50..100, BorrowKind::Exclusive).unwrap(); // meanwhile
    /// c.end_borrow(v);
    /// c.mark_device_written(0..50); // the kernel is queued
    /// assert_eq!(c.plan_device_access(&(50..100)).unwrap(), vec![50..100]);
    /// assert_eq!(c.plan_read(&(0..100)).unwrap(), vec![0..50]);
    /// ```
    pub fn mark_device_written(&mut self, r: Range<usize>) {
        self.fresh = false;
        self.dirty.remove(r.clone());
        self.readable.remove(r);
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_new_allocation_is_adopted_once_and_only_before_any_use() {
        // A view without phase 2 registers first, then adopts.
        let mut c = CacheState::for_new_allocation();
        let v = c
            .begin_detached_borrow(0..64, BorrowKind::Exclusive)
            .unwrap();
        assert!(c.adopt_fresh(&(0..64)));
        c.end_detached_borrow(v);
        assert!(!c.adopt_fresh(&(0..64)));
        // Anything that touches the allocation first ends it.
        let touch: [fn(&mut CacheState); 4] = [
            |c| c.mark_downloaded(0..8),
            |c| c.mark_device_access(0..8, false),
            |c| c.mark_device_access(8..16, true),
            |c| c.mark_device_written(0..8),
        ];
        for t in touch {
            let mut c = CacheState::for_new_allocation();
            t(&mut c);
            assert!(!c.adopt_fresh(&(32..64)));
            assert!(!c.readable().contains(&(32..64)));
        }
        // An adopted range is edited like a downloaded one: host-newer after the view.
        let mut c = CacheState::for_new_allocation();
        assert!(c.adopt_fresh(&(16..32)));
        let v = c.begin_borrow(16..32, BorrowKind::Exclusive).unwrap();
        c.end_borrow(v);
        assert_eq!(c.dirty().ranges(), &[16..32]);
        assert_eq!(c.plan_read(&(0..32)).unwrap(), vec![0..16]);
        assert!(!CacheState::default().adopt_fresh(&(0..8)));
    }

    #[test]
    fn interval_insert_merges_and_remove_splits() {
        let mut s = IntervalSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..30);
        assert_eq!(s.ranges(), &[10..40]);
        s.remove(15..25);
        assert_eq!(s.ranges(), &[10..15, 25..40]);
        assert!(s.contains(&(26..40)));
        assert!(!s.contains(&(14..26)));
        assert_eq!(s.missing(&(0..50)), vec![0..10, 15..25, 40..50]);
        assert!(s.overlaps(&(14..15)));
        assert!(!s.overlaps(&(15..25)));
    }

    #[test]
    fn view_then_device_write_invalidates() {
        let mut c = CacheState::default();
        assert_eq!(c.plan_read(&(0..100)).unwrap(), vec![0..100]);
        c.mark_downloaded(0..100);
        assert!(
            c.plan_read(&(10..20)).unwrap().is_empty(),
            "second read hits"
        );
        let up = c.plan_device_access(&(0..50)).unwrap();
        assert!(up.is_empty());
        c.mark_device_access(0..50, true);
        assert_eq!(c.plan_read(&(0..100)).unwrap(), vec![0..50]);
    }

    #[test]
    fn a_queued_device_write_keeps_host_edits_elsewhere() {
        let mut c = CacheState::default();
        c.mark_downloaded(0..100);
        assert!(c.plan_device_access(&(0..50)).unwrap().is_empty());
        c.mark_device_access(0..50, true);
        // Another thread edits the other half before the write is queued.
        let id = c.begin_borrow(50..100, BorrowKind::Exclusive).unwrap();
        c.end_borrow(id);
        c.mark_device_written(0..50);
        assert_eq!(
            c.dirty().ranges(),
            &[50..100],
            "the edit is still to upload"
        );
        assert_eq!(c.plan_device_access(&(0..100)).unwrap(), vec![50..100]);
        assert_eq!(c.plan_read(&(0..100)).unwrap(), vec![0..50]);
    }

    /// A device write checked before an exclusive view began and queued while it is open
    /// (two threads): the view's copy was downloaded before the write, so its bytes must
    /// not be uploaded over the write's when it ends.
    #[test]
    fn a_device_write_queued_during_a_view_is_not_undone_when_it_ends() {
        let mut c = CacheState::default();
        c.mark_downloaded(0..100);
        assert!(c.plan_device_access(&(0..60)).unwrap().is_empty());
        // Thread A: a kernel on 0..60 is being queued.
        c.mark_device_access(0..60, true);
        // Thread B: a mutable view of 0..100 downloads the old bytes first.
        assert_eq!(c.plan_read(&(0..100)).unwrap(), vec![0..60]);
        c.mark_downloaded(0..60);
        let v = c.begin_borrow(0..100, BorrowKind::Exclusive).unwrap();
        c.mark_device_written(0..60); // thread A: queued
        c.end_borrow(v);
        assert_eq!(
            c.dirty().ranges(),
            &[60..100],
            "only the view's other bytes"
        );
        assert_eq!(c.plan_device_access(&(0..100)).unwrap(), vec![60..100]);
        assert_eq!(
            c.plan_read(&(0..100)).unwrap(),
            vec![0..60],
            "the write's bytes"
        );
    }

    /// The same race without phase 2: a detached view marks its bytes readable when it
    /// begins, a device write queued meanwhile takes its bytes away, and the view uploads
    /// only what is left.
    #[test]
    fn a_detached_view_leaves_bytes_written_meanwhile_to_the_device() {
        let mut c = CacheState::default();
        c.mark_device_access(0..40, true); // a kernel on 0..40 is being queued
        let v = c
            .begin_detached_borrow(0..100, BorrowKind::Exclusive)
            .unwrap();
        c.mark_downloaded(0..100);
        assert!(
            c.plan_device_access(&(0..10)).is_err(),
            "refused while the view is open"
        );
        c.mark_device_written(0..40); // the kernel is queued
        assert_eq!(
            c.readable().within(&(0..100)),
            vec![40..100],
            "what the view uploads"
        );
        c.end_detached_borrow(v);
        assert!(c.dirty().is_empty());
    }

    #[test]
    fn view_mut_makes_host_newest_until_uploaded() {
        let mut c = CacheState::default();
        c.mark_downloaded(0..64);
        let id = c.begin_borrow(8..16, BorrowKind::Exclusive).unwrap();
        assert_eq!(
            c.plan_device_access(&(0..64)),
            Err(Conflict),
            "no device access mid-mutation"
        );
        assert_eq!(c.plan_read(&(0..64)), Err(Conflict));
        c.end_borrow(id);
        assert_eq!(c.dirty().ranges(), &[8..16]);
        assert_eq!(c.plan_device_access(&(32..40)).unwrap(), vec![8..16]);
        c.mark_device_access(32..40, false);
        assert!(c.dirty().is_empty());
        assert!(
            c.readable().contains(&(0..64)),
            "a device read keeps the host copy valid"
        );
    }

    #[test]
    fn device_access_outside_a_view_uploads_only_what_is_not_being_edited() {
        let mut c = CacheState::default();
        c.mark_downloaded(0..256);
        let whole = c.begin_borrow(0..256, BorrowKind::Exclusive).unwrap();
        c.end_borrow(whole); // every byte newer on the host
        let head = c.begin_borrow(0..128, BorrowKind::Exclusive).unwrap();
        // Refused through 737646b: a dirty range touched the view.
        assert_eq!(c.plan_device_access(&(128..256)).unwrap(), vec![128..256]);
        c.mark_device_access(128..256, true);
        assert_eq!(
            c.dirty().ranges(),
            &[0..128],
            "the view's bytes wait for it"
        );
        assert_eq!(c.plan_device_access(&(0..8)), Err(Conflict));
        c.end_borrow(head);
        assert_eq!(c.plan_device_access(&(0..256)).unwrap(), vec![0..128]);
        c.mark_device_access(0..256, false);
        assert!(c.dirty().is_empty());
    }

    #[test]
    fn shared_views_coexist_and_block_downloads_under_them() {
        let mut c = CacheState::default();
        c.mark_downloaded(0..32);
        let a = c.begin_borrow(0..32, BorrowKind::Shared).unwrap();
        let b = c.begin_borrow(0..16, BorrowKind::Shared).unwrap();
        assert_eq!(c.begin_borrow(0..8, BorrowKind::Exclusive), Err(Conflict));
        // The device overwrites bytes a view is reading: allowed, the view keeps its snapshot...
        c.mark_device_access(0..32, true);
        // ...but nothing may download under the active views.
        assert_eq!(c.plan_read(&(0..32)), Err(Conflict));
        c.end_borrow(a);
        c.end_borrow(b);
        assert_eq!(c.plan_read(&(0..32)).unwrap(), vec![0..32]);
    }

    proptest! {
        /// The fast path of a device access (`idle_for_device`) holds only where the plan
        /// it skips would find no conflict and nothing to upload.
        #[test]
        fn an_idle_state_plans_nothing_for_the_device(ops in proptest::collection::vec((0u8..6, 0usize..100, 1usize..40), 1..60)) {
            let mut c = CacheState::for_new_allocation();
            let mut open: Vec<u64> = Vec::new();
            for (op, start, len) in ops {
                let r = start..start + len;
                match op {
                    0 => { if let Ok(id) = c.begin_borrow(r.clone(), BorrowKind::Exclusive) { open.push(id); } }
                    1 => { if let Ok(id) = c.begin_borrow(r.clone(), BorrowKind::Shared) { open.push(id); } }
                    2 => { if let Some(id) = open.pop() { c.end_borrow(id); } }
                    3 => { if c.plan_read(&r).is_ok() { c.mark_downloaded(r.clone()); } }
                    4 => { if c.plan_device_access(&r).is_ok() { c.mark_device_access(r.clone(), start % 2 == 0); } }
                    _ => c.mark_device_written(r.clone()),
                }
                if c.idle_for_device() {
                    prop_assert_eq!(c.plan_device_access(&(0..140)), Ok(vec![]));
                    // A read's fast path leaves the state as the full mark does.
                    let (mut full, mut fast) = (c.clone(), c.clone());
                    full.mark_device_access(r.clone(), false);
                    fast.mark_idle_device_read();
                    prop_assert_eq!(format!("{full:?}"), format!("{fast:?}"));
                }
                prop_assert_eq!(c.idle_for_device(), open.is_empty() && c.dirty().is_empty());
            }
        }

        #[test]
        fn interval_set_matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0usize..200, 0usize..60), 1..60)) {
            let mut set = IntervalSet::new();
            let mut model = vec![false; 260];
            for (add, start, len) in ops {
                let r = start..start + len;
                if add { set.insert(r.clone()); } else { set.remove(r.clone()); }
                for b in &mut model[r] { *b = add; }
                // Sorted, disjoint, non-adjacent.
                for w in set.ranges().windows(2) {
                    prop_assert!(w[0].end < w[1].start);
                }
                let expect: usize = model.iter().filter(|b| **b).count();
                prop_assert_eq!(set.total(), expect);
                for (i, b) in model.iter().enumerate() {
                    prop_assert_eq!(set.contains(&(i..i + 1)), *b);
                }
                let probe = 50..150;
                let missing: usize = set.missing(&probe).iter().map(|r| r.len()).sum();
                prop_assert_eq!(missing, model[probe.clone()].iter().filter(|b| !**b).count());
                let within = set.within(&probe);
                for w in within.windows(2) {
                    prop_assert!(w[0].end < w[1].start);
                }
                for (i, b) in model.iter().enumerate() {
                    let inside = within.iter().any(|w| w.contains(&i));
                    prop_assert_eq!(inside, *b && probe.contains(&i));
                }
            }
        }
    }
}
