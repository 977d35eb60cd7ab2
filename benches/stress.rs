//! Concurrency stress (issue #7): N threads on one HAL and M HALs on one device, each
//! looping alloc, upload, kernel, get_at, view and free. Prints operations per second; the
//! floor is the same loop on one thread. Then the start of a HAL, its kernels loaded then
//! or at their first use (`HalConfig::preload_kernels`), alone on its device or beside
//! another HAL, whose kernels it shares.

mod common;

use std::time::{Duration, Instant};

use cuda_hal::{ops, CudaHal, HalConfig};

fn round(hal: &CudaHal, data: &[u32]) {
    let a = hal.copy_from("stress-a", data).unwrap();
    let out = hal.alloc::<u32>("stress-out", data.len()).unwrap();
    ops::add(&out, &a, &a).unwrap();
    assert_eq!(out.get_at(7).unwrap(), data[7].wrapping_mul(2));
    assert_eq!(
        out.view(|s| s[data.len() - 1]).unwrap(),
        data[data.len() - 1].wrapping_mul(2)
    );
}

/// Rounds per second with `threads` threads spread over `hals`, for `dur`.
fn throughput(hals: &[CudaHal], threads: usize, dur: Duration) -> f64 {
    let data: Vec<u32> = (0..64 * 1024).collect();
    let start = Instant::now();
    let done: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let hal = hals[t % hals.len()].clone();
                let data = &data;
                s.spawn(move || {
                    let mut n = 0usize;
                    while start.elapsed() < dur {
                        round(&hal, data);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    done as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Ok(hal) = CudaHal::new(0) else {
        return println!("SKIPPED: no GPU");
    };
    let dur = Duration::from_millis(1500);
    let one = throughput(std::slice::from_ref(&hal), 1, dur);
    let one_us = 1e6 / one;
    for threads in [4usize, 8, 16] {
        let r = throughput(std::slice::from_ref(&hal), threads, dur);
        println!(
            "ROW|stress|{threads} threads, one HAL (us per round)|{:.3}|1 thread|{one_us:.3}|-1|-",
            1e6 / r
        );
        println!(
            "INFO|stress|{threads} threads on one HAL: {r:.0} rounds/s ({:.2}x one thread)",
            r / one
        );
    }
    let hals: Vec<CudaHal> = (0..4).map(|_| CudaHal::new(0).unwrap()).collect();
    for threads in [4usize, 16] {
        let r = throughput(&hals, threads, dur);
        println!("ROW|stress|{threads} threads, 4 HALs on one device (us per round)|{:.3}|1 thread|{one_us:.3}|-1|-", 1e6 / r);
        println!(
            "INFO|stress|{threads} threads over 4 HALs: {r:.0} rounds/s ({:.2}x one thread)",
            r / one
        );
    }
    println!("INFO|stress|a round: alloc + 256 KiB upload + add kernel + get_at + view + 2 frees; one thread: {one:.0} rounds/s");
    // The starts below are of a device's only HAL: its context kept, no HAL on it.
    let _ctx = cuda_hal::driver::PrimaryContext::retain(0).unwrap();
    drop((hals, hal));
    hal_starts();
}

/// A new HAL, its kernels loaded as it starts (`preload`) or at their first use; with
/// `fill`, then a first kernel (an 8-byte fill of 1 MiB) and a wait for it.
fn start_hal(preload: bool, fill: bool) {
    let config = HalConfig {
        preload_kernels: preload,
        ..HalConfig::default()
    };
    let hal = CudaHal::with_config(0, config).unwrap();
    if fill {
        let b = hal.alloc::<u64>("first fill", 1 << 17).unwrap();
        b.fill(7).unwrap();
        hal.synchronize().unwrap();
    }
}

/// The start of a device's only HAL with its kernels loaded then, against loading them at
/// first use; then of a HAL beside another, which shares its kernels.
fn hal_starts() {
    let mut only = 0.0;
    for fill in [false, true] {
        let (preloaded, lazy) = common::paired_median_us(
            10,
            3000,
            || start_hal(true, fill),
            || start_hal(false, fill),
        );
        let what = match fill {
            false => "CudaHal::with_config",
            true => "CudaHal::with_config + first fill + sync",
        };
        println!(
            "ROW|stress|{what}, kernels loaded at the start (us)|{preloaded:.1}|{what}, kernels loaded at first use|{lazy:.1}|-1|-"
        );
        if !fill {
            only = preloaded;
        }
    }
    let first = CudaHal::new(0).unwrap();
    let beside = common::median_us(10, 3000, || start_hal(true, false));
    drop(first);
    println!(
        "ROW|stress|CudaHal::with_config beside a HAL on the device, kernels shared (us)|{beside:.1}|CudaHal::with_config, the device's only HAL|{only:.1}|-1|-"
    );
    start_parts();
}

/// What a HAL's start is made of: each part made and dropped on its own (the device's
/// context kept current meanwhile), against a whole HAL with its kernels loaded at first
/// use, to see where the start's time goes.
fn start_parts() {
    use cuda_hal::driver::{DeviceInfo, MemPool, Module, PrimaryContext, Stream};
    let ctx = PrimaryContext::retain(0).unwrap();
    ctx.bind().unwrap();
    let part = |f: &mut dyn FnMut()| common::median_us(10, 1000, f);
    let info = part(&mut || drop(DeviceInfo::query(0).unwrap()));
    let stream = part(&mut || drop(Stream::new_non_blocking().unwrap()));
    let pool = part(&mut || drop(MemPool::new(0, u64::MAX).unwrap()));
    let module = part(&mut || drop(Module::load(cuda_hal::FATBIN).unwrap()));
    let mut kernels = 0;
    let loaded = part(&mut || {
        let m = Module::load(cuda_hal::FATBIN).unwrap();
        kernels = m.load_all_functions().unwrap();
    });
    let lazy = HalConfig {
        preload_kernels: false,
        ..HalConfig::default()
    };
    let whole = part(&mut || drop(CudaHal::with_config(0, lazy.clone()).unwrap()));
    println!(
        "INFO|stress|a HAL's start by part, each made and dropped (median us): device info \
         {info:.1}, stream {stream:.1}, memory pool {pool:.1}, the kernels' module {module:.1}, \
         with its {kernels} kernels loaded {loaded:.1}; a whole HAL, kernels loaded at first \
         use, {whole:.1}"
    );
}
