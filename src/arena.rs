//! A batch arena (seed 000's `GpuBufferPool`, generalised): one device region allocated up
//! front and carved into per-batch views, so processing a batch allocates nothing.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ops::{Deref, Range};

use bytemuck::Pod;

use crate::arena_placement::{Placement, Taken};
use crate::{Buffer, CudaHal, Error, Result};

/// How an arena hands out its region.
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// // Slots: each input of a proof has its own fixed room.
/// let slots = ArenaLayout::Slots(vec![("trace".into(), 1 << 20), ("public".into(), 4096)]);
/// let arena = hal.batch_arena("inputs", 0, slots).unwrap();
/// assert_eq!(arena.capacity(), (1 << 20) + 4096);
/// // Bump: whatever the batch needs, in order, up to the capacity.
/// let arena = hal.batch_arena("scratch", 1 << 20, ArenaLayout::Bump).unwrap();
/// assert_eq!(arena.capacity(), 1 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArenaLayout {
    /// A fixed capacity in bytes per named slot; a batch takes each slot at most once.
    Slots(Vec<(String, usize)>),
    /// A bump allocator over the whole region, reset for every batch.
    Bump,
}

/// Counters of an arena.
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut arena = hal.batch_arena("a", 1 << 16, ArenaLayout::Bump).unwrap();
/// for n in [10usize, 1000, 100] {
///     let batch = arena.begin_batch();
///     batch.alloc::<u32>("x", n).unwrap();
///     batch.alloc::<u32>("y", n).unwrap();
/// }
/// let s = arena.stats();
/// assert_eq!((s.batches, s.reallocations_avoided), (3, 6));
/// assert_eq!(s.peak_bytes, 4096 + 4000, "the second batch: x at 0, y at the next 256-byte boundary");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Batches begun.
    pub batches: u64,
    /// Views handed out; each would have been an allocation without the arena.
    pub reallocations_avoided: u64,
    /// Most bytes one batch used.
    pub peak_bytes: usize,
    /// Most bytes one batch used per slot (slot layout), by slot order.
    pub slot_peaks: Vec<usize>,
}

/// Over-capacity request: the numbers say by how much.
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal, Error};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut arena = hal.batch_arena("a", 1024, ArenaLayout::Bump).unwrap();
/// let batch = arena.begin_batch();
/// let _x = batch.alloc::<u8>("x", 1000).unwrap();
/// match batch.alloc::<u8>("y", 100) {
///     Err(Error::ArenaFull { requested, used, capacity, .. }) => assert_eq!((requested, used, capacity), (100, 1000, 1024)),
///     other => panic!("expected ArenaFull, got {:?}", other.err()),
/// }
/// ```
pub(crate) fn full(slot: &str, requested: usize, used: usize, capacity: usize) -> Error {
    Error::ArenaFull {
        view: slot.to_string(),
        requested,
        used,
        capacity,
    }
}

/// One device region carved per batch. See [`CudaHal::batch_arena`].
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut arena = hal.batch_arena("batch", 1 << 20, ArenaLayout::Bump).unwrap();
/// for round in 0..3u32 {
///     let batch = arena.begin_batch();
///     let views = batch.upload(&[("atoms", &[round; 100][..]), ("ids", &[7; 10][..])]).unwrap();
///     assert_eq!(views[0].get_at(99).unwrap(), round);
/// }
/// assert_eq!(arena.stats().batches, 3);
/// ```
pub struct BatchArena {
    region: Buffer<u8>,
    /// Where each batch's views go in the region.
    places: Placement,
    stats: ArenaStats,
}

/// A batch in progress: views it hands out live no longer than it.
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
/// let sum = {
///     let batch = arena.begin_batch();
///     let v = batch.upload(&[("leaves", &[1u32, 2, 3][..])]).unwrap();
///     v[0].view(|s| s.iter().sum::<u32>()).unwrap()
/// }; // the batch and its views end here; the next batch reuses the memory
/// assert_eq!(sum, 6);
/// let batch = arena.begin_batch();
/// assert_eq!(batch.used(), 0);
/// ```
pub struct Batch<'a> {
    arena: &'a mut BatchArena,
    taken: std::cell::RefCell<Taken>,
    views: std::cell::Cell<u64>,
}

/// A typed view of arena memory, valid for its batch. Dereferences to [`Buffer`].
///
/// The borrow ends with the batch, but a `Buffer` cloned out of the view (or a slice of
/// it) does not: the arena's region stays allocated, so using one after its batch is not
/// unsafe, but it then sees whatever the next batch puts at those bytes.
///
/// ```
/// use cuda_hal::{ArenaLayout, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
/// let batch = arena.begin_batch();
/// let v = batch.alloc::<u64>("acc", 16).unwrap();
/// v.fill(5).unwrap(); // any `Buffer` method
/// assert_eq!((v.len(), v.get_at(15).unwrap()), (16, 5));
/// ```
pub struct ArenaView<'b, T> {
    buffer: Buffer<T>,
    _batch: PhantomData<&'b ()>,
}

impl<T> Deref for ArenaView<'_, T> {
    type Target = Buffer<T>;
    fn deref(&self) -> &Buffer<T> {
        &self.buffer
    }
}

impl CudaHal {
    /// Allocates an arena of `capacity` bytes (rounded up to the slots' total for the slot
    /// layout) with one driver allocation.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let slots = vec![("trace".to_string(), 4096), ("ids".to_string(), 256)];
    /// let mut arena = hal.batch_arena("slots", 0, ArenaLayout::Slots(slots)).unwrap();
    /// assert!(arena.can_fit(&[4096, 256]) && !arena.can_fit(&[8192]));
    /// let batch = arena.begin_batch();
    /// let ids = batch.alloc::<u32>("ids", 64).unwrap();
    /// ids.copy_from_slice(&[9; 64]).unwrap();
    /// match batch.alloc::<u32>("trace", 2048) {
    ///     Err(Error::ArenaFull { requested, capacity, .. }) => assert_eq!((requested, capacity), (8192, 4096)),
    ///     other => panic!("expected ArenaFull, got {:?}", other.err()),
    /// }
    /// ```
    pub fn batch_arena(
        &self,
        name: impl Into<Cow<'static, str>>,
        capacity: usize,
        layout: ArenaLayout,
    ) -> Result<BatchArena> {
        let places = Placement::new(capacity, layout)?;
        let slots = places.slot_starts().len();
        Ok(BatchArena {
            region: self.alloc::<u8>(name, places.capacity())?,
            places,
            stats: ArenaStats {
                slot_peaks: vec![0; slots],
                ..Default::default()
            },
        })
    }
}

impl BatchArena {
    /// The region's size in bytes.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let arena = hal.batch_arena("a", 3 << 20, ArenaLayout::Bump).unwrap();
    /// assert_eq!(arena.capacity(), 3 << 20);
    /// ```
    pub fn capacity(&self) -> usize {
        self.region.len()
    }

    /// Counters so far.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
    /// arena.begin_batch().upload(&[("x", &[0u8; 1000][..])]).unwrap();
    /// assert_eq!(arena.stats().peak_bytes, 1000);
    /// ```
    pub fn stats(&self) -> &ArenaStats {
        &self.stats
    }

    /// Whether a batch of these requests fits, each a view of that many bytes (`u8`, or
    /// any element type whose size divides 256), in order; per slot in slot order for the
    /// slot layout. Exactly when [`Batch::alloc`] would place them all: each view starts on
    /// a 256-byte boundary, and the last needs no more than its own bytes. For other element
    /// sizes, [`BatchArena::can_fit_as`].
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let arena = hal.batch_arena("a", 1024, ArenaLayout::Bump).unwrap();
    /// assert!(arena.can_fit(&[512, 512]));
    /// assert!(arena.can_fit(&[100, 100, 100, 100]), "the last one starts at 768 and fits");
    /// assert!(!arena.can_fit(&[100, 100, 100, 1000]), "each request starts on a 256-byte boundary");
    /// ```
    pub fn can_fit(&self, bytes: &[usize]) -> bool {
        self.can_fit_as::<u8>(bytes)
    }

    /// Whether a batch of views of `T` with these lengths (in order; per slot in slot
    /// order for the slot layout) fits: exactly when [`Batch::alloc::<T>`](Batch::alloc)
    /// would place them all. A view of an element size that does not divide 256 starts at
    /// the first multiple of that size from the next 256-byte boundary on.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let arena = hal.batch_arena("a", 1024, ArenaLayout::Bump).unwrap();
    /// // 24-byte elements (a degree-3 extension of a 64-bit field): the second view
    /// // starts at 264, not 256, so 32 more elements (768 bytes) do not fit.
    /// assert!(arena.can_fit(&[24, 768]));
    /// assert!(!arena.can_fit_as::<[u64; 3]>(&[1, 32]));
    /// assert!(arena.can_fit_as::<[u64; 3]>(&[1, 31]));
    /// ```
    pub fn can_fit_as<T: Pod>(&self, lens: &[usize]) -> bool {
        self.places.can_fit(std::mem::size_of::<T>(), lens)
    }

    /// Starts a batch: everything handed out by the previous one is reused.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
    /// let first = arena.begin_batch().alloc::<u8>("x", 1).unwrap().device_ptr().unwrap().addr;
    /// let second = arena.begin_batch().alloc::<u8>("x", 1).unwrap().device_ptr().unwrap().addr;
    /// assert_eq!(first, second, "the same memory again, no allocation");
    /// ```
    pub fn begin_batch(&mut self) -> Batch<'_> {
        self.stats.batches += 1;
        Batch {
            taken: std::cell::RefCell::new(self.places.nothing_taken()),
            arena: self,
            views: std::cell::Cell::new(0),
        }
    }
}

impl Batch<'_> {
    /// Bytes used so far in this batch.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
    /// let batch = arena.begin_batch();
    /// batch.alloc::<u8>("x", 100).unwrap();
    /// batch.alloc::<u32>("y", 10).unwrap(); // starts at byte 256
    /// assert_eq!(batch.used(), 296);
    /// ```
    pub fn used(&self) -> usize {
        self.arena.places.used(&self.taken.borrow())
    }

    /// A view of `len` elements: the next free bytes (bump) or slot `name` (slots).
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let slots = ArenaLayout::Slots(vec![("a".into(), 1024), ("b".into(), 1024)]);
    /// let mut arena = hal.batch_arena("s", 0, slots).unwrap();
    /// let batch = arena.begin_batch();
    /// let b = batch.alloc::<u32>("b", 256).unwrap();
    /// assert!(batch.alloc::<u32>("b", 1).is_err(), "a slot once per batch");
    /// assert!(batch.alloc::<u32>("c", 1).is_err(), "no such slot");
    /// assert_eq!(b.len(), 256);
    /// ```
    pub fn alloc<T: Pod>(&self, name: &str, len: usize) -> Result<ArenaView<'_, T>> {
        let sz = std::mem::size_of::<T>();
        if len == 0 || sz == 0 {
            return Err(Error::ZeroLength {
                name: name.to_string(),
            });
        }
        // Every check comes before any state changes: a refused view leaves the batch as
        // it was.
        let placed = (self.arena.places).place(&self.taken.borrow(), name, sz, len)?;
        let buffer = self.arena.region.reinterpret::<T>(placed.start, len)?;
        self.taken.borrow_mut().record(placed);
        self.views.set(self.views.get() + 1);
        Ok(ArenaView {
            buffer,
            _batch: PhantomData,
        })
    }

    /// Uploads each host slice into a new view with one copy: the views are laid out in
    /// the region, so the slices are gathered into pinned memory in the same layout and
    /// copied as one range. No device memory is allocated. All or nothing: if a view does
    /// not fit or the copy fails, the batch is left as it was.
    ///
    /// ```
    /// use cuda_hal::{ArenaLayout, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut arena = hal.batch_arena("a", 1 << 20, ArenaLayout::Bump).unwrap();
    /// let before = hal.ledger();
    /// for round in 0..4u32 {
    ///     let batch = arena.begin_batch();
    ///     let views = batch.upload(&[("x", &[round; 300][..]), ("y", &[round + 1; 5][..])]).unwrap();
    ///     assert_eq!((views[0].get_at(299).unwrap(), views[1].get_at(4).unwrap()), (round, round + 1));
    /// }
    /// let d = hal.ledger().since(&before);
    /// assert_eq!(d.pool_allocs + d.driver_allocs + d.cached_allocs, 0, "no allocation per batch");
    /// assert_eq!(d.h2d.calls, 4, "one copy per batch");
    /// ```
    pub fn upload<T: Pod>(&self, items: &[(&str, &[T])]) -> Result<Vec<ArenaView<'_, T>>> {
        let _range = crate::nvtx::range(|| {
            let names = crate::nvtx::name_list(items.iter().map(|(n, _)| *n));
            format!("arena upload {} slices: {names}", items.len())
        });
        // All or nothing: if any view or the copy fails, the batch is left as it was.
        let before = (self.taken.borrow().clone(), self.views.get());
        let uploaded = self.upload_views(items);
        if uploaded.is_err() {
            let (taken, views) = before;
            *self.taken.borrow_mut() = taken;
            self.views.set(views);
        }
        uploaded
    }

    fn upload_views<T: Pod>(&self, items: &[(&str, &[T])]) -> Result<Vec<ArenaView<'_, T>>> {
        let region = &self.arena.region;
        let base = region.byte_range().start;
        // Bytes of views handed out before: a copy spanning several new views must not
        // zero them in its gaps (slots of this batch lie between new ones; a bump batch's
        // earlier views all lie below the new ones).
        // (The borrow ends here: each view's `alloc` below records itself.)
        let taken: Vec<Range<usize>> = {
            let before = self.taken.borrow();
            match self.arena.places.layout() {
                ArenaLayout::Bump => std::iter::once(base..base + before.cursor).collect(),
                ArenaLayout::Slots(_) => (self.arena.places.slot_starts().iter())
                    .zip(before.slot_used.iter())
                    .filter(|(_, used)| **used > 0)
                    .map(|(start, used)| base + start..base + start + used)
                    .collect(),
            }
        };
        let views = items
            .iter()
            .map(|(name, data)| self.alloc::<T>(name, data.len()))
            .collect::<Result<Vec<_>>>()?;
        let mut spans: Vec<(Range<usize>, &[u8])> = views
            .iter()
            .zip(items)
            .map(|(v, (_, data))| (v.byte_range(), bytemuck::cast_slice(data)))
            .collect();
        spans.sort_unstable_by_key(|(r, _)| r.start);
        for run in copy_runs(&spans, &taken) {
            let (start, end) = (run[0].0.start, run[run.len() - 1].0.end);
            // Pinned memory only the copy engine reads, as for one slice's upload.
            let streaming = region.raw().hal().streams_upload(end - start);
            let fill = |at: usize, out: &mut [u8]| pack(out, start + at, run, streaming);
            region.upload_layout(start - base, end - start, &fill)?;
        }
        Ok(views)
    }
}

/// The sorted, disjoint `spans` of one upload in runs, one copy each: a run ends where the
/// gap to the next span holds bytes of `taken` (views handed out before), which the copy's
/// zeros would overwrite. One run when the views were uploaded together.
fn copy_runs<'a, S>(
    spans: &'a [(Range<usize>, S)],
    taken: &[Range<usize>],
) -> Vec<&'a [(Range<usize>, S)]> {
    let mut runs = Vec::new();
    let mut rest = spans;
    while !rest.is_empty() {
        let mut n = 1;
        while let Some(next) = rest.get(n) {
            let gap = rest[n - 1].0.end..next.0.start;
            if taken.iter().any(|t| t.start < gap.end && gap.start < t.end) {
                break;
            }
            n += 1;
        }
        let (run, after) = rest.split_at(n);
        runs.push(run);
        rest = after;
    }
    runs
}

/// Writes every byte of `staged`, which stands for the region's bytes from `start`: the
/// part of each span's bytes that falls in that window at its place, and zeros between
/// (alignment gaps). One pass over the window: it is reused pinned memory, so what a span
/// does not cover would otherwise be another batch's bytes. The spans are sorted and do
/// not overlap; a large upload packs its runs window by window, on several threads.
/// `streaming`: the spans' bytes go in with streaming stores (see `crate::fastcopy`).
fn pack(staged: &mut [u8], start: usize, spans: &[(Range<usize>, &[u8])], streaming: bool) {
    let end = start + staged.len();
    let first = spans.partition_point(|(r, _)| r.end <= start);
    let mut at = 0;
    for (r, bytes) in &spans[first..] {
        if r.start >= end {
            break;
        }
        let (lo, hi) = (r.start.max(start), r.end.min(end));
        staged[at..lo - start].fill(0);
        crate::fastcopy::copy_unfenced(
            &mut staged[lo - start..hi - start],
            &bytes[lo - r.start..hi - r.start],
            streaming,
        );
        at = hi - start;
    }
    staged[at..].fill(0);
    if streaming {
        crate::fastcopy::fence();
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let used = self.used();
        let taken = self.taken.borrow();
        (self.arena.stats).record_batch(used, &taken.slot_used, self.views.get());
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_runs, pack};

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn a_copy_never_spans_a_view_handed_out_before() {
        let spans = [(0..10, 'a'), (20..30, 'b'), (40..50, 'c'), (50..60, 'd')];
        let ends = |taken: &[std::ops::Range<usize>]| -> Vec<(usize, usize)> {
            copy_runs(&spans, taken)
                .iter()
                .map(|r| (r[0].0.start, r[r.len() - 1].0.end))
                .collect()
        };
        assert_eq!(ends(&[]), vec![(0, 60)], "nothing before: one copy");
        assert_eq!(
            ends(&[0..0]),
            vec![(0, 60)],
            "an empty slot is in nobody's way"
        );
        assert_eq!(ends(&[12..15]), vec![(0, 10), (20, 60)]);
        assert_eq!(ends(&[9..11, 35..36]), vec![(0, 10), (20, 30), (40, 60)]);
        assert_eq!(
            ends(&[60..100]),
            vec![(0, 60)],
            "after the last span: no gap"
        );
        assert!(copy_runs::<char>(&[], &[0..5]).is_empty());
    }

    #[test]
    fn pack_writes_spans_in_place_and_zeros_the_gaps() {
        // Stale bytes of an earlier batch in the reused block.
        let mut staged = vec![0xEEu8; 16];
        let (a, b) = ([1u8, 2, 3], [4u8; 4]);
        // The region's bytes 100..116: `a` at 101..104, `b` at 108..112.
        pack(
            &mut staged,
            100,
            &[(101..104, &a[..]), (108..112, &b[..])],
            false,
        );
        assert_eq!(
            staged,
            [0, 1, 2, 3, 0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0],
            "spans in place, every other byte zero"
        );
    }

    #[test]
    fn pack_with_no_gaps_copies_the_spans_back_to_back() {
        let mut staged = vec![0xEEu8; 6];
        pack(
            &mut staged,
            0,
            &[(0..2, &[9u8, 8][..]), (2..6, &[7u8; 4][..])],
            false,
        );
        assert_eq!(staged, [9, 8, 7, 7, 7, 7]);
    }

    #[test]
    fn a_window_gets_only_the_bytes_that_fall_in_it() {
        let (a, b) = ([1u8, 2, 3, 4], [5u8, 6]);
        let spans = [(2..6, &a[..]), (8..10, &b[..])];
        let mut staged = vec![0xEEu8; 5];
        // The run's bytes 4..9: the end of `a`, a gap, the start of `b`.
        pack(&mut staged, 4, &spans, false);
        assert_eq!(staged, [3, 4, 0, 0, 5]);
        let mut past = vec![0xEEu8; 3];
        pack(&mut past, 10, &spans, false);
        assert_eq!(past, [0, 0, 0], "a window past every span is zeros");
    }

    #[test]
    fn streaming_stores_pack_the_bytes_plain_ones_do() {
        // Spans long enough to stream, at offsets that are not 16-byte aligned, and windows
        // that cut them anywhere.
        let data: Vec<Vec<u8>> = [5000usize, 70_001, 4096, 3]
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|j| (j * 31 + i * 7) as u8).collect())
            .collect();
        let mut spans = Vec::new();
        let mut at = 3;
        for (bytes, gap) in data.iter().zip([0usize, 13, 1, 4100]) {
            at += gap;
            spans.push((at..at + bytes.len(), &bytes[..]));
            at += bytes.len();
        }
        let (start, end) = (spans[0].0.start, spans[3].0.end);
        let mut plain = vec![0xEEu8; end - start];
        pack(&mut plain, start, &spans, false);
        for window in [end - start, 4096, 9999] {
            let mut streamed = vec![0xEEu8; end - start + 1];
            for (k, out) in streamed[1..].chunks_mut(window).enumerate() {
                pack(out, start + k * window, &spans, true);
            }
            assert_eq!(streamed[0], 0xEE, "nothing written before the window");
            assert!(streamed[1..] == plain[..], "window {window}");
        }
    }

    proptest::proptest! {
        /// A large upload packs its run window by window, on several threads: whatever the
        /// windows, together they write what one pack of the whole run writes.
        #[test]
        fn packing_in_windows_writes_what_one_pack_writes(
            lens in proptest::collection::vec((0usize..40, 0usize..12), 1..8),
            window in 1usize..50,
        ) {
            let mut spans = Vec::new();
            let mut at = 0;
            let data: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &(len, _))| vec![i as u8 + 1; len])
                .collect();
            for (bytes, &(len, gap)) in data.iter().zip(&lens) {
                at += gap;
                spans.push((at..at + len, &bytes[..]));
                at += len;
            }
            let (start, end) = (spans[0].0.start, spans[spans.len() - 1].0.end);
            let mut whole = vec![0xEEu8; end - start];
            pack(&mut whole, start, &spans, false);
            let mut windowed = vec![0xEEu8; end - start];
            for (k, out) in windowed.chunks_mut(window).enumerate() {
                pack(out, start + k * window, &spans, false);
            }
            proptest::prop_assert_eq!(windowed, whole);
        }
    }
}
