//! The phase-3 block cache: freed pool blocks kept for reuse, by exact size. Sizes are
//! numbered as size classes when first seen, and an allocation carries its class, so that
//! freeing it finds its list without hashing. At most [`MAX_CLASSES`] sizes are numbered:
//! blocks of sizes first seen past that are not kept.

use cuda_sys::CUdeviceptr;
use rustc_hash::FxHashMap;

/// A class id meaning "no class": the allocation is not from the pool, or its size was
/// first seen past [`MAX_CLASSES`]. The cache keeps no block of it.
pub(crate) const NO_CLASS: u32 = u32::MAX;

/// The most sizes numbered as classes. A class costs a list and a map entry for good, so a
/// service whose sizes vary without end (trace lengths per proof) would grow the cache's
/// tables without bound. The sizes seen first keep their classes; a size first seen past
/// the cap gets [`NO_CLASS`], and its blocks go back to the pool when freed. 4096 matches
/// the request keys' cap (`crate::alloc_keys`): far more sizes than a prover reuses, and
/// the tables stay small (a few hundred KiB at the cap).
pub(crate) const MAX_CLASSES: usize = 1 << 12;

/// A cached block, with the tracker slot parked with it (`crate::tracking::NO_SLOT` when
/// untracked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parked {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) slot: u32,
}

/// The blocks of one size.
struct SizeClass {
    bytes: usize,
    parked: Vec<Parked>,
}

/// Freed pool blocks kept for reuse, by size class: at most [`MAX_CLASSES`] of them, the
/// sizes seen first.
#[derive(Default)]
#[repr(C)]
pub(crate) struct BlockCache {
    /// Bytes of the blocks kept.
    pub(crate) bytes: usize,
    classes: Vec<SizeClass>,
    /// Used only when a size is first seen: boxed, off the allocation path's cache lines.
    by_size: Box<FxHashMap<usize, u32>>,
}

impl BlockCache {
    /// Bytes from the start that the allocation path reads: all but the boxed map.
    #[cfg(test)]
    pub(crate) const HOT_BYTES: usize = std::mem::offset_of!(BlockCache, by_size);

    /// The class of size `bytes`, numbered when first seen; [`NO_CLASS`] for a size first
    /// seen once [`MAX_CLASSES`] are numbered (for good: classes are never forgotten).
    pub(crate) fn class_of(&mut self, bytes: usize) -> u32 {
        if let Some(&class) = self.by_size.get(&bytes) {
            return class;
        }
        if self.classes.len() >= MAX_CLASSES {
            return NO_CLASS;
        }
        let class = self.classes.len() as u32;
        self.classes.push(SizeClass {
            bytes,
            parked: Vec::new(),
        });
        self.by_size.insert(bytes, class);
        class
    }

    /// The last block kept of `class`, if any.
    #[inline]
    pub(crate) fn take(&mut self, class: u32) -> Option<Parked> {
        let c = self.classes.get_mut(class as usize)?;
        let block = c.parked.pop()?;
        self.bytes -= c.bytes;
        Some(block)
    }

    /// Keeps a block of `class` if the cache stays within `limit`; false if the caller
    /// must free it (also for [`NO_CLASS`]).
    #[inline]
    pub(crate) fn put(&mut self, class: u32, block: Parked, limit: usize) -> bool {
        let Some(c) = self.classes.get_mut(class as usize) else {
            return false;
        };
        if self.bytes + c.bytes > limit {
            return false;
        }
        c.parked.push(block);
        self.bytes += c.bytes;
        true
    }

    /// Puts back a block [`BlockCache::take`] just gave, whatever the limit.
    pub(crate) fn put_back(&mut self, class: u32, block: Parked) {
        self.put(class, block, usize::MAX);
    }

    /// Whether a block of exactly `bytes` is kept: an allocation of that size would take
    /// it, and no device memory. Numbers no class.
    pub(crate) fn holds(&self, bytes: usize) -> bool {
        self.by_size
            .get(&bytes)
            .and_then(|&class| self.classes.get(class as usize))
            .is_some_and(|c| !c.parked.is_empty())
    }

    /// Empties the cache: every block with its size.
    pub(crate) fn drain(&mut self) -> Vec<(Parked, usize)> {
        self.bytes = 0;
        self.classes
            .iter_mut()
            .flat_map(|c| {
                let bytes = c.bytes;
                c.parked.drain(..).map(move |p| (p, bytes))
            })
            .collect()
    }

    /// Blocks kept.
    pub(crate) fn parked_count(&self) -> usize {
        self.classes.iter().map(|c| c.parked.len()).sum()
    }

    /// The tracker slots parked with the blocks kept.
    pub(crate) fn parked_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.classes
            .iter()
            .flat_map(|c| c.parked.iter().map(|p| p.slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ptr: CUdeviceptr) -> Parked {
        Parked { ptr, slot: 7 }
    }

    #[test]
    fn blocks_are_kept_by_size_within_the_limit() {
        let mut c = BlockCache::default();
        let (small, big) = (c.class_of(100), c.class_of(400));
        assert_eq!((small, big, c.class_of(100)), (0, 1, 0));
        assert_eq!(c.take(small), None);
        assert!(c.put(small, block(0xA), 500));
        assert!(c.put(big, block(0xB), 500));
        assert!(!c.put(small, block(0xC), 500), "would pass the limit");
        assert!(!c.put(NO_CLASS, block(0xD), 500), "not a pool block");
        assert_eq!(c.bytes, 500);
        assert_eq!(c.parked_slots().collect::<Vec<_>>(), vec![7, 7]);
        assert_eq!(c.parked_count(), 2);
        assert!(c.holds(100) && c.holds(400));
        assert!(!c.holds(200), "no block of that size");
        assert_eq!(c.take(small), Some(block(0xA)));
        assert_eq!((c.take(small), c.bytes), (None, 400));
        assert!(!c.holds(100), "its one block was taken");
        c.put_back(small, block(0xA));
        c.put_back(small, block(0xE));
        assert_eq!(c.bytes, 600, "put back whatever the limit");
        assert_eq!(c.take(small), Some(block(0xE)), "the last kept first");
        let mut drained = c.drain();
        drained.sort_by_key(|(p, _)| p.ptr);
        assert_eq!(drained, vec![(block(0xA), 100), (block(0xB), 400)]);
        assert_eq!((c.bytes, c.take(big)), (0, None));
    }

    #[test]
    fn sizes_past_the_class_cap_get_no_class_and_are_not_kept() {
        let mut c = BlockCache::default();
        for bytes in 1..=MAX_CLASSES {
            assert_eq!(c.class_of(bytes), bytes as u32 - 1);
        }
        let past = MAX_CLASSES + 1;
        assert_eq!(c.class_of(past), NO_CLASS);
        assert_eq!(c.class_of(past), NO_CLASS, "and stays so");
        assert!(!c.holds(past));
        assert_eq!(
            (c.classes.len(), c.by_size.len()),
            (MAX_CLASSES, MAX_CLASSES)
        );
        let class = c.class_of(past);
        assert!(!c.put(class, block(0xA), usize::MAX), "not kept");
        assert_eq!((c.bytes, c.parked_count(), c.take(NO_CLASS)), (0, 0, None));
        // The sizes seen before the cap keep their classes, and their blocks are kept.
        assert_eq!(
            (c.class_of(1), c.class_of(MAX_CLASSES)),
            (0, MAX_CLASSES as u32 - 1)
        );
        let class = c.class_of(7);
        assert!(c.put(class, block(0xB), usize::MAX));
        assert_eq!(c.take(6), Some(block(0xB)));
    }
}
