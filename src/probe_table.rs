//! The open-addressing table behind the allocation path's lookups (`crate::alloc_keys`,
//! and the tracker's static names): linear probing from a Fibonacci hash, at most an
//! eighth full ([`SPARSITY`]), never evicting, and capped, so that a lookup is nearly
//! always one compare and entries used in turn never push each other out.

/// A table has at least this many entries per entry kept. Collisions cost a second
/// compare and a branch that the CPU may mispredict on the allocation path. At an eighth
/// full, the 12 keys of the tracking bench (request `k` pairs name `k % 4` with size
/// `k % 6`: 12 of the 24 pairs, those of one parity) collide about a quarter as often as
/// at half full. In one comparison on the H100 the tracking overhead was
/// 0.15-0.3 points lower; that is within the bench's spread (RESULTS.md). At the cap
/// (4096 entries) a table has 32768 entries: 1 MiB for the request keys.
const SPARSITY: usize = 8;
/// Entries of a new table.
const FIRST_SIZE: usize = 256;

/// An entry of a [`ProbeTable`].
pub(crate) trait ProbeEntry: Copy {
    /// The empty entry: no lookup accepts it.
    const EMPTY: Self;
    /// Whether this is the empty entry.
    fn is_empty(&self) -> bool;
    /// The entry's key mixed into 64 bits, as [`ProbeTable::find`] is given it.
    fn hash(&self) -> u64;
}

/// Entries of `E` by their [`ProbeEntry::hash`].
#[repr(C)]
pub(crate) struct ProbeTable<E> {
    /// A power of two in size.
    entries: Vec<E>,
    /// 64 - log2(table size): the hash's shift.
    shift: u32,
    len: usize,
    /// The most entries kept.
    max: usize,
}

impl<E: ProbeEntry> ProbeTable<E> {
    /// An empty table that keeps at most `max` entries.
    pub(crate) fn new(max: usize) -> Self {
        ProbeTable {
            entries: vec![E::EMPTY; FIRST_SIZE],
            shift: 64 - FIRST_SIZE.trailing_zeros(),
            len: 0,
            max,
        }
    }

    /// Entries kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Where the probe for `hash` starts: Fibonacci hashing.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The entry of hash `hash` that `is` accepts (it must refuse the empty entry).
    #[inline]
    pub(crate) fn find(&self, hash: u64, is: impl Fn(&E) -> bool) -> Option<&E> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(hash);
        loop {
            let e = &self.entries[i];
            if is(e) {
                return Some(e);
            }
            if e.is_empty() {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Keeps `e` (whose key is not kept yet, and which is not empty), unless the table
    /// holds its most entries already: then false.
    pub(crate) fn insert(&mut self, e: E) -> bool {
        if self.len >= self.max || e.is_empty() {
            return false;
        }
        if (self.len + 1) * SPARSITY > self.entries.len() {
            let bigger = vec![E::EMPTY; 2 * self.entries.len()];
            let old = std::mem::replace(&mut self.entries, bigger);
            self.shift -= 1;
            for e in old.into_iter().filter(|e| !e.is_empty()) {
                self.put(e);
            }
        }
        self.put(e);
        self.len += 1;
        true
    }

    /// Writes `e` into the first empty entry of its probe sequence.
    fn put(&mut self, e: E) {
        let mask = self.entries.len() - 1;
        let mut i = self.home(e.hash());
        while !self.entries[i].is_empty() {
            i = (i + 1) & mask;
        }
        self.entries[i] = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key and a value; key 0 is the empty entry.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Kv(u64, u32);

    impl ProbeEntry for Kv {
        const EMPTY: Self = Kv(0, 0);
        fn is_empty(&self) -> bool {
            self.0 == 0
        }
        fn hash(&self) -> u64 {
            self.0
        }
    }

    fn get(t: &ProbeTable<Kv>, key: u64) -> Option<u32> {
        t.find(key, |e| e.0 == key).map(|e| e.1)
    }

    #[test]
    fn it_grows_keeps_everything_until_its_most_and_stays_sparse() {
        let mut t = ProbeTable::new(1000);
        // Keys 4096 apart: the hash must spread them, not their low bits.
        for k in 1..=1200u64 {
            assert_eq!(t.insert(Kv(k << 12, k as u32)), k <= 1000);
        }
        assert_eq!(t.len(), 1000);
        assert!(t.len() * SPARSITY <= t.entries.len());
        for k in 1..=1200u64 {
            assert_eq!(get(&t, k << 12), (k <= 1000).then_some(k as u32));
        }
        assert!(!t.insert(Kv::EMPTY));
        assert_eq!(get(&t, 5), None);
    }

    #[test]
    fn keys_of_one_home_spill_over_to_the_next_entries() {
        let mut t = ProbeTable::new(100);
        let home = t.home(1 << 12);
        let keys: Vec<u64> = (1..)
            .map(|k| k << 12)
            .filter(|&k| t.home(k) == home)
            .take(4)
            .collect();
        for (i, &k) in keys.iter().enumerate() {
            assert!(t.insert(Kv(k, i as u32)));
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(get(&t, k), Some(i as u32));
        }
    }
}
