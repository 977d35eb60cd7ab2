//! New host memory that faults in fast: results in new `Vec`s, anonymous mappings (host
//! copies, pinned memory), 2 MiB page advice, and first writes spread over the rayon pool.
//!
//! A new allocation's pages are faulted in on first write, a 4 KiB page at a time. On the
//! H200 host (2026-11-26) a new 64 MiB `Vec` written by one thread took 37.6 ms, by the
//! rayon pool (16 threads) 4.0 ms, and by the pool in 2 MiB pages 2.0 ms, against 1.2 ms
//! for the copy from the device. So large new memory asks for 2 MiB pages
//! (`MADV_HUGEPAGE`: transparent huge pages are often enabled only where asked for) and is
//! first written by the pool.

use bytemuck::Pod;
use rayon::prelude::*;

/// Below this many bytes new memory is written by the calling thread.
const PARALLEL_MIN: usize = 1 << 20;
/// From this many bytes new memory asks for 2 MiB pages.
pub(crate) const HUGE_PAGES_MIN: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// Copies with the rayon pool in 1 MiB pieces (page faults of a new destination included),
/// with streaming stores where `streaming` is set (see `crate::fastcopy`).
pub(crate) fn par_copy(dst: &mut [u8], src: &[u8], streaming: bool) {
    dst.par_chunks_mut(PARALLEL_MIN)
        .zip(src.par_chunks(PARALLEL_MIN))
        .for_each(|(d, s)| crate::fastcopy::copy(d, s, streaming));
}

/// Copies each `(dst, src)` pair (of equal lengths), for the batches' copies into and out
/// of their pinned block. `bytes`, what the pairs hold in all (a block's data span, its
/// alignment padding included, will do), picks the route: from 1 MiB the pairs are spread
/// over the rayon pool, a large pair in 1 MiB pieces; below it they are copied on the
/// calling thread as they come, with no list of them built. (The callers know `bytes`
/// from their block's layout; summing it here would take a list or a second pass, which a
/// small batch pays for per buffer.) With `streaming`, streaming stores, fenced before this
/// returns.
#[inline]
pub(crate) fn copy_pairs<'a>(
    pairs: impl Iterator<Item = (&'a mut [u8], &'a [u8])>,
    bytes: usize,
    streaming: bool,
) {
    if bytes < PARALLEL_MIN {
        for (dst, src) in pairs {
            crate::fastcopy::copy_unfenced(dst, src, streaming);
        }
        if streaming {
            crate::fastcopy::fence();
        }
        return;
    }
    let mut pairs: Vec<_> = pairs.collect();
    // (Each copy fences its own streaming stores, on the thread that made them.)
    pairs.par_iter_mut().for_each(|(dst, src)| {
        if dst.len() >= PARALLEL_MIN {
            par_copy(dst, src, streaming);
        } else {
            crate::fastcopy::copy(dst, src, streaming);
        }
    });
}

/// `buf`'s pieces at the sorted, disjoint `ranges` (each within `buf`), as mutable slices.
pub(crate) fn pieces_mut(
    buf: &mut [u8],
    ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
) -> impl Iterator<Item = &mut [u8]> {
    let (mut rest, mut at) = (buf, 0);
    ranges.into_iter().map(move |r| {
        debug_assert!(at <= r.start && r.start <= r.end);
        let (piece, tail) = std::mem::take(&mut rest)[r.start - at..].split_at_mut(r.len());
        (rest, at) = (tail, r.end);
        piece
    })
}

/// Faults in every page of `bytes` (one store of zero a page: new memory reads zero
/// anyway), on the rayon pool when large.
pub(crate) fn prefault(bytes: &mut [u8]) {
    if bytes.len() >= PARALLEL_MIN {
        bytes.par_chunks_mut(PARALLEL_MIN).for_each(touch);
    } else {
        touch(bytes);
    }
}

/// [`prefault`] on the copy threads, never the rayon pool: for new pinned memory, which a
/// transfer may make while its caller holds a buffer's lock (the staging pool grows as a
/// download into a host copy needs more slots), where the rayon pool's threads may all be
/// waiting for that lock. Found on the GPU (2026-11-28 20:14, 2x H200): the first view of
/// a new buffer beside rayon readers of it hung in the all build.
pub(crate) fn prefault_off_pool(bytes: &mut [u8]) {
    crate::copy_threads::split_over(bytes, PARALLEL_MIN, &touch);
}

/// One store of zero a page of `piece`.
fn touch(piece: &mut [u8]) {
    piece.iter_mut().step_by(PAGE).for_each(|b| *b = 0);
}

/// `len` zeroed elements in new memory whose pages are not written yet (where the
/// allocator maps a large request afresh), asking for 2 MiB pages when large.
pub(crate) fn zeroed<T: Pod>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = bytemuck::zeroed_vec(len);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    if bytes.len() >= HUGE_PAGES_MIN {
        advise_huge_pages(bytes);
    }
    v
}

/// [`zeroed`], with every page faulted in by the rayon pool: for a result that the
/// driver, or one thread, then writes.
pub(crate) fn prefaulted<T: Pod>(len: usize) -> Vec<T> {
    let mut v = zeroed::<T>(len);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    if bytes.len() >= PARALLEL_MIN {
        prefault(bytes);
    }
    v
}

/// A new `Vec` of `len` elements, whose pages the rayon pool faults in while the calling
/// thread does `work` (a download), and `work`'s answer. `work` gets the result's bytes
/// from [`Faulting::wait`] to copy into them, so that the faults overlap the download. On
/// the H200 host (three runs each, taking turns) a 64 MiB `to_vec` took 4.91 / 5.31 / 4.55
/// ms with its result faulted in by the copy after the download, and 4.31 / 4.04 / 3.76 ms
/// with it faulted in beside it: the faults and the copy share the host's memory
/// bandwidth, which bounds the rest.
///
/// On a thread of the rayon pool (which `work` must not hold waiting for the pool), or below
/// [`HUGE_PAGES_MIN`], the bytes are handed over at once, and the copy faults them in.
pub(crate) fn faulted_while<T: Pod, R>(
    len: usize,
    work: impl FnOnce(Faulting<'_>) -> R,
) -> (Vec<T>, R) {
    let mut v = zeroed::<T>(len);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    if rayon::current_thread_index().is_some() || bytes.len() < HUGE_PAGES_MIN {
        let r = work(Faulting::Ready(bytes));
        return (v, r);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    // `work` runs on this thread; the faults are the pool's, whose end the scope awaits.
    let r = rayon::in_place_scope(|s| {
        s.spawn(move |_| {
            prefault(bytes);
            let _ = tx.send(bytes);
        });
        work(Faulting::Pending(rx))
    });
    (v, r)
}

/// The bytes of a result that [`faulted_while`] is faulting in.
pub(crate) enum Faulting<'a> {
    Ready(&'a mut [u8]),
    Pending(std::sync::mpsc::Receiver<&'a mut [u8]>),
}

impl<'a> Faulting<'a> {
    /// The bytes, every page faulted in (or, handed over at once, to be faulted in by the
    /// caller's writes).
    pub(crate) fn wait(self) -> &'a mut [u8] {
        match self {
            Faulting::Ready(bytes) => bytes,
            // The task sends them back as it ends; it cannot fail before (it only writes
            // bytes it owns), and if it panicked the scope would raise that panic here.
            Faulting::Pending(rx) => rx.recv().expect("the fault-in task sends the bytes back"),
        }
    }
}

/// A new `Vec` of the elements whose bytes are `src` (a whole number of elements),
/// written by the rayon pool when large.
pub(crate) fn copied<T: Pod>(src: &[u8]) -> Vec<T> {
    let mut v = zeroed::<T>(src.len() / std::mem::size_of::<T>().max(1));
    copy(bytemuck::cast_slice_mut(&mut v), src);
    v
}

/// Copies `src` into `dst` (of the same length), with the rayon pool when large.
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    if dst.len() >= PARALLEL_MIN {
        par_copy(dst, src, false);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Asks the kernel for 2 MiB pages under the whole 2 MiB pages of `bytes`. Advice only:
/// where it is refused (no transparent huge pages), 4 KiB pages serve as before.
pub(crate) fn advise_huge_pages(bytes: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        let start = (bytes.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        let end = (bytes.as_ptr() as usize + bytes.len()) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: the range lies within `bytes`, memory this process owns and maps
            // read-write; MADV_HUGEPAGE changes how its pages are backed, never their
            // contents.
            let r = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE)
            };
            if r != 0 {
                log::trace!("MADV_HUGEPAGE refused: {}", std::io::Error::last_os_error());
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (bytes, HUGE_PAGE);
}

/// A new private anonymous mapping of at least one byte: zeroed pages, committed as they
/// are first touched, unmapped on drop.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Mapping owns its pages; who may touch them is its owner's business.
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; `&Mapping` hands out only the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes (at least 1), or `None` where the OS refuses them.
    pub(crate) fn new(len: usize) -> Option<Self> {
        let len = len.max(1);
        // SAFETY: a new private anonymous mapping: no file, no address asked for; the
        // kernel gives page-aligned zero pages, or MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED && !p.is_null()).then_some(Mapping { ptr: p.cast(), len })
    }

    /// The first byte's address (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped, as asked for (the kernel maps whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, for writing.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping holds `len` bytes, and `&mut self` is the only way to them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr is the start of a mapping of `len` bytes (the kernel unmaps the
        // whole pages), unmapped once; nothing borrowed from it outlives the Mapping.
        if unsafe { libc::munmap(self.ptr.cast(), self.len) } != 0 {
            log::warn!("unmapping host memory: {}", std::io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_the_ranges_of_the_buffer() {
        let mut buf: Vec<u8> = (0..100).collect();
        let pieces: Vec<_> = pieces_mut(&mut buf, [3..7, 7..7, 10..20, 90..100]).collect();
        let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [4, 0, 10, 10]);
        assert_eq!((pieces[0][0], pieces[2][0], pieces[3][9]), (3, 10, 99));
        for p in pieces {
            p.fill(0xff);
        }
        let touched: Vec<usize> = (0..100).filter(|&i| buf[i] == 0xff).collect();
        let expected: Vec<usize> = (3..7).chain(10..20).chain(90..100).collect();
        assert_eq!(touched, expected);
    }

    #[test]
    fn pairs_are_copied_whole_on_one_thread_or_many() {
        // Below 1 MiB in all (one thread), and past it with small and large pairs (the
        // pool, a large pair in pieces), plain and streaming, at odd lengths and offsets.
        let cases: [&[usize]; 3] = [
            &[1, 255, 256, 1000, 4097],
            &[3; 600],
            &[
                PARALLEL_MIN + 77,
                1,
                64 << 10,
                PARALLEL_MIN / 2 + 3,
                0,
                5000,
            ],
        ];
        for lens in cases {
            for streaming in [false, true] {
                let total: usize = lens.iter().sum();
                let src: Vec<u8> = (0..total + 1).map(|i| (i * 7 + 1) as u8).collect();
                let mut dst = vec![0u8; total + lens.len()];
                let (mut at_src, mut at_dst, mut ranges) = (1, 0, Vec::new());
                let mut srcs = Vec::new();
                for &len in lens {
                    ranges.push(at_dst..at_dst + len);
                    srcs.push(&src[at_src..at_src + len]);
                    (at_src, at_dst) = (at_src + len, at_dst + len + 1);
                }
                let pairs = pieces_mut(&mut dst, ranges.clone()).zip(srcs);
                copy_pairs(pairs, total, streaming);
                for (r, k) in ranges.iter().zip(0..) {
                    let start = 1 + r.start - k;
                    assert!(dst[r.clone()] == src[start..start + r.len()], "pair {k}");
                    if r.end < dst.len() {
                        assert_eq!(dst[r.end], 0, "the byte after pair {k} untouched");
                    }
                }
            }
        }
    }

    #[test]
    fn copies_hold_their_source_at_every_size() {
        for len in [
            0,
            1,
            3,
            1000,
            PARALLEL_MIN / 4 - 1,
            PARALLEL_MIN / 4 + 5,
            (HUGE_PAGES_MIN + HUGE_PAGE + 12) / 4,
        ] {
            let src: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(2654435761))
                .collect();
            let v: Vec<u32> = copied(bytemuck::cast_slice(&src));
            assert_eq!(v, src, "{len} elements");
        }
    }

    /// `work` runs on the calling thread (it makes driver calls, in the context bound
    /// there), gets zeroed bytes to write, and the result holds what it wrote: from a thread
    /// outside the pool (the pages faulted in by the pool meanwhile), from one of its
    /// threads, and below the size worth it.
    #[test]
    fn a_result_faulted_in_beside_the_work_holds_what_the_work_wrote() {
        let check = |len: usize| {
            let caller = std::thread::current().id();
            let (v, ran_on) = faulted_while::<u32, _>(len, |pages| {
                let ran_on = std::thread::current().id();
                let bytes = pages.wait();
                assert!(bytes.iter().all(|&b| b == 0), "{len}: zeroed");
                let words: &mut [u32] = bytemuck::cast_slice_mut(bytes);
                words
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, w)| *w = i as u32 * 3);
                ran_on
            });
            assert_eq!(ran_on, caller, "{len}: the work ran on the calling thread");
            assert_eq!(v.len(), len);
            assert!(
                v.iter().enumerate().all(|(i, &w)| w == i as u32 * 3),
                "{len}"
            );
        };
        for len in [
            0,
            1,
            1000,
            HUGE_PAGES_MIN / 4 - 1,
            HUGE_PAGES_MIN / 4,
            3 << 20,
        ] {
            check(len);
        }
        // On a thread of the pool: the bytes come at once (nothing waits for the pool).
        rayon::scope(|_| check(3 << 20));
    }

    #[test]
    fn a_new_mapping_is_zeroed_writable_and_page_aligned() {
        for len in [0, 1, 4097, HUGE_PAGES_MIN + 3] {
            let mut m = Mapping::new(len).unwrap();
            assert_eq!(m.as_ptr() as usize % PAGE, 0);
            assert_eq!(m.len(), len.max(1));
            prefault(m.as_mut_slice());
            assert!(m.as_mut_slice().iter().all(|&b| b == 0));
            m.as_mut_slice().fill(7);
            assert_eq!(m.as_mut_slice()[len.max(1) - 1], 7);
        }
    }

    #[test]
    fn new_results_are_zeroed() {
        for len in [0, 7, PARALLEL_MIN + 3, HUGE_PAGES_MIN + 5] {
            assert!(zeroed::<u8>(len).iter().all(|&b| b == 0));
            let v = prefaulted::<u16>(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 0));
        }
    }

    /// The transparent huge pages mode (`always`, `madvise` or `never`), if the kernel
    /// has them.
    fn thp_mode() -> Option<String> {
        let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
        let start = s.find('[')? + 1;
        Some(s[start..start + s[start..].find(']')?].to_string())
    }

    /// Kilobytes of 2 MiB pages backing the mapping that holds `addr`.
    fn huge_kib_at(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if let (true, Some(kib)) = (inside, line.strip_prefix("AnonHugePages:")) {
                return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_large_result_is_backed_by_huge_pages_where_the_kernel_has_them() {
        match thp_mode().as_deref() {
            Some("madvise") | Some("always") => {}
            mode => {
                println!("skipped: transparent huge pages are {mode:?} here");
                return;
            }
        }
        let v = prefaulted::<u8>(16 << 20);
        let kib = huge_kib_at(v.as_ptr() as usize + (8 << 20));
        // 2 MiB pages are given where free ones (or compaction) allow: at least one of
        // the seven whole ones inside.
        assert!(
            kib >= 2048,
            "{kib} KiB in huge pages ({:?} mode)",
            thp_mode()
        );
    }
}
