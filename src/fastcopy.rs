//! Host memcpy for staging. Large copies into or out of pinned staging use streaming
//! (non-temporal) stores on x86_64: they skip the read-for-ownership of the destination
//! and leave the caches alone, which matters when the copy runs at memory bandwidth.

/// Copies `src` into `dst` (same length), with streaming stores when `streaming` is set
/// and the target supports them.
pub(crate) fn copy(dst: &mut [u8], src: &[u8], streaming: bool) {
    if copy_unfenced(dst, src, streaming) {
        fence();
    }
}

/// [`copy`] without the fence that orders its streaming stores before later stores: for
/// many small copies into one buffer, followed by one [`fence`] before the buffer is handed
/// to the copy engine. Whether it used streaming stores. (Inline, with the streaming loop
/// out of line: a small plain copy costs its memcpy and a test.)
#[inline]
pub(crate) fn copy_unfenced(dst: &mut [u8], src: &[u8], streaming: bool) -> bool {
    debug_assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if streaming && dst.len() >= STREAM_MIN {
        stream_copy(dst, src);
        return true;
    }
    let _ = streaming;
    dst.copy_from_slice(src);
    false
}

/// Copies shorter than this use plain stores: the aligned head and tail they would copy
/// plainly anyway are most of them.
#[cfg(target_arch = "x86_64")]
const STREAM_MIN: usize = 256;

/// Orders the streaming stores made so far before every later store (the DMA enqueue).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86_64 baseline; a fence has no other effect.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn stream_copy(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let n = dst.len().min(src.len());
    let head = dst.as_ptr().align_offset(16).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let body_end = head + (n - head) / 64 * 64;
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    let mut i = head;
    while i < body_end {
        // SAFETY: i + 64 <= n for both slices; loads are unaligned, stores go to
        // 16-byte aligned addresses (dst + head is aligned and i - head is a multiple of 64).
        // SSE2 is part of the x86_64 baseline.
        unsafe {
            let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
            _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
        }
        i += 64;
    }
    dst[body_end..n].copy_from_slice(&src[body_end..n]);
}

#[cfg(test)]
mod tests {
    use super::copy;

    #[test]
    fn copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in [0usize, 1, 7, 15, 16, 33] {
            for len in [
                0usize, 1, 63, 255, 256, 300, 1024, 4096, 4097, 10_001, 19_000,
            ] {
                let mut dst = vec![0xEEu8; 20_100];
                copy(&mut dst[offset..offset + len], &src[..len], true);
                assert_eq!(
                    &dst[offset..offset + len],
                    &src[..len],
                    "offset {offset} len {len}"
                );
                assert!(dst[..offset].iter().all(|b| *b == 0xEE));
                assert!(dst[offset + len..].iter().all(|b| *b == 0xEE));
            }
        }
    }
}
