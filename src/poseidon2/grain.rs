//! Reproducible generation of the Poseidon2 BabyBear parameters.
//!
//! This follows the parameter script of the Poseidon2 authors,
//! `poseidon2_rust_params.sage` in <https://github.com/HorizenLabs/poseidon2> (commit
//! `bb476b9`), which produced the published tables in
//! `plain_implementations/src/poseidon2/poseidon2_instance_babybear.rs`:
//!
//! 1. An 80-bit Grain LFSR (feedback taps 62, 51, 38, 23, 13, 0) is seeded with the bits of
//!    `FIELD = 1` (2 bits), `SBOX = 0` (4 bits), the field size `n = 31` (12 bits), the width
//!    `t` (12 bits), `R_F` (10 bits), `R_P` (10 bits) and thirty 1s, most significant bit
//!    first, and clocked 160 times. Output bits are then taken in pairs: when the first bit
//!    of a pair is 1 the second is output, otherwise the pair is discarded.
//! 2. Round constants: `R_F·t + R_P` values of `n` bits each (most significant bit first),
//!    each redrawn while `>= p`. The first `R_F/2·t` are the initial external rounds, the
//!    next `R_P` the partial rounds (one per round, added to state element 0), the rest the
//!    final external rounds.
//! 3. The internal matrix is `1 + diag(d_0 - 1, …, d_{t-1} - 1)` (all ones off the
//!    diagonal, `d_i` on it). Candidates for `d` are drawn as `t` further `n`-bit values
//!    (reduced mod `p`, no rejection) until one satisfies the script's condition: for
//!    `k = 1..=2t`, the minimal polynomial of `M^k` has degree `t` and is irreducible, that
//!    is the characteristic polynomial of `M^k` is irreducible. For width 16 the 19th
//!    candidate is the first to pass, for width 24 the 5th; the tests check that the result
//!    equals the published tables.

use super::Poseidon2;
use crate::field::{Elem, P};

/// The 80-bit Grain LFSR of the Poseidon parameter scripts.
struct Grain {
    /// Bit `i` is `s[i]` of the script's `bit_sequence`.
    state: u128,
}

impl Grain {
    fn new(width: usize, rounds_f: usize, rounds_p: usize) -> Grain {
        let fields: [(u64, u32); 6] = [
            (1, 2),   // FIELD = 1: a prime field
            (0, 4),   // SBOX = 0: x^alpha
            (31, 12), // field size in bits
            (width as u64, 12),
            (rounds_f as u64, 10),
            (rounds_p as u64, 10),
        ];
        let mut state = 0u128;
        let mut i = 0;
        for (value, bits) in fields {
            for b in (0..bits).rev() {
                state |= u128::from((value >> b) & 1) << i;
                i += 1;
            }
        }
        for _ in 0..30 {
            state |= 1 << i;
            i += 1;
        }
        debug_assert_eq!(i, 80);
        let mut g = Grain { state };
        for _ in 0..160 {
            g.clock();
        }
        g
    }

    fn clock(&mut self) -> u128 {
        let s = self.state;
        let bit = ((s >> 62) ^ (s >> 51) ^ (s >> 38) ^ (s >> 23) ^ (s >> 13) ^ s) & 1;
        self.state = (s >> 1) | (bit << 79);
        bit
    }

    fn next_bit(&mut self) -> u32 {
        loop {
            let keep = self.clock();
            let bit = self.clock();
            if keep == 1 {
                return bit as u32;
            }
        }
    }

    /// `n` output bits, most significant first.
    fn bits(&mut self, n: u32) -> u32 {
        (0..n).fold(0, |acc, _| (acc << 1) | self.next_bit())
    }

    /// A field element by rejection sampling (round constants).
    fn field_element(&mut self) -> Elem {
        loop {
            let x = self.bits(31);
            if x < P {
                return Elem::new(x);
            }
        }
    }
}

/// Generates the Poseidon2 parameters for width `W` (a multiple of 4) as described in the
/// module documentation.
pub(super) fn generate<const W: usize>(rounds_f: usize, rounds_p: usize) -> Poseidon2<W> {
    let mut g = Grain::new(W, rounds_f, rounds_p);
    let half = rounds_f / 2;
    let row = |g: &mut Grain| -> [Elem; W] { std::array::from_fn(|_| g.field_element()) };
    let external_initial: Vec<[Elem; W]> = (0..half).map(|_| row(&mut g)).collect();
    let internal: Vec<Elem> = (0..rounds_p).map(|_| g.field_element()).collect();
    let external_final: Vec<[Elem; W]> = (0..rounds_f - half).map(|_| row(&mut g)).collect();
    let diag = loop {
        let d: [Elem; W] = std::array::from_fn(|_| Elem::new(g.bits(31)));
        if minpoly_condition(&d) {
            break d;
        }
    };
    Poseidon2 {
        rounds_f,
        rounds_p,
        external_initial,
        internal,
        external_final,
        diag_m_1: diag.map(|d| d - Elem::ONE),
    }
}

/// The script's `check_minpoly_condition` for `M = 1 + diag(d - 1)`: the characteristic
/// polynomials of `M, M^2, …, M^(2t)` are all irreducible.
fn minpoly_condition(d: &[Elem]) -> bool {
    let t = d.len();
    let m: Vec<Elem> = (0..t * t)
        .map(|k| if k / t == k % t { d[k / t] } else { Elem::ONE })
        .collect();
    let mut power = m.clone();
    for k in 1..=2 * t {
        if !is_irreducible(&charpoly(&power, t)) {
            return false;
        }
        if k < 2 * t {
            power = mat_mul(&m, &power, t);
        }
    }
    true
}

fn mat_mul(a: &[Elem], b: &[Elem], n: usize) -> Vec<Elem> {
    let mut c = vec![Elem::ZERO; n * n];
    for i in 0..n {
        for k in 0..n {
            let aik = a[i * n + k];
            for j in 0..n {
                c[i * n + j] += aik * b[k * n + j];
            }
        }
    }
    c
}

/// The characteristic polynomial `det(x·I - A)` of the `n × n` matrix `a` (row-major),
/// coefficients lowest degree first (monic, length `n + 1`): reduction to upper Hessenberg
/// form by similarity transforms, then the usual recurrence.
fn charpoly(a: &[Elem], n: usize) -> Vec<Elem> {
    let mut h = a.to_vec();
    let at = |i: usize, j: usize| i * n + j;
    for j in 0..n.saturating_sub(2) {
        let Some(piv) = (j + 1..n).find(|&i| h[at(i, j)] != Elem::ZERO) else {
            continue;
        };
        if piv != j + 1 {
            for k in 0..n {
                h.swap(at(piv, k), at(j + 1, k));
            }
            for k in 0..n {
                h.swap(at(k, piv), at(k, j + 1));
            }
        }
        let inv = h[at(j + 1, j)].inv();
        for i in j + 2..n {
            let u = h[at(i, j)] * inv;
            if u == Elem::ZERO {
                continue;
            }
            for k in 0..n {
                let v = h[at(j + 1, k)];
                h[at(i, k)] -= u * v;
            }
            for k in 0..n {
                let v = h[at(k, i)];
                h[at(k, j + 1)] += u * v;
            }
        }
    }
    // p_0 = 1; p_m = (x - h_mm) p_{m-1} - sum_{i<m} h_{i,m} (prod_{k=i+1}^{m} h_{k,k-1}) p_{i-1}
    let mut polys: Vec<Vec<Elem>> = vec![vec![Elem::ONE]];
    for m in 1..=n {
        let prev = &polys[m - 1];
        let mut next = vec![Elem::ZERO; m + 1];
        for (k, &c) in prev.iter().enumerate() {
            next[k + 1] += c;
            next[k] -= h[at(m - 1, m - 1)] * c;
        }
        let mut prod = Elem::ONE;
        for i in (1..m).rev() {
            prod *= h[at(i, i - 1)];
            let c = h[at(i - 1, m - 1)] * prod;
            for (k, &q) in polys[i - 1].iter().enumerate() {
                next[k] -= c * q;
            }
        }
        polys.push(next);
    }
    polys.pop().unwrap_or_default()
}

fn trim(mut a: Vec<Elem>) -> Vec<Elem> {
    while a.last() == Some(&Elem::ZERO) {
        a.pop();
    }
    a
}

/// `a mod f` for monic `f`.
fn poly_rem(mut a: Vec<Elem>, f: &[Elem]) -> Vec<Elem> {
    let n = f.len() - 1;
    while a.len() > n {
        let Some(c) = a.pop() else { break };
        let base = a.len() - n;
        for k in 0..n {
            a[base + k] -= c * f[k];
        }
    }
    a
}

fn poly_mul_mod(a: &[Elem], b: &[Elem], f: &[Elem]) -> Vec<Elem> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let mut c = vec![Elem::ZERO; a.len() + b.len() - 1];
    for (i, &x) in a.iter().enumerate() {
        for (j, &y) in b.iter().enumerate() {
            c[i + j] += x * y;
        }
    }
    poly_rem(c, f)
}

/// The degree of `gcd(a, b)` (`None` when both are zero).
fn gcd_degree(a: Vec<Elem>, b: Vec<Elem>) -> Option<usize> {
    let (mut a, mut b) = (trim(a), trim(b));
    while !b.is_empty() {
        let lead_inv = b[b.len() - 1].inv();
        while a.len() >= b.len() {
            let c = a[a.len() - 1] * lead_inv;
            let shift = a.len() - b.len();
            for (k, &bk) in b.iter().enumerate() {
                a[shift + k] -= c * bk;
            }
            a = trim(a);
        }
        std::mem::swap(&mut a, &mut b);
    }
    a.len().checked_sub(1)
}

/// Ben-Or's test for a monic `f` of degree `n`: irreducible iff
/// `gcd(f, x^(p^i) - x) = 1` for `i = 1..=n/2`.
fn is_irreducible(f: &[Elem]) -> bool {
    let n = f.len() - 1;
    if n <= 1 {
        return n == 1;
    }
    // x^p mod f by square-and-multiply, then the powers (x^p)^k mod f for k < n, which turn
    // the Frobenius map g(x) -> g(x)^p = g(x^p) into a linear map.
    let x = poly_rem(vec![Elem::ZERO, Elem::ONE], f);
    let mut xp = vec![Elem::ONE];
    let mut base = x.clone();
    let mut e = u64::from(P);
    while e != 0 {
        if e & 1 == 1 {
            xp = poly_mul_mod(&xp, &base, f);
        }
        base = poly_mul_mod(&base, &base, f);
        e >>= 1;
    }
    let mut frob = vec![vec![Elem::ONE]];
    for k in 1..n {
        let next = poly_mul_mod(&frob[k - 1], &xp, f);
        frob.push(next);
    }
    let mut cur = x;
    for _ in 1..=n / 2 {
        let mut next = vec![Elem::ZERO; n];
        for (k, &c) in cur.iter().enumerate() {
            for (j, &q) in frob[k].iter().enumerate() {
                next[j] += c * q;
            }
        }
        cur = next;
        let mut g = cur.clone();
        g[1] -= Elem::ONE;
        if gcd_degree(f.to_vec(), g) != Some(0) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poly(c: &[u32]) -> Vec<Elem> {
        c.iter().map(|&x| Elem::new(x)).collect()
    }

    #[test]
    fn grain_reproduces_the_first_published_constants() {
        let mut g = Grain::new(16, 8, 13);
        let first: Vec<u32> = (0..4).map(|_| g.field_element().as_u32()).collect();
        assert_eq!(first, [0x69cbb6af, 0x46ad93f9, 0x60a00f4e, 0x6b1297cd]);
    }

    #[test]
    fn charpoly_of_small_matrices() {
        // [[2, 1], [1, 3]]: x^2 - 5x + 5.
        let m = poly(&[2, 1, 1, 3]);
        assert_eq!(
            charpoly(&m, 2),
            vec![Elem::new(5), -Elem::new(5), Elem::ONE]
        );
        // A matrix that needs a pivot swap: [[1, 2, 3], [0, 4, 5], [6, 7, 8]] has trace 13,
        // principal 2x2 minors 4 - 10 - 3 = -9 and determinant -15: x^3 - 13x^2 - 9x + 15.
        let m = poly(&[1, 2, 3, 0, 4, 5, 6, 7, 8]);
        let want = vec![Elem::new(15), -Elem::new(9), -Elem::new(13), Elem::ONE];
        assert_eq!(charpoly(&m, 3), want);
    }

    #[test]
    fn irreducibility() {
        // x^2 - 11: 11 is a non-residue, so irreducible; x^2 - 4 = (x-2)(x+2) is not.
        assert!(is_irreducible(&[-Elem::new(11), Elem::ZERO, Elem::ONE]));
        assert!(!is_irreducible(&[-Elem::new(4), Elem::ZERO, Elem::ONE]));
        // x^4 - 11 is irreducible (the extension field's modulus), x^4 - 16 is not.
        assert!(is_irreducible(&poly(&[P - 11, 0, 0, 0, 1])));
        assert!(!is_irreducible(&poly(&[P - 16, 0, 0, 0, 1])));
        // (x^2 - 11)(x^2 - 13) has no root but is reducible.
        let f = poly_mul_mod(
            &[-Elem::new(11), Elem::ZERO, Elem::ONE],
            &[-Elem::new(13), Elem::ZERO, Elem::ONE],
            &poly(&[0, 0, 0, 0, 0, 1]),
        );
        assert!(!is_irreducible(&f));
    }
}
