//! Issue #5 benchmarks (all-features build): tracking overhead, resize, arena batches.
//! `ROW|memory|operation|crate_us|floor|floor_us|bytes|target`.
//!
//! `bench-memory --bench [tracking|resize|arena]...` runs only the named sections.
//!
//! The tracking overhead is measured in several fresh processes (this bench runs itself
//! again): within one process the pairs of HALs agree closely, but from one process to
//! the next the figure moves by a few nanoseconds with where the code and heap land.

mod common;

use std::process::Command;
use std::time::Instant;

use common::alloc_mix::{NAMES, SIZES};
use common::{hal_with_staging, median, median_ci95, median_us, paired_median_us};

use cuda_hal::cuda_sys;
use cuda_hal::{ArenaLayout, CudaHal, HalConfig, StagingConfig};

const MIB: usize = 1 << 20;

/// Set in the processes [`tracking_overhead`] starts: run one measurement, print it, exit.
const TRACKING_CHILD: &str = "CUDA_HAL_BENCH_TRACKING_RUN";
/// Processes the tracking overhead is measured in (odd, for a median), unless
/// `CUDA_HAL_TRACKING_PROCESSES` says otherwise. From one process to the next the cached
/// figure moves by about a point (code and heap placement); 25 bring the 95% interval of
/// the median to about a quarter of a point either side.
const TRACKING_PROCESSES: usize = 25;

/// The count the environment variable `name` gives (at least 1), or `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
        .max(1)
}

fn row(op: &str, crate_us: f64, floor: &str, floor_us: f64, bytes: i64, target: &str) {
    println!("ROW|memory|{op}|{crate_us:.3}|{floor}|{floor_us:.3}|{bytes}|{target}");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::var_os(TRACKING_CHILD).is_some() {
        return tracking_run();
    }
    let Ok(hal) = CudaHal::new(0) else {
        return println!("SKIPPED: no GPU");
    };
    hal.synchronize().unwrap();
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |s: &str| sections.is_empty() || sections.iter().any(|a| a == s);
    if wanted("tracking") {
        tracking_overhead();
    }
    if wanted("resize") {
        resize(&hal);
    }
    if wanted("arena") {
        arena(&hal);
    }
}

/// The tracking overhead: [`tracking_run`] in [`TRACKING_PROCESSES`] fresh processes; the
/// row is the process with the median ratio, and every process's figure is printed, with
/// the control: how far apart two HALs of the same kind land, which bounds what the bench
/// can resolve.
fn tracking_overhead() {
    let exe = std::env::current_exe().expect("the bench's own path");
    // label -> (on us, off us) per process, and the control percentages (off vs off, on
    // vs on) of every process
    type Measured = (String, Vec<(f64, f64)>, Vec<f64>);
    let mut runs: Vec<Measured> = Vec::new();
    let processes = env_count("CUDA_HAL_TRACKING_PROCESSES", TRACKING_PROCESSES);
    for _ in 0..processes {
        let out = Command::new(&exe)
            .arg("--bench")
            .env(TRACKING_CHILD, "1")
            .output()
            .expect("start a tracking measurement");
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains("RUN|") {
            println!("ERROR|memory|tracking measurement failed: {text}");
            std::process::exit(1);
        }
        for line in text.lines().filter_map(|l| l.strip_prefix("RUN|")) {
            let f: Vec<&str> = line.split('|').collect();
            let num = |i: usize| -> f64 { f[i].parse().unwrap() };
            let i = match runs.iter().position(|(label, ..)| label == f[0]) {
                Some(i) => i,
                None => {
                    runs.push((f[0].to_string(), Vec::new(), Vec::new()));
                    runs.len() - 1
                }
            };
            runs[i].1.push((num(1), num(2)));
            runs[i].2.extend([num(3), num(4)]);
        }
        for line in text.lines().filter(|l| l.starts_with("INFO|")) {
            println!("{line}");
        }
    }
    for (label, mut v, mut control) in runs {
        v.sort_by(|x, y| (x.0 / x.1).total_cmp(&(y.0 / y.1)));
        let (a, b) = v[v.len() / 2];
        let pct = |(a, b): (f64, f64)| (a / b - 1.0) * 100.0;
        row(
            &format!("alloc+free mixed, {label}, tracking on"),
            a,
            "same, tracking off",
            b,
            -1,
            "<1% overhead",
        );
        let each: Vec<String> = v
            .iter()
            .map(|&r| format!("{:+.2}% ({:+.1} ns)", pct(r), (r.0 - r.1) * 1e3))
            .collect();
        let quarter = v.len() / 4;
        let ratios: Vec<f64> = v.iter().map(|&r| pct(r)).collect();
        let (low, high) = median_ci95(&ratios);
        println!(
            "INFO|memory|tracking overhead on alloc+free ({label}): median {:+.2}% ({:+.2} ns: {a:.4} us vs {b:.4} us) over {} processes, 95% interval of the median {low:+.2}% to {high:+.2}%, middle half {:+.2}% to {:+.2}%; each: {}",
            pct((a, b)),
            (a - b) * 1e3,
            v.len(),
            pct(v[quarter]),
            pct(v[v.len() - 1 - quarter]),
            each.join(", "),
        );
        // The pool path is bimodal from one process to the next (so is the raw driver
        // pair): the halves by untracked time show each mode's own figure.
        let mut by_base = v.clone();
        by_base.sort_by(|x, y| x.1.total_cmp(&y.1));
        let (faster, slower) = by_base.split_at(by_base.len() / 2);
        let half = |h: &[(f64, f64)]| -> String {
            let mut r: Vec<f64> = h.iter().map(|&(a, b)| a / b).collect();
            let mut ns: Vec<f64> = h.iter().map(|&(a, b)| (a - b) * 1e3).collect();
            let mut base: Vec<f64> = h.iter().map(|&(_, b)| b).collect();
            format!(
                "{:+.2}% ({:+.1} ns on {:.3} us) over {}",
                (median(&mut r) - 1.0) * 100.0,
                median(&mut ns),
                median(&mut base),
                h.len()
            )
        };
        if !faster.is_empty() {
            println!(
                "INFO|memory|  by untracked time ({label}): faster half {}; slower half {}",
                half(faster),
                half(slower),
            );
        }
        control.sort_by(|x, y| x.abs().total_cmp(&y.abs()));
        let each: Vec<String> = control.iter().map(|x| format!("{x:+.2}%")).collect();
        println!(
            "INFO|memory|  control ({label}): two HALs of the same kind differ by a median {:.2}% (largest {:.2}%) over {} pairs: {}",
            control[control.len() / 2].abs(),
            control[control.len() - 1].abs(),
            control.len(),
            each.join(", "),
        );
    }
}

/// One measurement of the tracking overhead, in this process: alloc+free of mixed sizes
/// and names on HALs with tracking on and off, measured pairwise. Batches of alloc+frees
/// rotate over two HALs of each kind (made in the order on, off, off, on, and visited in
/// an order that flips every round), so that drift in the machine's speed, which on the
/// VM is larger than the effect, and where each HAL's state lies in memory hit both kinds
/// alike. Prints `RUN|label|on us|off us|control off %|control on %` (medians of the
/// kinds' batch times, and how far the later HAL of each kind lands from the earlier one)
/// and the spread over ten consecutive slices of the run and between the two pairs.
/// Measured with the phase-3 block cache on (the fastest path, about 0.2 us) and off (the
/// pool).
fn tracking_run() {
    let batch_ops = env_count("CUDA_HAL_TRACKING_BATCH", 32);
    // The same number of alloc+frees whatever the batch.
    let rounds = (320_000 / batch_ops).max(20);
    const SLICES: usize = 10;
    // Microseconds of one batch of `batch_ops` alloc+frees.
    let batch = |hal: &CudaHal, k: &mut usize| {
        let t = Instant::now();
        for _ in 0..batch_ops {
            let b = hal
                .alloc::<u8>(NAMES[*k % NAMES.len()], SIZES[*k % SIZES.len()])
                .unwrap();
            *k += 1;
            drop(b);
        }
        t.elapsed().as_secs_f64() * 1e6
    };
    for cache in [1usize << 30, 0] {
        let cfg = |track| HalConfig {
            track_allocations: track,
            block_cache_bytes: cache,
            ..Default::default()
        };
        // (hal, tracking) in creation order; each kind once early and once late.
        let hals: Vec<(CudaHal, bool)> = [true, false, false, true]
            .into_iter()
            .map(|track| (CudaHal::with_config(0, cfg(track)).unwrap(), track))
            .collect();
        let mut next = vec![0usize; hals.len()];
        let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); hals.len()];
        for round in 0..rounds + 100 {
            for i in 0..hals.len() {
                let i = if round % 2 == 0 {
                    i
                } else {
                    hals.len() - 1 - i
                };
                let t = batch(&hals[i].0, &mut next[i]);
                if round >= 100 {
                    times[i].push(t);
                }
            }
        }
        // The batch times of one kind over rounds `r`.
        let kind = |track: bool, r: std::ops::Range<usize>| -> Vec<f64> {
            (0..hals.len())
                .filter(|&i| hals[i].1 == track)
                .flat_map(|i| times[i][r.clone()].to_vec())
                .collect()
        };
        let (a, b) = (
            median(&mut kind(true, 0..rounds)) / batch_ops as f64,
            median(&mut kind(false, 0..rounds)) / batch_ops as f64,
        );
        let slice = rounds / SLICES;
        let mut ratios: Vec<f64> = (0..SLICES)
            .map(|i| {
                let r = i * slice..(i + 1) * slice;
                median(&mut kind(true, r.clone())) / median(&mut kind(false, r))
            })
            .collect();
        ratios.sort_by(|a, b| a.total_cmp(b));
        let pct = |r: f64| (r - 1.0) * 100.0;
        // HAL i against HAL j, in percent. The pairs in creation order are (0, 1), the
        // first on and off, and (3, 2), the last; the control is (2, 1) and (3, 0).
        let ratio =
            |i: usize, j: usize| pct(median(&mut times[i].clone()) / median(&mut times[j].clone()));
        let label = if cache > 0 {
            "block cache on"
        } else {
            "block cache off"
        };
        println!("RUN|{label}|{a}|{b}|{}|{}", ratio(2, 1), ratio(3, 0));
        println!(
            "INFO|memory|  one process ({label}): {:+.2}% ({a:.4} us vs {b:.4} us, medians of {rounds} rounds of one {batch_ops}-op batch per HAL, 2 HALs per kind; {SLICES} slices {:+.2}% to {:+.2}%; pairs {:+.2}% and {:+.2}%)",
            pct(a / b),
            pct(ratios[0]),
            pct(ratios[SLICES - 1]),
            ratio(0, 1),
            ratio(3, 2),
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
    // The raw copy of the bytes a resize keeps, and a sync.
    let d2d = |bytes: usize| {
        median_us(20, 300, || unsafe {
            // SAFETY: both ranges are live allocations of at least 256 MiB >= bytes.
            cuda_sys::driver()
                .unwrap()
                .cuMemcpyDtoDAsync(d, s, bytes, stream.raw())
                .unwrap();
            cuda_sys::driver()
                .unwrap()
                .cuStreamSynchronize(stream.raw())
                .unwrap();
        })
    };
    let (floor, floor_half) = (d2d(256 * MIB), d2d(128 * MIB));
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
        "D2D 128 MiB",
        floor_half,
        (128 * MIB) as i64,
        "-",
    );
}

fn arena(hal: &CudaHal) {
    let parts: Vec<Vec<u32>> = (0..8).map(|k| vec![k; 64 * 1024]).collect();
    let part_bytes = 64 * 1024 * 4;
    let mut arena = hal
        .batch_arena("bench-arena", 4 * MIB, ArenaLayout::Bump)
        .unwrap();
    let t = median_us(200, 300, || {
        let batch = arena.begin_batch();
        let items: Vec<(&str, &[u32])> = parts.iter().map(|p| ("part", &p[..])).collect();
        let v = batch.upload(&items).unwrap();
        hal.synchronize().unwrap();
        drop(v);
    });
    let t_alloc = median_us(200, 300, || {
        let bufs: Vec<_> = parts
            .iter()
            .map(|p| hal.copy_from("part", p).unwrap())
            .collect();
        hal.synchronize().unwrap();
        drop(bufs);
    });
    // The raw floor: the same eight pageable slices copied by the driver into one region
    // allocated once, each with a synchronous cuMemcpyHtoD (what a hand-rolled batch does).
    let region = hal
        .alloc::<u32>("bench-arena-floor", 8 * 64 * 1024)
        .unwrap();
    let base = region.device_ptr_mut().unwrap().addr;
    hal.synchronize().unwrap();
    let d = cuda_sys::driver().unwrap();
    let floor = median_us(200, 300, || {
        for (k, p) in parts.iter().enumerate() {
            // SAFETY: the region holds 8 parts of `part_bytes`; `p` is a live host slice of
            // that many bytes.
            unsafe {
                d.cuMemcpyHtoD(
                    base + (k * part_bytes) as u64,
                    p.as_ptr().cast(),
                    part_bytes,
                )
            }
            .unwrap();
        }
    });
    row(
        "arena batch: 8 x 256 KiB views + one upload (+ sync)",
        t,
        "8 x cuMemcpyHtoD pageable into one region",
        floor,
        (8 * part_bytes) as i64,
        "-",
    );
    row(
        "8 x copy_from, 256 KiB each (alloc + upload, + sync)",
        t_alloc,
        "8 x cuMemcpyHtoD pageable into one region",
        floor,
        (8 * part_bytes) as i64,
        "-",
    );
    println!(
        "INFO|memory|arena batch {t:.1} us against 8 separate copy_from {t_alloc:.1} us: {:.2}x faster",
        t_alloc / t
    );
    drop(region);
    arena_stores(hal, &parts);
    large_arena_batch(hal);
}

/// The 8 x 256 KiB batch packed with streaming stores (the default) and with plain ones
/// (`streaming_upload_max_bytes` 0), in turns.
fn arena_stores(hal: &CudaHal, parts: &[Vec<u32>]) {
    let plain = hal_with_staging(StagingConfig {
        streaming_upload_max_bytes: 0,
        ..StagingConfig::default()
    });
    let items: Vec<(&str, &[u32])> = parts.iter().map(|p| ("part", &p[..])).collect();
    let mut arenas = [hal, &plain].map(|h| {
        h.batch_arena("bench-arena-stores", 4 * MIB, ArenaLayout::Bump)
            .unwrap()
    });
    let [streaming, plain_stores] = &mut arenas;
    let batch = |arena: &mut cuda_hal::BatchArena, h: &CudaHal| {
        let batch = arena.begin_batch();
        let v = batch.upload(&items).unwrap();
        h.synchronize().unwrap();
        drop(v);
    };
    let (t_stream, t_plain) = paired_median_us(
        200,
        400,
        || batch(streaming, hal),
        || batch(plain_stores, &plain),
    );
    println!(
        "INFO|memory|arena batch 8 x 256 KiB: {t_stream:.1} us packed with streaming stores, {t_plain:.1} us with plain ones, timed in turns ({:+.1}%)",
        (t_stream / t_plain - 1.0) * 100.0
    );
}

/// A batch larger than the pinned pool (256 MiB by default): two views of 192 MiB, packed
/// through the staging slots, against the driver copying the same pageable slices into
/// one region.
fn large_arena_batch(hal: &CudaHal) {
    let part = 192 * MIB;
    let parts: Vec<Vec<u32>> = (0..2u32).map(|k| vec![k + 1; part / 4]).collect();
    let mut arena = hal
        .batch_arena("bench-arena-large", 2 * part + 4096, ArenaLayout::Bump)
        .unwrap();
    let t = median_us(5, 3000, || {
        let batch = arena.begin_batch();
        let v = batch
            .upload(&[("a", &parts[0][..]), ("b", &parts[1][..])])
            .unwrap();
        hal.synchronize().unwrap();
        drop(v);
    });
    let region = hal
        .alloc::<u8>("bench-arena-large-floor", 2 * part)
        .unwrap();
    let base = region.device_ptr_mut().unwrap().addr;
    hal.synchronize().unwrap();
    let d = cuda_sys::driver().unwrap();
    let floor = median_us(5, 3000, || {
        for (k, p) in parts.iter().enumerate() {
            // SAFETY: the region holds two parts of `part` bytes; `p` is a live host slice
            // of that many bytes.
            unsafe { d.cuMemcpyHtoD(base + (k * part) as u64, p.as_ptr().cast(), part) }.unwrap();
        }
    });
    row(
        "arena batch: 2 x 192 MiB, past the pinned pool (+ sync)",
        t,
        "2 x cuMemcpyHtoD pageable into one region",
        floor,
        (2 * part) as i64,
        "-",
    );
    let st = hal.stats().unwrap();
    println!(
        "INFO|memory|large arena batch: pinned pool {:?}, staging {:?}",
        st.pinned, st.staging
    );
}
