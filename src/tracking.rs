//! Live-allocation tracking: every allocation by name and size, totals per name and
//! overall (current and peak), and the leak report.

use std::borrow::Cow;
use std::fmt;

use parking_lot::Mutex;
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

/// The live table is a slab (slot index = allocation id) and names are interned to small
/// ids, so a free does no hashing and an allocation hashes a name at most once (a static
/// name is found by its address).
#[derive(Default)]
struct State {
    slots: Vec<Option<(u32, usize)>>,
    free_slots: Vec<u32>,
    names: Vec<NameTotals>,
    by_addr: FxHashMap<(usize, usize), u32>,
    by_name: FxHashMap<String, u32>,
    current: usize,
    peak: usize,
}

impl State {
    #[allow(clippy::ptr_arg)] // a borrowed name is keyed by its address
    fn name_id(&mut self, name: &Cow<'static, str>) -> u32 {
        let key = (name.as_ptr() as usize, name.len());
        if let Cow::Borrowed(_) = name {
            if let Some(id) = self.by_addr.get(&key) {
                return *id;
            }
        }
        let id = match self.by_name.get(name.as_ref()) {
            Some(id) => *id,
            None => {
                let id = self.names.len() as u32;
                self.names.push(NameTotals {
                    name: name.to_string(),
                    ..Default::default()
                });
                self.by_name.insert(name.to_string(), id);
                id
            }
        };
        if let Cow::Borrowed(_) = name {
            self.by_addr.insert(key, id);
        }
        id
    }
}

/// The tracker of one HAL.
#[derive(Default)]
pub(crate) struct Tracker {
    state: Mutex<State>,
}

impl Tracker {
    /// Bytes alive now.
    #[cfg(test)]
    pub(crate) fn current(&self) -> usize {
        self.state.lock().current
    }

    /// Records an allocation; returns its id.
    #[cfg(test)]
    #[allow(clippy::ptr_arg)]
    pub(crate) fn track(&self, name: &Cow<'static, str>, bytes: usize) -> u64 {
        self.track_within(name, bytes, usize::MAX).unwrap_or(0)
    }

    /// Records an allocation if the bytes alive stay within `limit`; its id, or `None`.
    /// (A `&Cow`: a static name is found by its address, with no hashing of its text.)
    #[allow(clippy::ptr_arg)]
    pub(crate) fn track_within(
        &self,
        name: &Cow<'static, str>,
        bytes: usize,
        limit: usize,
    ) -> Option<u64> {
        let mut s = self.state.lock();
        if s.current.saturating_add(bytes) > limit {
            return None;
        }
        let name_id = s.name_id(name);
        s.current += bytes;
        s.peak = s.peak.max(s.current);
        let t = &mut s.names[name_id as usize];
        t.live += 1;
        t.current_bytes += bytes;
        t.peak_bytes = t.peak_bytes.max(t.current_bytes);
        t.allocations += 1;
        let slot = match s.free_slots.pop() {
            Some(i) => {
                s.slots[i as usize] = Some((name_id, bytes));
                i
            }
            None => {
                s.slots.push(Some((name_id, bytes)));
                (s.slots.len() - 1) as u32
            }
        };
        Some(slot as u64)
    }

    /// Records that allocation `id` was freed.
    pub(crate) fn untrack(&self, id: u64) {
        let mut s = self.state.lock();
        let Some(entry) = s.slots.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        let (name_id, bytes) = entry;
        s.current -= bytes;
        let t = &mut s.names[name_id as usize];
        t.live -= 1;
        t.current_bytes -= bytes;
        s.free_slots.push(id as u32);
    }

    pub(crate) fn report(&self) -> MemoryReport {
        let s = self.state.lock();
        let mut live: Vec<LiveAllocation> = s
            .slots
            .iter()
            .enumerate()
            .filter_map(|(id, e)| {
                e.map(|(name_id, bytes)| LiveAllocation {
                    id: id as u64,
                    name: s.names[name_id as usize].name.clone(),
                    bytes,
                })
            })
            .collect();
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
        let mut by_name: Vec<NameTotals> = s
            .names
            .iter()
            .filter(|n| n.allocations > 0)
            .cloned()
            .collect();
        by_name.sort_by(|a, b| {
            b.current_bytes
                .cmp(&a.current_bytes)
                .then(a.name.cmp(&b.name))
        });
        MemoryReport {
            current_bytes: s.current,
            peak_bytes: s.peak,
            live,
            by_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_follow_allocations_and_frees() {
        let t = Tracker::default();
        let a = t.track(&Cow::Borrowed("column"), 100);
        let b = t.track(&Cow::Borrowed("column"), 50);
        let c = t.track(&Cow::Owned("tree-0".to_string()), 400);
        assert_eq!(t.current(), 550);
        t.untrack(b);
        t.untrack(b); // twice is harmless
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
    }
}
