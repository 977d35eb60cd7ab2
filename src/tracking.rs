//! Live-allocation tracking: every allocation by name and size, totals per name and
//! overall (current and peak), and the leak report.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use parking_lot::Mutex;

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAllocation {
    /// Allocation id, unique within the HAL.
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

#[derive(Default)]
struct State {
    next_id: u64,
    live: HashMap<u64, (Cow<'static, str>, usize)>,
    names: HashMap<Cow<'static, str>, NameTotals>,
    current: usize,
    peak: usize,
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
    /// (A `&Cow`: cloning it keeps a static name borrowed, with no allocation.)
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
        s.next_id += 1;
        let id = s.next_id;
        s.current += bytes;
        s.peak = s.peak.max(s.current);
        let t = match s.names.get_mut(name.as_ref()) {
            Some(t) => t,
            None => s.names.entry(name.clone()).or_insert_with(|| NameTotals {
                name: name.to_string(),
                ..Default::default()
            }),
        };
        t.live += 1;
        t.current_bytes += bytes;
        t.peak_bytes = t.peak_bytes.max(t.current_bytes);
        t.allocations += 1;
        s.live.insert(id, (name.clone(), bytes));
        Some(id)
    }

    /// Records that allocation `id` was freed.
    pub(crate) fn untrack(&self, id: u64) {
        let mut s = self.state.lock();
        if let Some((name, bytes)) = s.live.remove(&id) {
            s.current -= bytes;
            if let Some(t) = s.names.get_mut(name.as_ref()) {
                t.live -= 1;
                t.current_bytes -= bytes;
            }
        }
    }

    pub(crate) fn report(&self) -> MemoryReport {
        let s = self.state.lock();
        let mut live: Vec<LiveAllocation> = s
            .live
            .iter()
            .map(|(id, (name, bytes))| LiveAllocation {
                id: *id,
                name: name.to_string(),
                bytes: *bytes,
            })
            .collect();
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
        let mut by_name: Vec<NameTotals> = s.names.values().cloned().collect();
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
