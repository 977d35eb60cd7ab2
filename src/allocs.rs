//! The bookkeeping of device allocations under one lock: the phase-3 block cache, the
//! live-allocation tracker and the hot-path counts. A pooled allocation and every free
//! take the lock once, so tracking adds only plain memory writes to a lock section the
//! block cache needs anyway.

use std::borrow::Cow;

use cuda_sys::CUdeviceptr;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::ledger::HotCounts;
use crate::tracking::{MemoryReport, TrackId, Tracker};

/// The allocation bookkeeping of one HAL.
pub(crate) struct Allocs {
    state: Mutex<State>,
    /// Whether allocations are tracked (`track_allocations`, or a limit is set).
    tracking: bool,
    /// The byte limit, `usize::MAX` when there is none.
    limit: usize,
    /// Most bytes the block cache keeps.
    cache_limit: usize,
}

#[derive(Default)]
struct State {
    blocks: BlockCache,
    tracker: Tracker,
    counts: HotCounts,
}

/// What [`Allocs::alloc`] granted.
pub(crate) struct Granted {
    /// The tracker's id of the allocation, when tracking.
    pub(crate) track_id: Option<TrackId>,
    /// A cached block of exactly the requested size, if there was one.
    pub(crate) cached: Option<CUdeviceptr>,
}

impl Allocs {
    pub(crate) fn new(tracking: bool, limit: Option<usize>, cache_limit: usize) -> Self {
        Allocs {
            state: Mutex::default(),
            tracking: tracking || limit.is_some(),
            limit: limit.unwrap_or(usize::MAX),
            cache_limit,
        }
    }

    /// One lock section: refuses `bytes` past the limit (`None`), tracks the allocation
    /// when tracking, and when `pooled` takes a cached block of exactly `bytes`. Takes no
    /// lock when neither applies.
    #[allow(clippy::ptr_arg)] // a borrowed name is keyed by its address
    #[inline]
    pub(crate) fn alloc(
        &self,
        name: &Cow<'static, str>,
        bytes: usize,
        pooled: bool,
    ) -> Option<Granted> {
        if !self.tracking && !pooled {
            return Some(Granted {
                track_id: None,
                cached: None,
            });
        }
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let track_id = match self.tracking {
            true => Some(s.tracker.track_within(name, bytes, self.limit)?),
            false => None,
        };
        let cached = if pooled { s.blocks.take(bytes) } else { None };
        s.counts.cached_allocs += cached.is_some() as u64;
        Some(Granted { track_id, cached })
    }

    /// Forgets the tracked allocation the driver then refused.
    pub(crate) fn abandon(&self, track_id: Option<TrackId>) {
        if let Some(id) = track_id {
            self.state.lock().tracker.untrack(id);
        }
    }

    /// One lock section: counts a free and untracks it; with `offer`, the cache keeps the
    /// block if it fits. True when it was kept: the caller must not free it.
    #[inline]
    pub(crate) fn free(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        track_id: Option<TrackId>,
        offer: bool,
    ) -> bool {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        s.counts.frees += 1;
        if let Some(id) = track_id {
            s.tracker.untrack(id);
        }
        offer && s.blocks.put(ptr, bytes, self.cache_limit)
    }

    /// Tracks an allocation made elsewhere (managed memory) whether tracking is on or not,
    /// within the limit; its id, or `None` past the limit.
    #[allow(clippy::ptr_arg)]
    pub(crate) fn track(&self, name: &Cow<'static, str>, bytes: usize) -> Option<TrackId> {
        self.state
            .lock()
            .tracker
            .track_within(name, bytes, self.limit)
    }

    /// Forgets an allocation of [`Allocs::track`].
    pub(crate) fn untrack(&self, id: TrackId) {
        self.state.lock().tracker.untrack(id);
    }

    pub(crate) fn report(&self) -> MemoryReport {
        self.state.lock().tracker.report()
    }

    pub(crate) fn counts(&self) -> HotCounts {
        self.state.lock().counts
    }

    /// Bytes of blocks in the cache.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.state.lock().blocks.bytes
    }

    /// Empties the block cache; the caller frees the blocks.
    pub(crate) fn drain_cache(&self) -> Vec<CUdeviceptr> {
        self.state.lock().blocks.drain()
    }
}

/// Freed pool blocks kept for reuse, keyed by exact size.
#[derive(Default)]
struct BlockCache {
    by_size: FxHashMap<usize, Vec<CUdeviceptr>>,
    bytes: usize,
}

impl BlockCache {
    fn take(&mut self, bytes: usize) -> Option<CUdeviceptr> {
        let ptr = self.by_size.get_mut(&bytes)?.pop()?;
        self.bytes -= bytes;
        Some(ptr)
    }

    /// Keeps the block if the cache stays within `limit`; false if the caller must free it.
    fn put(&mut self, ptr: CUdeviceptr, bytes: usize, limit: usize) -> bool {
        if self.bytes + bytes > limit {
            return false;
        }
        self.by_size.entry(bytes).or_default().push(ptr);
        self.bytes += bytes;
        true
    }

    fn drain(&mut self) -> Vec<CUdeviceptr> {
        self.bytes = 0;
        self.by_size.drain().flat_map(|(_, v)| v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COL: Cow<'static, str> = Cow::Borrowed("column");

    #[test]
    fn a_freed_block_is_reused_by_the_next_allocation_of_its_size() {
        let a = Allocs::new(true, None, 1000);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(g.track_id.is_some() && g.cached.is_none());
        assert!(a.free(0xA000, 100, g.track_id, true), "kept by the cache");
        assert_eq!(a.cached_bytes(), 100);
        assert_eq!(a.alloc(&COL, 200, true).unwrap().cached, None, "other size");
        let g = a.alloc(&COL, 100, true).unwrap();
        assert_eq!(g.cached, Some(0xA000));
        assert_eq!(a.cached_bytes(), 0);
        assert!(!a.free(0xB000, 2000, None, true), "too big for the cache");
        assert!(!a.free(0xC000, 100, g.track_id, false), "not offered");
        let counts = a.counts();
        assert_eq!((counts.cached_allocs, counts.frees), (1, 3));
        let r = a.report();
        assert_eq!((r.current_bytes, r.peak_bytes, r.live.len()), (200, 300, 1));
        assert!(a.free(0xD000, 100, None, true));
        assert_eq!(a.drain_cache(), vec![0xD000]);
        assert_eq!(a.cached_bytes(), 0);
    }

    #[test]
    fn without_tracking_only_the_cache_and_counts_are_kept() {
        let a = Allocs::new(false, None, 1000);
        let g = a.alloc(&COL, 100, false).unwrap();
        assert_eq!((g.track_id, g.cached), (None, None));
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.free(0xA000, 100, g.track_id, true));
        assert_eq!(a.alloc(&COL, 100, true).unwrap().cached, Some(0xA000));
        assert_eq!(a.report(), MemoryReport::default());
        assert_eq!(a.counts().cached_allocs, 1);
    }

    #[test]
    fn a_limit_turns_tracking_on_and_refuses_before_the_cache_is_touched() {
        let a = Allocs::new(false, Some(150), 1000);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(g.track_id.is_some());
        assert!(a.free(0xA000, 100, g.track_id, true));
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.alloc(&COL, 100, true).is_none(), "over the limit");
        assert_eq!(a.counts().cached_allocs, 1);
        a.abandon(g.track_id);
        assert_eq!(a.report().current_bytes, 0);
        let id = a.track(&Cow::Owned("managed".into()), 150).unwrap();
        assert_eq!(a.track(&COL, 1), None);
        a.untrack(id);
        assert_eq!(a.report().current_bytes, 0);
    }

    #[test]
    fn concurrent_allocations_and_frees_keep_consistent_totals() {
        use std::collections::HashSet;
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

        const THREADS: usize = 8;
        const ROUNDS: usize = 3000;
        const HELD: usize = 5;
        let a = Allocs::new(true, None, 4096);
        let names: [Cow<'static, str>; 3] = [
            Cow::Borrowed("column"),
            Cow::Borrowed("tree"),
            Cow::Owned("column".to_string()),
        ];
        let next_ptr = AtomicU64::new(1);
        let in_use = parking_lot::Mutex::new(HashSet::new());
        let held: Vec<Vec<(CUdeviceptr, usize, Option<TrackId>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (a, names, next_ptr, in_use) = (&a, &names, &next_ptr, &in_use);
                    scope.spawn(move || {
                        let mut held = Vec::new();
                        for i in 0..ROUNDS {
                            let bytes = 64 * (1 + (i * 7 + t) % 4);
                            let g = a.alloc(&names[i % 3], bytes, true).unwrap();
                            let ptr = g.cached.unwrap_or_else(|| next_ptr.fetch_add(1, Relaxed));
                            assert!(in_use.lock().insert(ptr), "block {ptr} handed out twice");
                            held.push((ptr, bytes, g.track_id));
                            if held.len() > HELD {
                                let (ptr, bytes, id) = held.swap_remove((i * 31) % held.len());
                                in_use.lock().remove(&ptr);
                                a.free(ptr, bytes, id, true);
                            }
                        }
                        held
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let held: Vec<_> = held.into_iter().flatten().collect();
        let r = a.report();
        assert_eq!(r.live.len(), THREADS * HELD);
        let live_ids: HashSet<u64> = r.live.iter().map(|l| l.id).collect();
        let held_ids: HashSet<u64> = held.iter().map(|h| h.2.unwrap().public()).collect();
        assert_eq!(live_ids, held_ids, "the live ids are exactly those held");
        assert_eq!(r.current_bytes, held.iter().map(|h| h.1).sum::<usize>());
        assert!(r.peak_bytes >= r.current_bytes);
        let sum = |f: fn(&crate::NameTotals) -> usize| r.by_name.iter().map(f).sum::<usize>();
        assert_eq!(sum(|n| n.current_bytes), r.current_bytes);
        assert_eq!(sum(|n| n.live), THREADS * HELD);
        // `column` (static and owned) is used by two rounds in three, `tree` by the third.
        let allocations: Vec<(&str, u64)> = r
            .by_name
            .iter()
            .map(|n| (n.name.as_str(), n.allocations))
            .collect();
        let tree = (THREADS * ROUNDS / 3) as u64;
        let mut expected = vec![("column", (THREADS * ROUNDS) as u64 - tree), ("tree", tree)];
        let mut got = allocations.clone();
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
        for (ptr, bytes, id) in held {
            a.free(ptr, bytes, id, true);
        }
        let r = a.report();
        assert_eq!((r.current_bytes, r.live.len()), (0, 0));
        assert!(r
            .by_name
            .iter()
            .all(|n| n.live == 0 && n.current_bytes == 0));
        let c = a.counts();
        assert_eq!(c.frees as usize, THREADS * ROUNDS);
        let fresh = next_ptr.load(Relaxed) - 1;
        assert_eq!(c.cached_allocs + fresh, (THREADS * ROUNDS) as u64);
        assert!(c.cached_allocs > 0, "the cache served some");
    }
}
