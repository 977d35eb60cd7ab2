//! Uses the HAL the way a prover backend does: uploads columns, runs kernels, reads single
//! elements and views, then prints the ledger and timings.
//!
//! `cargo run --release --example prover_demo`

use std::time::Instant;

use cuda_hal::{ops, CudaHal, PHASES};

fn main() {
    let hal = match CudaHal::new(0) {
        Ok(h) => h,
        Err(e) => {
            println!("No CUDA GPU available ({e}); nothing to run on the GPU here.");
            return;
        }
    };
    let info = hal.info();
    println!(
        "device 0: {} (sm_{}{}, {} SMs, {:.1} GiB), driver {}, phases: {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.driver_version,
        PHASES.label()
    );
    if let Err(e) = run(&hal) {
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

    let stats = hal.stats()?;
    let l = stats.ledger;
    println!("upload {COLS} x {} MiB: {upload:?}", (ROWS * 4) >> 20);
    println!("{} kernels: {kernels:?}", l.launches);
    println!("64 get_at reads: {reads:?}; two views of 16 MiB: {views:?}");
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
