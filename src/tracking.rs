//! Live-allocation tracking: every allocation by name and size, totals per name and
//! overall (current and peak), and the leak report. Totals are kept for the first
//! [`MAX_NAMES`] distinct names; later ones share one entry (see [`OVERFLOW_TEXT`]).

use std::borrow::Cow;
use std::fmt;

use rustc_hash::FxHashMap;

use crate::probe_table::{ProbeEntry, ProbeTable};

/// One live allocation.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let _a = hal.alloc::<u8>("merkle-layer-3", 4096).unwrap();
/// let live = &hal.memory_report().live;
/// assert_eq!((live[0].name.as_str(), live[0].bytes), ("merkle-layer-3", 4096));
/// ```
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
///
/// The first 4096 distinct names requested of a HAL each have their own totals. Names first
/// requested after those (a service that names buffers `format!("proof-{id}-trace")`
/// would otherwise grow its tables without end) share one entry, named
/// `(names past the first 4096)`, whose totals are those of all their allocations
/// together. [`MemoryReport::live`] still names each live allocation by its own name.
/// (Their allocations skip the block cache: each takes a block from the pool, and gives it
/// back when freed.)
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// for round in 0..3 {
///     let _scratch = hal.alloc::<u32>("fri-scratch", 1024 << round).unwrap();
/// }
/// let report = hal.memory_report();
/// let t = report.by_name.iter().find(|t| t.name == "fri-scratch").unwrap();
/// assert_eq!((t.live, t.current_bytes, t.peak_bytes, t.allocations), (0, 0, 16384, 3));
/// ```
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
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.alloc::<u8>("a", 100).unwrap();
/// let b = hal.alloc::<u8>("b", 300).unwrap();
/// drop(a);
/// let r = hal.memory_report();
/// assert_eq!((r.current_bytes, r.peak_bytes), (300, 400));
/// assert_eq!(r.live.len(), 1);
/// drop(b);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Bytes alive now.
    pub current_bytes: usize,
    /// Most bytes alive at once.
    pub peak_bytes: usize,
    /// Every live allocation, largest first.
    pub live: Vec<LiveAllocation>,
    /// Totals per name, largest current bytes first: every name requested so far, up to
    /// the first 4096 distinct ones, and one entry named `(names past the first 4096)`
    /// for all names first requested after those together (see [`NameTotals`]).
    pub by_name: Vec<NameTotals>,
}

impl MemoryReport {
    /// The `n` largest live allocations as (name, bytes).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let _small = hal.alloc::<u8>("small", 10).unwrap();
    /// let _big = hal.alloc::<u8>("big", 1000).unwrap();
    /// assert_eq!(hal.memory_report().largest(1), vec![("big".to_string(), 1000)]);
    /// ```
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

impl ProbeEntry for StaticName {
    /// No `&str` lives at address 0.
    const EMPTY: Self = StaticName {
        addr: 0,
        len: 0,
        id: 0,
    };

    fn is_empty(&self) -> bool {
        self.addr == 0
    }

    fn hash(&self) -> u64 {
        self.addr as u64
    }
}

/// The most static names remembered by address; past it they are found by their text.
const MAX_STATIC_NAMES: usize = 1 << 12;

/// Name ids of static names by the address and length of their text. (String literals lie
/// back to back in memory: the table's hash spreads neighbouring addresses, and the length
/// is compared, not hashed.)
struct StaticNames(ProbeTable<StaticName>);

impl Default for StaticNames {
    fn default() -> Self {
        StaticNames(ProbeTable::new(MAX_STATIC_NAMES))
    }
}

impl StaticNames {
    /// The id of `text` if it was remembered.
    #[inline]
    fn get(&self, text: &str) -> Option<u32> {
        let (addr, len) = (text.as_ptr() as usize, text.len());
        let is = |e: &StaticName| e.addr == addr && e.len as usize == len;
        self.0.find(addr as u64, is).map(|e| e.id)
    }

    /// Remembers `text` (a static name not yet remembered) as name `id`.
    fn insert(&mut self, text: &str, id: u32) {
        if let Ok(len) = u32::try_from(text.len()) {
            let addr = text.as_ptr() as usize;
            self.0.insert(StaticName { addr, len, id });
        }
    }
}

/// A name id meaning "no name": the allocation is not tracked.
pub(crate) const NO_NAME: u32 = u32::MAX;
/// The most distinct names interned. Names are never forgotten (their totals outlive their
/// allocations), so a service that names buffers by proof would grow the tables, and its
/// reports, without end. 4096 is far more than a prover's own names, and matches the cap
/// of the static names' table.
pub(crate) const MAX_NAMES: usize = 1 << 12;
/// The name id shared by every name first seen once [`MAX_NAMES`] are interned: one
/// entry of the totals for all of them. Live allocations under it keep their own text
/// (see [`Names::overflow`]).
pub(crate) const OVERFLOW_NAME: u32 = MAX_NAMES as u32;
/// The report's name for the totals of [`OVERFLOW_NAME`]. (A name of this very text among
/// the first [`MAX_NAMES`] is a name of its own, listed beside it.)
pub(crate) const OVERFLOW_TEXT: &str = "(names past the first 4096)";
/// A slot id meaning "no slot": the allocation is not tracked.
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// The `name` of a slot on the free list.
const FREE: u32 = u32::MAX;

/// Names interned to small ids: a static name is found by the address of its text
/// ([`StaticNames`]), any other name by hashing its text. One text is one name, however
/// and wherever it is given, for the first [`MAX_NAMES`] texts; every text first seen past
/// them is [`OVERFLOW_NAME`] (and stays so: it is not remembered, and is hashed each time).
#[derive(Default)]
pub(crate) struct Names {
    statics: StaticNames,
    /// Indexed by name id: the interned texts, then [`OVERFLOW_TEXT`] once a name
    /// overflowed (at most `MAX_NAMES + 1`).
    texts: Vec<String>,
    /// At most [`MAX_NAMES`] entries.
    by_text: FxHashMap<String, u32>,
    /// The text of the allocation last tracked under [`OVERFLOW_NAME`] in each slot, by
    /// slot: written for every such allocation ([`Tracker::name_next_new_slot`] before it
    /// takes its new block, [`Tracker::name_slot`] for managed memory), read by reports
    /// only for the live slots whose name is [`OVERFLOW_NAME`], so the entry of a slot
    /// since freed or named otherwise is never read. At most one entry per slot of the
    /// tracker, and one for the next slot it adds.
    overflow: FxHashMap<u32, Cow<'static, str>>,
    /// The first ids, known before any allocation ([`Tracker::reserve_names`]): left out of
    /// reports while no allocation used them.
    reserved: usize,
}

impl Names {
    /// The id of `name`, and whether it is new.
    #[allow(clippy::ptr_arg)] // a borrowed name is keyed by its address
    fn id(&mut self, name: &Cow<'static, str>) -> (u32, bool) {
        if let Cow::Borrowed(text) = name {
            if let Some(id) = self.statics.get(text) {
                return (id, false);
            }
        }
        let (id, new) = match self.by_text.get(name.as_ref()) {
            Some(&id) => (id, false),
            // Not remembered, by text nor (for a static text) by address.
            None if self.texts.len() >= MAX_NAMES => {
                let new = self.texts.len() == MAX_NAMES;
                if new {
                    self.texts.push(OVERFLOW_TEXT.to_string());
                }
                return (OVERFLOW_NAME, new);
            }
            None => {
                let id = self.texts.len() as u32;
                self.texts.push(name.to_string());
                self.by_text.insert(name.to_string(), id);
                (id, true)
            }
        };
        if let Cow::Borrowed(text) = name {
            // A static text's address and length identify it for good.
            self.statics.insert(text, id);
        }
        (id, new)
    }
}

/// One entry of the live table: the slot of a block the HAL holds (live, or parked with
/// its block in the block cache), or a free slot (`name == FREE`, and `next` is the next
/// free slot).
#[derive(Clone, Copy)]
struct Slot {
    bytes: usize,
    name: u32,
    next: u32,
}

/// What the hot path keeps per name (the live count is found by the report). Aligned so
/// that a name's fields share one cache line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Totals {
    current: usize,
    /// The peak up to the name's last free: see [`Tracker`] on peaks.
    peak: usize,
    /// Allocations of the name freed so far: its allocations are these and its live ones.
    frees: u64,
}

/// Counts of everything a [`Tracker`] recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TrackerCounts {
    /// Allocations freed (abandoned ones not counted): every allocation made is one of
    /// these or alive.
    pub(crate) freed: u64,
    /// Those that took a new block rather than a parked one.
    pub(crate) fresh: u64,
    /// Slots in use: blocks live or parked, and memory tracked for the caller.
    pub(crate) blocks: usize,
}

/// Live allocations with totals per name and overall. Not synchronised: the HAL keeps it
/// under the lock its allocation path takes anyway (see `crate::allocs`).
///
/// Built so that an allocation served by the block cache costs little more than the cache
/// itself:
/// - A slot of the live table (its index is the allocation id) belongs to a device block,
///   not to one allocation: it stays with its block while the block is cached, and the
///   next allocation the block serves takes it again. Only a block that leaves for the
///   driver gives its slot back to the free list.
/// - The bytes in use are not counted on the hot path: they are the bytes held (live and
///   cached blocks) less the cache's own count, which the cache keeps anyway.
/// - Name ids come from the caller, who finds them once per size and static name (see
///   `crate::alloc_keys`).
/// - Names are capped at [`MAX_NAMES`]: later ones share [`OVERFLOW_NAME`], one entry of
///   `totals`, so the per-name tables stay bounded. The hot path does not know of it: such
///   a name is resolved the slow way each time (never remembered per size), which sends
///   its allocation to a new block, never a cached one, and first gives its text to
///   [`Tracker::name_next_new_slot`] for the report.
/// - An allocation adds its bytes to its name's and names its slot. Allocations are
///   counted when freed, which keeps a write off the allocation: a name's allocations are
///   its frees and its live ones, which a report counts.
/// - An allocation is charged to its name first in the lock section, before the block
///   cache is touched (see `crate::allocs::Allocs::alloc`), and a free takes it off first:
///   those writes then retire while the cache's loads are still in flight.
/// - Peaks per name are folded in lazily. A name's bytes only grow from one of its frees
///   to the next, so their most is reached right before a free of the name, or now: each
///   free folds the name's bytes into its peak before they drop, and a report folds in
///   the present. An allocation then only adds to its name's totals.
/// - The overall peak is kept as allocations come, and the limit is checked only against a
///   new peak: the peak never passes the limit, so bytes in use at or below it are within.
///   An allocation from the cache compares the bytes the cache keeps with a floor (see
///   `floor`), and is checked only under it.
#[repr(C)]
pub(crate) struct Tracker {
    /// Bytes of every block held for an allocation: live, or parked in the block cache.
    held: usize,
    /// Most bytes in use at once. Never above `limit`: an allocation is checked against
    /// the limit only when it would raise the peak.
    peak: usize,
    /// The most bytes in use allowed, `usize::MAX` when there is no limit.
    limit: usize,
    /// At least the fewest cached bytes that keep the bytes in use (held less cached) at
    /// or under the peak, `held - peak`: an allocation from the cache that leaves fewer
    /// may set a new peak, and is checked. Kept lazily: what raises `held - peak` raises
    /// it, what lowers it leaves it, and the check sets it exactly.
    floor: usize,
    /// Allocations that took a new block rather than a parked one (abandoned ones not
    /// counted).
    fresh: u64,
    /// The first free slot; `slots.len()` when none is free.
    free_head: u32,
    slots: Vec<Slot>,
    /// Indexed by name id, like `names.texts`.
    totals: Vec<Totals>,
    /// Used only when a name is first seen and by reports: boxed, off the allocation
    /// path's cache lines.
    names: Box<Names>,
    /// The slot of the last new block whose admission raised the peak, and the peak
    /// before it (`FREE` when that block is gone): if the driver then refuses the
    /// allocation, the peak goes back, so it never counts memory that was never held.
    raised: (u32, usize),
}

impl Default for Tracker {
    /// A tracker with no limit.
    fn default() -> Self {
        Tracker::with_limit(usize::MAX)
    }
}

impl Tracker {
    /// A tracker that refuses allocations past `limit` bytes in use.
    pub(crate) fn with_limit(limit: usize) -> Self {
        Tracker {
            held: 0,
            peak: 0,
            limit,
            floor: 0,
            fresh: 0,
            free_head: 0,
            slots: Vec::new(),
            totals: Vec::new(),
            names: Box::default(),
            raised: (FREE, 0),
        }
    }

    /// Bytes from the start that the allocation path reads: all but the boxed names.
    #[cfg(test)]
    pub(crate) const HOT_BYTES: usize = std::mem::offset_of!(Tracker, names);

    /// The id of `name` (known from now on), or [`OVERFLOW_NAME`] for a name first seen
    /// once [`MAX_NAMES`] are known: an allocation under it must then be given to
    /// [`Tracker::name_slot`] once tracked.
    #[allow(clippy::ptr_arg)]
    pub(crate) fn name_id(&mut self, name: &Cow<'static, str>) -> u32 {
        let (id, new) = self.names.id(name);
        if new {
            self.totals.push(Totals::default());
        }
        id
    }

    /// Makes `names` known before any allocation (the crate's own), with the first ids:
    /// they count towards [`MAX_NAMES`] from the start, and reports leave them out while
    /// no allocation used them. Called on a new tracker only.
    pub(crate) fn reserve_names(&mut self, names: &[&'static str]) {
        for name in names {
            self.name_id(&Cow::Borrowed(name));
        }
        self.names.reserved = self.names.texts.len();
    }

    /// Keeps `text` as the name that reports give the allocation just tracked in `slot`
    /// under name id `name`, when that is [`OVERFLOW_NAME`] (other names are found by
    /// their id). Every allocation tracked under [`OVERFLOW_NAME`] must be given here, so
    /// that no slot shows the text of an allocation it held before.
    #[allow(clippy::ptr_arg)]
    #[inline]
    pub(crate) fn name_slot(&mut self, slot: u32, name: u32, text: &Cow<'static, str>) {
        if name == OVERFLOW_NAME {
            self.name_overflow_slot(slot, text);
        }
    }

    /// [`Tracker::name_slot`] for the slot the next new block takes (the next allocation
    /// of [`Tracker::track_new`]), which the caller's allocation under [`OVERFLOW_NAME`]
    /// takes next, in the same lock section. (If the allocation is refused, the free slot
    /// keeps a text no report reads.)
    #[allow(clippy::ptr_arg)]
    pub(crate) fn name_next_new_slot(&mut self, text: &Cow<'static, str>) {
        self.name_overflow_slot(self.free_head, text);
    }

    /// [`Tracker::name_slot`] for a name past the cap. `slot` is a slot of the table or the
    /// next one to be added: the texts kept stay within one per slot.
    #[allow(clippy::ptr_arg)]
    #[cold]
    #[inline(never)]
    fn name_overflow_slot(&mut self, slot: u32, text: &Cow<'static, str>) {
        if (slot as usize) <= self.slots.len() {
            // (Reuses the slot's last owned text's buffer when it can.)
            let kept = self.names.overflow.entry(slot).or_insert(Cow::Borrowed(""));
            kept.clone_from(text);
        }
    }

    /// Charges an allocation of `bytes` to name `name` (an id of [`Tracker::name_id`]): the
    /// first step of tracking it, before [`Tracker::track_parked`] or
    /// [`Tracker::track_new`]. Taken back with [`Tracker::refund`] if they refuse it.
    /// (Wrapping: a request too large to hold is refused after its charge, and refunded.)
    #[inline]
    pub(crate) fn charge(&mut self, name: u32, bytes: usize) {
        if let Some(t) = self.totals.get_mut(name as usize) {
            t.current = t.current.wrapping_add(bytes);
        }
    }

    /// Takes back the charge of an allocation that was refused.
    #[cold]
    pub(crate) fn refund(&mut self, name: u32, bytes: usize) {
        if let Some(t) = self.totals.get_mut(name as usize) {
            t.current = t.current.wrapping_sub(bytes);
        }
    }

    /// Records an allocation of `bytes` under name `name`, [charged](Tracker::charge)
    /// already, served by a block just taken from the cache with its slot `slot`, if the
    /// bytes in use stay within the limit. `cached` is the bytes left in the cache. Its
    /// slot, or `None` past the limit (the caller refunds the charge).
    #[inline]
    pub(crate) fn track_parked(
        &mut self,
        name: u32,
        bytes: usize,
        slot: u32,
        cached: usize,
    ) -> Option<u32> {
        // A parked block is held already: what is held stays, and the bytes in use pass the
        // peak only if the cache keeps fewer than the floor.
        if cached < self.floor {
            self.admit_parked(cached)?;
        }
        match self.slots.get_mut(slot as usize) {
            Some(s) => {
                s.name = name;
                Some(slot)
            }
            // (Not a slot of this tracker's: the block gets one.)
            None => Some(self.new_slot_cold(bytes, name)),
        }
    }

    /// Records an allocation of `bytes` under name `name`, [charged](Tracker::charge)
    /// already, that took a new block, if the bytes in use stay within the limit. `cached`
    /// is the bytes in the cache. Its slot, or `None` past the limit (the caller refunds
    /// the charge).
    #[inline]
    pub(crate) fn track_new(&mut self, name: u32, bytes: usize, cached: usize) -> Option<u32> {
        let held = self.held.checked_add(bytes)?;
        let peak = self.peak;
        self.admit(held.wrapping_sub(cached))?;
        self.held = held;
        // `held - peak` rose by up to `bytes`: the floor becomes `held`, which is at least
        // that, and the next allocation from the cache sets it exactly.
        self.floor = held;
        self.fresh += 1;
        let slot = self.new_slot(bytes, name);
        if self.peak != peak {
            self.raised = (slot, peak);
        }
        Some(slot)
    }

    /// Charges and tracks an allocation that takes a new block, refunded past the limit:
    /// [`Tracker::track_new`] for callers off the hot path.
    pub(crate) fn charge_and_track_new(
        &mut self,
        name: u32,
        bytes: usize,
        cached: usize,
    ) -> Option<u32> {
        self.charge(name, bytes);
        let slot = self.track_new(name, bytes, cached);
        if slot.is_none() {
            self.refund(name, bytes);
        }
        slot
    }

    /// Bytes that may come into use before the limit, with `cached` bytes in the block
    /// cache (held, not in use).
    pub(crate) fn room(&self, cached: usize) -> usize {
        self.limit.saturating_sub(self.held.saturating_sub(cached))
    }

    /// Whether `in_use` bytes are within the limit, raising the peak to them. Only a new
    /// peak can be past the limit, since the peak never is.
    #[inline]
    fn admit(&mut self, in_use: usize) -> Option<()> {
        if in_use > self.peak {
            if in_use > self.limit {
                return None;
            }
            self.peak = in_use;
        }
        Some(())
    }

    /// [`Tracker::admit`] for an allocation from the cache that leaves `cached` bytes
    /// there, under the floor; the floor is then set exactly.
    #[cold]
    #[inline(never)]
    fn admit_parked(&mut self, cached: usize) -> Option<()> {
        let peak = self.peak;
        self.admit(self.held.wrapping_sub(cached))?;
        if self.peak != peak {
            // A peak this allocation reached: a refused allocation in flight may no longer
            // take the peak back below it (see `Tracker::abandon`).
            self.raised.0 = FREE;
        }
        self.floor = self.held.saturating_sub(self.peak);
        Some(())
    }

    /// A slot for a new block: the first free one, or a new one.
    #[inline]
    fn new_slot(&mut self, bytes: usize, name: u32) -> u32 {
        let slot = self.free_head;
        match self.slots.get_mut(slot as usize) {
            Some(free) => {
                self.free_head = free.next;
                // Field by field: a `Slot` built first and copied whole was read back as one
                // wide word before its writes had retired (a store-forwarding stall).
                free.bytes = bytes;
                free.name = name;
                free.next = 0;
                slot
            }
            None => self.push_slot(Slot {
                bytes,
                name,
                next: 0,
            }),
        }
    }

    /// [`Tracker::new_slot`] off the hot path.
    #[cold]
    #[inline(never)]
    fn new_slot_cold(&mut self, bytes: usize, name: u32) -> u32 {
        self.new_slot(bytes, name)
    }

    /// A new slot at the end of the table, none being free.
    #[cold]
    #[inline(never)]
    fn push_slot(&mut self, s: Slot) -> u32 {
        self.slots.push(s);
        self.free_head = self.slots.len() as u32;
        self.free_head - 1
    }

    /// Records that an allocation (`name`, `slot`, as tracked) was freed and its memory
    /// went back to the driver. (A block the cache keeps is only
    /// [uncharged](Tracker::uncharge): its slot is parked with it.)
    #[inline]
    pub(crate) fn release(&mut self, name: u32, slot: u32, bytes: usize) {
        self.uncharge(name, bytes);
        self.forget_block(slot, bytes);
    }

    /// The name's part of [`Tracker::release`]: its peak folded in, the bytes taken off.
    /// First in a free's lock section, for the reason [`Tracker::charge`] is.
    #[inline]
    pub(crate) fn uncharge(&mut self, name: u32, bytes: usize) {
        if let Some(t) = self.totals.get_mut(name as usize) {
            if t.current > t.peak {
                t.peak = t.current;
            }
            t.current -= bytes;
            t.frees += 1;
        }
    }

    /// Takes back an allocation the driver then refused: not counted as made, and left out
    /// of the overall peak, unless an allocation since raised that further (then possibly
    /// counted, only when another thread allocated meanwhile), and of its name's, unless a
    /// free of the name came meanwhile (which folds the name's bytes, this request's with
    /// them, into its peak). A name's peak is then brought down to the overall peak, which
    /// its bytes, all in use, never passed. `cached` is the bytes in the cache.
    pub(crate) fn abandon(&mut self, name: u32, slot: u32, bytes: usize, cached: usize) {
        self.refund(name, bytes);
        self.fresh -= 1;
        let raised_by_it = self.raised.0 == slot;
        self.forget_block(slot, bytes);
        if raised_by_it {
            self.peak = self.raised.1.max(self.held.wrapping_sub(cached));
            // `held - peak` may have risen: the floor becomes its upper bound.
            self.floor = self.held;
        }
        if let Some(t) = self.totals.get_mut(name as usize) {
            t.peak = t.peak.min(self.peak);
        }
    }

    /// Forgets a block that goes back to the driver: its bytes and its slot.
    #[inline]
    pub(crate) fn forget_block(&mut self, slot: u32, bytes: usize) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if s.name == FREE {
            return;
        }
        s.name = FREE;
        s.next = self.free_head;
        self.free_head = slot;
        if self.raised.0 == slot {
            // The slot may be taken by an allocation that raised nothing.
            self.raised.0 = FREE;
        }
        // (`held - peak` drops: the floor may stay above it.)
        self.held -= bytes;
    }

    /// The counts [`crate::allocs::Allocs`] derives its own from.
    pub(crate) fn counts(&self) -> TrackerCounts {
        TrackerCounts {
            freed: self.totals.iter().map(|t| t.frees).sum(),
            fresh: self.fresh,
            blocks: self.slots.iter().filter(|s| s.name != FREE).count(),
        }
    }

    /// Every live allocation (largest first) and the totals per name (most current bytes
    /// first) of every name used so far (the first [`MAX_NAMES`], and [`OVERFLOW_TEXT`]
    /// for the others together). `parked` are the slots of the blocks in the
    /// cache, `cached` their bytes: held but not in use.
    pub(crate) fn report(&self, parked: impl Iterator<Item = u32>, cached: usize) -> MemoryReport {
        let mut in_cache = vec![false; self.slots.len()];
        for slot in parked {
            if let Some(p) = in_cache.get_mut(slot as usize) {
                *p = true;
            }
        }
        let mut live = Vec::new();
        let mut live_by_name = vec![0; self.names.texts.len()];
        for (id, s) in self.slots.iter().enumerate() {
            if s.name != FREE && !in_cache[id] {
                live_by_name[s.name as usize] += 1;
                let name = match s.name {
                    OVERFLOW_NAME => match self.names.overflow.get(&(id as u32)) {
                        Some(text) => text.to_string(),
                        None => OVERFLOW_TEXT.to_string(), // (every such slot has one)
                    },
                    name => self.names.texts[name as usize].clone(),
                };
                live.push(LiveAllocation {
                    id: id as u64,
                    name,
                    bytes: s.bytes,
                });
            }
        }
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
        let reserved = self.names.reserved;
        let mut by_name: Vec<NameTotals> = (self.names.texts.iter().zip(&self.totals))
            .zip(live_by_name)
            .enumerate()
            .filter(|(id, ((_, t), live))| *id >= reserved || t.frees > 0 || *live > 0)
            .map(|(_, ((name, t), live))| NameTotals {
                name: name.clone(),
                live,
                current_bytes: t.current,
                peak_bytes: t.peak.max(t.current),
                allocations: t.frees + live as u64,
            })
            .collect();
        by_name.sort_by(|a, b| {
            b.current_bytes
                .cmp(&a.current_bytes)
                .then(a.name.cmp(&b.name))
        });
        MemoryReport {
            current_bytes: self.held.wrapping_sub(cached),
            peak_bytes: self.peak,
            live,
            by_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tracks `bytes` under `name` as a new block (no cache), within no limit.
    fn track(t: &mut Tracker, name: Cow<'static, str>, bytes: usize) -> (u32, u32) {
        let id = t.name_id(&name);
        let slot = t.charge_and_track_new(id, bytes, 0).unwrap();
        t.name_slot(slot, id, &name);
        (id, slot)
    }

    fn free(t: &mut Tracker, (name, slot): (u32, u32), bytes: usize) {
        t.release(name, slot, bytes);
    }

    /// The ids of static names.
    fn ids<const N: usize>(t: &mut Tracker, names: [&'static str; N]) -> [u32; N] {
        names.map(|n| t.name_id(&Cow::Borrowed(n)))
    }

    fn report(t: &Tracker) -> MemoryReport {
        t.report(std::iter::empty(), 0)
    }

    #[test]
    fn a_refused_allocation_leaves_the_peak_as_it_was() {
        let mut t = Tracker::default();
        let a = track(&mut t, "a".into(), 100);
        free(&mut t, a, 100);
        // Admitted (raising the peak to 500), then refused by the driver.
        let (id, slot) = track(&mut t, "big".into(), 500);
        assert_eq!(report(&t).peak_bytes, 500);
        t.abandon(id, slot, 500, 0);
        let r = report(&t);
        assert_eq!((r.peak_bytes, r.current_bytes), (100, 0));
        let big = r.by_name.iter().find(|n| n.name == "big").unwrap();
        assert_eq!((big.peak_bytes, big.allocations), (0, 0));
        // One that raised nothing lowers nothing.
        let keep = track(&mut t, "keep".into(), 60);
        let (id, slot) = track(&mut t, "small".into(), 30);
        t.abandon(id, slot, 30, 0);
        assert_eq!(report(&t).peak_bytes, 100);
        // Raised by it, but the bytes in use now are more than the old peak.
        let (id, slot) = track(&mut t, "big".into(), 200);
        let more = track(&mut t, "more".into(), 50);
        t.abandon(id, slot, 200, 0);
        assert_eq!(
            report(&t).peak_bytes,
            310,
            "60 + 200 + 50 were admitted at once"
        );
        free(&mut t, more, 50);
        free(&mut t, keep, 60);
    }

    #[test]
    fn a_free_of_its_name_does_not_lift_the_names_peak_past_the_overall_one() {
        let mut t = Tracker::default();
        let a = track(&mut t, "column".into(), 100);
        // Admitted, and at the driver while the name's other allocation is freed (which
        // folds the name's 600 bytes into its peak); then refused.
        let (id, slot) = track(&mut t, "column".into(), 500);
        free(&mut t, a, 100);
        t.abandon(id, slot, 500, 0);
        let r = report(&t);
        assert_eq!(r.peak_bytes, 100);
        let column = r.by_name.iter().find(|n| n.name == "column").unwrap();
        assert_eq!(
            (column.peak_bytes, column.allocations),
            (100, 1),
            "never more than 100 bytes of it were held"
        );
    }

    #[test]
    fn reserved_names_keep_their_ids_past_the_cap_and_stay_out_of_reports_until_used() {
        let mut t = Tracker::default();
        t.reserve_names(&["own-a", "own-b"]);
        assert!(
            report(&t).by_name.is_empty(),
            "unused reserved names are not listed"
        );
        for k in 0..MAX_NAMES {
            t.name_id(&Cow::Owned(format!("prover-{k}")));
        }
        assert_eq!(t.name_id(&Cow::Owned("late".into())), OVERFLOW_NAME);
        let (id, _) = track(&mut t, Cow::Borrowed("own-b"), 64);
        assert_eq!(id, 1, "its own id, not the overflow's");
        let r = report(&t);
        let own: Vec<_> = r
            .by_name
            .iter()
            .filter(|n| n.name.starts_with("own-"))
            .collect();
        assert_eq!(own.len(), 1, "the unused one still left out");
        assert_eq!((own[0].name.as_str(), own[0].live), ("own-b", 1));
    }

    #[test]
    fn a_reused_slot_does_not_inherit_a_raised_peak() {
        let mut t = Tracker::default();
        let a = track(&mut t, "a".into(), 300); // raises the peak, in slot 0
        free(&mut t, a, 300);
        let (id, slot) = track(&mut t, "b".into(), 10); // slot 0 again, raising nothing
        assert_eq!(slot, a.1);
        t.abandon(id, slot, 10, 0);
        assert_eq!(report(&t).peak_bytes, 300);
    }

    #[test]
    fn totals_follow_allocations_and_frees() {
        let mut t = Tracker::default();
        let a = track(&mut t, Cow::Borrowed("column"), 100);
        let b = track(&mut t, Cow::Borrowed("column"), 50);
        let c = track(&mut t, Cow::Owned("tree-0".to_string()), 400);
        assert_eq!(report(&t).current_bytes, 550);
        free(&mut t, b, 50);
        t.forget_block(b.1, 50); // a slot already free is left alone
        t.forget_block(1000, 50); // so is an unknown one
        let r = report(&t);
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
        free(&mut t, a, 100);
        free(&mut t, c, 400);
        let r = report(&t);
        assert_eq!((r.current_bytes, r.peak_bytes, r.live.len()), (0, 550, 0));
        assert!(r.to_string().contains("0 live allocations"));
        assert_eq!(r.by_name.len(), 2, "names stay in the totals once used");
    }

    #[test]
    fn the_limit_refuses_without_recording() {
        let mut t = Tracker::with_limit(100);
        let [a, b] = ids(&mut t, ["a", "b"]);
        let first = t.charge_and_track_new(a, 60, 0).unwrap();
        assert_eq!(t.charge_and_track_new(b, 41, 0), None);
        assert_eq!(t.charge_and_track_new(a, usize::MAX, 0), None);
        let r = report(&t);
        assert_eq!((r.current_bytes, r.peak_bytes, r.live.len()), (60, 60, 1));
        assert_eq!(
            r.by_name
                .iter()
                .map(|n| (n.name.as_str(), n.allocations))
                .collect::<Vec<_>>(),
            vec![("a", 1), ("b", 0)]
        );
        assert!(t.charge_and_track_new(b, 40, 0).is_some(), "exactly at it");
        t.release(a, first, 60);
        assert!(t.charge_and_track_new(b, 60, 0).is_some());
        assert_eq!(t.charge_and_track_new(b, 1, 0), None, "at the limit again");
    }

    #[test]
    fn freed_slots_are_reused_latest_first() {
        let mut t = Tracker::default();
        let ids: Vec<(u32, u32)> = (0..4)
            .map(|_| track(&mut t, Cow::Borrowed("x"), 1))
            .collect();
        assert_eq!(ids.iter().map(|i| i.1).collect::<Vec<_>>(), [0, 1, 2, 3]);
        free(&mut t, ids[1], 1);
        free(&mut t, ids[3], 1);
        assert_eq!(track(&mut t, Cow::Borrowed("y"), 1).1, 3);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1).1, 1);
        assert_eq!(track(&mut t, Cow::Borrowed("x"), 1).1, 4);
        let ids: Vec<u64> = report(&t).live.iter().map(|l| l.id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_parked_block_keeps_its_slot_and_is_held_but_not_in_use() {
        let mut t = Tracker::with_limit(1000);
        let [col, tree] = ids(&mut t, ["col", "tree"]);
        let slot = t.charge_and_track_new(col, 100, 0).unwrap();
        // Freed into the cache: 100 bytes cached, the slot parked with the block.
        t.uncharge(col, 100);
        let r = t.report([slot].into_iter(), 100);
        assert_eq!((r.current_bytes, r.live.len()), (0, 0));
        // Another name takes the block again, with its slot: nothing new is held.
        t.charge(tree, 100);
        assert_eq!(t.track_parked(tree, 100, slot, 0), Some(slot));
        let counts = TrackerCounts {
            freed: 1,
            fresh: 1,
            blocks: 1,
        };
        assert_eq!(t.counts(), counts, "the second took the parked block");
        let r = t.report(std::iter::empty(), 0);
        assert_eq!((r.current_bytes, r.peak_bytes), (100, 100));
        assert_eq!(r.largest(1), vec![("tree".to_string(), 100)]);
        let by: Vec<(&str, usize, usize, usize)> = r
            .by_name
            .iter()
            .map(|n| (n.name.as_str(), n.live, n.current_bytes, n.peak_bytes))
            .collect();
        assert_eq!(by, vec![("tree", 1, 100, 100), ("col", 0, 0, 100)]);
        // Parked again; a new block of 950 passes the limit with 100 cached, not in use.
        t.uncharge(tree, 100);
        assert!(t.charge_and_track_new(col, 950, 100).is_some());
        // Taking the parked block back would pass it: refused, and the charge refunded.
        t.charge(tree, 100);
        assert_eq!(t.track_parked(tree, 100, slot, 0), None);
        t.refund(tree, 100);
        assert_eq!(t.report([slot].into_iter(), 100).current_bytes, 950);
        // The drained block leaves: its slot is free, its bytes no longer held.
        t.forget_block(slot, 100);
        assert_eq!(t.report(std::iter::empty(), 0).current_bytes, 950);
        assert_eq!(t.charge_and_track_new(tree, 50, 0), Some(slot));
    }

    #[test]
    fn a_floor_left_high_by_a_driver_free_is_set_again_by_the_next_check() {
        let mut t = Tracker::with_limit(1000);
        let [col] = ids(&mut t, ["col"]);
        let a = t.charge_and_track_new(col, 100, 0).unwrap();
        let b = t.charge_and_track_new(col, 100, 0).unwrap();
        assert_eq!(
            (t.peak, t.floor),
            (200, 200),
            "a new block sets the floor to held"
        );
        t.uncharge(col, 100); // `a` parked: 100 cached
        t.release(col, b, 100); // `b` back to the driver: 100 held, all of it cached
        assert_eq!(t.floor, 200, "left high");
        t.charge(col, 100);
        assert_eq!(
            t.track_parked(col, 100, a, 0),
            Some(a),
            "checked: no new peak"
        );
        assert_eq!(t.floor, 0, "held 100 cannot pass the peak of 200");
        t.uncharge(col, 100);
        t.charge(col, 100);
        assert_eq!(t.track_parked(col, 100, a, 0), Some(a), "not checked");
        let r = report(&t);
        assert_eq!((r.current_bytes, r.peak_bytes), (100, 200));
        // Under a limit the check refuses what would pass it, whatever the floor.
        let mut t = Tracker::with_limit(150);
        let [col] = ids(&mut t, ["col"]);
        let a = t.charge_and_track_new(col, 100, 0).unwrap();
        t.uncharge(col, 100);
        assert!(
            t.charge_and_track_new(col, 100, 100).is_some(),
            "in use 100"
        );
        t.charge(col, 100);
        assert_eq!(t.track_parked(col, 100, a, 0), None, "in use 200 > 150");
        t.refund(col, 100);
        assert_eq!(report(&t).peak_bytes, 100);
    }

    #[test]
    fn an_abandoned_allocation_is_not_counted() {
        let mut t = Tracker::default();
        let kept = track(&mut t, Cow::Borrowed("x"), 5);
        free(&mut t, kept, 5);
        let (id, slot) = track(&mut t, Cow::Borrowed("x"), 10);
        t.abandon(id, slot, 10, 0);
        let counts = TrackerCounts {
            freed: 1,
            fresh: 1,
            blocks: 0,
        };
        assert_eq!(t.counts(), counts, "the abandoned one is not counted");
        let r = report(&t);
        assert_eq!((r.current_bytes, r.live.len()), (0, 0));
        let x = &r.by_name[0];
        assert_eq!((x.allocations, x.current_bytes, x.peak_bytes), (1, 0, 5));
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
        let r = report(&t);
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
            let r = report(&t);
            assert_eq!(r.by_name.len(), names.len());
            for n in &r.by_name {
                let i: usize = n.name["name-".len()..].parse().unwrap();
                assert_eq!((n.live, n.current_bytes), (round, round * (i + 1)));
            }
        }
        assert!(names.iter().all(|n| t.names.statics.get(n).is_some()));
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
        let (c, m) = (t.names.statics.get(column), t.names.statics.get(merkle));
        assert!(
            c.is_some() && m.is_some() && c != m,
            "both remembered, apart"
        );
        let r = report(&t);
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
        assert_eq!(names.0.len(), MAX_STATIC_NAMES);
        assert_eq!(names.get(texts[7]), Some(7));
        assert_eq!(names.get(texts[MAX_STATIC_NAMES + 3]), None);
        // The tracker still names them right, through the text.
        let mut t = Tracker {
            names: Box::new(Names {
                statics: names,
                ..Default::default()
            }),
            ..Default::default()
        };
        track(&mut t, Cow::Borrowed(texts[MAX_STATIC_NAMES + 3]), 5);
        let r = report(&t);
        assert_eq!(
            r.largest(1),
            vec![(texts[MAX_STATIC_NAMES + 3].to_string(), 5)]
        );
    }

    /// (id, name, bytes) of the live allocations, by id.
    fn live(r: &MemoryReport) -> Vec<(u64, String, usize)> {
        let mut live: Vec<_> = r
            .live
            .iter()
            .map(|l| (l.id, l.name.clone(), l.bytes))
            .collect();
        live.sort();
        live
    }

    #[test]
    fn names_past_the_cap_share_one_total_and_live_ones_keep_their_own_text() {
        assert_eq!(OVERFLOW_TEXT, format!("(names past the first {MAX_NAMES})"));
        let mut t = Tracker::default();
        // The cap's worth of names, each allocated and freed once.
        for i in 0..MAX_NAMES {
            let a = track(&mut t, Cow::Owned(format!("n{i}")), 1);
            free(&mut t, a, 1);
        }
        // Past it: owned names, and static ones (one with two requests).
        let leaked: &'static str = Box::leak("static-late".to_string().into_boxed_str());
        let mut late: Vec<((u32, u32), String, usize)> = (0..10)
            .map(|i| {
                let text = format!("late-{i}");
                (
                    track(&mut t, Cow::Owned(text.clone()), 100 + i),
                    text,
                    100 + i,
                )
            })
            .collect();
        for bytes in [50, 60] {
            let a = track(&mut t, Cow::Borrowed(leaked), bytes);
            late.push((a, leaked.to_string(), bytes));
        }
        assert!(late.iter().all(|(a, ..)| a.0 == OVERFLOW_NAME));
        // Known names keep their ids, static or not.
        let n7 = track(&mut t, Cow::Borrowed("n7"), 1000);
        assert_eq!(n7.0, 7);
        let r = report(&t);
        assert_eq!(r.by_name.len(), MAX_NAMES + 1);
        let over = |r: &MemoryReport| {
            let n = r.by_name.iter().find(|n| n.name == OVERFLOW_TEXT).unwrap();
            (n.live, n.current_bytes, n.peak_bytes, n.allocations)
        };
        let late_bytes: usize = (100..110).sum::<usize>() + 110;
        assert_eq!(over(&r), (12, late_bytes, late_bytes, 12));
        let mut want: Vec<_> = late
            .iter()
            .map(|(a, text, b)| (u64::from(a.1), text.clone(), *b))
            .collect();
        want.push((u64::from(n7.1), "n7".to_string(), 1000));
        want.sort();
        assert_eq!(live(&r), want, "each under its own text");
        assert_eq!(
            (r.current_bytes, r.peak_bytes),
            (late_bytes + 1000, late_bytes + 1000)
        );
        // Freed, their slots are taken again by known names and by new late ones.
        for (a, _, bytes) in &late {
            free(&mut t, *a, *bytes);
        }
        let again: Vec<(u32, u32)> = (0..6)
            .map(|i| track(&mut t, Cow::Owned(format!("n{i}")), 7))
            .collect();
        let other = track(&mut t, Cow::Owned("later".to_string()), 9);
        let slots: Vec<u32> = late.iter().map(|(a, ..)| a.1).collect();
        assert!(
            again.iter().chain([&other]).all(|a| slots.contains(&a.1)),
            "reused"
        );
        let r = report(&t);
        let mut want: Vec<_> = (0..6)
            .map(|i| (u64::from(again[i].1), format!("n{i}"), 7))
            .collect();
        want.push((u64::from(other.1), "later".to_string(), 9));
        want.push((u64::from(n7.1), "n7".to_string(), 1000));
        want.sort();
        assert_eq!(live(&r), want, "no text of a freed allocation");
        assert_eq!(over(&r), (1, 9, late_bytes, 13));
        assert_eq!(
            (r.current_bytes, r.peak_bytes),
            (1000 + 42 + 9, late_bytes + 1000)
        );
        assert_eq!(r.by_name.len(), MAX_NAMES + 1);
        assert_eq!(t.counts().freed, MAX_NAMES as u64 + 12);
        // Bounded: one text per name below the cap, one overflow text per slot.
        assert_eq!(
            (t.names.texts.len(), t.totals.len()),
            (MAX_NAMES + 1, MAX_NAMES + 1)
        );
        assert_eq!(t.names.by_text.len(), MAX_NAMES);
        assert!(t.names.overflow.len() <= t.slots.len());
    }

    #[test]
    fn a_parked_slot_shows_the_name_of_whoever_takes_it_next() {
        let mut t = Tracker::default();
        for i in 0..MAX_NAMES {
            t.name_id(&Cow::Owned(format!("n{i}")));
        }
        let (a, b) = (Cow::Owned("late-a".to_string()), Cow::Borrowed("late-b"));
        let (over, n0) = (t.name_id(&a), t.name_id(&Cow::Borrowed("n0")));
        assert_eq!((t.name_id(&b), over, n0), (OVERFLOW_NAME, OVERFLOW_NAME, 0));
        let slot = t.charge_and_track_new(over, 100, 0).unwrap();
        t.name_slot(slot, over, &a);
        let name_of = |t: &Tracker| report(t).live[0].name.clone();
        assert_eq!(name_of(&t), "late-a");
        // Parked with its block, and taken by a known name: the hot path names nothing else.
        t.uncharge(over, 100);
        t.charge(n0, 100);
        assert_eq!(t.track_parked(n0, 100, slot, 0), Some(slot));
        t.name_slot(slot, n0, &Cow::Borrowed("n0"));
        assert_eq!(name_of(&t), "n0");
        // Parked again, and taken by another late name.
        t.uncharge(n0, 100);
        t.charge(over, 100);
        assert_eq!(t.track_parked(over, 100, slot, 0), Some(slot));
        t.name_slot(slot, over, &b);
        assert_eq!(name_of(&t), "late-b");
        let r = report(&t);
        let o = r.by_name.iter().find(|n| n.name == OVERFLOW_TEXT).unwrap();
        assert_eq!((o.live, o.current_bytes, o.allocations), (1, 100, 2));
        // A slot that is not the tracker's is not kept.
        t.name_slot(1000, over, &a);
        assert_eq!(t.names.overflow.len(), 1);
    }
}
