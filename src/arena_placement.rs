//! A batch arena's host-side arithmetic: where each view of a batch goes, what a batch
//! has taken, whether a batch fits, and the counters a finished batch adds. No memory and
//! no driver: [`crate::BatchArena`] carves its region by it, and the tests here check it
//! against a model on the CPU.

use crate::arena::{full, ArenaLayout, ArenaStats};
use crate::{Error, Result};

/// Views start on boundaries of this many bytes (and on a multiple of their element size).
pub(crate) const VIEW_ALIGN: usize = 256;

/// Where the views of an arena's batches go.
#[derive(Clone, Debug)]
pub(crate) struct Placement {
    layout: ArenaLayout,
    /// Byte offset of each slot (slot layout).
    slot_starts: Vec<usize>,
    /// The region's bytes.
    capacity: usize,
}

/// What a batch has taken so far: the bump cursor (bump layout) and the bytes of each slot
/// (slot layout; 0 for a slot not taken).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) cursor: usize,
    pub(crate) slot_used: Vec<usize>,
}

/// A view placed: its first byte, its bytes, and its slot (slot layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) start: usize,
    pub(crate) bytes: usize,
    pub(crate) slot: Option<usize>,
}

impl Placement {
    /// The placement of an arena of `capacity` bytes with `layout`: slots laid out in
    /// order, each rounded up to [`VIEW_ALIGN`], the capacity raised to their total.
    pub(crate) fn new(capacity: usize, layout: ArenaLayout) -> Result<Placement> {
        let mut slot_starts = Vec::new();
        let capacity = match &layout {
            ArenaLayout::Bump => capacity,
            ArenaLayout::Slots(slots) => {
                let mut off = 0usize;
                for (slot, cap) in slots {
                    slot_starts.push(off);
                    off = cap
                        .checked_next_multiple_of(VIEW_ALIGN)
                        .and_then(|c| off.checked_add(c))
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "arena slots overflow the address space at slot `{slot}`"
                            ))
                        })?;
                }
                off.max(capacity)
            }
        };
        Ok(Placement {
            layout,
            slot_starts,
            capacity,
        })
    }

    /// The region's bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The arena's layout.
    pub(crate) fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    /// Byte offset of each slot (slot layout; none for bump).
    pub(crate) fn slot_starts(&self) -> &[usize] {
        &self.slot_starts
    }

    /// What a new batch has taken: nothing.
    pub(crate) fn nothing_taken(&self) -> Taken {
        Taken {
            cursor: 0,
            slot_used: vec![0; self.slot_starts.len()],
        }
    }

    /// Bytes a batch that took `taken` uses.
    pub(crate) fn used(&self, taken: &Taken) -> usize {
        match self.layout {
            ArenaLayout::Bump => taken.cursor,
            ArenaLayout::Slots(_) => taken.slot_used.iter().sum(),
        }
    }

    /// Where a view `name` of `len` elements of `sz` bytes (both > 0) goes after `taken`:
    /// the next free bytes (bump) or slot `name` (slots). Refused (`ArenaFull` with the
    /// numbers, or `InvalidArgument`) where it does not fit, names no slot, takes a slot
    /// twice, or a slot's start is not aligned for the elements. Changes nothing: the
    /// caller records a placement with [`Taken::record`].
    pub(crate) fn place(&self, taken: &Taken, name: &str, sz: usize, len: usize) -> Result<Placed> {
        let bytes = len
            .checked_mul(sz)
            .ok_or_else(|| full(name, usize::MAX, self.used(taken), self.capacity))?;
        match &self.layout {
            ArenaLayout::Bump => {
                let start = bump_start(taken.cursor, sz)
                    .filter(|s| s.checked_add(bytes).is_some_and(|end| end <= self.capacity));
                let Some(start) = start else {
                    return Err(full(name, bytes, taken.cursor, self.capacity));
                };
                Ok(Placed {
                    start,
                    bytes,
                    slot: None,
                })
            }
            ArenaLayout::Slots(slots) => {
                let i = slots
                    .iter()
                    .position(|(n, _)| n == name)
                    .ok_or_else(|| Error::InvalidArgument(format!("arena has no slot `{name}`")))?;
                if taken.slot_used[i] != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "slot `{name}` already used in this batch"
                    )));
                }
                let cap = slots[i].1;
                if bytes > cap {
                    return Err(full(name, bytes, 0, cap));
                }
                let start = self.slot_starts[i];
                if start % sz != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "slot `{name}` is not aligned for {sz}-byte elements"
                    )));
                }
                Ok(Placed {
                    start,
                    bytes,
                    slot: Some(i),
                })
            }
        }
    }

    /// Whether views of `sz`-byte elements (> 0) with these lengths fit a new batch, in
    /// order (per slot in slot order for the slot layout): exactly when [`Placement::place`]
    /// would place them all.
    pub(crate) fn can_fit(&self, sz: usize, lens: &[usize]) -> bool {
        let bytes = |len: usize| len.checked_mul(sz).filter(|b| *b > 0);
        match &self.layout {
            ArenaLayout::Bump => lens
                .iter()
                .try_fold(0usize, |cursor, len| {
                    let end = bump_start(cursor, sz)?.checked_add(bytes(*len)?)?;
                    (end <= self.capacity).then_some(end)
                })
                .is_some(),
            ArenaLayout::Slots(slots) => {
                lens.len() <= slots.len()
                    && lens.iter().zip(slots).zip(&self.slot_starts).all(
                        |((len, (_, cap)), start)| {
                            bytes(*len).is_some_and(|b| b <= *cap) && start % sz == 0
                        },
                    )
            }
        }
    }
}

impl Taken {
    /// Records view `placed`.
    pub(crate) fn record(&mut self, placed: Placed) {
        match placed.slot {
            None => self.cursor = placed.start + placed.bytes,
            Some(i) => self.slot_used[i] = placed.bytes,
        }
    }
}

impl ArenaStats {
    /// Adds a finished batch that used `used` bytes, `slot_used` per slot, and handed out
    /// `views` views (each an allocation the arena saved).
    pub(crate) fn record_batch(&mut self, used: usize, slot_used: &[usize], views: u64) {
        self.peak_bytes = self.peak_bytes.max(used);
        for (p, u) in self.slot_peaks.iter_mut().zip(slot_used) {
            *p = (*p).max(*u);
        }
        self.reallocations_avoided += views;
    }
}

/// Where a bump view of `sz`-byte elements starts with the batch's cursor at `cursor`: the
/// first multiple of `sz` from the next [`VIEW_ALIGN`] boundary on (the boundary itself
/// for sizes that divide it). `None` past the address space.
fn bump_start(cursor: usize, sz: usize) -> Option<usize> {
    cursor
        .checked_next_multiple_of(VIEW_ALIGN)?
        .checked_next_multiple_of(sz)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Element sizes of the crate's users: bytes, words, field and extension elements,
    /// digests, and sizes that do not divide 256.
    const SIZES: [usize; 8] = [1, 2, 4, 8, 12, 24, 32, 40];

    fn bump(capacity: usize) -> Placement {
        Placement::new(capacity, ArenaLayout::Bump).unwrap()
    }

    fn slots(caps: &[usize]) -> Placement {
        let slots = caps
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("s{i}"), *c))
            .collect();
        Placement::new(0, ArenaLayout::Slots(slots)).unwrap()
    }

    #[test]
    fn slots_are_laid_out_in_order_on_256_byte_boundaries() {
        let p = slots(&[100, 256, 1]);
        assert_eq!(p.slot_starts(), &[0, 256, 512]);
        assert_eq!(p.capacity(), 768);
        let wide = Placement::new(4096, p.layout().clone()).unwrap();
        assert_eq!(wide.capacity(), 4096, "a larger capacity is kept");
        let overflow = ArenaLayout::Slots(vec![("a".into(), usize::MAX)]);
        assert!(matches!(
            Placement::new(0, overflow),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn bump_views_start_on_the_next_boundary_for_their_elements() {
        let p = bump(1024);
        let mut t = p.nothing_taken();
        let a = p.place(&t, "a", 1, 100).unwrap();
        t.record(a);
        let b = p.place(&t, "b", 24, 1).unwrap();
        assert_eq!(
            (a.start, b.start),
            (0, 264),
            "264: the first multiple of 24 from 256"
        );
        t.record(b);
        assert_eq!(p.used(&t), 288);
        match p.place(&t, "c", 4, 200) {
            Err(Error::ArenaFull {
                requested,
                used,
                capacity,
                ..
            }) => assert_eq!((requested, used, capacity), (800, 288, 1024)),
            other => panic!("expected ArenaFull, got {other:?}"),
        }
        assert!(matches!(
            p.place(&t, "huge", 8, usize::MAX),
            Err(Error::ArenaFull {
                requested: usize::MAX,
                ..
            })
        ));
    }

    #[test]
    fn a_slot_is_taken_once_per_batch_by_its_name() {
        let p = slots(&[1024, 100]);
        let mut t = p.nothing_taken();
        let s1 = p.place(&t, "s1", 4, 25).unwrap();
        assert_eq!((s1.start, s1.bytes, s1.slot), (1024, 100, Some(1)));
        t.record(s1);
        assert!(matches!(
            p.place(&t, "s1", 4, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            p.place(&t, "s9", 4, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            p.place(&t, "s0", 4, 257),
            Err(Error::ArenaFull {
                requested: 1028,
                used: 0,
                capacity: 1024,
                ..
            })
        ));
        // Slot 1 starts at 1024: not a multiple of 24.
        let q = slots(&[100, 240]);
        assert_eq!(q.slot_starts()[1], 256);
        assert!(q.place(&q.nothing_taken(), "s1", 24, 10).is_err());
        assert_eq!(p.used(&t), 100);
    }

    #[test]
    fn a_batch_adds_its_peaks_and_its_views() {
        let mut s = ArenaStats {
            slot_peaks: vec![0, 0],
            ..Default::default()
        };
        s.record_batch(300, &[200, 100], 2);
        s.record_batch(250, &[0, 250], 1);
        assert_eq!(s.peak_bytes, 300);
        assert_eq!(s.slot_peaks, vec![200, 250]);
        assert_eq!(s.reallocations_avoided, 3);
    }

    /// A placement checked against what it promises: every view placed lies in the
    /// region, on its boundary, past every view before it (bump) or in its own slot, never
    /// overlapping another; a refused one changes nothing; `can_fit` says yes exactly when
    /// each of the lengths in turn is placed.
    fn check_a_batch(
        p: &Placement,
        sz: usize,
        lens: &[usize],
    ) -> std::result::Result<(), TestCaseError> {
        let mut t = p.nothing_taken();
        let mut placed: Vec<Placed> = Vec::new();
        let mut all = true;
        for (k, len) in lens.iter().enumerate() {
            let name = match p.layout() {
                ArenaLayout::Bump => "view".to_string(),
                ArenaLayout::Slots(_) => format!("s{k}"),
            };
            let before = t.clone();
            match p.place(&t, &name, sz, *len) {
                Ok(v) => {
                    prop_assert!(v.start + v.bytes <= p.capacity());
                    prop_assert_eq!(v.bytes, len * sz);
                    prop_assert_eq!(v.start % sz, 0);
                    if matches!(p.layout(), ArenaLayout::Bump) {
                        prop_assert!(v.start >= t.cursor);
                        prop_assert_eq!(
                            v.start,
                            t.cursor.next_multiple_of(256).next_multiple_of(sz)
                        );
                    }
                    for w in &placed {
                        prop_assert!(v.start >= w.start + w.bytes || w.start >= v.start + v.bytes);
                    }
                    t.record(v);
                    placed.push(v);
                }
                Err(e) => {
                    let typed = matches!(e, Error::ArenaFull { .. } | Error::InvalidArgument(_));
                    prop_assert!(typed, "an untyped refusal: {}", e);
                    prop_assert_eq!(&t, &before, "a refusal leaves the batch as it was");
                    all = false;
                    // (Bump: the next views would start from the same cursor; stop here so
                    // that `all` means "the lengths in turn".)
                    break;
                }
            }
        }
        prop_assert_eq!(p.can_fit(sz, lens), all, "can_fit of {:?} x {} B", lens, sz);
        let used: usize = match p.layout() {
            ArenaLayout::Bump => placed.last().map_or(0, |v| v.start + v.bytes),
            ArenaLayout::Slots(_) => placed.iter().map(|v| v.bytes).sum(),
        };
        prop_assert_eq!(p.used(&t), used);
        Ok(())
    }

    proptest! {
        #[test]
        fn bump_batches_match_their_promises(
            capacity in 1usize..20_000,
            size in 0usize..SIZES.len(),
            lens in prop::collection::vec(1usize..2_000, 0..12),
        ) {
            check_a_batch(&bump(capacity), SIZES[size], &lens)?;
        }

        /// Capacities at the edge: the lengths' exact fit, a byte short of it, a byte over.
        #[test]
        fn bump_batches_at_the_edge_match_their_promises(
            size in 0usize..SIZES.len(),
            lens in prop::collection::vec(1usize..2_000, 1..8),
            slack in 0usize..3,
        ) {
            let sz = SIZES[size];
            let exact = lens.iter().fold(0usize, |cursor, len| {
                cursor.next_multiple_of(256).next_multiple_of(sz) + len * sz
            });
            check_a_batch(&bump(exact + slack - 1), sz, &lens)?;
        }

        /// Slots at the edge: each as large as its view, a byte short, or a byte over.
        #[test]
        fn slot_batches_at_the_edge_match_their_promises(
            size in 0usize..SIZES.len(),
            views in prop::collection::vec((1usize..400, 0usize..3), 1..6),
        ) {
            let sz = SIZES[size];
            let caps: Vec<usize> = views.iter().map(|(len, slack)| len * sz + slack - 1).collect();
            let lens: Vec<usize> = views.iter().map(|(len, _)| *len).collect();
            check_a_batch(&slots(&caps), sz, &lens)?;
        }

        #[test]
        fn slot_batches_match_their_promises(
            caps in prop::collection::vec(1usize..3_000, 1..6),
            size in 0usize..SIZES.len(),
            lens in prop::collection::vec(1usize..400, 0..6),
        ) {
            let p = slots(&caps);
            let lens = &lens[..lens.len().min(caps.len())];
            check_a_batch(&p, SIZES[size], lens)?;
        }
    }
}
