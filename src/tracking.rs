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

/// A static name's text address and length, and its name id.
#[derive(Clone, Copy)]
struct StaticName {
    addr: usize,
    len: u32,
    id: u32,
}

/// An empty entry of [`StaticNames`] (no `&str` lives at address 0).
const NO_NAME: StaticName = StaticName {
    addr: 0,
    len: 0,
    id: 0,
};

/// The most static names remembered by address; past it they are found by their text.
const MAX_STATIC_NAMES: usize = 1 << 12;

/// Name ids of static names by the address and length of their text: open addressing
/// with linear probing, at most half full and never evicting, so a name is found in one
/// or two compares and names used in turn never push each other out. (String literals lie
/// back to back in memory: the hash spreads neighbouring addresses, and the length is
/// compared, not hashed.)
struct StaticNames {
    /// A power of two in size.
    table: Vec<StaticName>,
    /// 64 - log2(table size): the hash's shift.
    shift: u32,
    len: usize,
}

impl Default for StaticNames {
    fn default() -> Self {
        StaticNames {
            table: vec![NO_NAME; 64],
            shift: 64 - 6,
            len: 0,
        }
    }
}

impl StaticNames {
    /// Where the probe for `addr` starts: Fibonacci hashing of the address.
    #[inline]
    fn home(&self, addr: usize) -> usize {
        ((addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The id of `text` if it was remembered.
    #[inline]
    fn get(&self, text: &str) -> Option<u32> {
        let (addr, len) = (text.as_ptr() as usize, text.len());
        let mask = self.table.len() - 1;
        let mut i = self.home(addr);
        loop {
            let e = self.table[i];
            if e.addr == addr && e.len as usize == len {
                return Some(e.id);
            }
            if e.addr == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Remembers `text` (a static name not yet remembered) as name `id`.
    fn insert(&mut self, text: &str, id: u32) {
        let Ok(len) = u32::try_from(text.len()) else {
            return;
        };
        if self.len >= MAX_STATIC_NAMES {
            return;
        }
        if (self.len + 1) * 2 > self.table.len() {
            let bigger = vec![NO_NAME; 2 * self.table.len()];
            let old = std::mem::replace(&mut self.table, bigger);
            self.shift -= 1;
            for e in old.into_iter().filter(|e| e.addr != 0) {
                self.put(e);
            }
        }
        let addr = text.as_ptr() as usize;
        self.put(StaticName { addr, len, id });
        self.len += 1;
    }

    /// Writes `e` into the first empty entry of its probe sequence.
    fn put(&mut self, e: StaticName) {
        let mask = self.table.len() - 1;
        let mut i = self.home(e.addr);
        while self.table[i].addr != 0 {
            i = (i + 1) & mask;
        }
        self.table[i] = e;
    }
}

/// The `name` of a free slot of the live table.
const FREE: u32 = u32::MAX;

/// One entry of the live table: a live allocation (`name` is its name id), or a free slot
/// (`name == FREE`, and `next` is the next free slot).
#[derive(Clone, Copy)]
struct Slot {
    bytes: usize,
    name: u32,
    next: u32,
}

/// A tracked allocation: its slot in the live table (its id) and its name id, so that
/// freeing it needs no lookup. Owned by the allocation and given back once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TrackId {
    slot: u32,
    name: u32,
}

#[cfg(test)]
impl TrackId {
    /// The allocation id reports show: unique among live allocations.
    pub(crate) fn public(self) -> u64 {
        u64::from(self.slot)
    }
}

/// What the hot path keeps per name (the live count is found by the report).
#[derive(Clone, Copy, Default)]
struct Totals {
    current: usize,
    peak: usize,
    allocations: u64,
}

/// Live allocations with totals per name and overall. Not synchronised: the HAL keeps it
/// under the lock its allocation path takes anyway (see `crate::allocs`).
///
/// The live table is a slab (slot index = allocation id) with its free list threaded
/// through the free slots, so neither tracking nor freeing hashes or allocates. Names are
/// interned to small ids: a static name is found by the address of its text
/// ([`StaticNames`]), any other name by hashing its text. The fields the hot path touches
/// come first.
#[derive(Default)]
pub(crate) struct Tracker {
    current: usize,
    peak: usize,
    /// The first free slot; `slots.len()` when none is free.
    free_head: u32,
    slots: Vec<Slot>,
    /// Indexed by name id, like `names`.
    totals: Vec<Totals>,
    statics: StaticNames,
    names: Vec<String>,
    by_text: FxHashMap<String, u32>,
}

impl Tracker {
    /// Bytes alive now.
    #[cfg(test)]
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// Records an allocation if the bytes alive stay within `limit`; its id, or `None`.
    #[allow(clippy::ptr_arg)]
    #[inline]
    pub(crate) fn track_within(
        &mut self,
        name: &Cow<'static, str>,
        bytes: usize,
        limit: usize,
    ) -> Option<TrackId> {
        let fits = bytes <= limit.saturating_sub(self.current);
        fits.then(|| self.track(name, bytes))
    }

    /// Records an allocation (the caller checked the limit).
    /// (A `&Cow`: a static name is found by its address, with no hashing of its text.)
    #[allow(clippy::ptr_arg)]
    #[inline]
    fn track(&mut self, name: &Cow<'static, str>, bytes: usize) -> TrackId {
        let name = self.name_id(name);
        self.current += bytes;
        if self.current > self.peak {
            self.peak = self.current;
        }
        let t = &mut self.totals[name as usize];
        t.current += bytes;
        t.allocations += 1;
        if t.current > t.peak {
            t.peak = t.current;
        }
        let slot = self.free_head;
        match self.slots.get_mut(slot as usize) {
            Some(s) => {
                self.free_head = s.next;
                s.bytes = bytes;
                s.name = name;
            }
            None => self.push_slot(bytes, name),
        }
        TrackId { slot, name }
    }

    /// Adds a slot for a live allocation when none is free.
    #[inline(never)]
    fn push_slot(&mut self, bytes: usize, name: u32) {
        self.slots.push(Slot {
            bytes,
            name,
            next: 0,
        });
        self.free_head = self.slots.len() as u32;
    }

    /// Records that allocation `id` was freed (an unknown or freed id is ignored).
    #[inline]
    pub(crate) fn untrack(&mut self, id: TrackId) {
        let Some(s) = self.slots.get_mut(id.slot as usize) else {
            return;
        };
        if s.name != id.name {
            return;
        }
        let bytes = s.bytes;
        s.name = FREE;
        s.next = self.free_head;
        self.free_head = id.slot;
        self.current -= bytes;
        self.totals[id.name as usize].current -= bytes;
    }

    /// The id of a name: for a static name seen before, found by its address.
    #[allow(clippy::ptr_arg)] // a borrowed name is keyed by its address
    #[inline]
    fn name_id(&mut self, name: &Cow<'static, str>) -> u32 {
        if let Cow::Borrowed(text) = name {
            if let Some(id) = self.statics.get(text) {
                return id;
            }
        }
        self.name_id_by_text(name)
    }

    /// The id of a name found by its text (added on first use); a static name is then
    /// remembered by its address and length, which identify its text for good.
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
            self.statics.insert(text, id);
        }
        id
    }

    /// Every live allocation (largest first) and the totals per name (most current bytes
    /// first) of every name used so far.
    pub(crate) fn report(&self) -> MemoryReport {
        let mut live = Vec::new();
        let mut live_by_name = vec![0; self.names.len()];
        for (id, s) in self.slots.iter().enumerate() {
            if s.name != FREE {
                live_by_name[s.name as usize] += 1;
                live.push(LiveAllocation {
                    id: id as u64,
                    name: self.names[s.name as usize].clone(),
                    bytes: s.bytes,
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

    fn track(t: &mut Tracker, name: Cow<'static, str>, bytes: usize) -> TrackId {
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
        t.untrack(TrackId {
            slot: 1000,
            name: 0,
        }); // so is an unknown id
        t.untrack(TrackId { slot: 0, name: 9 }); // or name
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
        let ids: Vec<TrackId> = (0..4)
            .map(|_| track(&mut t, Cow::Borrowed("x"), 1))
            .collect();
        assert_eq!(ids.iter().map(|i| i.slot).collect::<Vec<_>>(), [0, 1, 2, 3]);
        t.untrack(ids[1]);
        t.untrack(ids[3]);
        assert_eq!(track(&mut t, Cow::Borrowed("y"), 1).slot, 3);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1).slot, 1);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1).slot, 4);
        t.untrack(ids[3]); // slot 3 is `y` now: a stale id of another name is ignored
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
    fn many_static_names_stay_apart_and_are_all_found_by_address() {
        let mut t = Tracker::default();
        let names: Vec<&'static str> = (0..300)
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
        assert!(names.iter().all(|n| t.statics.get(n).is_some()));
        assert!(
            t.statics.len * 2 <= t.statics.table.len(),
            "at most half full"
        );
    }

    #[test]
    fn back_to_back_literals_are_remembered_apart() {
        // String literals lie back to back: `column` then `merkle-layer` right after it,
        // where address ^ length of the two is the same number.
        let text: &'static str = Box::leak("columnmerkle-layer".to_string().into_boxed_str());
        let (column, merkle) = (&text[..6], &text[6..]);
        let mut t = Tracker::default();
        for _ in 0..3 {
            track(&mut t, Cow::Borrowed(column), 1);
            track(&mut t, Cow::Borrowed(merkle), 2);
        }
        let (c, m) = (t.statics.get(column), t.statics.get(merkle));
        assert!(
            c.is_some() && m.is_some() && c != m,
            "both remembered, apart"
        );
        let r = t.report();
        let totals: Vec<(&str, usize)> = r
            .by_name
            .iter()
            .map(|n| (n.name.as_str(), n.current_bytes))
            .collect();
        assert_eq!(totals, vec![("merkle-layer", 6), ("column", 3)]);
    }

    #[test]
    fn past_the_cap_static_names_are_found_by_their_text() {
        let mut names = StaticNames::default();
        let texts: Vec<&'static str> = (0..MAX_STATIC_NAMES + 10)
            .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
            .collect();
        for (i, text) in texts.iter().enumerate() {
            names.insert(text, i as u32);
        }
        assert_eq!(names.len, MAX_STATIC_NAMES);
        assert_eq!(names.get(texts[7]), Some(7));
        assert_eq!(names.get(texts[MAX_STATIC_NAMES + 3]), None);
        // The tracker still names them right, through the text.
        let mut t = Tracker {
            statics: names,
            ..Default::default()
        };
        track(&mut t, Cow::Borrowed(texts[MAX_STATIC_NAMES + 3]), 5);
        let r = t.report();
        assert_eq!(
            r.largest(1),
            vec![(texts[MAX_STATIC_NAMES + 3].to_string(), 5)]
        );
    }

    /// A plain model of the tracker: live allocations by id, and totals per name.
    #[derive(Default)]
    struct Model {
        live: BTreeMap<u64, (String, usize)>,
        names: BTreeMap<String, NameTotals>,
        peak: usize,
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
            pick: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..NAMES.len(), any::<bool>(), 1usize..100)
                .prop_map(|(name, owned, bytes)| Op::Alloc { name, owned, bytes }),
            2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            1 => any::<usize>().prop_map(|pick| Op::FreeAgain { pick }),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_plain_model(
            ops in prop::collection::vec(op(), 1..300),
            limit in 200usize..3000,
        ) {
            let mut t = Tracker::default();
            let mut m = Model::default();
            let mut ids: BTreeMap<u64, TrackId> = BTreeMap::new();
            let mut freed: Vec<TrackId> = Vec::new();
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
                        prop_assert!(!m.live.contains_key(&id.public()), "id {:?} is live", id);
                        ids.insert(id.public(), id);
                        m.live.insert(id.public(), (text.to_string(), bytes));
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
                        t.untrack(ids[&id]);
                        freed.push(ids[&id]);
                        let (name, bytes) = m.live.remove(&id).unwrap();
                        let n = m.names.get_mut(&name).unwrap();
                        n.live -= 1;
                        n.current_bytes -= bytes;
                    }
                    Op::FreeAgain { pick } => {
                        // Only ids not live again: a double free changes nothing.
                        let Some(&id) = freed.get(pick % freed.len().max(1)) else { continue };
                        if !m.live.contains_key(&id.public()) {
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
