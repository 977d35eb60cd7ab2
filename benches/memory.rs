//! Issue #5 benchmarks (all-features build): tracking overhead, resize, arena batches.
//! `ROW|memory|operation|crate_us|floor|floor_us|bytes|target`.

mod common;

use std::time::Instant;

use common::median_us;

use cuda_hal::cuda_sys;
use cuda_hal::{ArenaLayout, CudaHal, HalConfig};

const MIB: usize = 1 << 20;

fn row(op: &str, crate_us: f64, floor: &str, floor_us: f64, bytes: i64, target: &str) {
    println!("ROW|memory|{op}|{crate_us:.3}|{floor}|{floor_us:.3}|{bytes}|{target}");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Ok(hal) = CudaHal::new(0) else {
        return println!("SKIPPED: no GPU");
    };
    hal.synchronize().unwrap();
    tracking_overhead();
    resize(&hal);
    arena(&hal);
}

/// Alloc+free of mixed sizes on two HALs, tracking on and off, measured pairwise: batches
/// of alloc+frees alternate between the two HALs (the order flips every pair), so drift
/// in the machine's speed, which on the VM is larger than the effect, hits both alike.
/// The overhead is the ratio of the two HALs' median batch times over all pairs; the
/// spread is the range of that ratio over ten consecutive slices of the run. Measured with
/// the phase-3 block cache on (the fastest path, about 0.25 us) and off (the pool).
fn tracking_overhead() {
    const BATCH: usize = 32;
    const PAIRS: usize = 20_000;
    const SLICES: usize = 10;
    let sizes = [4 << 10, 64 << 10, MIB, 16 * MIB, 64 * MIB, 256 * MIB];
    // Microseconds of one batch of BATCH alloc+frees.
    let batch = |hal: &CudaHal, k: &mut usize| {
        let t = Instant::now();
        for _ in 0..BATCH {
            let b = hal.alloc::<u8>("mixed", sizes[*k % sizes.len()]).unwrap();
            *k += 1;
            drop(b);
        }
        t.elapsed().as_secs_f64() * 1e6
    };
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for cache in [1usize << 30, 0] {
        let cfg = |track| HalConfig {
            track_allocations: track,
            block_cache_bytes: cache,
            ..Default::default()
        };
        let on = CudaHal::with_config(0, cfg(true)).unwrap();
        let off = CudaHal::with_config(0, cfg(false)).unwrap();
        let (mut k_on, mut k_off) = (0usize, 0usize);
        for _ in 0..200 {
            batch(&on, &mut k_on);
            batch(&off, &mut k_off);
        }
        let (mut t_on, mut t_off) = (Vec::with_capacity(PAIRS), Vec::with_capacity(PAIRS));
        for pair in 0..PAIRS {
            if pair % 2 == 0 {
                t_on.push(batch(&on, &mut k_on));
                t_off.push(batch(&off, &mut k_off));
            } else {
                t_off.push(batch(&off, &mut k_off));
                t_on.push(batch(&on, &mut k_on));
            }
        }
        let (a, b) = (median(&t_on) / BATCH as f64, median(&t_off) / BATCH as f64);
        let slice = PAIRS / SLICES;
        let mut ratios: Vec<f64> = (0..SLICES)
            .map(|i| {
                let r = i * slice..(i + 1) * slice;
                median(&t_on[r.clone()]) / median(&t_off[r])
            })
            .collect();
        ratios.sort_by(|a, b| a.total_cmp(b));
        let pct = |r: f64| (r - 1.0) * 100.0;
        let label = if cache > 0 {
            "block cache on"
        } else {
            "block cache off"
        };
        row(
            &format!("alloc+free mixed, {label}, tracking on"),
            a,
            "same, tracking off",
            b,
            -1,
            "<1% overhead",
        );
        println!(
            "INFO|memory|tracking overhead on alloc+free ({label}): {:+.2}% ({a:.4} us vs {b:.4} us, medians of {PAIRS} interleaved batch pairs of {BATCH}; {SLICES} slices ranged {:+.2}% to {:+.2}%)",
            pct(a / b),
            pct(ratios[0]),
            pct(ratios[SLICES - 1]),
        );
    }
}

fn resize(hal: &CudaHal) {
    let n = 256 * MIB / 4;
    let b = hal.alloc::<u32>("resize-src", n).unwrap();
    b.fill(3).unwrap();
    let dst = hal.alloc::<u32>("resize-dst", 2 * n).unwrap();
    let (s, d) = (
        b.device_ptr().unwrap().addr,
        dst.device_ptr_mut().unwrap().addr,
    );
    hal.synchronize().unwrap();
    let stream = hal.main_stream();
    let floor = median_us(20, 300, || unsafe {
        // SAFETY: both ranges are live allocations of at least 256 MiB.
        cuda_sys::driver()
            .unwrap()
            .cuMemcpyDtoDAsync(d, s, 256 * MIB, stream.raw())
            .unwrap();
        cuda_sys::driver()
            .unwrap()
            .cuStreamSynchronize(stream.raw())
            .unwrap();
    });
    drop(dst);
    let t = median_us(20, 300, || {
        let g = b.resized(2 * n).unwrap();
        hal.synchronize().unwrap();
        drop(g);
    });
    row(
        "resize 256 MiB -> 512 MiB (alloc + D2D + sync)",
        t,
        "D2D 256 MiB",
        floor,
        (256 * MIB) as i64,
        "<1000us, aim 300us",
    );
    let t = median_us(20, 300, || {
        let g = b.resized(n / 2).unwrap();
        hal.synchronize().unwrap();
        drop(g);
    });
    row(
        "shrink 256 MiB -> 128 MiB",
        t,
        "D2D 256 MiB",
        floor,
        (128 * MIB) as i64,
        "-",
    );
}

fn arena(hal: &CudaHal) {
    let parts: Vec<Vec<u32>> = (0..8).map(|k| vec![k; 64 * 1024]).collect();
    let mut arena = hal
        .batch_arena("bench-arena", 4 * MIB, ArenaLayout::Bump)
        .unwrap();
    let t = median_us(200, 300, || {
        let batch = arena.begin_batch();
        let items: Vec<(&str, &[u32])> = parts.iter().map(|p| ("part", &p[..])).collect();
        let v = batch.upload(&items).unwrap();
        drop(v);
    });
    let t_alloc = median_us(200, 300, || {
        let bufs: Vec<_> = parts
            .iter()
            .map(|p| hal.copy_from("part", p).unwrap())
            .collect();
        drop(bufs);
    });
    row(
        "arena batch: 8 x 256 KiB views + one upload",
        t,
        "8 x copy_from (alloc + upload)",
        t_alloc,
        (8 * 256 * 1024) as i64,
        "-",
    );
}
