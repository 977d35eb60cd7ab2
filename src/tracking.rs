//! Live-allocation tracking: every allocation by name and size, totals per name and
//! overall (current and peak), and the leak report.

use std::borrow::Cow;
use std::fmt;

use rustc_hash::FxHashMap;

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAllocation {
    /// Allocation id, unique among the HAL's live allocations (ids of freed ones are reused).
    pub id: u64,
    /// The buffer's name.
    pub name: String,
    /// Bytes.
    pub bytes: usize,
}

/// Totals of every allocation made under one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameTotals {
    /// The name.
    pub name: String,
    /// Allocations of this name alive now.
    pub live: usize,
    /// Bytes alive now.
    pub current_bytes: usize,
    /// Most bytes alive at once.
    pub peak_bytes: usize,
    /// Allocations made so far.
    pub allocations: u64,
}

/// What the HAL has allocated: see [`CudaHal::memory_report`](crate::CudaHal::memory_report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Bytes alive now.
    pub current_bytes: usize,
    /// Most bytes alive at once.
    pub peak_bytes: usize,
    /// Every live allocation, largest first.
    pub live: Vec<LiveAllocation>,
    /// Totals per name, largest current bytes first.
    pub by_name: Vec<NameTotals>,
}

impl MemoryReport {
    /// The `n` largest live allocations as (name, bytes).
    pub fn largest(&self, n: usize) -> Vec<(String, usize)> {
        self.live
            .iter()
            .take(n)
            .map(|a| (a.name.clone(), a.bytes))
            .collect()
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} live allocations, {} bytes (peak {} bytes)",
            self.live.len(),
            self.current_bytes,
            self.peak_bytes
        )?;
        for n in &self.by_name {
            writeln!(
                f,
                "  {:<32} {:>4} live {:>14} B  peak {:>14} B  ({} allocations)",
                n.name, n.live, n.current_bytes, n.peak_bytes, n.allocations
            )?;
        }
        Ok(())
    }
}

/// Static names remembered by address in a direct-mapped table (a power of two).
const STATIC_SLOTS: usize = 64;

/// A static name's address and length, and its name id.
#[derive(Clone, Copy)]
struct StaticName {
    addr: usize,
    len: usize,
    id: u32,
}

/// The slot of a static name in the direct-mapped table: Fibonacci hashing of its
/// address and length.
#[inline]
fn static_slot(text: &str) -> usize {
    let key = (text.as_ptr() as usize ^ text.len()) as u64;
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - STATIC_SLOTS.ilog2())) as usize
}

/// One entry of the live table: a live allocation, or a link of the free list.
#[derive(Clone, Copy)]
enum Slot {
    Live { name: u32, bytes: usize },
    Free { next: u32 },
}

/// What the hot path keeps per name (the live count is found by the report).
#[derive(Clone, Copy, Default)]
struct Totals {
    current: usize,
    peak: usize,
    allocations: u64,
}

/// The end of the free list.
const NO_SLOT: u32 = u32::MAX;

/// Live allocations with totals per name and overall. Not synchronised: the HAL keeps it
/// under the lock its allocation path takes anyway (see `crate::allocs`).
///
/// The live table is a slab (slot index = allocation id) with its free list threaded
/// through the free slots, so a free does no hashing and no allocation. Names are interned
/// to small ids: a static name is found by its address in a small direct-mapped table (one
/// compare), any other name by hashing its text.
pub(crate) struct Tracker {
    slots: Vec<Slot>,
    free_head: u32,
    /// Indexed by name id, like `totals`.
    names: Vec<String>,
    totals: Vec<Totals>,
    by_text: FxHashMap<String, u32>,
    statics: [StaticName; STATIC_SLOTS],
    current: usize,
    peak: usize,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            slots: Vec::new(),
            free_head: NO_SLOT,
            names: Vec::new(),
            totals: Vec::new(),
            by_text: FxHashMap::default(),
            // Address 0 is never a `&str`'s, so these match no name.
            statics: [StaticName {
                addr: 0,
                len: 0,
                id: 0,
            }; STATIC_SLOTS],
            current: 0,
            peak: 0,
        }
    }
}

impl Tracker {
    /// Bytes alive now.
    #[cfg(test)]
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// Records an allocation if the bytes alive stay within `limit`; its id, or `None`.
    /// (A `&Cow`: a static name is found by its address, with no hashing of its text.)
    #[allow(clippy::ptr_arg)]
    #[inline]
    pub(crate) fn track_within(
        &mut self,
        name: &Cow<'static, str>,
        bytes: usize,
        limit: usize,
    ) -> Option<u32> {
        let current = self.current.checked_add(bytes).filter(|&c| c <= limit)?;
        let name = self.name_id(name);
        self.current = current;
        self.peak = self.peak.max(current);
        let t = &mut self.totals[name as usize];
        t.current += bytes;
        t.peak = t.peak.max(t.current);
        t.allocations += 1;
        let live = Slot::Live { name, bytes };
        let id = self.free_head;
        match self.slots.get_mut(id as usize) {
            Some(slot) => {
                // The free list holds only free slots.
                if let Slot::Free { next } = *slot {
                    self.free_head = next;
                }
                *slot = live;
                Some(id)
            }
            None => {
                self.slots.push(live);
                Some((self.slots.len() - 1) as u32)
            }
        }
    }

    /// Records that allocation `id` was freed (an unknown or freed id is ignored).
    #[inline]
    pub(crate) fn untrack(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        let Slot::Live { name, bytes } = *slot else {
            return;
        };
        *slot = Slot::Free {
            next: self.free_head,
        };
        self.free_head = id;
        self.current -= bytes;
        self.totals[name as usize].current -= bytes;
    }

    /// The id of a name: for a static name seen recently, one compare.
    #[allow(clippy::ptr_arg)] // a borrowed name is keyed by its address
    #[inline]
    fn name_id(&mut self, name: &Cow<'static, str>) -> u32 {
        if let Cow::Borrowed(text) = name {
            let seen = self.statics[static_slot(text)];
            if seen.addr == text.as_ptr() as usize && seen.len == text.len() {
                return seen.id;
            }
        }
        self.name_id_by_text(name)
    }

    /// The id of a name found by its text (added on first use); a static name is then
    /// remembered by its address, which identifies its text for good.
    #[allow(clippy::ptr_arg)]
    #[inline(never)]
    fn name_id_by_text(&mut self, name: &Cow<'static, str>) -> u32 {
        let id = match self.by_text.get(name.as_ref()) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.push(name.to_string());
                self.totals.push(Totals::default());
                self.by_text.insert(name.to_string(), id);
                id
            }
        };
        if let Cow::Borrowed(text) = name {
            self.statics[static_slot(text)] = StaticName {
                addr: text.as_ptr() as usize,
                len: text.len(),
                id,
            };
        }
        id
    }

    /// Every live allocation (largest first) and the totals per name (most current bytes
    /// first) of every name used so far.
    pub(crate) fn report(&self) -> MemoryReport {
        let mut live = Vec::new();
        let mut live_by_name = vec![0; self.names.len()];
        for (id, slot) in self.slots.iter().enumerate() {
            if let Slot::Live { name, bytes } = *slot {
                live_by_name[name as usize] += 1;
                live.push(LiveAllocation {
                    id: id as u64,
                    name: self.names[name as usize].clone(),
                    bytes,
                });
            }
        }
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
        let mut by_name: Vec<NameTotals> = (self.names.iter().zip(&self.totals))
            .zip(live_by_name)
            .map(|((name, t), live)| NameTotals {
                name: name.clone(),
                live,
                current_bytes: t.current,
                peak_bytes: t.peak,
                allocations: t.allocations,
            })
            .collect();
        by_name.sort_by(|a, b| {
            b.current_bytes
                .cmp(&a.current_bytes)
                .then(a.name.cmp(&b.name))
        });
        MemoryReport {
            current_bytes: self.current,
            peak_bytes: self.peak,
            live,
            by_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn track(t: &mut Tracker, name: Cow<'static, str>, bytes: usize) -> u32 {
        t.track_within(&name, bytes, usize::MAX).unwrap()
    }

    #[test]
    fn totals_follow_allocations_and_frees() {
        let mut t = Tracker::default();
        let a = track(&mut t, Cow::Borrowed("column"), 100);
        let b = track(&mut t, Cow::Borrowed("column"), 50);
        let c = track(&mut t, Cow::Owned("tree-0".to_string()), 400);
        assert_eq!(t.current(), 550);
        t.untrack(b);
        t.untrack(b); // twice is harmless
        t.untrack(1000); // so is an unknown id
        let r = t.report();
        assert_eq!((r.current_bytes, r.peak_bytes), (500, 550));
        assert_eq!(
            r.live.iter().map(|l| l.bytes).collect::<Vec<_>>(),
            vec![400, 100]
        );
        assert_eq!(r.largest(1), vec![("tree-0".to_string(), 400)]);
        let col = r.by_name.iter().find(|n| n.name == "column").unwrap();
        assert_eq!(
            (col.live, col.current_bytes, col.peak_bytes, col.allocations),
            (1, 100, 150, 2)
        );
        t.untrack(a);
        t.untrack(c);
        let r = t.report();
        assert_eq!((r.current_bytes, r.peak_bytes, r.live.len()), (0, 550, 0));
        assert!(r.to_string().contains("0 live allocations"));
        assert_eq!(r.by_name.len(), 2, "names stay in the totals once used");
    }

    #[test]
    fn the_limit_refuses_without_recording() {
        let mut t = Tracker::default();
        let a = t.track_within(&Cow::Borrowed("a"), 60, 100).unwrap();
        assert_eq!(t.track_within(&Cow::Borrowed("b"), 41, 100), None);
        assert_eq!(
            t.track_within(&Cow::Borrowed("a"), usize::MAX, usize::MAX),
            None
        );
        let r = t.report();
        assert_eq!((r.current_bytes, r.peak_bytes, r.live.len()), (60, 60, 1));
        assert!(r
            .by_name
            .iter()
            .all(|n| n.name == "a" && n.allocations == 1));
        assert!(
            t.track_within(&Cow::Borrowed("b"), 40, 100).is_some(),
            "exactly at it"
        );
        t.untrack(a);
        assert!(t.track_within(&Cow::Borrowed("b"), 60, 100).is_some());
    }

    #[test]
    fn freed_ids_are_reused_latest_first() {
        let mut t = Tracker::default();
        let ids: Vec<u32> = (0..4)
            .map(|_| track(&mut t, Cow::Borrowed("x"), 1))
            .collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        t.untrack(1);
        t.untrack(3);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1), 3);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1), 1);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1), 4);
        let ids: Vec<u64> = t.report().live.iter().map(|l| l.id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn one_text_is_one_name_however_it_is_given() {
        let mut t = Tracker::default();
        // Another static copy of the text, at another address.
        let leaked: &'static str = Box::leak("column".to_string().into_boxed_str());
        track(&mut t, Cow::Borrowed("column"), 1);
        track(&mut t, Cow::Owned("column".to_string()), 2);
        track(&mut t, Cow::Borrowed(leaked), 4);
        track(&mut t, Cow::Borrowed(&leaked[..3]), 8); // "col": same address, shorter
        let r = t.report();
        assert_eq!(r.by_name.len(), 2);
        let col = r.by_name.iter().find(|n| n.name == "column").unwrap();
        assert_eq!((col.live, col.current_bytes, col.allocations), (3, 7, 3));
        assert!(r
            .by_name
            .iter()
            .any(|n| n.name == "col" && n.current_bytes == 8));
    }

    #[test]
    fn many_static_names_that_collide_in_the_address_table_stay_apart() {
        let mut t = Tracker::default();
        let names: Vec<&'static str> = (0..4 * STATIC_SLOTS)
            .map(|i| &*Box::leak(format!("name-{i}").into_boxed_str()))
            .collect();
        for round in 1..=3 {
            for (i, n) in names.iter().enumerate() {
                track(&mut t, Cow::Borrowed(*n), i + 1);
            }
            let r = t.report();
            assert_eq!(r.by_name.len(), names.len());
            for n in &r.by_name {
                let i: usize = n.name["name-".len()..].parse().unwrap();
                assert_eq!((n.live, n.current_bytes), (round, round * (i + 1)));
            }
        }
    }

    /// A plain model of the tracker: live allocations by id, and totals per name.
    #[derive(Default)]
    struct Model {
        live: BTreeMap<u32, (String, usize)>,
        names: BTreeMap<String, NameTotals>,
        peak: usize,
        most_live: usize,
    }

    impl Model {
        fn current(&self) -> usize {
            self.live.values().map(|(_, b)| b).sum()
        }

        fn report(&self) -> MemoryReport {
            let mut live: Vec<LiveAllocation> = self
                .live
                .iter()
                .map(|(&id, (name, bytes))| LiveAllocation {
                    id: id as u64,
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

    #[derive(Clone, Debug)]
    enum Op {
        Alloc {
            name: usize,
            owned: bool,
            bytes: usize,
        },
        Free {
            pick: usize,
        },
        FreeAgain {
            id: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..NAMES.len(), any::<bool>(), 1usize..400)
                .prop_map(|(name, owned, bytes)| Op::Alloc { name, owned, bytes }),
            2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            1 => (0u32..40).prop_map(|id| Op::FreeAgain { id }),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_plain_model(
            ops in prop::collection::vec(op(), 1..200),
            limit in 200usize..3000,
        ) {
            let mut t = Tracker::default();
            let mut m = Model::default();
            for op in ops {
                match op {
                    Op::Alloc { name, owned, bytes } => {
                        let text = NAMES[name];
                        let cow = match owned {
                            true => Cow::Owned(text.to_string()),
                            false => Cow::Borrowed(text),
                        };
                        let got = t.track_within(&cow, bytes, limit);
                        if m.current() + bytes > limit {
                            prop_assert_eq!(got, None);
                            continue;
                        }
                        let id = got.expect("within the limit");
                        prop_assert!(!m.live.contains_key(&id), "id {} is live", id);
                        m.live.insert(id, (text.to_string(), bytes));
                        m.most_live = m.most_live.max(m.live.len());
                        prop_assert!((id as usize) < m.most_live, "ids stay dense");
                        m.peak = m.peak.max(m.current());
                        let n = m.names.entry(text.to_string()).or_insert_with(|| NameTotals {
                            name: text.to_string(),
                            ..Default::default()
                        });
                        n.live += 1;
                        n.current_bytes += bytes;
                        n.peak_bytes = n.peak_bytes.max(n.current_bytes);
                        n.allocations += 1;
                    }
                    Op::Free { pick } => {
                        if m.live.is_empty() {
                            continue;
                        }
                        let id = *m.live.keys().nth(pick % m.live.len()).unwrap();
                        t.untrack(id);
                        let (name, bytes) = m.live.remove(&id).unwrap();
                        let n = m.names.get_mut(&name).unwrap();
                        n.live -= 1;
                        n.current_bytes -= bytes;
                    }
                    Op::FreeAgain { id } => {
                        // Only ids that are not live: a double free changes nothing.
                        if !m.live.contains_key(&id) {
                            t.untrack(id);
                        }
                    }
                }
                prop_assert_eq!(t.current(), m.current());
            }
            prop_assert_eq!(t.report(), m.report());
        }
    }
}
