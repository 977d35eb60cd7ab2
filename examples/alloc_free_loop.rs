//! A fixed loop of alloc+frees on one HAL, for counting the host instructions of the
//! allocation path with a profiler. The mix is the tracking bench's: four names, six sizes
//! from 4 KiB to 256 MiB, served by the phase-3 block cache after the first round (or,
//! with `pool`, by the memory pool: the block cache off).
//!
//! ```sh
//! cargo build --release --example alloc_free_loop
//! # tracking on or off, N alloc+frees (default 100000), block cache or pool:
//! valgrind --tool=callgrind target/release/examples/alloc_free_loop on 100000 [cache|pool]
//! # without a GPU, through the stub driver (nothing runs on a device):
//! scripts/stub-libcuda.py /tmp/libcuda-stub.so
//! CUDA_HAL_LIBCUDA=/tmp/libcuda-stub.so valgrind --tool=callgrind \
//!     target/release/examples/alloc_free_loop off
//! ```
//!
//! Run each mode with two values of N: the difference of the totals over the difference of
//! N is one alloc+free (the HAL's setup cancels out), and on minus off is what tracking adds.
//! Exits non-zero if an allocation fails, or if no device opens while
//! `CUDA_HAL_REQUIRE_GPU=1` (as `scripts/gpu-run.sh` sets).

use std::process::ExitCode;

use cuda_hal::{CudaHal, HalConfig};

// The benches' mix, from the same file.
#[path = "../benches/common/alloc_mix.rs"]
mod alloc_mix;
use alloc_mix::{NAMES, SIZES};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tracking = match args.first().map(String::as_str) {
        Some("on") => true,
        Some("off") | None => false,
        Some(other) => {
            return fail(&format!(
                "usage: alloc_free_loop [on|off] [N] [cache|pool]; got {other:?}"
            ))
        }
    };
    let n: usize = match args.get(1).map(|s| s.parse()) {
        None => 100_000,
        Some(Ok(n)) => n,
        Some(Err(e)) => return fail(&format!("N: {e}")),
    };
    let block_cache_bytes = match args.get(2).map(String::as_str) {
        Some("cache") | None => 1 << 30,
        Some("pool") => 0,
        Some(other) => return fail(&format!("cache or pool, not {other:?}")),
    };
    let config = HalConfig {
        track_allocations: tracking,
        block_cache_bytes,
        ..Default::default()
    };
    let hal = match CudaHal::with_config(0, config) {
        Ok(hal) => hal,
        Err(e) if std::env::var("CUDA_HAL_REQUIRE_GPU").as_deref() == Ok("1") => {
            return fail(&format!("no device, and CUDA_HAL_REQUIRE_GPU=1: {e}"))
        }
        Err(e) => {
            println!("no GPU (and no stub driver): {e}");
            return ExitCode::SUCCESS;
        }
    };
    // One round of every size first, so that the loop is served by the block cache (with
    // the cache on).
    for k in 0..SIZES.len() + n {
        match hal.alloc::<u8>(NAMES[k % NAMES.len()], SIZES[k % SIZES.len()]) {
            Ok(buffer) => drop(buffer),
            Err(e) => return fail(&format!("alloc {k}: {e}")),
        }
    }
    let report = hal.memory_report();
    println!(
        "{n} alloc+frees, tracking {}, block cache {}: {} live at the end, peak {} bytes",
        if tracking { "on" } else { "off" },
        if block_cache_bytes > 0 { "on" } else { "off" },
        report.live.len(),
        report.peak_bytes
    );
    ExitCode::SUCCESS
}

fn fail(why: &str) -> ExitCode {
    eprintln!("alloc_free_loop: {why}");
    ExitCode::FAILURE
}
