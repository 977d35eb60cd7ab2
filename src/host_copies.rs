//! The phase-2 host copies' memory: page-aligned host bytes the size of an allocation, and
//! a HAL's cache of those its freed buffers left, so that a new buffer's host copy reuses
//! pages already faulted in. (New host memory costs a page fault per 4 KiB page when first
//! touched: filling a new 64 MiB copy took 36 ms on the H100 host, a reused one 5 ms.)
//!
//! A host copy mirrors its whole allocation, while a view may cover a few bytes of it (a
//! small slice of a large buffer, a view of a batch arena): large copies are mapped with
//! `mmap`, so that only the pages a view touches are ever committed.

use std::alloc::Layout;
use std::ops::Range;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::host_pages::Mapping;
use crate::{Error, Result};

/// Alignment of a host copy: a page, so that views of any `Pod` type up to that alignment
/// are aligned (a `#[repr(align(128))]` type is `Pod` too).
pub(crate) const HOST_ALIGN: usize = 4096;

/// [`HostBytes::zero`]'s pieces are whole multiples of this, and from two of them on it
/// runs on several threads.
const ZERO_PIECE: usize = 2 << 20;

/// From this many bytes on, a host copy is an anonymous mapping: zero pages committed when
/// first touched. (The allocator's zeroed memory at a page's alignment is written through
/// on one thread: 8 GiB of host memory, and seconds, for a 4 KiB view of an 8 GiB arena.)
/// Smaller ones come from the allocator: a mapping costs a system call each way.
const MAPPED_BYTES: usize = 256 << 10;

/// Page-aligned host memory the size of an allocation: its phase-2 host copy.
pub(crate) struct HostBytes {
    pub(crate) ptr: *mut u8,
    layout: Layout,
    /// The mapping `ptr` points into, else `ptr` is from the allocator with `layout`.
    mapping: Option<Mapping>,
    /// Never written since it was allocated zeroed (a reused copy holds an earlier
    /// buffer's bytes).
    zeroed: bool,
}

// SAFETY: HostBytes owns its allocation; access is coordinated by `CacheState` borrows.
unsafe impl Send for HostBytes {}
// SAFETY: see `Send`.
unsafe impl Sync for HostBytes {}

impl HostBytes {
    /// `len` zeroed bytes; from [`MAPPED_BYTES`] on, committed by the OS only as they are
    /// first touched.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), HOST_ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("host copy of {len} bytes: {e}")))?;
        let refused = || Error::InvalidArgument(format!("host memory for a {len}-byte cache"));
        let mapping = match layout.size() >= MAPPED_BYTES {
            true => Some(Mapping::new(layout.size()).ok_or_else(refused)?),
            false => None,
        };
        let ptr = match &mapping {
            Some(m) => m.as_ptr(),
            // SAFETY: layout has non-zero size.
            None => unsafe { std::alloc::alloc_zeroed(layout) },
        };
        if ptr.is_null() {
            return Err(refused());
        }
        Ok(HostBytes {
            ptr,
            layout,
            mapping,
            zeroed: true,
        })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Zeroes `r` unless the bytes were never written, for a view that stands for device
    /// bytes nothing wrote (see [`crate::host_cache::CacheState::adopt_fresh`]).
    ///
    /// # Safety
    /// No reference to bytes of `r` may exist.
    pub(crate) unsafe fn zero(&self, r: Range<usize>) {
        if self.zeroed {
            return;
        }
        // Over several threads, as the download this replaces spreads its host copies: the
        // copy threads, never the rayon pool, since the caller holds its buffer's lock.
        crate::copy_threads::split_over(self.range_mut(r), ZERO_PIECE, &|p| p.fill(0));
    }

    /// Records that the bytes may be written from now on (a download into them is about
    /// to begin, and may fail part way): [`HostBytes::zero`] no longer skips them.
    pub(crate) fn mark_written(&mut self) {
        self.zeroed = false;
    }

    /// Bytes of `r`.
    ///
    /// # Safety
    /// No mutable reference to bytes of `r` may exist while the result lives.
    pub(crate) unsafe fn range(&self, r: Range<usize>) -> &[u8] {
        std::slice::from_raw_parts(self.ptr.add(r.start), r.len())
    }

    /// Mutable bytes of `r`.
    ///
    /// # Safety
    /// No other reference to bytes of `r` may exist while the result lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range_mut(&self, r: Range<usize>) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len())
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        // (A mapping unmaps itself.)
        if self.mapping.is_none() {
            // SAFETY: ptr was allocated with exactly this layout and is freed once.
            unsafe { std::alloc::dealloc(self.ptr, self.layout) };
        }
    }
}

/// What a HAL's cache of host copies holds and has done: see
/// [`HalConfig::host_copy_cache_bytes`](crate::HalConfig::host_copy_cache_bytes).
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// for _ in 0..3 {
///     let b = hal.copy_from("column", &vec![1u32; 1 << 20]).unwrap();
///     assert_eq!(b.to_vec().unwrap()[5], 1); // a host read: the buffer gets a host copy
/// }
/// let s = hal.stats().unwrap().host_copies;
/// if cuda_hal::PHASES.host_cache {
///     assert_eq!((s.made, s.reused), (1, 2), "the first buffer's copy served the others");
///     assert_eq!(s.kept_bytes, 4 << 20);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCopyStats {
    /// Bytes of host copies kept for reuse now.
    pub kept_bytes: u64,
    /// Host copies allocated.
    pub made: u64,
    /// Host copies taken from the cache instead.
    pub reused: u64,
}

/// Host copies of freed buffers, by exact size, up to a byte limit: the next buffer of the
/// same size that needs a host copy takes one.
pub(crate) struct HostCopies {
    limit: usize,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_len: FxHashMap<usize, Vec<HostBytes>>,
    bytes: usize,
    made: u64,
    reused: u64,
}

impl HostCopies {
    /// A cache that keeps up to `limit` bytes (0: none).
    pub(crate) fn new(limit: usize) -> Self {
        HostCopies {
            limit,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// A host copy of `len` bytes: a kept one (holding an earlier buffer's bytes) or a new
    /// zeroed one.
    pub(crate) fn take(&self, len: usize) -> Result<HostBytes> {
        let reused = {
            let mut k = self.kept.lock();
            let found = k.by_len.get_mut(&len.max(1)).and_then(|v| v.pop());
            if let Some(b) = &found {
                k.bytes -= b.len();
                k.reused += 1;
                if k.by_len.get(&len.max(1)).is_some_and(|v| v.is_empty()) {
                    k.by_len.remove(&len.max(1));
                }
            } else {
                k.made += 1;
            }
            found
        };
        match reused {
            Some(b) => Ok(b),
            None => HostBytes::new(len).inspect_err(|_| self.kept.lock().made -= 1),
        }
    }

    /// Keeps `b` for reuse if the cache stays within its limit, making room by freeing
    /// kept copies of other sizes (the largest first) if need be; frees `b` otherwise. A
    /// prover whose buffer sizes change keeps copies of the sizes it uses now.
    pub(crate) fn give(&self, mut b: HostBytes) {
        b.mark_written();
        let len = b.len();
        let mut evicted = Vec::new();
        let mut k = self.kept.lock();
        if len <= self.limit && k.bytes + len > self.limit {
            let mut others: Vec<usize> = k.by_len.keys().copied().filter(|&l| l != len).collect();
            others.sort_unstable_by(|a, b| b.cmp(a));
            for other in others {
                while k.bytes + len > self.limit {
                    let Some(c) = k.by_len.get_mut(&other).and_then(|v| v.pop()) else {
                        break;
                    };
                    k.bytes -= c.len();
                    evicted.push(c);
                }
                if k.by_len.get(&other).is_some_and(|v| v.is_empty()) {
                    k.by_len.remove(&other);
                }
                if k.bytes + len <= self.limit {
                    break;
                }
            }
        }
        if k.bytes + len <= self.limit {
            k.bytes += len;
            k.by_len.entry(len).or_default().push(b);
            drop(k);
        } else {
            drop(k);
            drop(b);
        }
        drop(evicted); // (freed outside the lock)
    }

    /// Frees every host copy kept.
    pub(crate) fn clear(&self) {
        let freed = {
            let mut k = self.kept.lock();
            k.bytes = 0;
            std::mem::take(&mut k.by_len)
        };
        drop(freed);
    }

    pub(crate) fn stats(&self) -> HostCopyStats {
        let k = self.kept.lock();
        HostCopyStats {
            kept_bytes: k.bytes as u64,
            made: k.made,
            reused: k.reused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_copies_are_reused_by_size_within_the_limit_and_zeroed_for_new_buffers() {
        let cache = HostCopies::new(3 * 4096);
        let a = cache.take(4096).unwrap();
        assert!(a.zeroed);
        // SAFETY: no other reference to `a`'s bytes exists.
        unsafe { a.range_mut(0..4096).fill(7) };
        let a_ptr = a.ptr;
        cache.give(a);
        assert_eq!(cache.stats().kept_bytes, 4096);
        assert!(
            cache.take(8192).is_ok_and(|b| b.zeroed),
            "another size: new"
        );
        let again = cache.take(4096).unwrap();
        assert_eq!((again.ptr, again.zeroed), (a_ptr, false), "the same pages");
        // SAFETY: as above.
        unsafe {
            assert_eq!(again.range(0..4), &[7; 4], "an earlier buffer's bytes");
            again.zero(0..2);
            assert_eq!(again.range(0..4), &[0, 0, 7, 7]);
        }
        // Past the limit: copies of other sizes make room, the largest first; a copy
        // larger than the limit is freed, not kept.
        cache.give(again);
        cache.give(HostBytes::new(8192).unwrap());
        assert_eq!(cache.stats().kept_bytes, 3 * 4096);
        cache.give(HostBytes::new(4096).unwrap());
        let s = cache.stats();
        assert_eq!(
            s.kept_bytes,
            2 * 4096,
            "the 8 KiB one made room for the 4 KiB one"
        );
        assert_eq!((s.made, s.reused), (2, 1));
        assert!(
            cache.take(8192).is_ok_and(|b| b.zeroed),
            "the 8 KiB one is gone"
        );
        let (x, y) = (cache.take(4096).unwrap(), cache.take(4096).unwrap());
        assert!(!x.zeroed && !y.zeroed, "both 4 KiB ones were kept");
        cache.give(x);
        cache.give(y);
        cache.give(HostBytes::new(4 * 4096).unwrap());
        assert_eq!(
            cache.stats().kept_bytes,
            2 * 4096,
            "larger than the limit: freed"
        );
        cache.clear();
        assert_eq!(cache.stats().kept_bytes, 0);
        let none = HostCopies::new(0);
        none.give(HostBytes::new(1).unwrap());
        assert_eq!(none.stats().kept_bytes, 0, "a limit of 0 keeps nothing");
    }

    #[test]
    fn a_reused_copy_is_zeroed_on_several_threads_past_4_mib() {
        let cache = HostCopies::new(usize::MAX);
        let len = 9 << 20;
        let b = cache.take(len).unwrap();
        // SAFETY: no other reference to `b`'s bytes exists.
        unsafe { b.range_mut(0..len).fill(0xAB) };
        cache.give(b);
        let b = cache.take(len).unwrap();
        // SAFETY: as above.
        unsafe {
            b.zero(1..len - 1);
            let all = b.range(0..len);
            assert_eq!((all[0], all[len - 1]), (0xAB, 0xAB), "only the range");
            assert!(all[1..len - 1].iter().all(|x| *x == 0));
        }
    }

    /// Resident bytes of this process (Linux).
    #[cfg(target_os = "linux")]
    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        // SAFETY: sysconf has no preconditions.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
    }

    /// A host copy mirrors its whole allocation while a view may touch a page of it: before,
    /// a new copy was zeroed through on one thread (512 MiB committed here, and about 0.3 s).
    #[test]
    #[cfg(target_os = "linux")]
    fn a_large_new_copy_commits_only_the_pages_touched() {
        let len = 512 << 20;
        let before = resident_bytes();
        let b = HostBytes::new(len).unwrap();
        assert_eq!(b.ptr as usize % HOST_ALIGN, 0, "page-aligned");
        // SAFETY: no other reference to `b`'s bytes exists.
        unsafe {
            b.range_mut(len / 2..len / 2 + 4096).fill(1);
            assert!(b.range(0..4096).iter().all(|x| *x == 0), "zero");
            assert_eq!(b.range(len / 2..len / 2 + 1), &[1]);
        }
        let grown = resident_bytes().saturating_sub(before);
        assert!(
            grown < 64 << 20,
            "{grown} bytes committed for two touched pages"
        );
        drop(b);
        let small = HostBytes::new(MAPPED_BYTES - 1).unwrap();
        assert!(small.mapping.is_none() && small.ptr as usize % HOST_ALIGN == 0);
    }

    #[test]
    fn a_new_copy_is_zeroed_and_zero_leaves_it_alone() {
        let b = HostBytes::new(100).unwrap();
        // SAFETY: no other reference to `b`'s bytes exists.
        unsafe {
            b.zero(0..100);
            assert!(b.range(0..100).iter().all(|x| *x == 0));
        }
    }
}
