//! The bookkeeping of device allocations under one lock: the phase-3 block cache, the
//! live-allocation tracker and the hot-path counts. A pooled allocation and every free
//! take the lock once, so tracking adds only plain memory writes to a lock section the
//! block cache needs anyway. A tracked HAL keeps no counts of its own there:
//! [`Allocs::counts`] derives them from the tracker's records, which spares the tracked
//! path two of its memory writes (on the H100 host that halved what tracking costs).
//!
//! A request first finds its size class and name id in one probe of [`AllocKeys`], keyed
//! by size and the static name's address; the allocation then carries both (a
//! [`Ticket`]), so freeing it needs no lookup at all. A size first seen past the block
//! cache's cap gets no class ([`NO_CLASS`]): its blocks are allocated and tracked as any
//! other, and go back to the pool when freed. A name first seen past the tracker's cap
//! ([`OVERFLOW_NAME`]) is never remembered by its key: its requests take the slow path,
//! which gives each allocation's text to the tracker for the report, and sends it to a new
//! block (not a cached one), whose slot the tracker knows in advance.

use std::borrow::Cow;

use cuda_sys::CUdeviceptr;
use parking_lot::Mutex;

use crate::alloc_keys::{AllocKeys, NameKey, Resolved};
use crate::block_cache::{BlockCache, Parked, NO_CLASS};
use crate::ledger::HotCounts;
use crate::tracking::{MemoryReport, Tracker, NO_NAME, NO_SLOT, OVERFLOW_NAME};

/// The allocation bookkeeping of one HAL. Laid out hot fields first from a cache line's
/// start, so that the allocation path touches as few lines as it can.
#[repr(C, align(64))]
pub(crate) struct Allocs {
    /// Whether allocations are tracked (`track_allocations`, or a limit is set).
    tracking: bool,
    /// Most bytes the block cache keeps.
    cache_limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
#[repr(C)]
struct State {
    keys: AllocKeys,
    /// The hot-path counts of an untracked HAL (a tracked one derives them).
    counts: HotCounts,
    blocks: BlockCache,
    tracker: Tracker,
    /// Allocations of [`Allocs::track`] released by [`Allocs::untrack`].
    untracked: u64,
}

/// What an allocation keeps for its free: its size class, and when tracked its slot and
/// name id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    class: u32,
    slot: u32,
    name: u32,
}

impl Ticket {
    /// An untracked allocation that is not from the pool.
    const NONE: Ticket = Ticket {
        class: NO_CLASS,
        slot: NO_SLOT,
        name: NO_NAME,
    };

    /// The allocation id reports show, when tracked.
    #[cfg(test)]
    pub(crate) fn id(self) -> Option<u64> {
        (self.slot != NO_SLOT).then_some(u64::from(self.slot))
    }
}

/// What [`Allocs::alloc`] granted.
pub(crate) struct Granted {
    pub(crate) ticket: Ticket,
    /// A cached block of exactly the requested size, if there was one.
    pub(crate) cached: Option<CUdeviceptr>,
}

/// The names of the crate's own allocations, known to a tracked HAL from its start: a
/// prover's names, however many, never push them past the tracker's cap, so they keep
/// their totals in reports, and their cached blocks (a read's snapshot counts on one: see
/// `HalInner::fits_easily`).
const OWN_NAMES: [&str; 10] = [
    crate::transfer::READ_SNAPSHOT_NAME,
    crate::transfer::GATHER_SCRATCH,
    crate::transfer::UPLOAD_BATCH_SCRATCH,
    crate::transfer::DOWNLOAD_BATCH_SCRATCH,
    crate::pipeline::PIPELINE_IN,
    crate::pipeline::PIPELINE_OUT,
    crate::prover_ops::PROVER_TWIDDLES,
    crate::prover_ops::PROVER_SHIFT_POWERS,
    crate::prover_ops::PROVER_POSEIDON2,
    crate::prover_ops::PROVER_NTT_SCRATCH,
];

impl Allocs {
    pub(crate) fn new(tracking: bool, limit: Option<usize>, cache_limit: usize) -> Self {
        let tracking = tracking || limit.is_some();
        let mut tracker = Tracker::with_limit(limit.unwrap_or(usize::MAX));
        if tracking {
            tracker.reserve_names(&OWN_NAMES);
        }
        Allocs {
            tracking,
            cache_limit,
            state: Mutex::new(State {
                tracker,
                ..State::default()
            }),
        }
    }

    /// One lock section: refuses `bytes` (> 0) past the limit (`None`), tracks the
    /// allocation when tracking, and when `pooled` takes a cached block of exactly `bytes`.
    /// Takes no lock when neither applies.
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
                ticket: Ticket::NONE,
                cached: None,
            });
        }
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let found = match name {
            Cow::Borrowed(text) if self.tracking => s.find(bytes, NameKey::of(text), name),
            // A tracked name that is not static has no key: its id is found by its text.
            Cow::Owned(_) if self.tracking => s.find_owned(bytes, name),
            _ => s.find(bytes, NameKey::NONE, name),
        };
        let class = if pooled { found.class } else { NO_CLASS };
        let (ticket, parked) = if self.tracking {
            let name = found.name;
            // Charged before the cache is touched: the name's writes retire while the
            // cache's loads are in flight.
            s.tracker.charge(name, bytes);
            let parked = if pooled { s.blocks.take(class) } else { None };
            let cached = s.blocks.bytes;
            let slot = match parked {
                Some(p) => s.tracker.track_parked(name, bytes, p.slot, cached),
                None => s.tracker.track_new(name, bytes, cached),
            };
            let Some(slot) = slot else {
                if let Some(p) = parked {
                    s.blocks.put_back(class, p);
                }
                s.tracker.refund(name, bytes);
                return None;
            };
            (Ticket { class, slot, name }, parked)
        } else {
            let parked = if pooled { s.blocks.take(class) } else { None };
            s.counts.cached_allocs += parked.is_some() as u64;
            let ticket = Ticket {
                class,
                slot: NO_SLOT,
                name: NO_NAME,
            };
            (ticket, parked)
        };
        Some(Granted {
            ticket,
            cached: parked.map(|p| p.ptr),
        })
    }

    /// Forgets the tracked allocation of `bytes` the driver then refused.
    pub(crate) fn abandon(&self, ticket: Ticket, bytes: usize) {
        if self.tracking {
            self.untrack_refused(ticket, bytes);
        }
    }

    /// One lock section: untracks or counts a free; with `offer`, the cache keeps the
    /// block if it fits. True when it was kept: the caller must not free it.
    #[inline]
    pub(crate) fn free(&self, ptr: CUdeviceptr, bytes: usize, ticket: Ticket, offer: bool) -> bool {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let block = Parked {
            ptr,
            slot: ticket.slot,
        };
        // The name's part first, as in `alloc`.
        if self.tracking {
            s.tracker.uncharge(ticket.name, bytes);
        }
        let kept = offer && s.blocks.put(ticket.class, block, self.cache_limit);
        if !self.tracking {
            s.counts.frees += 1;
        } else if !kept {
            s.tracker.forget_block(ticket.slot, bytes);
        }
        kept
    }

    /// Tracks an allocation made elsewhere (managed memory) whether tracking is on or not,
    /// within the limit; its ticket, or `None` past the limit.
    #[allow(clippy::ptr_arg)]
    pub(crate) fn track(&self, text: &Cow<'static, str>, bytes: usize) -> Option<Ticket> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let name = s.tracker.name_id(text);
        let cached = self.cached_held(s);
        let slot = s.tracker.charge_and_track_new(name, bytes, cached)?;
        s.tracker.name_slot(slot, name, text);
        Some(Ticket {
            class: NO_CLASS,
            slot,
            name,
        })
    }

    /// Takes back an allocation of [`Allocs::track`] of `bytes` the driver then refused:
    /// as if it was never asked for.
    pub(crate) fn untrack_refused(&self, ticket: Ticket, bytes: usize) {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let cached = self.cached_held(s);
        s.tracker.abandon(ticket.name, ticket.slot, bytes, cached);
    }

    /// Forgets an allocation of [`Allocs::track`] of `bytes`.
    pub(crate) fn untrack(&self, ticket: Ticket, bytes: usize) {
        let mut s = self.state.lock();
        s.tracker.release(ticket.name, ticket.slot, bytes);
        s.untracked += 1;
    }

    pub(crate) fn report(&self) -> MemoryReport {
        let s = self.state.lock();
        let cached = self.cached_held(&s);
        // (Untracked blocks park no slot: the tracker ignores theirs.)
        s.tracker.report(s.blocks.parked_slots(), cached)
    }

    /// Allocations served by a cached block, and frees. A tracked HAL derives them: every
    /// allocation the tracker counts took a parked block or a new one, and is alive, or was
    /// freed, or was tracked for the caller and untracked since.
    pub(crate) fn counts(&self) -> HotCounts {
        let s = self.state.lock();
        if !self.tracking {
            return s.counts;
        }
        let t = s.tracker.counts();
        let live = (t.blocks - s.blocks.parked_count()) as u64;
        HotCounts {
            cached_allocs: t.freed + live - t.fresh,
            frees: t.freed - s.untracked,
        }
    }

    /// Bytes that may be allocated before the limit refuses (`usize::MAX` without one).
    pub(crate) fn room_under_limit(&self) -> usize {
        let s = self.state.lock();
        s.tracker.room(s.blocks.bytes)
    }

    /// Whether the block cache keeps a block of exactly `bytes`: an allocation of that
    /// size then takes no device memory.
    pub(crate) fn caches_block_of(&self, bytes: usize) -> bool {
        self.state.lock().blocks.holds(bytes)
    }

    /// Bytes of blocks in the cache.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.state.lock().blocks.bytes
    }

    /// Empties the block cache; the caller frees the blocks.
    pub(crate) fn drain_cache(&self) -> Vec<CUdeviceptr> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let blocks = s.blocks.drain();
        if self.tracking {
            for &(p, bytes) in &blocks {
                s.tracker.forget_block(p.slot, bytes);
            }
        }
        blocks.into_iter().map(|(p, _)| p.ptr).collect()
    }

    /// The bytes the tracker counts as held that are cached, not in use: the cache's
    /// blocks when tracking (every pool block is then tracked), else none.
    fn cached_held(&self, s: &State) -> usize {
        if self.tracking {
            s.blocks.bytes
        } else {
            0
        }
    }
}

impl State {
    /// What a request with `key` resolves to: its size class, and its name id unless
    /// `key` is [`NameKey::NONE`] (see [`State::resolve`]).
    #[allow(clippy::ptr_arg)]
    #[inline]
    fn find(&mut self, bytes: usize, key: NameKey, name: &Cow<'static, str>) -> Resolved {
        match self.keys.get(bytes, key) {
            Some(found) => found,
            None => self.resolve(bytes, key, name),
        }
    }

    /// What a tracked request with a name that is not static resolves to: its size class
    /// by the key with no name, its name id by the text.
    #[allow(clippy::ptr_arg)]
    #[inline(never)]
    fn find_owned(&mut self, bytes: usize, name: &Cow<'static, str>) -> Resolved {
        let class = self.find(bytes, NameKey::NONE, name).class;
        let id = self.tracker.name_id(name);
        self.past_the_name_cap(Resolved { class, name: id }, name)
    }

    /// A request resolved to [`OVERFLOW_NAME`] takes a new block (no size class), so its
    /// slot is the tracker's next new one, which gets its text now, before the allocation
    /// (the lock is held until then): the hot path never sees such a name. Its blocks go
    /// back to the pool when freed. Other requests are left as they are.
    #[allow(clippy::ptr_arg)]
    fn past_the_name_cap(&mut self, found: Resolved, name: &Cow<'static, str>) -> Resolved {
        if found.name != OVERFLOW_NAME {
            return found;
        }
        self.tracker.name_next_new_slot(name);
        Resolved {
            class: NO_CLASS,
            ..found
        }
    }

    /// Resolves a request the slow way (the size class by its size, the name of a key
    /// that has one by its address or text) and remembers it, unless its name is past the
    /// tracker's cap: every allocation under [`OVERFLOW_NAME`] must take the slow path, to
    /// give its text to the tracker. Only tracked requests key their names.
    #[allow(clippy::ptr_arg)]
    #[inline(never)]
    fn resolve(&mut self, bytes: usize, key: NameKey, name: &Cow<'static, str>) -> Resolved {
        let class = self.blocks.class_of(bytes);
        let id = if key.is_none() {
            NO_NAME
        } else {
            self.tracker.name_id(name)
        };
        let found = Resolved { class, name: id };
        if id == OVERFLOW_NAME {
            // Never remembered: each such request comes here, to give the tracker its text.
            return self.past_the_name_cap(found, name);
        }
        self.keys.insert(bytes, key, found);
        found
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::block_cache::MAX_CLASSES;
    use crate::tracking::{LiveAllocation, NameTotals, MAX_NAMES, OVERFLOW_TEXT};

    const COL: Cow<'static, str> = Cow::Borrowed("column");

    /// A cached allocation that raises the peak while another allocation waits for the
    /// driver: when the driver then refuses that one, the peak the cached one reached
    /// stays (it was taken back to the peak before the refused request).
    #[test]
    fn a_refused_allocation_keeps_a_peak_a_cached_one_reached_meanwhile() {
        let a = Allocs::new(true, None, 1 << 20);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.free(0xA, 100, g.ticket, true));
        let _big = a.alloc(&COL, 250, true).unwrap();
        let pending = a.alloc(&COL, 16, true).unwrap(); // waits for the driver
        let c = a.alloc(&COL, 100, true).unwrap();
        assert_eq!(c.cached, Some(0xA));
        // 250 + 100 live at once (and the pending 16 counted while asked for).
        assert_eq!(a.report().peak_bytes, 366);
        assert!(!a.free(0xA, 100, c.ticket, false));
        a.abandon(pending.ticket, 16);
        let r = a.report();
        // The raise the cached allocation made while the request was counted stays: the
        // peak does not fall below what was once counted live (never below 350).
        assert_eq!(r.peak_bytes, 366);
        assert_eq!(r.current_bytes, 250);
    }

    #[test]
    fn the_allocation_path_reads_the_first_cache_lines_only() {
        use std::mem::offset_of;
        let a = Allocs::new(true, None, 0);
        let base = &a as *const Allocs as usize;
        assert_eq!(base % 64, 0, "starts a cache line");
        let state = &*a.state.lock() as *const State as usize - base;
        // Untracked: the flags, the lock, the request keys, the counts and the cache's
        // bytes and classes.
        let untracked = state + offset_of!(State, blocks) + BlockCache::HOT_BYTES;
        assert!(untracked <= 128, "untracked path reads {untracked} bytes");
        // Tracked: the tracker's counters and tables too.
        let tracked = state + offset_of!(State, tracker) + Tracker::HOT_BYTES;
        assert!(tracked <= 256, "tracked path reads {tracked} bytes");
        assert!(offset_of!(State, untracked) > offset_of!(State, tracker));
    }

    /// The room under the limit is what a next allocation may take: blocks in use count,
    /// cached ones do not, and an allocation of exactly the room is admitted.
    #[test]
    fn the_room_under_the_limit_is_what_the_next_allocation_may_take() {
        assert_eq!(Allocs::new(false, None, 0).room_under_limit(), usize::MAX);
        let a = Allocs::new(true, Some(1000), 1000);
        let g = a.alloc(&COL, 300, true).unwrap();
        assert_eq!(a.room_under_limit(), 700);
        assert!(a.free(0xA, 300, g.ticket, true), "kept by the cache");
        assert_eq!(a.room_under_limit(), 1000, "a cached block is not in use");
        let _b = a.alloc(&COL, 400, true).unwrap();
        assert_eq!(a.room_under_limit(), 600);
        assert!(a.alloc(&COL, 601, true).is_none(), "past the room: refused");
        let _c = a.alloc(&COL, 600, true).unwrap();
        assert_eq!(a.room_under_limit(), 0);
    }

    #[test]
    fn a_freed_block_is_reused_by_the_next_allocation_of_its_size() {
        let a = Allocs::new(true, None, 1000);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(g.ticket.id().is_some() && g.cached.is_none());
        assert!(a.free(0xA000, 100, g.ticket, true), "kept by the cache");
        assert_eq!(a.cached_bytes(), 100);
        assert_eq!(a.report().current_bytes, 0, "cached is not in use");
        assert_eq!(a.alloc(&COL, 200, true).unwrap().cached, None, "other size");
        let g = a.alloc(&COL, 100, true).unwrap();
        assert_eq!(g.cached, Some(0xA000));
        assert_eq!(a.cached_bytes(), 0);
        let big = a.alloc(&COL, 2000, true).unwrap();
        assert!(
            !a.free(0xB000, 2000, big.ticket, true),
            "too big for the cache"
        );
        assert!(!a.free(0xC000, 100, g.ticket, false), "not offered");
        let counts = a.counts();
        assert_eq!((counts.cached_allocs, counts.frees), (1, 3));
        let r = a.report();
        assert_eq!(
            (r.current_bytes, r.peak_bytes, r.live.len()),
            (200, 2300, 1)
        );
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.free(0xD000, 100, g.ticket, true));
        assert_eq!(a.drain_cache(), vec![0xD000]);
        assert_eq!(a.cached_bytes(), 0);
        assert_eq!(a.report().current_bytes, 200);
    }

    /// A cached block of a size serves the next allocation of exactly that size, whatever
    /// its name, and is then no longer cached: what `HalInner::fits_easily` asks.
    #[test]
    fn a_cached_block_is_found_by_its_exact_size_until_it_is_taken() {
        for tracking in [false, true] {
            let a = Allocs::new(tracking, None, 1000);
            assert!(!a.caches_block_of(300), "nothing cached yet");
            let g = a.alloc(&COL, 300, true).unwrap();
            assert!(!a.caches_block_of(300), "in use, not cached");
            assert!(a.free(0xA, 300, g.ticket, true));
            assert!(a.caches_block_of(300));
            assert!(!a.caches_block_of(299) && !a.caches_block_of(301));
            let other = Cow::Borrowed("read_async snapshot");
            assert_eq!(a.alloc(&other, 300, true).unwrap().cached, Some(0xA));
            assert!(!a.caches_block_of(300), "taken by another name");
        }
    }

    #[test]
    fn without_tracking_only_the_cache_and_counts_are_kept() {
        let a = Allocs::new(false, None, 1000);
        let g = a.alloc(&COL, 100, false).unwrap();
        assert_eq!((g.ticket, g.cached), (Ticket::NONE, None));
        let g = a.alloc(&COL, 100, true).unwrap();
        assert_eq!(g.ticket.id(), None);
        assert!(a.free(0xA000, 100, g.ticket, true));
        assert_eq!(a.alloc(&COL, 100, true).unwrap().cached, Some(0xA000));
        assert_eq!(a.report(), MemoryReport::default());
        assert_eq!(a.counts().cached_allocs, 1);
    }

    #[test]
    fn a_limit_turns_tracking_on_and_refuses_before_the_cache_is_touched() {
        let a = Allocs::new(false, Some(150), 1000);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(g.ticket.id().is_some());
        assert!(a.free(0xA000, 100, g.ticket, true));
        let g = a.alloc(&COL, 100, true).unwrap();
        assert_eq!(g.cached, Some(0xA000));
        assert!(a.free(0xA000, 100, g.ticket, true));
        let g = a.alloc(&COL, 100, true).unwrap();
        let other = a.alloc(&COL, 50, true).unwrap();
        a.abandon(other.ticket, 50);
        assert!(a.free(0xA000, 100, g.ticket, true));
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.alloc(&COL, 100, true).is_none(), "over the limit");
        assert_eq!(a.counts().cached_allocs, 3);
        a.abandon(g.ticket, 100);
        assert_eq!(a.report().current_bytes, 0);
        let id = a.track(&Cow::Owned("managed".into()), 150).unwrap();
        assert_eq!(a.track(&COL, 1), None);
        a.untrack(id, 150);
        assert_eq!(a.report().current_bytes, 0);
        let col = a.report().by_name.into_iter().find(|n| n.name == "column");
        assert_eq!(
            col.unwrap().allocations,
            3,
            "the abandoned ones are not counted"
        );
    }

    #[test]
    fn a_cached_block_over_the_limit_stays_cached() {
        let a = Allocs::new(true, Some(100), 1000);
        let g = a.alloc(&COL, 80, true).unwrap();
        assert!(a.free(0xA000, 80, g.ticket, true));
        let held = a.alloc(&COL, 50, true).unwrap();
        assert!(a.alloc(&COL, 80, true).is_none(), "50 + 80 > 100");
        assert_eq!(a.cached_bytes(), 80, "the block is put back");
        a.free(0xB000, 50, held.ticket, false);
        assert_eq!(a.alloc(&COL, 80, true).unwrap().cached, Some(0xA000));
    }

    #[test]
    fn managed_memory_is_tracked_beside_an_untracked_cache() {
        let a = Allocs::new(false, None, 1000);
        let g = a.alloc(&COL, 100, true).unwrap();
        assert!(a.free(0xA000, 100, g.ticket, true));
        let m = a.track(&Cow::Borrowed("managed"), 300).unwrap();
        let r = a.report();
        assert_eq!((r.current_bytes, r.live.len()), (300, 1));
        a.untrack(m, 300);
        assert_eq!(a.report().current_bytes, 0);
    }

    #[test]
    fn concurrent_allocations_and_frees_keep_consistent_totals() {
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
        let held: Vec<Vec<(CUdeviceptr, usize, Ticket)>> = std::thread::scope(|scope| {
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
                            held.push((ptr, bytes, g.ticket));
                            if held.len() > HELD {
                                let (ptr, bytes, ticket) = held.swap_remove((i * 31) % held.len());
                                in_use.lock().remove(&ptr);
                                a.free(ptr, bytes, ticket, true);
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
        let held_ids: HashSet<u64> = held.iter().map(|h| h.2.id().unwrap()).collect();
        assert_eq!(live_ids, held_ids, "the live ids are exactly those held");
        assert_eq!(r.current_bytes, held.iter().map(|h| h.1).sum::<usize>());
        assert!(r.peak_bytes >= r.current_bytes);
        let sum = |f: fn(&NameTotals) -> usize| r.by_name.iter().map(f).sum::<usize>();
        assert_eq!(sum(|n| n.current_bytes), r.current_bytes);
        assert_eq!(sum(|n| n.live), THREADS * HELD);
        // `column` (static and owned) is used by two rounds in three, `tree` by the third.
        let mut got: Vec<(&str, u64)> = r
            .by_name
            .iter()
            .map(|n| (n.name.as_str(), n.allocations))
            .collect();
        let tree = (THREADS * ROUNDS / 3) as u64;
        let mut expected = vec![("column", (THREADS * ROUNDS) as u64 - tree), ("tree", tree)];
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
        for (ptr, bytes, ticket) in held {
            a.free(ptr, bytes, ticket, true);
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

    /// A plain model of the bookkeeping: live allocations by id, totals per name, and the
    /// cache as a stack of blocks per size.
    #[derive(Default)]
    struct Model {
        live: BTreeMap<u64, (String, usize)>,
        names: BTreeMap<String, NameTotals>,
        peak: usize,
        cache: HashMap<usize, Vec<CUdeviceptr>>,
        cached_bytes: usize,
        /// The totals each text is counted in (itself, or the overflow name), from its
        /// first request; how many texts have totals of their own.
        totals_of: HashMap<String, String>,
        interned: usize,
        /// The sizes seen, those with a size class, and how many have one.
        sizes_seen: HashSet<usize>,
        classes: HashSet<usize>,
        numbered: usize,
    }

    impl Model {
        /// The totals `text` is counted in, from its first request on.
        fn intern(&mut self, text: &str) -> String {
            if let Some(key) = self.totals_of.get(text) {
                return key.clone();
            }
            let key = match self.interned < MAX_NAMES {
                true => text.to_string(),
                false => OVERFLOW_TEXT.to_string(),
            };
            self.interned += (self.interned < MAX_NAMES) as usize;
            self.names.entry(key.clone()).or_insert_with(|| NameTotals {
                name: key.clone(),
                ..Default::default()
            });
            self.totals_of.insert(text.to_string(), key.clone());
            key
        }

        /// Numbers `bytes` as a size class at its first sight, within the cap.
        fn number(&mut self, bytes: usize) {
            if self.sizes_seen.insert(bytes) && self.numbered < MAX_CLASSES {
                self.numbered += 1;
                self.classes.insert(bytes);
            }
        }

        fn current(&self) -> usize {
            self.live.values().map(|(_, b)| b).sum()
        }

        fn report(&self) -> MemoryReport {
            let mut live: Vec<LiveAllocation> = self
                .live
                .iter()
                .map(|(&id, (name, bytes))| LiveAllocation {
                    id,
                    name: name.clone(),
                    bytes: *bytes,
                })
                .collect();
            live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
            let mut by_name: Vec<NameTotals> = self.names.values().cloned().collect();
            by_name.sort_by(|a, b| {
                b.current_bytes
                    .cmp(&a.current_bytes)
                    .then(a.name.cmp(&b.name))
            });
            MemoryReport {
                current_bytes: self.current(),
                peak_bytes: self.peak,
                live,
                by_name,
            }
        }
    }

    const NAMES: [&str; 4] = ["column", "tree", "twiddles", "scratch"];
    const SIZES: [usize; 4] = [16, 48, 100, 250];

    #[derive(Clone, Debug)]
    enum Op {
        Alloc {
            name: usize,
            owned: bool,
            size: usize,
        },
        Managed {
            name: usize,
            size: usize,
        },
        Free {
            pick: usize,
            offer: bool,
        },
        Trim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..NAMES.len(), any::<bool>(), 0..SIZES.len())
                .prop_map(|(name, owned, size)| Op::Alloc { name, owned, size }),
            1 => (0..NAMES.len(), 0..SIZES.len()).prop_map(|(name, size)| Op::Managed { name, size }),
            5 => (any::<usize>(), prop::bool::weighted(0.8))
                .prop_map(|(pick, offer)| Op::Free { pick, offer }),
            1 => Just(Op::Trim),
        ]
    }

    /// A live allocation as the test holds it: block, bytes, ticket, managed or not.
    type Held = (CUdeviceptr, usize, Ticket, bool);

    proptest! {
        #[test]
        fn matches_a_plain_model(
            ops in prop::collection::vec(op(), 1..300),
            tracking in any::<bool>(),
            limit in prop::option::of(200usize..1500),
            cache_limit in 0usize..800,
            pooled in prop::bool::weighted(0.8),
        ) {
            check_against_the_model(ops, tracking, limit, cache_limit, pooled, false)?;
        }
    }

    proptest! {
        // Each case reports thousands of names at every step: fewer, shorter cases.
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Two of the four names and two of the four sizes come past the caps.
        #[test]
        fn matches_a_plain_model_across_the_caps(
            ops in prop::collection::vec(op(), 1..200),
            tracking in any::<bool>(),
            limit in prop::option::of(200usize..1500),
            cache_limit in 0usize..800,
            pooled in prop::bool::weighted(0.8),
        ) {
            check_against_the_model(ops, tracking, limit, cache_limit, pooled, true)?;
        }
    }

    /// Runs `ops` against a fresh [`Allocs`] and the model, checking every step. With
    /// `near_the_caps`, all but two names and two size classes are taken first.
    fn check_against_the_model(
        ops: Vec<Op>,
        tracking: bool,
        limit: Option<usize>,
        cache_limit: usize,
        pooled: bool,
        near_the_caps: bool,
    ) -> Result<(), TestCaseError> {
        let a = Allocs::new(tracking, limit, cache_limit);
        let tracked = tracking || limit.is_some();
        let limit = limit.unwrap_or(usize::MAX);
        // (A tracked HAL's own names come first.)
        let mut m = Model {
            interned: if tracked { OWN_NAMES.len() } else { 0 },
            ..Model::default()
        };
        if near_the_caps {
            let mut s = a.state.lock();
            for i in 0..MAX_NAMES - 2 - m.interned {
                let text = format!("filler-{i}");
                s.tracker.name_id(&Cow::Owned(text.clone()));
                m.intern(&text);
            }
            for i in 0..MAX_CLASSES - 2 {
                s.blocks.class_of(1 << 20 | i);
                m.number(1 << 20 | i);
            }
        }
        let mut held: BTreeMap<u64, Held> = BTreeMap::new(); // by the model's id
                                                             // Those under a name past the cap: their blocks are never cached.
        let mut no_class = HashSet::new();
        let (mut next_ptr, mut next_id) = (1u64, 0u64);
        let (mut cached_allocs, mut frees) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Alloc { .. } | Op::Managed { .. } => {
                    let (name, owned, size, managed) = match op {
                        Op::Alloc { name, owned, size } => (name, owned, size, false),
                        Op::Managed { name, size } => (name, false, size, true),
                        _ => unreachable!(),
                    };
                    let (text, bytes) = (NAMES[name], SIZES[size]);
                    let cow = match owned {
                        true => Cow::Owned(text.to_string()),
                        false => Cow::Borrowed(text),
                    };
                    if tracked || managed {
                        // A name is known from its first request, refused or not.
                        m.intern(text);
                    }
                    if !managed && (tracked || pooled) {
                        // So is a size, by every request that takes the lock.
                        m.number(bytes);
                    }
                    let refused = (tracked || managed) && m.current() + bytes > limit;
                    let mut past_cap = false;
                    let (ptr, ticket) = if managed {
                        let got = a.track(&cow, bytes);
                        if refused {
                            prop_assert_eq!(got, None);
                            continue;
                        }
                        next_ptr += 1;
                        (next_ptr, got.expect("within the limit"))
                    } else {
                        let got = a.alloc(&cow, bytes, pooled);
                        if refused {
                            prop_assert!(got.is_none());
                            continue;
                        }
                        let g = got.expect("within the limit");
                        // A name past the cap takes a new block: its slot gets its text.
                        past_cap = tracked && m.totals_of[text] == OVERFLOW_TEXT;
                        let want = match pooled && !past_cap {
                            true => m.cache.get_mut(&bytes).and_then(|v| v.pop()),
                            false => None,
                        };
                        prop_assert_eq!(g.cached, want);
                        if want.is_some() {
                            m.cached_bytes -= bytes;
                            cached_allocs += 1;
                        }
                        let ptr = g.cached.unwrap_or_else(|| {
                            next_ptr += 1;
                            next_ptr
                        });
                        (ptr, g.ticket)
                    };
                    let id = match (tracked || managed, ticket.id()) {
                        (true, Some(id)) => id,
                        (false, None) => {
                            next_id += 1;
                            1 << 40 | next_id
                        }
                        (t, got) => {
                            prop_assert!(false, "tracked {} but id {:?}", t, got);
                            unreachable!()
                        }
                    };
                    prop_assert!(!held.contains_key(&id), "id {} is live", id);
                    held.insert(id, (ptr, bytes, ticket, managed));
                    if past_cap {
                        no_class.insert(id);
                    }
                    if tracked || managed {
                        m.live.insert(id, (text.to_string(), bytes));
                        m.peak = m.peak.max(m.current());
                        let n = m.names.get_mut(&m.totals_of[text]).unwrap();
                        n.live += 1;
                        n.current_bytes += bytes;
                        n.peak_bytes = n.peak_bytes.max(n.current_bytes);
                        n.allocations += 1;
                    }
                }
                Op::Free { pick, offer } => {
                    if held.is_empty() {
                        continue;
                    }
                    let id = *held.keys().nth(pick % held.len()).unwrap();
                    let (ptr, bytes, ticket, managed) = held.remove(&id).unwrap();
                    if managed {
                        a.untrack(ticket, bytes);
                    } else {
                        let past_cap = no_class.remove(&id);
                        let keep = offer
                            && pooled
                            && !past_cap
                            && m.classes.contains(&bytes)
                            && m.cached_bytes + bytes <= cache_limit;
                        prop_assert_eq!(a.free(ptr, bytes, ticket, offer), keep);
                        frees += 1;
                        if keep {
                            m.cache.entry(bytes).or_default().push(ptr);
                            m.cached_bytes += bytes;
                        }
                    }
                    if let Some((text, bytes)) = m.live.remove(&id) {
                        let n = m.names.get_mut(&m.totals_of[&text]).unwrap();
                        n.live -= 1;
                        n.current_bytes -= bytes;
                    }
                }
                Op::Trim => {
                    let mut got = a.drain_cache();
                    let mut want: Vec<CUdeviceptr> = m.cache.drain().flat_map(|(_, v)| v).collect();
                    got.sort();
                    want.sort();
                    prop_assert_eq!(got, want);
                    m.cached_bytes = 0;
                }
            }
            prop_assert_eq!(a.cached_bytes(), m.cached_bytes);
            prop_assert_eq!(a.report(), m.report());
            prop_assert_eq!(
                a.counts(),
                HotCounts {
                    cached_allocs,
                    frees
                }
            );
        }
        Ok(())
    }

    #[test]
    fn sizes_past_the_class_cap_are_tracked_but_their_blocks_are_not_cached() {
        for tracking in [true, false] {
            let a = Allocs::new(tracking, None, usize::MAX);
            for bytes in 1..=MAX_CLASSES {
                let g = a.alloc(&COL, bytes, true).unwrap();
                assert!(a.free(bytes as CUdeviceptr, bytes, g.ticket, true));
            }
            let cached = a.cached_bytes();
            let past = MAX_CLASSES + 1;
            let owned = Cow::Owned("owned".to_string());
            for name in [&COL, &owned, &COL] {
                let g = a.alloc(name, past, true).unwrap();
                assert_eq!((g.cached, g.ticket.class), (None, NO_CLASS));
                assert_eq!(g.ticket.id().is_some(), tracking);
                if tracking {
                    let r = a.report();
                    assert_eq!(r.current_bytes, past);
                    assert_eq!(r.largest(2), vec![(name.to_string(), past)]);
                }
                assert!(!a.free(0xF000, past, g.ticket, true), "freed, not kept");
                assert_eq!(a.cached_bytes(), cached);
            }
            // A size seen before the cap is still served from the cache.
            let g = a.alloc(&COL, 5, true).unwrap();
            assert_eq!(g.cached, Some(5));
            assert!(a.free(5, 5, g.ticket, true));
            let counts = HotCounts {
                cached_allocs: 1,
                frees: MAX_CLASSES as u64 + 4,
            };
            assert_eq!(a.counts(), counts);
            assert_eq!(a.report().current_bytes, 0);
            assert_eq!(a.drain_cache().len(), MAX_CLASSES);
        }
    }

    #[test]
    fn names_past_the_cap_keep_their_own_text_and_skip_the_cache() {
        let a = Allocs::new(true, None, usize::MAX);
        // (The HAL's own names come first.)
        for i in 0..MAX_NAMES - OWN_NAMES.len() {
            let g = a.alloc(&Cow::Owned(format!("n{i}")), 8, true).unwrap();
            assert!(a.free(0x8, 8, g.ticket, true));
        }
        let leak = |s: &str| -> Cow<'static, str> {
            Cow::Borrowed(Box::leak(s.to_string().into_boxed_str()))
        };
        let (late_a, late_b) = (leak("static-late-a"), leak("static-late-b"));
        let n3 = Cow::Borrowed("n3"); // known (as an owned text)
        let in_turn = [
            Cow::Owned("owned-late-a".to_string()),
            Cow::Owned("owned-late-b".to_string()),
            late_a.clone(),
            late_b.clone(),
            late_a.clone(),
            n3.clone(),
            late_b.clone(),
            n3.clone(), // now by its key, from the cache
            late_a.clone(),
        ];
        // Names past the cap take new blocks and give them back; a known name's block is
        // parked with its slot, which a late name's allocation may have named before.
        for (i, name) in in_turn.iter().enumerate() {
            let late = name != &n3;
            let g = a.alloc(name, 100, true).unwrap();
            let parked_before = in_turn[..i].iter().any(|n| n == &n3);
            assert_eq!(
                g.cached,
                (!late && parked_before).then_some(0x100),
                "step {i}"
            );
            let r = a.report();
            assert_eq!(r.largest(2), vec![(name.to_string(), 100)], "step {i}");
            assert_eq!(a.free(0x100, 100, g.ticket, true), !late, "step {i}");
        }
        let m = a
            .track(&Cow::Owned("managed-late".to_string()), 10)
            .unwrap();
        assert_eq!(
            a.report().largest(2),
            vec![("managed-late".to_string(), 10)]
        );
        a.untrack(m, 10);
        let r = a.report();
        assert_eq!(
            r.by_name.len(),
            MAX_NAMES - OWN_NAMES.len() + 1,
            "the HAL's own names, unused, left out"
        );
        let over = r.by_name.iter().find(|n| n.name == OVERFLOW_TEXT).unwrap();
        let n3 = r.by_name.iter().find(|n| n.name == "n3").unwrap();
        assert_eq!(
            (
                over.live,
                over.current_bytes,
                over.peak_bytes,
                over.allocations
            ),
            (0, 0, 100, 8)
        );
        assert_eq!((n3.allocations, n3.peak_bytes), (3, 100));
        assert_eq!((r.current_bytes, r.peak_bytes), (0, 100));
    }
}
