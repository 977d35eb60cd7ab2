//! Uses the HAL the way a prover backend does: uploads columns, runs kernels, reads single
//! elements and views, then prints the ledger and timings.
//!
//! Then it runs a small prover flow through the backend-neutral [`Hal`] trait: interpolate
//! trace columns (inverse NTT), extend them onto a coset (LDE), commit to the rows with
//! Poseidon2 and a Merkle tree, and check an opening. Without a GPU (or with `--cpu`) only
//! that flow runs, on [`CpuHal`].
//!
//! `cargo run --release --example prover_demo [-- --cpu]`

use std::time::Instant;

use cuda_hal::field::Elem;
use cuda_hal::poseidon2::{compress, hash_row};
use cuda_hal::{ops, CpuHal, CudaHal, Digest, Hal, HalBuffer, PHASES};

fn main() {
    let gpu = if std::env::args().any(|a| a == "--cpu") {
        None
    } else {
        match CudaHal::new(0) {
            Ok(h) => Some(h),
            Err(e) => {
                println!("No CUDA GPU available ({e}); running the prover flow on the CPU HAL.");
                None
            }
        }
    };
    let Some(hal) = gpu else {
        if let Err(e) = prover_flow(&CpuHal::new()) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        return;
    };
    let info = hal.info();
    println!(
        "device 0: {} (sm_{}{}, {} SMs, {:.1} GiB), driver {}, phases: {}, NVTX ranges: {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.driver_version,
        PHASES.label(),
        if cuda_hal::nvtx::enabled() {
            "on"
        } else {
            "off"
        }
    );
    if let Err(e) = run(&hal).and_then(|()| prover_flow(&hal)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(hal: &CudaHal) -> cuda_hal::Result<()> {
    const ROWS: usize = 1 << 22; // 4 Mi rows, 16 MiB per column
    const COLS: usize = 8;
    let t = Instant::now();
    let columns: Vec<_> = (0..COLS)
        .map(|c| {
            let data: Vec<u32> = (0..ROWS as u32)
                .map(|r| r.wrapping_mul(31).wrapping_add(c as u32))
                .collect();
            hal.copy_from(format!("column-{c}"), &data)
        })
        .collect::<Result<_, _>>()?;
    let upload = t.elapsed();

    // Fold the columns pairwise: acc = sum of all columns (wrapping), mixed with a product.
    let t = Instant::now();
    let acc = hal.alloc_zeroed::<u32>("acc", ROWS)?;
    let tmp = hal.alloc::<u32>("tmp", ROWS)?;
    for c in &columns {
        ops::add(&tmp, &acc, c)?;
        acc.copy_from_buffer(&tmp)?;
    }
    let prod = hal.alloc::<u32>("prod", ROWS)?;
    ops::mul(&prod, &acc, &columns[0])?;
    hal.synchronize()?;
    let kernels = t.elapsed();

    // Merkle-style single-element reads, then a view of a whole column.
    let t = Instant::now();
    let mut checksum = 0u32;
    for i in (0..ROWS).step_by(ROWS / 64) {
        checksum = checksum.wrapping_add(prod.get_at(i)?);
    }
    let reads = t.elapsed();
    let t = Instant::now();
    let total = acc.view(|s| s.iter().fold(0u32, |a, b| a.wrapping_add(*b)))?;
    let again = acc.view(|s| s[ROWS - 1])?;
    let views = t.elapsed();

    // Check against the CPU.
    let want = |r: usize| -> u32 {
        let sum = (0..COLS as u32).fold(0u32, |a, c| {
            a.wrapping_add((r as u32).wrapping_mul(31).wrapping_add(c))
        });
        sum.wrapping_mul((r as u32).wrapping_mul(31))
    };
    let mut want_checksum = 0u32;
    for i in (0..ROWS).step_by(ROWS / 64) {
        want_checksum = want_checksum.wrapping_add(want(i));
    }
    assert_eq!(checksum, want_checksum, "GPU result differs from the CPU");
    let _ = (total, again);

    // Query openings: scattered elements of device-written columns in one gather, small
    // columns up and down in one batch each, and a batch of them through an arena.
    let t = Instant::now();
    let picks: Vec<(&cuda_hal::Buffer<u32>, usize)> = (0..64)
        .map(|k| (if k % 2 == 0 { &prod } else { &tmp }, (k * 65_537) % ROWS))
        .collect();
    let opened = hal.gather(&picks)?;
    assert_eq!(opened[0], want(0), "gathered opening");
    let small: Vec<Vec<u32>> = (0..4u32).map(|c| vec![c * 7 + 1; 1024]).collect();
    let quotient: Vec<_> = (0..small.len())
        .map(|c| hal.alloc::<u32>(format!("quotient-{c}"), 1024))
        .collect::<Result<_, _>>()?;
    let ups: Vec<_> = quotient
        .iter()
        .zip(&small)
        .map(|(b, d)| (b, &d[..]))
        .collect();
    hal.upload_batch(&ups)?;
    let mut back = vec![vec![0u32; 1024]; small.len()];
    let mut downs: Vec<_> = quotient
        .iter()
        .zip(&mut back)
        .map(|(b, d)| (b, &mut d[..]))
        .collect();
    hal.download_batch(&mut downs)?;
    assert_eq!(back, small, "batch round trip");
    let mut arena = hal.batch_arena("openings", 1 << 20, cuda_hal::ArenaLayout::Bump)?;
    let batch = arena.begin_batch();
    let staged = batch.upload(&[("opening-a", &small[0][..]), ("opening-b", &small[1][..])])?;
    assert_eq!(staged[1].get_at(1023)?, small[1][1023], "arena batch");
    drop(staged);
    drop(batch);
    let openings = t.elapsed();

    let stats = hal.stats()?;
    let l = stats.ledger;
    println!("upload {COLS} x {} MiB: {upload:?}", (ROWS * 4) >> 20);
    println!("{} kernels: {kernels:?}", l.launches);
    println!("64 get_at reads: {reads:?}; two views of 16 MiB: {views:?}");
    println!("openings (a gather, two batches and an arena batch): {openings:?}");
    println!(
        "ledger: H2D {} B in {} copies, D2H {} B in {} copies, D2D {} B in {} copies",
        l.h2d.bytes, l.h2d.calls, l.d2h.bytes, l.d2h.calls, l.d2d.bytes, l.d2d.calls
    );
    println!(
        "allocations: {} pool, {} driver, {} frees; cache {} hits / {} misses",
        l.pool_allocs, l.driver_allocs, l.frees, l.cache_hits, l.cache_misses
    );
    println!(
        "pool: used {} B (high {}), reserved {} B (high {}); staging: {} pinned B, {} reuses",
        stats.pool.used_current,
        stats.pool.used_high,
        stats.pool.reserved_current,
        stats.pool.reserved_high,
        stats.staging.pinned_bytes,
        stats.staging.slot_reuses
    );
    println!("checksum {checksum:#010x} matches the CPU");
    Ok(())
}

/// A small commitment flow, written once for any backend.
fn prover_flow<H: Hal>(hal: &H) -> cuda_hal::Result<()> {
    const LOG_N: u32 = 12; // 4096 rows
    const LOG_BLOWUP: u32 = 2; // LDE onto 16384 points
    const COLS: usize = 8;
    let n = 1usize << LOG_N;
    let big = n << LOG_BLOWUP;

    // Trace columns (column-major): column c is a Fibonacci-like sequence seeded with (1, c).
    let trace: Vec<Elem> = (0..COLS)
        .flat_map(|c| {
            let (mut a, mut b) = (Elem::ONE, Elem::new(c as u32));
            (0..n).map(move |_| {
                let x = a;
                (a, b) = (b, a + b);
                x
            })
        })
        .collect();

    let t = Instant::now();
    let coeffs = hal.copy_from("trace", &trace)?;
    hal.batch_ntt(&coeffs, LOG_N, true)?; // evaluations on H -> coefficients
    let lde = hal.alloc::<Elem>("lde", COLS * big)?;
    hal.coset_lde(&lde, &coeffs, LOG_N, LOG_BLOWUP)?; // evaluations on 31*H'
    let leaves = hal.alloc::<Digest>("leaves", big)?;
    hal.poseidon2_hash_rows(&leaves, &lde, big, COLS)?;
    let mut layers = vec![leaves];
    while let Some(last) = layers.last().filter(|l| l.len() > 1) {
        let next = hal.alloc::<Digest>(format!("layer-{}", last.len() / 2), last.len() / 2)?;
        hal.merkle_layer(&next, last)?;
        layers.push(next);
    }
    hal.synchronize()?;
    let elapsed = t.elapsed();
    let root = layers[layers.len() - 1].get_at(0)?;

    // Check 1: the LDE is the interpolant of column 0 evaluated on the shifted coset.
    let c0 = coeffs.slice(0, n)?.to_vec()?;
    let w = Elem::root_of_unity(LOG_N + LOG_BLOWUP).unwrap_or_default();
    let i = 12_345;
    let x = Elem::GENERATOR * w.pow(i as u64);
    let want = c0.iter().rev().fold(Elem::ZERO, |acc, &k| acc * x + k);
    assert_eq!(lde.get_at(i)?, want, "LDE point {i}");

    // Check 2: open row i against the root: leaf hash, then the authentication path.
    let row: Vec<Elem> = (0..COLS)
        .map(|c| lde.get_at(c * big + i))
        .collect::<Result<_, _>>()?;
    let mut node = hash_row(&row);
    let mut index = i;
    for layer in &layers[..layers.len() - 1] {
        let sibling = layer.get_at(index ^ 1)?;
        node = if index % 2 == 0 {
            compress(&node, &sibling)
        } else {
            compress(&sibling, &node)
        };
        index /= 2;
    }
    assert_eq!(node, root, "Merkle opening of row {i}");

    println!("backend: {}", hal.name());
    println!(
        "{COLS} columns x {n} rows: inverse NTT, LDE x{} onto the coset 31*H ({big} points), \
         Poseidon2 row hashes, {} Merkle layers: {elapsed:?}",
        1 << LOG_BLOWUP,
        layers.len() - 1
    );
    println!("Merkle root: {root:?}");
    println!("row {i} opens against the root; the LDE matches direct evaluation");
    Ok(())
}
