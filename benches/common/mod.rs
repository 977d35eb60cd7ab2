//! Timing helpers shared by the GPU benchmarks.
#![allow(dead_code)]

use std::time::Instant;

pub mod alloc_mix;

/// A HAL of device 0 with `staging` and the default configuration otherwise: for timing
/// one staging setting against the default in the same process.
pub fn hal_with_staging(staging: cuda_hal::StagingConfig) -> cuda_hal::CudaHal {
    let config = cuda_hal::HalConfig {
        staging,
        ..cuda_hal::HalConfig::default()
    };
    cuda_hal::CudaHal::with_config(0, config).unwrap()
}

/// Median microseconds of `f` after two warm-up calls, over at least `min_iters` runs and
/// about `budget_ms` (at most 200 000 runs).
pub fn median_us(min_iters: usize, budget_ms: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < min_iters || (start.elapsed().as_millis() as u64) < budget_ms {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        if samples.len() >= 200_000 {
            break;
        }
    }
    median(&mut samples)
}

/// Medians in microseconds of `a` and `b` timed in turns (the order flipping each turn)
/// after two warm-up calls each, over at least `min_iters` turns and about `budget_ms`: a
/// floor and the crate measured this way see the same drift of the machine.
pub fn paired_median_us(
    min_iters: usize,
    budget_ms: u64,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    for _ in 0..2 {
        a();
        b();
    }
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let time = |f: &mut dyn FnMut(), samples: &mut Vec<f64>| {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    };
    while sa.len() < min_iters || (start.elapsed().as_millis() as u64) < budget_ms {
        if sa.len() % 2 == 0 {
            time(&mut a, &mut sa);
            time(&mut b, &mut sb);
        } else {
            time(&mut b, &mut sb);
            time(&mut a, &mut sa);
        }
        if sa.len() >= 100_000 {
            break;
        }
    }
    (median(&mut sa), median(&mut sb))
}

/// The median of `v` (the upper one of an even count); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A 95% confidence interval of the median of `v`: the 2.5th and 97.5th percentiles of
/// the medians of 4000 resamples of `v` (with replacement; a fixed seed, so that a run's
/// figures can be reproduced from its printed values).
pub fn median_ci95(v: &[f64]) -> (f64, f64) {
    const RESAMPLES: usize = 4000;
    // xorshift64*: plenty for resampling indices.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: usize| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    };
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let mut s: Vec<f64> = (0..v.len()).map(|_| v[next(v.len())]).collect();
            median(&mut s)
        })
        .collect();
    medians.sort_by(|a, b| a.total_cmp(b));
    (
        medians[RESAMPLES / 40],
        medians[RESAMPLES - 1 - RESAMPLES / 40],
    )
}

/// GB/s for `bytes` moved in `us` microseconds.
pub fn gbps(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us / 1e3
}
