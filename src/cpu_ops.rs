//! Reference implementations of the prover operations on host slices.
//!
//! These define what every [`Hal`](crate::Hal) backend must compute, bit for bit; the
//! differential tests compare each backend with them. They validate nothing beyond what the
//! slices' lengths require and **panic** on inconsistent lengths (see each `# Panics`); the
//! HAL methods check their arguments first and return errors instead.
//!
//! # Conventions
//!
//! - **Layout.** A batch of `cols` columns of `n = 2^log_n` elements is column-major: column
//!   `c` is `data[c·n .. (c+1)·n]`. A matrix hashed by rows ([`hash_rows`]) uses the same
//!   layout with `rows` elements per column.
//! - **NTT.** [`ntt`] forward maps the coefficients `a_0..a_{n-1}` of a column to the
//!   evaluations `A_i = Σ_j a_j·ω_n^(i·j)`, `ω_n = 31^((p-1)/n)` ([`Elem::root_of_unity`]),
//!   natural order in and out. The inverse maps evaluations back to coefficients and
//!   includes the `1/n` scaling, so `inverse(forward(a)) = a`.
//! - **Bit reversal.** [`bit_reverse`] swaps elements `i` and `rev_{log_n}(i)` of each column.
//! - **Coset LDE.** [`coset_lde`] takes coefficient columns of `n` elements and returns the
//!   evaluations on the coset `s·H_N`, `N = n·2^log_blowup`, `s = 31`
//!   ([`Elem::GENERATOR`]), natural order: `out[c·N + i] = Σ_j a_{c,j}·(s·ω_N^i)^j`. The
//!   shift keeps the LDE domain disjoint from the trace domain (the "zk shift").
//! - **Hashing.** [`hash_rows`] gives one [`Digest`] per row (row `r` is
//!   `matrix[c·rows + r]` for `c = 0..cols`, in column order) with
//!   [`poseidon2::hash_iter`]; [`merkle_layer`] compresses pairs of consecutive digests with
//!   [`poseidon2::compress`].

use crate::field::{Elem, FieldElement};
use crate::poseidon2::{self, Digest};

fn check_len(what: &str, expected: usize, actual: usize) {
    assert_eq!(
        expected, actual,
        "{what}: expected {expected} elements, got {actual}"
    );
}

/// `out[i] = a[i] + b[i]`.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// let (a, b) = ([Elem::new(3), Elem::new(4)], [Elem::new(10), Elem::new(20)]);
/// let mut out = [Elem::ZERO; 2];
/// cpu_ops::eltwise_add(&mut out, &a, &b);
/// assert_eq!(out, [Elem::new(13), Elem::new(24)]);
/// ```
///
/// # Panics
/// If the three lengths differ.
pub fn eltwise_add<F: FieldElement>(out: &mut [F], a: &[F], b: &[F]) {
    eltwise(out, a, b, |x, y| x + y);
}

/// `out[i] = a[i] - b[i]`.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// let (a, b) = ([Elem::new(3), Elem::new(4)], [Elem::new(1), Elem::new(5)]);
/// let mut out = [Elem::ZERO; 2];
/// cpu_ops::eltwise_sub(&mut out, &a, &b);
/// assert_eq!(out, [Elem::new(2), -Elem::new(1)]);
/// ```
///
/// # Panics
/// If the three lengths differ.
pub fn eltwise_sub<F: FieldElement>(out: &mut [F], a: &[F], b: &[F]) {
    eltwise(out, a, b, |x, y| x - y);
}

/// `out[i] = a[i] * b[i]`.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// let (a, b) = ([Elem::new(3), Elem::new(4)], [Elem::new(5), Elem::new(6)]);
/// let mut out = [Elem::ZERO; 2];
/// cpu_ops::eltwise_mul(&mut out, &a, &b);
/// assert_eq!(out, [Elem::new(15), Elem::new(24)]);
/// ```
///
/// # Panics
/// If the three lengths differ.
pub fn eltwise_mul<F: FieldElement>(out: &mut [F], a: &[F], b: &[F]) {
    eltwise(out, a, b, |x, y| x * y);
}

/// `out[i] = a[i] * scalar`.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// let a = [Elem::new(1), Elem::new(2)];
/// let mut out = [Elem::ZERO; 2];
/// cpu_ops::eltwise_mul_scalar(&mut out, &a, Elem::new(10));
/// assert_eq!(out, [Elem::new(10), Elem::new(20)]);
/// ```
///
/// # Panics
/// If `out` and `a` differ in length.
pub fn eltwise_mul_scalar<F: FieldElement>(out: &mut [F], a: &[F], scalar: F) {
    check_len("eltwise_mul_scalar input", out.len(), a.len());
    for (o, &x) in out.iter_mut().zip(a) {
        *o = x * scalar;
    }
}

fn eltwise<F: FieldElement>(out: &mut [F], a: &[F], b: &[F], op: impl Fn(F, F) -> F) {
    check_len("eltwise input a", out.len(), a.len());
    check_len("eltwise input b", out.len(), b.len());
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = op(x, y);
    }
}

fn columns(len: usize, log_n: u32) -> usize {
    assert!(
        log_n < usize::BITS && len % (1usize << log_n) == 0,
        "length {len} is not a whole number of columns of 2^{log_n}"
    );
    len >> log_n
}

/// Swaps elements `i` and `rev_{log_n}(i)` in every column of `2^log_n` elements.
///
/// ```
/// use cuda_hal::cpu_ops;
/// let mut v: Vec<u32> = (0..8).collect();
/// cpu_ops::bit_reverse(&mut v, 2); // two columns of 4
/// assert_eq!(v, [0, 2, 1, 3, 4, 6, 5, 7]);
/// ```
///
/// # Panics
/// If `data.len()` is not a multiple of `2^log_n`.
pub fn bit_reverse<T: Copy>(data: &mut [T], log_n: u32) {
    columns(data.len(), log_n);
    if log_n == 0 {
        return;
    }
    let n = 1usize << log_n;
    for col in data.chunks_exact_mut(n) {
        for i in 0..n {
            let j = i.reverse_bits() >> (usize::BITS - log_n);
            if i < j {
                col.swap(i, j);
            }
        }
    }
}

/// `w^k` for `k < n/2`, the twiddles of an `n = 2^log_n`-point transform with root `w`.
fn twiddles(log_n: u32, inverse: bool) -> Vec<Elem> {
    let w = Elem::root_of_unity(log_n).unwrap_or_else(|| {
        panic!(
            "an NTT of 2^{log_n} points needs log_n <= {}",
            Elem::TWO_ADICITY
        )
    });
    let w = if inverse { w.inv() } else { w };
    let half = (1usize << log_n) / 2;
    let mut t = Vec::with_capacity(half);
    let mut x = Elem::ONE;
    for _ in 0..half {
        t.push(x);
        x *= w;
    }
    t
}

/// Radix-2 decimation-in-time NTT of one column in place: bit reversal, then `log_n` stages
/// of butterflies with the precomputed twiddles.
fn ntt_column(col: &mut [Elem], log_n: u32, tw: &[Elem]) {
    bit_reverse(col, log_n);
    let n = col.len();
    let mut half = 1;
    while half < n {
        let stride = n / (2 * half);
        for block in col.chunks_exact_mut(2 * half) {
            let (lo, hi) = block.split_at_mut(half);
            for (j, (u, v)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                let t = *v * tw[j * stride];
                let x = *u;
                *u = x + t;
                *v = x - t;
            }
        }
        half *= 2;
    }
}

/// Forward (coefficients → evaluations at `ω_n^i`) or inverse (evaluations → coefficients,
/// scaled by `1/n`) NTT of every column of `2^log_n` elements, in place, natural order.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// // 1 + 2x at the 2nd roots of unity {1, -1}: [3, -1].
/// let mut v = [Elem::new(1), Elem::new(2)];
/// cpu_ops::ntt(&mut v, 1, false);
/// assert_eq!(v, [Elem::new(3), -Elem::ONE]);
/// cpu_ops::ntt(&mut v, 1, true);
/// assert_eq!(v, [Elem::new(1), Elem::new(2)]);
/// ```
///
/// # Panics
/// If `log_n > 27` or `data.len()` is not a multiple of `2^log_n`.
pub fn ntt(data: &mut [Elem], log_n: u32, inverse: bool) {
    columns(data.len(), log_n);
    let tw = twiddles(log_n, inverse);
    let n = 1usize << log_n;
    let scale = Elem::inv_pow2(log_n);
    for col in data.chunks_exact_mut(n) {
        ntt_column(col, log_n, &tw);
        if inverse {
            for x in col.iter_mut() {
                *x *= scale;
            }
        }
    }
}

/// Low-degree extension onto the coset `31·H_N`: each column of `2^log_n` coefficients in
/// `coeffs` becomes `N = 2^(log_n + log_blowup)` evaluations in `out`, natural order.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// // The constant polynomial 5 evaluates to 5 everywhere.
/// let coeffs = [Elem::new(5), Elem::ZERO];
/// let mut out = [Elem::ZERO; 8];
/// cpu_ops::coset_lde(&mut out, &coeffs, 1, 2);
/// assert!(out.iter().all(|&x| x == Elem::new(5)));
/// ```
///
/// # Panics
/// If `log_n + log_blowup > 27`, `coeffs.len()` is not a multiple of `2^log_n`, or
/// `out.len() != coeffs.len() << log_blowup`.
pub fn coset_lde(out: &mut [Elem], coeffs: &[Elem], log_n: u32, log_blowup: u32) {
    let cols = columns(coeffs.len(), log_n);
    let log_big = log_n
        .checked_add(log_blowup)
        .filter(|&l| l <= Elem::TWO_ADICITY)
        .unwrap_or_else(|| panic!("log_n + log_blowup = {log_n} + {log_blowup} > 27"));
    check_len("coset_lde output", cols << log_big, out.len());
    let tw = twiddles(log_big, false);
    let n = 1usize << log_n;
    let big = 1usize << log_big;
    for (dst, src) in out.chunks_exact_mut(big).zip(coeffs.chunks_exact(n)) {
        let mut shift_pow = Elem::ONE;
        for (d, &a) in dst.iter_mut().zip(src) {
            *d = a * shift_pow;
            shift_pow *= Elem::GENERATOR;
        }
        dst[n..].fill(Elem::ZERO);
        ntt_column(dst, log_big, &tw);
    }
}

/// One Poseidon2 digest per row of a column-major `rows × cols` matrix (see the module
/// conventions).
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::field::Elem;
/// use cuda_hal::poseidon2::{hash_row, Digest};
/// // Two rows, two columns: column 0 = [1, 2], column 1 = [3, 4].
/// let m = [1, 2, 3, 4].map(Elem::new);
/// let mut out = [Digest::default(); 2];
/// cpu_ops::hash_rows(&mut out, &m, 2, 2);
/// assert_eq!(out[1], hash_row(&[Elem::new(2), Elem::new(4)]));
/// ```
///
/// # Panics
/// If `out.len() != rows` or `matrix.len() != rows * cols`.
pub fn hash_rows(out: &mut [Digest], matrix: &[Elem], rows: usize, cols: usize) {
    check_len("hash_rows output", rows, out.len());
    check_len("hash_rows matrix", rows.saturating_mul(cols), matrix.len());
    for (r, d) in out.iter_mut().enumerate() {
        *d = poseidon2::hash_iter((0..cols).map(|c| matrix[c * rows + r]));
    }
}

/// One layer of a Merkle tree: `out[i] = compress(input[2i], input[2i+1])`.
///
/// ```
/// use cuda_hal::cpu_ops;
/// use cuda_hal::poseidon2::{compress, hash_row, Digest};
/// use cuda_hal::field::Elem;
/// let leaves: Vec<Digest> = (0..4).map(|i| hash_row(&[Elem::new(i)])).collect();
/// let mut layer = [Digest::default(); 2];
/// cpu_ops::merkle_layer(&mut layer, &leaves);
/// let mut root = [Digest::default()];
/// cpu_ops::merkle_layer(&mut root, &layer);
/// assert_eq!(root[0], compress(&compress(&leaves[0], &leaves[1]), &compress(&leaves[2], &leaves[3])));
/// ```
///
/// # Panics
/// If `input.len() != 2 * out.len()`.
pub fn merkle_layer(out: &mut [Digest], input: &[Digest]) {
    check_len(
        "merkle_layer input",
        out.len().saturating_mul(2),
        input.len(),
    );
    for (o, pair) in out.iter_mut().zip(input.chunks_exact(2)) {
        *o = poseidon2::compress(&pair[0], &pair[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::ExtElem;
    use proptest::prelude::*;

    fn naive_dft(a: &[Elem], w: Elem) -> Vec<Elem> {
        (0..a.len())
            .map(|i| {
                let wi = w.pow(i as u64);
                a.iter().rev().fold(Elem::ZERO, |acc, &c| acc * wi + c)
            })
            .collect()
    }

    fn elems(seed: u64, n: usize) -> Vec<Elem> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                Elem::from_u64(x)
            })
            .collect()
    }

    #[test]
    fn ntt_matches_the_naive_dft_and_inverts() {
        for log_n in 0..=7 {
            let n = 1 << log_n;
            let w = Elem::root_of_unity(log_n).unwrap();
            let a = elems(u64::from(log_n), 3 * n);
            let mut v = a.clone();
            ntt(&mut v, log_n, false);
            for c in 0..3 {
                assert_eq!(
                    v[c * n..(c + 1) * n],
                    naive_dft(&a[c * n..(c + 1) * n], w)[..]
                );
            }
            ntt(&mut v, log_n, true);
            assert_eq!(v, a, "log_n {log_n}");
        }
    }

    #[test]
    fn coset_lde_evaluates_on_the_shifted_coset() {
        let (log_n, log_blowup) = (3, 2);
        let n = 1 << log_n;
        let big = n << log_blowup;
        let a = elems(9, 2 * n);
        let mut out = vec![Elem::ZERO; 2 * big];
        coset_lde(&mut out, &a, log_n, log_blowup);
        let w = Elem::root_of_unity(log_n + log_blowup).unwrap();
        for c in 0..2 {
            for i in 0..big {
                let x = Elem::GENERATOR * w.pow(i as u64);
                let want = a[c * n..(c + 1) * n]
                    .iter()
                    .rev()
                    .fold(Elem::ZERO, |acc, &k| acc * x + k);
                assert_eq!(out[c * big + i], want, "column {c}, point {i}");
            }
        }
    }

    #[test]
    fn eltwise_ops() {
        let a = [ExtElem::new([1, 2, 3, 4].map(Elem::new)); 3];
        let b = [ExtElem::ONE; 3];
        let mut out = [ExtElem::ZERO; 3];
        eltwise_add(&mut out, &a, &b);
        assert_eq!(out[2], a[0] + ExtElem::ONE);
        eltwise_sub(&mut out, &a, &b);
        assert_eq!(out[1], a[0] - ExtElem::ONE);
        eltwise_mul(&mut out, &a, &a);
        assert_eq!(out[0], a[0] * a[0]);
    }

    #[test]
    #[should_panic(expected = "expected 2 elements, got 3")]
    fn length_mismatch_panics() {
        let mut out = [Elem::ZERO; 2];
        eltwise_add(&mut out, &[Elem::ZERO; 3], &[Elem::ZERO; 2]);
    }

    #[test]
    #[should_panic(expected = "log_n + log_blowup = 5 + 4294967293 > 27")]
    fn a_blowup_past_the_field_panics_saying_so() {
        // (The sum overflowed before: a debug build's overflow panic, a release build's
        // slice index.)
        coset_lde(&mut [Elem::ZERO; 4], &[Elem::ONE; 32], 5, u32::MAX - 2);
    }

    proptest! {
        #[test]
        fn bit_reverse_is_an_involution(log_n in 0u32..10, cols in 1usize..4) {
            let v: Vec<u32> = (0..(cols << log_n) as u32).collect();
            let mut w = v.clone();
            bit_reverse(&mut w, log_n);
            if log_n > 1 {
                prop_assert_ne!(&w, &v);
            }
            bit_reverse(&mut w, log_n);
            prop_assert_eq!(w, v);
        }
    }
}
