//! Prover-operation benchmark on the GPU: BabyBear element-wise arithmetic, NTTs, the coset
//! LDE and Poseidon2. Prints `ROW|prover|operation|crate_us|floor|floor_us|bytes|target`
//! and `INFO|prover|...` lines (the format of `benches/phases.rs`). Times are medians of
//! wall-clock time around the launches plus `synchronize`, after warm-up.

mod common;

use common::{gbps, median, median_us};

use cuda_hal::cuda_sys;
use cuda_hal::driver::Module;
use cuda_hal::field::Elem;
use cuda_hal::{Buffer, CudaHal, Digest, Hal, HalConfig, LaunchDims};

fn row(op: &str, crate_us: f64, floor: &str, floor_us: f64, bytes: i64, target: &str) {
    println!("ROW|prover|{op}|{crate_us:.3}|{floor}|{floor_us:.3}|{bytes}|{target}");
}

fn info(msg: &str) {
    println!("INFO|prover|{msg}");
}

fn elems(n: usize, seed: u64) -> Vec<Elem> {
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

/// The raw floor: one device-to-device copy of `bytes` on the HAL's stream, synchronised.
fn floor_d2d(hal: &CudaHal, dst: &Buffer<Elem>, src: &Buffer<Elem>, bytes: usize) -> f64 {
    let d = cuda_sys::driver().expect("driver");
    let (dst, src) = (
        dst.device_ptr_mut().unwrap().addr,
        src.device_ptr().unwrap().addr,
    );
    median_us(20, 300, || {
        // SAFETY: both are live allocations of at least `bytes`, which do not overlap.
        unsafe { d.cuMemcpyDtoDAsync(dst, src, bytes, hal.stream_handle()) }.unwrap();
        hal.synchronize().unwrap();
    })
}

/// The raw floor for a kernel that reads `read` bytes and writes `written` bytes of device
/// memory: a device-to-device copy moving as many bytes (half read, half written) between
/// two scratch buffers.
fn floor_traffic(hal: &CudaHal, read: usize, written: usize) -> f64 {
    let bytes = (read + written) / 2;
    let n = bytes.div_ceil(4);
    let src = hal.alloc::<Elem>("floor-src", n).unwrap();
    let dst = hal.alloc::<Elem>("floor-dst", n).unwrap();
    floor_d2d(hal, &dst, &src, bytes)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with --bench (cargo bench does this)");
        return;
    }
    let hal = match CudaHal::new(0) {
        Ok(h) => h,
        Err(e) => {
            println!("SKIPPED: no GPU: {e}");
            return;
        }
    };
    hal.synchronize().unwrap();
    let i = hal.info();
    info(&format!(
        "device {} (sm_{}{}), {} SMs, driver {}",
        i.name, i.compute_capability.0, i.compute_capability.1, i.multiprocessors, i.driver_version
    ));
    bench_launch(&hal);
    bench_eltwise(&hal);
    bench_ntt(&hal);
    bench_lde(&hal);
    bench_poseidon2(&hal);
}

/// The host cost of a launch. An empty kernel (`fill_u32` over 0 elements, one block)
/// is queued through the crate, with its output buffer's bookkeeping, and through
/// `cuLaunchKernel` on the same stream. Rounds of 64 launches take turns between the two
/// and are timed without the synchronize that drains the stream after each round. A
/// launch followed by a synchronize is timed as well.
fn bench_launch(hal: &CudaHal) {
    const BATCH: usize = 64;
    const ROUNDS: usize = 400;
    let out = hal.alloc::<u32>("launch-out", 1024).unwrap();
    let dims = LaunchDims {
        grid: (1, 1, 1),
        block: (32, 1, 1),
        shared_bytes: 0,
    };
    // SAFETY: fill_u32(out, value, n) with n = 0 writes nothing.
    let via_crate = || unsafe {
        hal.launch("fill_u32", dims)
            .output(&out)
            .scalar(0u32)
            .scalar(0u64)
            .run()
            .unwrap()
    };
    let module = Module::load(cuda_hal::FATBIN).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let d = cuda_sys::driver().expect("driver");
    let (ptr, stream) = (out.device_ptr_mut().unwrap().addr, hal.stream_handle());
    let raw = || {
        let (mut o, mut v, mut n) = (ptr, 0u32, 0u64);
        let mut params: [*mut std::ffi::c_void; 3] = [
            (&mut o as *mut u64).cast(),
            (&mut v as *mut u32).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: the arguments match fill_u32(out, value, n); with n = 0 the kernel
        // touches no memory, and `out` is a live allocation anyway.
        unsafe {
            d.cuLaunchKernel(
                fill.raw(),
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .unwrap();
    };
    let mut per_launch = [Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS)];
    for round in 0..ROUNDS + 10 {
        for k in [round % 2, 1 - round % 2] {
            let t = std::time::Instant::now();
            for _ in 0..BATCH {
                match k {
                    0 => via_crate(),
                    _ => raw(),
                }
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / BATCH as f64;
            hal.synchronize().unwrap();
            if round >= 10 {
                per_launch[k].push(us);
            }
        }
    }
    let (c, f) = (median(&mut per_launch[0]), median(&mut per_launch[1]));
    row(
        "launch, empty kernel, queued (rounds of 64)",
        c,
        "cuLaunchKernel, same kernel and stream",
        f,
        0,
        "-",
    );
    let c_sync = median_us(50, 300, || {
        via_crate();
        hal.synchronize().unwrap();
    });
    let f_sync = median_us(50, 300, || {
        raw();
        hal.synchronize().unwrap();
    });
    row(
        "launch + synchronize, empty kernel",
        c_sync,
        "cuLaunchKernel + synchronize",
        f_sync,
        0,
        "-",
    );
    info(&format!(
        "launch host cost: {c:.2} us queued through the crate vs {f:.2} us raw (+{:.2} us); \
         with a synchronize {c_sync:.2} vs {f_sync:.2} us",
        c - f
    ));
}

fn bench_eltwise(hal: &CudaHal) {
    let n = 1usize << 26;
    let a = hal.copy_from("a", &elems(n, 1)).unwrap();
    let b = hal.copy_from("b", &elems(n, 2)).unwrap();
    let out = hal.alloc::<Elem>("out", n).unwrap();
    let moved = 3 * n * 4; // two reads, one write
    let t = median_us(20, 500, || {
        Hal::eltwise_mul(hal, &out, &a, &b).unwrap();
        hal.synchronize().unwrap();
    });
    // A copy that reads and writes the same number of bytes in all: 1.5 x 256 MiB.
    let copy_bytes = moved / 2;
    let src = hal.alloc::<Elem>("copy-src", copy_bytes / 4).unwrap();
    let dst = hal.alloc::<Elem>("copy-dst", copy_bytes / 4).unwrap();
    let floor = floor_d2d(hal, &dst, &src, copy_bytes);
    row(
        "eltwise_mul_bb 2^26",
        t,
        "cuMemcpyDtoD 384 MiB (same bytes moved)",
        floor,
        moved as i64,
        ">=0.9x floor bandwidth",
    );
    info(&format!(
        "eltwise_mul_bb 2^26: {:.0} GB/s (read+write), D2D copy {:.0} GB/s, ratio {:.2}",
        gbps(moved, t),
        gbps(moved, floor),
        floor / t
    ));
    for (name, tag) in [("add", "bb"), ("mul_scalar", "bb")] {
        let t = median_us(20, 300, || {
            match name {
                "add" => Hal::eltwise_add(hal, &out, &a, &b).unwrap(),
                _ => Hal::eltwise_mul_scalar(hal, &out, &a, Elem::new(7)).unwrap(),
            }
            hal.synchronize().unwrap();
        });
        let bytes = if name == "add" { moved } else { 2 * n * 4 };
        info(&format!(
            "eltwise_{name}_{tag} 2^26: {t:.1} us, {:.0} GB/s",
            gbps(bytes, t)
        ));
    }
    let n4 = n / 4;
    let a4 = a.reinterpret::<cuda_hal::field::ExtElem>(0, n4).unwrap();
    let b4 = b.reinterpret::<cuda_hal::field::ExtElem>(0, n4).unwrap();
    let o4 = out.reinterpret::<cuda_hal::field::ExtElem>(0, n4).unwrap();
    let t = median_us(20, 300, || {
        Hal::eltwise_mul(hal, &o4, &a4, &b4).unwrap();
        hal.synchronize().unwrap();
    });
    info(&format!(
        "eltwise_mul_bb4 2^24 ext elems: {t:.1} us, {:.0} GB/s",
        gbps(moved, t)
    ));
}

fn bench_ntt(hal: &CudaHal) {
    // The generic pass kernels (sizes as arguments), for the passes compiled per size.
    let generic = CudaHal::with_config(
        0,
        HalConfig {
            ntt_fixed_passes: false,
            ..HalConfig::default()
        },
    )
    .unwrap();
    for (log_n, cols, target, op) in [
        (24u32, 1usize, "<=200 us (sppark 222 us)", "ntt 2^24 x1"),
        (16, 1024, "<=1500 us", "ntt 2^16 x1024"),
        (18, 256, "-", "ntt 2^18 x256"),
        (26, 1, "<=980 us (sppark 0.98 ms)", "ntt 2^26 x1"),
        // One pass: every stage in one kernel.
        (12, 4096, "-", "ntt 2^12 x4096"),
    ] {
        let n = cols << log_n;
        let io = hal.copy_from("ntt", &elems(n, 3)).unwrap();
        let other = hal.alloc::<Elem>("ntt-copy", n).unwrap();
        let bytes = n * 4;
        let t = median_us(20, 500, || {
            Hal::batch_ntt(hal, &io, log_n, false).unwrap();
            hal.synchronize().unwrap();
        });
        let floor = floor_d2d(hal, &other, &io, bytes);
        row(
            op,
            t,
            "cuMemcpyDtoD same bytes",
            floor,
            bytes as i64,
            target,
        );
        let ti = median_us(20, 300, || {
            Hal::batch_ntt(hal, &io, log_n, true).unwrap();
            hal.synchronize().unwrap();
        });
        row(
            &format!("inverse {op}"),
            ti,
            "cuMemcpyDtoD same bytes",
            floor,
            bytes as i64,
            "-",
        );
        let generic_io = generic.copy_from("ntt", &elems(n, 3)).unwrap();
        let tg = median_us(20, 500, || {
            Hal::batch_ntt(&generic, &generic_io, log_n, false).unwrap();
            generic.synchronize().unwrap();
        });
        row(
            &format!("{op}, generic passes"),
            tg,
            "cuMemcpyDtoD same bytes",
            floor,
            bytes as i64,
            "-",
        );
        drop(generic_io);
        let tr = median_us(5, 300, || {
            hal.batch_ntt_radix2(&io, log_n, false).unwrap();
            hal.synchronize().unwrap();
        });
        info(&format!(
            "{op}: fused {t:.1} us ({:.0} GB/s per pass-equivalent copy {floor:.1} us), generic passes {tg:.1} us ({:+.1}%), radix-2 reference path {tr:.1} us",
            gbps(2 * bytes, t),
            (t / tg - 1.0) * 100.0
        ));
    }
}

/// Coset LDEs as a prover makes them: the NTT reading the coefficients in its first pass
/// (the default), and in the same run the expansion kernel then the NTT
/// (`lde_fused_expand: false`, the crate's path before).
fn bench_lde(hal: &CudaHal) {
    let expanding = CudaHal::with_config(
        0,
        HalConfig {
            lde_fused_expand: false,
            ..HalConfig::default()
        },
    )
    .unwrap();
    // Blowups of 4, 2 and 8 (an LDE's first pass skips the stages that only pair values
    // with zeros: one per doubling, up to two); 2^10 -> 2^12 takes one pass.
    let shapes = [
        (16u32, 2u32, 256usize),
        (22, 2, 1),
        (17, 1, 128),
        (21, 3, 1),
        (10, 2, 4096),
    ];
    for (log_n, log_blowup, cols) in shapes {
        let op = format!("coset_lde 2^{log_n} -> 2^{} x{cols}", log_n + log_blowup);
        let c = elems(cols << log_n, 4);
        let time = |hal: &CudaHal| {
            let coeffs = hal.copy_from("coeffs", &c).unwrap();
            let out = hal
                .alloc::<Elem>("lde", cols << (log_n + log_blowup))
                .unwrap();
            median_us(10, 500, || {
                Hal::coset_lde(hal, &out, &coeffs, log_n, log_blowup).unwrap();
                hal.synchronize().unwrap();
            })
        };
        let t = time(hal);
        let te = time(&expanding);
        let (read, written) = (c.len() * 4, (cols << (log_n + log_blowup)) * 4);
        let floor = floor_traffic(hal, read, written);
        let what = "cuMemcpyDtoD, as many bytes read + written";
        row(&op, t, what, floor, written as i64, "-");
        row(
            &format!("{op}, expanded first"),
            te,
            what,
            floor,
            written as i64,
            "-",
        );
        info(&format!(
            "{op}: first pass reading the coefficients {t:.1} us, expansion kernel then NTT {te:.1} us ({:+.1}%)",
            (t / te - 1.0) * 100.0
        ));
    }
}

fn bench_poseidon2(hal: &CudaHal) {
    // Width 24's states are 1.5 times larger: 2^23 of them keep the buffer at 768 MiB.
    for (width, log_n, target, peer) in [
        (16usize, 24u32, ">=2.0 G perm/s", "2.09"),
        (24, 23, "-", "1.12"),
    ] {
        let n = 1usize << log_n;
        let bytes = 4 * width * n;
        let states = hal.copy_from("states", &elems(width * n, 5)).unwrap();
        let t = median_us(10, 1000, || {
            hal.poseidon2_permute(&states, width).unwrap();
            hal.synchronize().unwrap();
        });
        let rate = n as f64 / t / 1e3; // G perm/s
        let floor = floor_traffic(hal, bytes, bytes);
        row(
            &format!("poseidon2 w{width} permute 2^{log_n} states"),
            t,
            "cuMemcpyDtoD, as many bytes read + written",
            floor,
            (2 * bytes) as i64,
            target,
        );
        info(&format!(
            "poseidon2 width {width}: {rate:.2} G perm/s (peers: {peer})"
        ));
    }

    let (rows, cols) = (1usize << 22, 16usize);
    let matrix = hal.copy_from("matrix", &elems(rows * cols, 6)).unwrap();
    let digests = hal.alloc::<Digest>("digests", rows).unwrap();
    let t = median_us(10, 1000, || {
        Hal::poseidon2_hash_rows(hal, &digests, &matrix, rows, cols).unwrap();
        hal.synchronize().unwrap();
    });
    let floor = floor_traffic(hal, rows * cols * 4, rows * 32);
    row(
        "poseidon2_hash_rows 2^22 x 16",
        t,
        "cuMemcpyDtoD, as many bytes read + written",
        floor,
        (rows * cols * 4 + rows * 32) as i64,
        "-",
    );
    info(&format!(
        "hash_rows 2^22 x 16: {:.2} G perm/s",
        (2 * rows) as f64 / t / 1e3
    ));
    let layer = hal.alloc::<Digest>("layer", rows / 2).unwrap();
    let t = median_us(10, 1000, || {
        Hal::merkle_layer(hal, &layer, &digests).unwrap();
        hal.synchronize().unwrap();
    });
    let floor = floor_traffic(hal, rows * 32, rows * 16);
    row(
        "merkle_layer 2^22 -> 2^21",
        t,
        "cuMemcpyDtoD, as many bytes read + written",
        floor,
        (rows * 32 + rows * 16) as i64,
        "-",
    );
    info(&format!(
        "merkle layer: {:.2} G perm/s",
        (rows / 2) as f64 / t / 1e3
    ));
}
