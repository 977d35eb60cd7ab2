//! Differential tests of the prover operations: every [`Hal`] backend against the
//! `cpu_ops` reference functions, called directly (not through a HAL).
//!
//! `suite` runs each operation on random inputs of several shapes, with every output
//! poisoned (filled with a value that is not a field element) before each run, so an
//! element a backend fails to write cannot pass. It then checks the errors for bad input
//! and that the HAL is still usable after them.

mod common;

use bytemuck::Pod;
use common::Rng;
use cuda_hal::field::{Elem, ExtElem, FieldElement};
use cuda_hal::{cpu_ops, CpuHal, Digest, Error, Hal, HalBuffer};

/// Not a field element (`>= p`): marks output a backend did not write.
const POISON: u32 = 0xDEAD_BEEF;

fn poison_elem() -> Elem {
    bytemuck::cast(POISON)
}

fn poison_digest() -> Digest {
    Digest([poison_elem(); 8])
}

trait Random: FieldElement {
    fn random(rng: &mut Rng) -> Self;
    fn poison() -> Self;
}

impl Random for Elem {
    fn random(rng: &mut Rng) -> Self {
        Elem::from_u64(rng.next_u64())
    }
    fn poison() -> Self {
        poison_elem()
    }
}

impl Random for ExtElem {
    fn random(rng: &mut Rng) -> Self {
        ExtElem::new(std::array::from_fn(|_| Elem::random(rng)))
    }
    fn poison() -> Self {
        ExtElem::new([poison_elem(); 4])
    }
}

fn randoms<F: Random>(rng: &mut Rng, n: usize) -> Vec<F> {
    (0..n).map(|_| F::random(rng)).collect()
}

fn random_digests(rng: &mut Rng, n: usize) -> Vec<Digest> {
    (0..n)
        .map(|_| Digest(std::array::from_fn(|_| Elem::random(rng))))
        .collect()
}

/// A buffer of `len` elements, all `poison`.
fn poisoned<H: Hal, T: Pod + Send + Sync>(
    hal: &H,
    name: &'static str,
    len: usize,
    poison: T,
) -> H::Buffer<T> {
    let b = hal.alloc::<T>(name, len).unwrap();
    b.copy_from_slice(&vec![poison; len]).unwrap();
    b
}

fn assert_same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: first difference at element {i} of {}: got {:?}, want {:?}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// The whole differential suite, for any backend.
fn suite<H: Hal>(hal: &H) {
    let t = std::time::Instant::now();
    let mut rng = Rng::new(0x5eed);
    eltwise::<H, Elem>(hal, &mut rng, &[1, 2, 1000, 1_000_003]);
    eltwise::<H, ExtElem>(hal, &mut rng, &[1, 3, 4097, 100_003]);
    eltwise_on_slices_of_one_allocation(hal, &mut rng);
    fill(hal, &mut rng);
    a_panicking_view_leaves_its_edits(hal);
    bit_reverse(hal, &mut rng);
    ntt(hal, &mut rng);
    coset_lde(hal, &mut rng);
    hash_rows(hal, &mut rng);
    merkle(hal, &mut rng);
    threads(hal, &mut rng);
    bad_input(hal);
    eprintln!("prover_ops suite on `{}`: {:?}", hal.name(), t.elapsed());
}

fn eltwise<H: Hal, F: Random>(hal: &H, rng: &mut Rng, lens: &[usize]) {
    type Op<F> = fn(&mut [F], &[F], &[F]);
    for &n in lens {
        let (av, bv) = (randoms::<F>(rng, n), randoms::<F>(rng, n));
        let scalar = F::random(rng);
        let a = hal.copy_from("a", &av).unwrap();
        let b = hal.copy_from("b", &bv).unwrap();
        let mut want = vec![F::ZERO; n];
        let ops: [(&str, Op<F>); 3] = [
            ("add", cpu_ops::eltwise_add),
            ("sub", cpu_ops::eltwise_sub),
            ("mul", cpu_ops::eltwise_mul),
        ];
        for (name, reference) in ops {
            let out = poisoned(hal, "out", n, F::poison());
            match name {
                "add" => hal.eltwise_add(&out, &a, &b),
                "sub" => hal.eltwise_sub(&out, &a, &b),
                _ => hal.eltwise_mul(&out, &a, &b),
            }
            .unwrap();
            reference(&mut want, &av, &bv);
            assert_same(
                &format!("eltwise_{name}_{} n={n}", F::TAG),
                &out.to_vec().unwrap(),
                &want,
            );
        }
        let out = poisoned(hal, "out", n, F::poison());
        hal.eltwise_mul_scalar(&out, &a, scalar).unwrap();
        cpu_ops::eltwise_mul_scalar(&mut want, &av, scalar);
        assert_same(
            &format!("eltwise_mul_scalar_{} n={n}", F::TAG),
            &out.to_vec().unwrap(),
            &want,
        );
        // The same input twice is not aliasing.
        let out = poisoned(hal, "out", n, F::poison());
        hal.eltwise_mul(&out, &a, &a).unwrap();
        cpu_ops::eltwise_mul(&mut want, &av, &av);
        assert_same("eltwise a*a", &out.to_vec().unwrap(), &want);
    }
}

/// Inputs and output as disjoint slices of one allocation, at odd offsets.
fn eltwise_on_slices_of_one_allocation<H: Hal>(hal: &H, rng: &mut Rng) {
    let n = 1001;
    let arena = poisoned(hal, "arena", 3 * n + 7, poison_elem());
    let (a, b, out) = (
        arena.slice(1, n).unwrap(),
        arena.slice(n + 3, n).unwrap(),
        arena.slice(2 * n + 5, n).unwrap(),
    );
    let (av, bv) = (randoms::<Elem>(rng, n), randoms::<Elem>(rng, n));
    a.copy_from_slice(&av).unwrap();
    b.copy_from_slice(&bv).unwrap();
    hal.eltwise_sub(&out, &a, &b).unwrap();
    let mut want = vec![Elem::ZERO; n];
    cpu_ops::eltwise_sub(&mut want, &av, &bv);
    assert_same("eltwise on slices", &out.to_vec().unwrap(), &want);
    // Nothing outside the three slices was touched.
    let all = arena.to_vec().unwrap();
    for i in [0, n + 1, n + 2, 2 * n + 3, 2 * n + 4, 3 * n + 5, 3 * n + 6] {
        assert_eq!(all[i], poison_elem(), "arena element {i}");
    }
}

/// `fill` of every element type of the crate, both backends. (Before, the CUDA HAL refused
/// `ExtElem` and `Digest`, which `CpuHal` filled.)
fn fill<H: Hal>(hal: &H, rng: &mut Rng) {
    fn check<H: Hal, T: Pod + Send + Sync + PartialEq + std::fmt::Debug>(hal: &H, values: [T; 2]) {
        for len in [1, 1000, 100_003] {
            let b = hal.alloc::<T>("fill", len).unwrap();
            for v in values {
                b.fill(v).unwrap();
                assert_same(
                    &format!("fill of {len}"),
                    &b.to_vec().unwrap(),
                    &vec![v; len],
                );
            }
            // A slice: only its elements change.
            if len > 2 {
                b.slice(1, len - 2).unwrap().fill(values[0]).unwrap();
                let mut want = vec![values[1]; len];
                want[1..len - 1].fill(values[0]);
                assert_same(
                    &format!("fill of a slice of {len}"),
                    &b.to_vec().unwrap(),
                    &want,
                );
            }
        }
    }
    check(hal, [0x5au8, 0]);
    check(hal, [0x1234u16, 7]);
    check(hal, [Elem::random(rng), Elem::ZERO]);
    check(hal, [u64::MAX - 5, 1]);
    check(hal, [[1u32, 2, 3], [0; 3]]);
    check(hal, [ExtElem::random(rng), ExtElem::ONE]);
    check(hal, [[9u32, 8, 7, 6, 5, 4], [0; 6]]);
    let d: [Digest; 2] = [random_digests(rng, 1)[0], Digest([Elem::ZERO; 8])];
    check(hal, d);
}

/// A `view_mut` whose closure panics leaves its edits, and ends (as any `&mut [T]` would).
/// Before, `CpuHal` dropped them (and so did the CUDA HAL without phase 2), while the CUDA
/// HAL with phase 2 kept them.
fn a_panicking_view_leaves_its_edits<H: Hal>(hal: &H) {
    let b = hal.copy_from("edits", &[7u32; 3]).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.view_mut(|s| {
            s[0] = 99;
            panic!("a panicking view (expected by the test)");
        })
    }));
    assert!(unwound.is_err());
    assert_eq!(b.to_vec().unwrap(), vec![99, 7, 7]);
    b.view_mut(|s| s[1] = 1).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![99, 1, 7], "the view ended");
}

fn bit_reverse<H: Hal>(hal: &H, rng: &mut Rng) {
    for log_n in 0..=12 {
        for cols in [1, 3] {
            let v = randoms::<Elem>(rng, cols << log_n);
            let io = hal.copy_from("io", &v).unwrap();
            hal.batch_bit_reverse(&io, log_n).unwrap();
            let mut want = v.clone();
            cpu_ops::bit_reverse(&mut want, log_n);
            assert_same(
                &format!("bit_reverse log_n={log_n} cols={cols}"),
                &io.to_vec().unwrap(),
                &want,
            );
        }
    }
}

fn ntt<H: Hal>(hal: &H, rng: &mut Rng) {
    for log_n in 1..=12 {
        for cols in [1, 2, 5] {
            let v = randoms::<Elem>(rng, cols << log_n);
            let io = hal.copy_from("io", &v).unwrap();
            hal.batch_ntt(&io, log_n, false).unwrap();
            let mut want = v.clone();
            cpu_ops::ntt(&mut want, log_n, false);
            let what = format!("ntt log_n={log_n} cols={cols}");
            assert_same(&what, &io.to_vec().unwrap(), &want);
            hal.batch_ntt(&io, log_n, true).unwrap();
            assert_same(&format!("inverse {what}"), &io.to_vec().unwrap(), &v);
            // The inverse on its own, on fresh random evaluations.
            let e = randoms::<Elem>(rng, cols << log_n);
            io.copy_from_slice(&e).unwrap();
            hal.batch_ntt(&io, log_n, true).unwrap();
            let mut want = e;
            cpu_ops::ntt(&mut want, log_n, true);
            assert_same(
                &format!("inverse-only {what}"),
                &io.to_vec().unwrap(),
                &want,
            );
        }
    }
    // A column in the middle of a larger buffer: only that slice changes.
    let v = randoms::<Elem>(rng, 3 << 6);
    let whole = hal.copy_from("whole", &v).unwrap();
    hal.batch_ntt(&whole.slice(1 << 6, 1 << 6).unwrap(), 6, false)
        .unwrap();
    let mut want = v.clone();
    cpu_ops::ntt(&mut want[1 << 6..2 << 6], 6, false);
    assert_same("ntt on a slice", &whole.to_vec().unwrap(), &want);
}

fn coset_lde<H: Hal>(hal: &H, rng: &mut Rng) {
    for (log_n, log_blowup) in [(0, 1), (1, 1), (4, 2), (8, 3), (10, 1), (6, 0)] {
        for cols in [1, 3] {
            let c = randoms::<Elem>(rng, cols << log_n);
            let coeffs = hal.copy_from("coeffs", &c).unwrap();
            let big = cols << (log_n + log_blowup);
            let out = poisoned(hal, "lde", big, poison_elem());
            hal.coset_lde(&out, &coeffs, log_n, log_blowup).unwrap();
            let mut want = vec![Elem::ZERO; big];
            cpu_ops::coset_lde(&mut want, &c, log_n, log_blowup);
            assert_same(
                &format!("coset_lde log_n={log_n} log_blowup={log_blowup} cols={cols}"),
                &out.to_vec().unwrap(),
                &want,
            );
            // The input is left as it was.
            assert_same("lde input", &coeffs.to_vec().unwrap(), &c);
        }
    }
}

fn hash_rows<H: Hal>(hal: &H, rng: &mut Rng) {
    for (rows, cols) in [
        (1, 1),
        (3, 8),
        (5, 9),
        (64, 16),
        (1000, 3),
        (257, 24),
        (2, 100),
    ] {
        let m = randoms::<Elem>(rng, rows * cols);
        let matrix = hal.copy_from("matrix", &m).unwrap();
        let out = poisoned(hal, "digests", rows, poison_digest());
        hal.poseidon2_hash_rows(&out, &matrix, rows, cols).unwrap();
        let mut want = vec![Digest::default(); rows];
        cpu_ops::hash_rows(&mut want, &m, rows, cols);
        assert_same(
            &format!("hash_rows {rows}x{cols}"),
            &out.to_vec().unwrap(),
            &want,
        );
    }
}

fn merkle<H: Hal>(hal: &H, rng: &mut Rng) {
    // Whole trees over 2^k leaves, layer by layer, in one buffer of 2^(k+1) - 1 nodes
    // (leaves first, root last): each layer reads one slice and writes the next.
    for k in [0u32, 1, 5, 8] {
        let leaves = random_digests(rng, 1 << k);
        let nodes = poisoned(hal, "tree", (2 << k) - 1, poison_digest());
        nodes
            .slice(0, 1 << k)
            .unwrap()
            .copy_from_slice(&leaves)
            .unwrap();
        let mut want = leaves;
        let mut at = 0;
        for level in (0..k).rev() {
            let width = 2 << level;
            let input = nodes.slice(at, width).unwrap();
            let out = nodes.slice(at + width, width / 2).unwrap();
            hal.merkle_layer(&out, &input).unwrap();
            let mut next = vec![Digest::default(); width / 2];
            cpu_ops::merkle_layer(&mut next, &want);
            assert_same(
                &format!("merkle k={k} level={level}"),
                &out.to_vec().unwrap(),
                &next,
            );
            want = next;
            at += width;
        }
        assert_eq!(nodes.get_at((2 << k) - 2).unwrap(), want[0], "root, k={k}");
    }
    // A layer whose width is not a power of two.
    let input = random_digests(rng, 10);
    let inb = hal.copy_from("in", &input).unwrap();
    let out = poisoned(hal, "out", 5, poison_digest());
    hal.merkle_layer(&out, &inb).unwrap();
    let mut want = vec![Digest::default(); 5];
    cpu_ops::merkle_layer(&mut want, &input);
    assert_same("merkle 10 -> 5", &out.to_vec().unwrap(), &want);
}

/// Several threads share the HAL and one allocation (disjoint slices).
fn threads<H: Hal>(hal: &H, rng: &mut Rng) {
    let (log_n, parts) = (8, 4);
    let v = randoms::<Elem>(rng, parts << log_n);
    let io = hal.copy_from("shared", &v).unwrap();
    std::thread::scope(|s| {
        for p in 0..parts {
            let part = io.slice(p << log_n, 1 << log_n).unwrap();
            s.spawn(move || {
                for _ in 0..4 {
                    hal.batch_ntt(&part, log_n, false).unwrap();
                    hal.batch_ntt(&part, log_n, true).unwrap();
                }
                hal.batch_ntt(&part, log_n, false).unwrap();
            });
        }
    });
    let mut want = v;
    cpu_ops::ntt(&mut want, log_n, false);
    assert_same("threads", &io.to_vec().unwrap(), &want);
}

fn bad_input<H: Hal>(hal: &H) {
    fn expect(r: cuda_hal::Result<()>, what: &str, ok: impl Fn(&Error) -> bool) {
        match r {
            Err(e) if ok(&e) => {}
            Err(e) => panic!("{what}: wrong error {e:?}"),
            Ok(()) => panic!("{what}: accepted"),
        }
    }
    let e = hal.alloc::<Elem>("empty", 0).unwrap_err();
    assert!(
        matches!(&e, Error::ZeroLength { name } if name == "empty"),
        "{e:?}"
    );

    let a = hal.copy_from("a", &[Elem::ONE; 8]).unwrap();
    let short = hal.copy_from("short", &[Elem::ONE; 7]).unwrap();
    let out = hal.alloc::<Elem>("out", 8).unwrap();
    assert!(matches!(a.slice(0, 0), Err(Error::ZeroLength { .. })));
    assert!(matches!(
        a.slice(5, 10),
        Err(Error::OutOfRange {
            start: 5,
            end: 15,
            len: 8,
            ..
        })
    ));
    assert!(matches!(
        a.slice(usize::MAX, 2),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        a.get_at(8),
        Err(Error::OutOfRange {
            start: 8,
            end: 9,
            len: 8,
            ..
        })
    ));
    expect(a.copy_from_slice(&[Elem::ONE; 3]), "copy_from_slice", |e| {
        matches!(
            e,
            Error::LengthMismatch {
                expected: 8,
                actual: 3,
                ..
            }
        )
    });
    let mut dst = [Elem::ZERO; 9];
    expect(a.copy_to_slice(&mut dst), "copy_to_slice", |e| {
        matches!(
            e,
            Error::LengthMismatch {
                expected: 8,
                actual: 9,
                ..
            }
        )
    });

    // Element-wise: lengths and aliasing.
    expect(
        hal.eltwise_add(&out, &a, &short),
        "eltwise length",
        |e| matches!(e, Error::LengthMismatch { name, expected: 8, actual: 7 } if name == "short"),
    );
    expect(
        hal.eltwise_mul_scalar(&short, &a, Elem::ONE),
        "scalar length",
        |e| {
            matches!(
                e,
                Error::LengthMismatch {
                    expected: 7,
                    actual: 8,
                    ..
                }
            )
        },
    );
    expect(hal.eltwise_add(&a, &a, &out), "out = a", |e| {
        matches!(e, Error::Aliasing { .. })
    });
    let arena = hal.alloc::<Elem>("arena", 12).unwrap();
    let (x, y) = (arena.slice(0, 8).unwrap(), arena.slice(4, 8).unwrap());
    expect(hal.eltwise_sub(&y, &out, &x), "overlapping slices", |e| {
        matches!(e, Error::Aliasing { .. })
    });
    expect(
        hal.eltwise_mul_scalar(&x, &y, Elem::ONE),
        "scalar aliasing",
        |e| matches!(e, Error::Aliasing { .. }),
    );

    // Fill: elements of 1, 2, or a multiple of 4 bytes up to 32.
    for (r, size) in [
        (hal.alloc::<[u8; 3]>("odd", 4).unwrap().fill([1; 3]), 3),
        (hal.alloc::<[u32; 9]>("wide", 4).unwrap().fill([1; 9]), 36),
    ] {
        expect(
            r,
            "fill size",
            |e| matches!(e, Error::UnsupportedElementSize { op: "fill", size: s } if *s == size),
        );
    }

    // Transforms: whole columns, at most 2^27 points.
    let io = hal.alloc::<Elem>("io", 12).unwrap();
    expect(hal.batch_ntt(&io, 3, false), "ntt columns", |e| {
        matches!(
            e,
            Error::LengthMismatch {
                expected: 16,
                actual: 12,
                ..
            }
        )
    });
    expect(hal.batch_bit_reverse(&io, 4), "bit reverse columns", |e| {
        matches!(
            e,
            Error::LengthMismatch {
                expected: 16,
                actual: 12,
                ..
            }
        )
    });
    expect(hal.batch_ntt(&io, 28, true), "ntt size", |e| {
        matches!(e, Error::InvalidArgument(_))
    });
    // Columns of one point change nothing, but are accesses all the same: refused under an
    // open view of the elements. (Before, the CUDA HAL returned Ok without checking.)
    let borrowed = |e: &Error| matches!(e, Error::BufferBorrowed { .. });
    let (ntt, rev) = io
        .view_mut(|_| (hal.batch_ntt(&io, 0, false), hal.batch_bit_reverse(&io, 0)))
        .unwrap();
    expect(ntt, "ntt of one point under a view", borrowed);
    expect(rev, "bit reversal of one point under a view", borrowed);
    hal.batch_ntt(&io, 0, true).unwrap();
    let coeffs = hal.alloc::<Elem>("coeffs", 8).unwrap();
    let lde = hal.alloc::<Elem>("lde", 16).unwrap();
    expect(
        hal.coset_lde(&lde, &coeffs, 2, 2),
        "lde output",
        |e| matches!(e, Error::LengthMismatch { name, expected: 32, actual: 16 } if name == "lde"),
    );
    expect(hal.coset_lde(&lde, &coeffs, 3, 25), "lde size", |e| {
        matches!(e, Error::InvalidArgument(_))
    });
    expect(
        hal.coset_lde(&lde, &io, 3, 1),
        "lde columns",
        |e| matches!(e, Error::LengthMismatch { name, .. } if name == "io"),
    );
    let big = hal.alloc::<Elem>("big", 24).unwrap();
    expect(
        hal.coset_lde(&big.slice(4, 16).unwrap(), &big.slice(0, 8).unwrap(), 3, 1),
        "lde aliasing",
        |e| matches!(e, Error::Aliasing { .. }),
    );

    // Hashing.
    let digests = hal.alloc::<Digest>("digests", 4).unwrap();
    let matrix = hal.alloc::<Elem>("matrix", 12).unwrap();
    expect(
        hal.poseidon2_hash_rows(&digests, &matrix, 4, 2),
        "matrix",
        |e| matches!(e, Error::LengthMismatch { name, expected: 8, actual: 12 } if name == "matrix"),
    );
    expect(
        hal.poseidon2_hash_rows(&digests, &matrix, 3, 4),
        "rows",
        |e| matches!(e, Error::LengthMismatch { name, expected: 3, actual: 4 } if name == "digests"),
    );
    expect(
        hal.poseidon2_hash_rows(&digests, &matrix, 4, 0),
        "cols",
        |e| matches!(e, Error::ZeroLength { .. }),
    );
    let layer = hal.alloc::<Digest>("layer", 3).unwrap();
    expect(hal.merkle_layer(&layer, &digests), "merkle", |e| {
        matches!(
            e,
            Error::LengthMismatch {
                expected: 6,
                actual: 4,
                ..
            }
        )
    });
    expect(
        hal.merkle_layer(&digests.slice(1, 2).unwrap(), &digests),
        "merkle aliasing",
        |e| matches!(e, Error::Aliasing { .. }),
    );

    // Still usable.
    hal.eltwise_add(&out, &a, &a).unwrap();
    assert_eq!(out.to_vec().unwrap(), vec![Elem::new(2); 8]);
    hal.poseidon2_hash_rows(&digests, &matrix, 4, 3).unwrap();
    hal.synchronize().unwrap();
}

/// The generic suite on `CpuHal`. Its values come from `cpu_ops`, the suite's own
/// reference, so here the value checks compare the reference with itself: what this run
/// can fail on is the plumbing (slices, poisoned outputs, lengths, errors). The reference
/// is checked on its own by the unit tests of `cpu_ops` and `poseidon2` (Poseidon2's
/// published known answers, the NTT against a naive DFT).
#[test]
fn cpu_suite() {
    suite(&CpuHal::new());
}

/// The generic suite on the GPU. `gpu()` skips without a GPU and fails under
/// CUDA_HAL_REQUIRE_GPU=1, as for the other GPU tests.
#[test]
fn cuda_suite() {
    if let Some(hal) = common::gpu() {
        suite::<cuda_hal::CudaHal>(&hal);
    }
}

/// GPU-only paths the generic suite's sizes do not reach: the multi-pass fused NTT
/// (`log_n >= 14`, through scratch), the radix-2 reference path, large LDEs, and the plain
/// Poseidon2 permutation kernels of both widths.
#[test]
fn cuda_large_and_extra() {
    let Some(hal) = common::gpu() else { return };
    let hal: &cuda_hal::CudaHal = &hal;
    let mut rng = Rng::new(0xb16);
    for (log_n, cols) in [
        (13, 3),
        (14, 1),
        (14, 3),
        (15, 2),
        (16, 4),
        (17, 1),
        (18, 2),
        (20, 1),
        (21, 1),
        (22, 1),
    ] {
        let v = randoms::<Elem>(&mut rng, cols << log_n);
        let mut want = v.clone();
        cpu_ops::ntt(&mut want, log_n, false);
        for radix2 in [false, true] {
            let io = hal.copy_from("io", &v).unwrap();
            if radix2 {
                hal.batch_ntt_radix2(&io, log_n, false).unwrap();
            } else {
                Hal::batch_ntt(hal, &io, log_n, false).unwrap();
            }
            let what = format!("ntt log_n={log_n} cols={cols} radix2={radix2}");
            assert_same(&what, &io.to_vec().unwrap(), &want);
            if radix2 {
                hal.batch_ntt_radix2(&io, log_n, true).unwrap();
            } else {
                Hal::batch_ntt(hal, &io, log_n, true).unwrap();
            }
            assert_same(&format!("inverse {what}"), &io.to_vec().unwrap(), &v);
        }
    }
    // Small sizes through the radix-2 path too.
    for log_n in 1..=6 {
        let v = randoms::<Elem>(&mut rng, 3 << log_n);
        let io = hal.copy_from("io", &v).unwrap();
        hal.batch_ntt_radix2(&io, log_n, true).unwrap();
        let mut want = v;
        cpu_ops::ntt(&mut want, log_n, true);
        assert_same("radix2 small inverse", &io.to_vec().unwrap(), &want);
    }
    for (log_n, log_blowup, cols) in [(12, 2, 2), (16, 1, 1), (13, 3, 1)] {
        let c = randoms::<Elem>(&mut rng, cols << log_n);
        let coeffs = hal.copy_from("coeffs", &c).unwrap();
        let big = cols << (log_n + log_blowup);
        let out = poisoned(hal, "lde", big, poison_elem());
        Hal::coset_lde(hal, &out, &coeffs, log_n, log_blowup).unwrap();
        let mut want = vec![Elem::ZERO; big];
        cpu_ops::coset_lde(&mut want, &c, log_n, log_blowup);
        assert_same(
            &format!("large coset_lde {log_n}+{log_blowup} x{cols}"),
            &out.to_vec().unwrap(),
            &want,
        );
    }
    // Plain permutations: known answer and random states, both widths.
    let range: [Elem; 16] = std::array::from_fn(|i| Elem::new(i as u32));
    let b = hal.copy_from("kat", &range).unwrap();
    hal.poseidon2_permute(&b, 16).unwrap();
    assert_eq!(b.get_at(0).unwrap(), Elem::new(896_560_466));
    for width in [16usize, 24] {
        let n = 1000;
        let v = randoms::<Elem>(&mut rng, n * width);
        let b = hal.copy_from("states", &v).unwrap();
        hal.poseidon2_permute(&b, width).unwrap();
        let mut want = v.clone();
        for st in want.chunks_exact_mut(width) {
            if width == 16 {
                let s: &mut [Elem; 16] = st.try_into().unwrap();
                cuda_hal::poseidon2::Poseidon2::babybear16().permute(s);
            } else {
                let s: &mut [Elem; 24] = st.try_into().unwrap();
                cuda_hal::poseidon2::Poseidon2::babybear24().permute(s);
            }
        }
        assert_same(
            &format!("poseidon2 width {width}"),
            &b.to_vec().unwrap(),
            &want,
        );
    }
    let b = hal.alloc::<Elem>("odd", 17).unwrap();
    assert!(matches!(
        hal.poseidon2_permute(&b, 16),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        hal.poseidon2_permute(&b, 17),
        Err(Error::InvalidArgument(_))
    ));
    // Larger hash_rows / merkle shapes (many blocks, grid-stride).
    let (rows, cols) = (100_003, 13);
    let m = randoms::<Elem>(&mut rng, rows * cols);
    let matrix = hal.copy_from("matrix", &m).unwrap();
    let out = poisoned(hal, "digests", rows, poison_digest());
    Hal::poseidon2_hash_rows(hal, &out, &matrix, rows, cols).unwrap();
    let mut want = vec![Digest::default(); rows];
    cpu_ops::hash_rows(&mut want, &m, rows, cols);
    assert_same("large hash_rows", &out.to_vec().unwrap(), &want);
    let layer = poisoned(hal, "layer", rows / 2, poison_digest());
    let input = out.slice(0, 2 * (rows / 2)).unwrap();
    Hal::merkle_layer(hal, &layer, &input).unwrap();
    let mut next = vec![Digest::default(); rows / 2];
    cpu_ops::merkle_layer(&mut next, &want[..2 * (rows / 2)]);
    assert_same("large merkle layer", &layer.to_vec().unwrap(), &next);
}

/// NTTs of every size whose passes are compiled for it (`2^4` to `2^27` points, the
/// default) give what the generic pass kernels give, forward and inverse, and the inverse
/// undoes the forward. The single-pass sizes (up to `2^12`) run over 32 columns, the
/// count their kernels are compiled for, and over 1 and 3 (the generic kernel but at
/// `2^12`), each checked against `cpu_ops` too. Up to `2^22`, `cuda_large_and_extra`
/// checks the others against `cpu_ops`; from `2^23` (no host check runs such plans), a few
/// outputs of each forward transform are checked against the polynomial evaluated on the
/// host.
#[test]
fn cuda_fixed_ntt_passes_match_the_generic_ones() {
    let Some(device) = common::gpu() else { return };
    let hal: &cuda_hal::CudaHal = &device;
    assert!(hal.config().ntt_fixed_passes, "on by default");
    let generic = cuda_hal::CudaHal::with_config(
        0,
        cuda_hal::HalConfig {
            ntt_fixed_passes: false,
            ..cuda_hal::HalConfig::default()
        },
    )
    .unwrap();
    let mut rng = Rng::new(0xf1d);
    let shapes = (4..=12)
        .flat_map(|log_n| [(log_n, 32), (log_n, 1), (log_n, 3)])
        .chain((13..=27).map(|log_n| (log_n, 1)))
        .chain([(13, 5), (16, 3), (20, 2)]);
    for (log_n, cols) in shapes {
        let v = randoms::<Elem>(&mut rng, cols << log_n);
        let (a, b) = (
            hal.copy_from("io", &v).unwrap(),
            generic.copy_from("io", &v).unwrap(),
        );
        let mut want = v.clone();
        for inverse in [false, true] {
            Hal::batch_ntt(hal, &a, log_n, inverse).unwrap();
            Hal::batch_ntt(&generic, &b, log_n, inverse).unwrap();
            let what = format!("log_n={log_n} cols={cols} inverse={inverse}");
            let got = a.to_vec().unwrap();
            assert_same(&what, &got, &b.to_vec().unwrap());
            if log_n <= 12 {
                cpu_ops::ntt(&mut want, log_n, inverse);
                assert_same(&format!("{what} against cpu_ops"), &got, &want);
            }
            if !inverse && log_n >= 23 {
                let n = 1u64 << log_n;
                for i in [0, 1, n / 2 + 3, rng.next_u64() % n] {
                    let want =
                        evaluate(&v[..n as usize], Elem::root_of_unity(log_n).unwrap().pow(i));
                    assert_eq!(got[i as usize], want, "{what}: output {i}");
                }
            }
        }
        assert_same(
            &format!("round trip log_n={log_n}"),
            &a.to_vec().unwrap(),
            &v,
        );
    }
}

/// The polynomial with coefficients `coeffs` (lowest first) at `x`.
fn evaluate(coeffs: &[Elem], x: Elem) -> Elem {
    coeffs.iter().rev().fold(Elem::ZERO, |acc, &c| acc * x + c)
}

/// A coset LDE whose NTT reads the coefficients in its first pass (the default) gives what
/// the expansion kernel then the NTT give (`lde_fused_expand: false`), with the passes
/// compiled per size and with the generic ones: one-pass and multi-pass plans from `2^4`
/// to `2^24` points, blowups from 2 to 64 (past 16 the zero registers differ between
/// threads), one column and several; against `cpu_ops` up to `2^18` elements. The output
/// starts poisoned, so a position no pass writes shows.
#[test]
fn cuda_lde_reading_the_coefficients_matches_the_expansion() {
    let Some(device) = common::gpu() else { return };
    let hal: &cuda_hal::CudaHal = &device;
    assert!(hal.config().lde_fused_expand, "on by default");
    let with = |config: cuda_hal::HalConfig| cuda_hal::CudaHal::with_config(0, config).unwrap();
    let expanded = with(cuda_hal::HalConfig {
        lde_fused_expand: false,
        ..cuda_hal::HalConfig::default()
    });
    let generic = with(cuda_hal::HalConfig {
        ntt_fixed_passes: false,
        ..cuda_hal::HalConfig::default()
    });
    let mut rng = Rng::new(0x1de);
    let shapes = [
        (2, 2, 1),
        (3, 1, 3),
        (8, 3, 2),
        (10, 2, 4),
        (6, 6, 1),
        (12, 1, 1),
        (11, 4, 2),
        (14, 2, 3),
        (16, 2, 1),
        (12, 6, 1),
        (18, 2, 2),
        (20, 3, 1),
        (22, 2, 1),
        (16, 1, 16),
        (4, 2, 32),
        (6, 3, 64),
    ];
    for (log_n, log_blowup, cols) in shapes {
        let what = format!("2^{log_n} x {cols} blown up 2^{log_blowup}");
        let c = randoms::<Elem>(&mut rng, cols << log_n);
        let big = cols << (log_n + log_blowup);
        let lde = |hal: &cuda_hal::CudaHal| {
            let coeffs = hal.copy_from("coeffs", &c).unwrap();
            let out = poisoned(hal, "lde", big, poison_elem());
            Hal::coset_lde(hal, &out, &coeffs, log_n, log_blowup).unwrap();
            assert_same("the coefficients", &coeffs.to_vec().unwrap(), &c);
            out.to_vec().unwrap()
        };
        let got = lde(hal);
        assert_same(&format!("{what}, expanded first"), &got, &lde(&expanded));
        assert_same(&format!("{what}, generic passes"), &got, &lde(&generic));
        if big <= 1 << 18 {
            let mut want = vec![Elem::ZERO; big];
            cpu_ops::coset_lde(&mut want, &c, log_n, log_blowup);
            assert_same(&format!("{what}, cpu_ops"), &got, &want);
        }
    }
}

/// Past the memory for a whole batch's NTT scratch (a HAL's byte limit, here), the fused
/// NTT runs its columns in groups whose scratch fits; a coset LDE that cannot get even one
/// column's scratch is refused and leaves its output as it was. Before, the NTT failed with
/// `OutOfMemory`, and the LDE left its output expanded but not transformed.
#[test]
fn cuda_ntt_scratch_past_the_memory_limit() {
    let Some(_device) = common::gpu() else { return };
    let with_limit = |limit: usize| {
        let config = cuda_hal::HalConfig {
            memory_limit: Some(limit),
            ..cuda_hal::HalConfig::default()
        };
        cuda_hal::CudaHal::with_config(0, config).unwrap()
    };
    const K: usize = 1 << 10;
    let mut rng = Rng::new(0x5c4);
    // Five columns of 2^14 points (64 KiB each), and two twiddle tables (forward and
    // inverse, 32 KiB each): the scratch of two columns fits, of three does not.
    let (log_n, cols) = (14, 5);
    let hal = with_limit(5 * 64 * K + 2 * 32 * K + 2 * 64 * K + 16 * K);
    let v = randoms::<Elem>(&mut rng, cols << log_n);
    let io = hal.copy_from("io", &v).unwrap();
    hal.batch_ntt(&io, log_n, false).unwrap();
    let mut want = v.clone();
    cpu_ops::ntt(&mut want, log_n, false);
    assert_same("ntt in column groups", &io.to_vec().unwrap(), &want);
    hal.batch_ntt(&io, log_n, true).unwrap();
    assert_same("inverse in column groups", &io.to_vec().unwrap(), &v);
    let report = hal.memory_report();
    let scratch = report
        .by_name
        .iter()
        .find(|t| t.name == "prover-ntt-scratch");
    assert_eq!(
        scratch.map(|t| t.peak_bytes),
        Some(2 * 64 * K),
        "two columns at a time"
    );
    // An LDE of five columns of 2^12 to 2^14 points: coefficients 80 KiB, output 320 KiB,
    // shift powers 16 KiB, twiddles 32 KiB. Room for one column's scratch (64 KiB) but not
    // for two: in column groups too.
    let (log_n, log_blowup) = (12, 2);
    let c = randoms::<Elem>(&mut rng, cols << log_n);
    let lde = |limit: usize| {
        let hal = with_limit(limit);
        let coeffs = hal.copy_from("coeffs", &c).unwrap();
        let out = poisoned(&hal, "lde", cols << (log_n + log_blowup), poison_elem());
        let r = hal.coset_lde(&out, &coeffs, log_n, log_blowup);
        (r, out.to_vec().unwrap())
    };
    let fixed = (80 + 320 + 16 + 32) * K;
    let (r, got) = lde(fixed + 64 * K + 32 * K);
    r.unwrap();
    let mut want = vec![Elem::ZERO; cols << (log_n + log_blowup)];
    cpu_ops::coset_lde(&mut want, &c, log_n, log_blowup);
    assert_same("coset_lde in column groups", &got, &want);
    // No room for one column's scratch: refused before the output is touched.
    let (r, got) = lde(fixed + 32 * K);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    assert!(
        got.iter().all(|e| *e == poison_elem()),
        "the output is left as it was"
    );
}
