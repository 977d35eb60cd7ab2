//! What an allocation request resolves to, remembered per (size, static name): the size
//! class of the block cache and the tracker's name id. One probe of a small table finds
//! both, so a tracked request costs the same lookup as an untracked one (which uses the
//! key with no name).

use crate::probe_table::{ProbeEntry, ProbeTable};

/// A static name's text by address and length, or no name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NameKey {
    addr: usize,
    len: usize,
}

impl NameKey {
    /// No name: untracked requests, and names that are not static.
    pub(crate) const NONE: NameKey = NameKey { addr: 0, len: 0 };

    /// The key of a static text (no `&str` lies at address 0).
    #[inline]
    pub(crate) fn of(text: &'static str) -> NameKey {
        NameKey {
            addr: text.as_ptr() as usize,
            len: text.len(),
        }
    }

    pub(crate) fn is_none(self) -> bool {
        self == NameKey::NONE
    }
}

/// What a request resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The block cache's size class.
    pub(crate) class: u32,
    /// The tracker's name id (`crate::tracking::NO_NAME` for a key with no name).
    pub(crate) name: u32,
}

#[derive(Clone, Copy)]
struct Entry {
    /// 0 for an empty entry (no request is for 0 bytes).
    bytes: usize,
    key: NameKey,
    to: Resolved,
}

/// An empty entry: its key is no text's (none ends past the address space), so no
/// request matches it.
const EMPTY: Entry = Entry {
    bytes: 0,
    key: NameKey {
        addr: usize::MAX,
        len: usize::MAX,
    },
    to: Resolved { class: 0, name: 0 },
};

impl ProbeEntry for Entry {
    const EMPTY: Self = EMPTY;

    fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    #[inline]
    fn hash(&self) -> u64 {
        hash(self.bytes, self.key)
    }
}

/// The size rotated clear of the low bits where addresses of nearby texts differ, mixed
/// with the text's address.
#[inline]
fn hash(bytes: usize, key: NameKey) -> u64 {
    (bytes as u64).rotate_left(29) ^ key.addr as u64
}

/// The most entries remembered; requests past it are resolved the slow way each time.
const MAX_ENTRIES: usize = 1 << 12;

/// (size, name key) -> [`Resolved`].
pub(crate) struct AllocKeys(ProbeTable<Entry>);

impl Default for AllocKeys {
    fn default() -> Self {
        AllocKeys(ProbeTable::new(MAX_ENTRIES))
    }
}

impl AllocKeys {
    /// What (`bytes`, `key`) resolves to, if remembered.
    #[inline]
    pub(crate) fn get(&self, bytes: usize, key: NameKey) -> Option<Resolved> {
        let is = |e: &Entry| e.bytes == bytes && e.key == key;
        self.0.find(hash(bytes, key), is).map(|e| e.to)
    }

    /// Remembers what (`bytes` > 0, `key`), not yet remembered, resolves to (unless
    /// [`MAX_ENTRIES`] are remembered already).
    pub(crate) fn insert(&mut self, bytes: usize, key: NameKey, to: Resolved) {
        self.0.insert(Entry { bytes, key, to });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(class: u32, name: u32) -> Resolved {
        Resolved { class, name }
    }

    #[test]
    fn sizes_and_names_are_told_apart() {
        // Back-to-back texts: `column` then `merkle` at the next address.
        let text: &'static str = Box::leak("columnmerkle".to_string().into_boxed_str());
        let (column, merkle, col) = (
            NameKey::of(&text[..6]),
            NameKey::of(&text[6..]),
            NameKey::of(&text[..3]),
        );
        let mut k = AllocKeys::default();
        k.insert(4096, column, to(0, 0));
        k.insert(4096, merkle, to(0, 1));
        k.insert(4096, NameKey::NONE, to(0, u32::MAX));
        k.insert(8192, column, to(1, 0));
        assert_eq!(k.get(4096, column), Some(to(0, 0)));
        assert_eq!(k.get(4096, merkle), Some(to(0, 1)));
        assert_eq!(k.get(4096, NameKey::NONE), Some(to(0, u32::MAX)));
        assert_eq!(k.get(8192, column), Some(to(1, 0)));
        assert_eq!(k.get(8192, merkle), None);
        assert_eq!(k.get(4096, col), None, "same address, shorter text");
        assert!(NameKey::NONE.is_none() && !column.is_none());
    }

    #[test]
    fn it_grows_and_finds_everything_until_the_cap() {
        let names: Vec<NameKey> = (0..64)
            .map(|i| NameKey::of(Box::leak(format!("n{i}").into_boxed_str())))
            .collect();
        let mut k = AllocKeys::default();
        let sizes = 1..=(2 * MAX_ENTRIES / names.len());
        for bytes in sizes.clone() {
            for (n, &key) in names.iter().enumerate() {
                k.insert(bytes << 12, key, to(bytes as u32, n as u32));
            }
        }
        assert_eq!(k.0.len(), MAX_ENTRIES);
        let mut found = 0;
        for bytes in sizes {
            for (n, &key) in names.iter().enumerate() {
                match k.get(bytes << 12, key) {
                    Some(r) => {
                        assert_eq!(r, to(bytes as u32, n as u32));
                        found += 1;
                    }
                    None => assert!(bytes > MAX_ENTRIES / names.len(), "past the cap only"),
                }
            }
        }
        assert_eq!(found, MAX_ENTRIES);
        k.insert(0, names[0], to(0, 0));
        assert_eq!(k.get(0, names[0]), None, "no request is for 0 bytes");
    }
}
