//! The five-build benchmark of the GB10 plan (run once per feature set, see
//! `scripts/gpu-pack.sh` and `scripts/gpu-run.sh`). Each row times the crate and the raw
//! driver floor in the same run and prints `ROW|build|operation|crate_us|floor|floor_us|bytes|target`.
//! Medians of wall-clock time around complete operations (each ends with the data where
//! the caller needs it).

mod common;

use common::{gbps, median_us, paired_median_us};

use cuda_hal::cuda_sys::{self, CUdeviceptr, CUstream};
use cuda_hal::driver::{MemPool, Module, PinnedFlags, PinnedMemory, Stream};
use cuda_hal::{ops, CudaHal, LaunchDims, PHASES};

const MIB: usize = 1 << 20;

fn build_name() -> String {
    match PHASES.label().as_str() {
        "baseline" => "baseline".into(),
        "1" => "p1".into(),
        "1+2" => "p12".into(),
        "1+2+3" => "p123".into(),
        "1+2+3+4" => "all".into(),
        other => other.replace('+', ""),
    }
}

fn row(op: &str, crate_us: f64, floor: &str, floor_us: f64, bytes: i64, target: &str) {
    println!(
        "ROW|{}|{op}|{crate_us:.3}|{floor}|{floor_us:.3}|{bytes}|{target}",
        build_name()
    );
}

fn info(msg: &str) {
    println!("INFO|{}|{msg}", build_name());
}

fn d() -> &'static cuda_sys::Driver {
    cuda_sys::driver().expect("driver")
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
    hal.synchronize().unwrap(); // binds the HAL's context on this thread for raw calls
    let i = hal.info();
    info(&format!(
        "device {} (sm_{}{}), driver {}, phases {}",
        i.name,
        i.compute_capability.0,
        i.compute_capability.1,
        i.driver_version,
        PHASES.label()
    ));
    let stream = Stream::new_non_blocking().unwrap();
    bench_get_at(&hal);
    bench_view(&hal);
    bench_alloc_free(&hal, &stream);
    bench_pipeline(&hal, &stream);
    if PHASES.async_copy {
        host_memcpy_ceiling();
        staging_sweep();
    }
}

/// What the host's memory system allows: `threads` threads copying 256 MiB between two
/// pre-touched buffers, plain memcpy.
fn host_memcpy_ceiling() {
    let n = 256 * MIB;
    let src = vec![1u8; n];
    let mut dst = vec![2u8; n];
    for threads in [1usize, 4, 8, 16] {
        let t = median_us(5, 200, || {
            std::thread::scope(|s| {
                for (d, c) in dst.chunks_mut(n / threads).zip(src.chunks(n / threads)) {
                    s.spawn(move || d.copy_from_slice(c));
                }
            });
        });
        info(&format!(
            "host memcpy 256 MiB, {threads} threads: {:.1} GB/s",
            gbps(n, t)
        ));
    }
}

/// Phase-4 bandwidth for several staging shapes, 256 MiB each way, pageable Vec.
fn staging_sweep() {
    let bytes = 256 * MIB;
    let n = bytes / 4;
    let host: Vec<u32> = (0..n as u32).collect();
    let mut back = vec![0u32; n];
    for workers in [4usize, 8, 16] {
        for chunk_mib in [2usize, 8] {
            for streaming in [false, true] {
                let cfg = cuda_hal::HalConfig {
                    staging: cuda_hal::StagingConfig {
                        chunk_bytes: chunk_mib * MIB,
                        min_chunk_bytes: 256 << 10,
                        workers,
                        max_slots: 4 * workers,
                        streaming_upload_max_bytes: if streaming { usize::MAX } else { 0 },
                        streaming_downloads: streaming,
                        streaming_pipeline: streaming,
                    },
                    ..Default::default()
                };
                let h = CudaHal::with_config(0, cfg).unwrap();
                let b = h.alloc::<u32>("sweep", n).unwrap();
                let up = median_us(8, 300, || b.copy_from_slice(&host).unwrap());
                h.synchronize().unwrap();
                let down = median_us(8, 300, || {
                    let _ = b.device_ptr_mut().unwrap();
                    b.copy_to_slice(&mut back).unwrap();
                });
                assert_eq!(back[n - 1], host[n - 1]);
                info(&format!(
                    "staging workers={workers} chunk={chunk_mib}MiB streaming={streaming}: up {:.1} GB/s, down {:.1} GB/s",
                    gbps(bytes, up),
                    gbps(bytes, down)
                ));
            }
        }
    }
}

/// Raw floor: one 4-byte synchronous cuMemcpyDtoH into pageable memory.
fn floor_get4(ptr: CUdeviceptr, v: &mut u32) {
    // SAFETY: reads 4 bytes of a live allocation into a local.
    unsafe { d().cuMemcpyDtoH((v as *mut u32).cast(), ptr, 4) }.unwrap();
}

fn bench_get_at(hal: &CudaHal) {
    for mib in [1usize, 64, 256] {
        let n = mib * MIB / 4;
        let data: Vec<u32> = (0..n as u32)
            .map(|x| x.wrapping_mul(2_654_435_761))
            .collect();
        let b = hal.copy_from("get_at", &data).unwrap();
        let raw = b.device_ptr().unwrap().addr;
        hal.synchronize().unwrap();
        let mut idx = 0usize;
        let iters = if PHASES.offset_get_at || PHASES.host_cache {
            200
        } else {
            5
        };
        // Cold: the host copy (phase 2) is stale, as after a kernel wrote the buffer. The
        // floor is timed in turns with it.
        let before = hal.ledger();
        let mut calls = 0u64;
        let mut v = 0u32;
        let (floor, cold) = paired_median_us(
            iters,
            300,
            || floor_get4(raw, &mut v),
            || {
                let _ = b.device_ptr_mut().unwrap();
                idx = (idx + 7919) % n;
                assert_eq!(b.get_at(idx).unwrap(), data[idx]);
                calls += 1;
            },
        );
        let moved = hal.ledger().since(&before).d2h.bytes / calls.max(1);
        row(
            &format!("get_at {mib} MiB (after device write)"),
            cold,
            "cuMemcpyDtoH 4 B",
            floor,
            moved as i64,
            "<=1.2x floor",
        );
        if PHASES.host_cache {
            b.view(|_| ()).unwrap();
            let before = hal.ledger();
            let mut calls = 0u64;
            let warm = median_us(1000, 100, || {
                idx = (idx + 7919) % n;
                assert_eq!(b.get_at(idx).unwrap(), data[idx]);
                calls += 1;
            });
            let moved = hal.ledger().since(&before).d2h.bytes / calls.max(1);
            row(
                &format!("get_at {mib} MiB (host copy valid)"),
                warm,
                "cuMemcpyDtoH 4 B",
                floor,
                moved as i64,
                "-",
            );
        }
    }
}

/// Raw floor: a pinned, async D2H of `bytes` plus a stream sync.
fn floor_pinned_d2h(pinned: &PinnedMemory, src: CUdeviceptr, bytes: usize, s: CUstream) -> f64 {
    median_us(10, 200, || {
        // SAFETY: pinned holds at least `bytes`; src is a live allocation of `bytes`.
        unsafe {
            d().cuMemcpyDtoHAsync(pinned.as_ptr().cast(), src, bytes, s)
                .unwrap();
            d().cuStreamSynchronize(s).unwrap();
        }
    })
}

fn bench_view(hal: &CudaHal) {
    let n = 64 * MIB / 4;
    let data: Vec<u32> = (0..n as u32).collect();
    let b = hal.copy_from("view", &data).unwrap();
    let stream = Stream::new_non_blocking().unwrap();
    let pinned = PinnedMemory::new(64 * MIB, PinnedFlags::default()).unwrap();
    hal.synchronize().unwrap();
    let floor = floor_pinned_d2h(
        &pinned,
        b.device_ptr().unwrap().addr,
        64 * MIB,
        stream.raw(),
    );
    b.view(|s| assert_eq!(s[n - 1], data[n - 1])).unwrap();
    let before = hal.ledger();
    let mut calls = 0u64;
    let t = median_us(if PHASES.host_cache { 1000 } else { 10 }, 300, || {
        let x = b.view(|s| s[n / 2]).unwrap();
        assert_eq!(x, data[n / 2]);
        calls += 1;
    });
    let moved = hal.ledger().since(&before).d2h.bytes / calls.max(1);
    row(
        "repeated view, unchanged 64 MiB",
        t,
        "pinned D2H 64 MiB",
        floor,
        moved as i64,
        "<=1us, 0 B",
    );
}

fn bench_alloc_free(hal: &CudaHal, stream: &Stream) {
    let sizes = common::alloc_mix::SIZES;
    let pool = MemPool::new(0, u64::MAX).unwrap();
    let mut k = 0usize;
    let floor = median_us(2000, 200, || {
        let size = sizes[k % sizes.len()];
        k += 1;
        let mut p: CUdeviceptr = 0;
        // SAFETY: pool and stream are live; the pointer is freed in stream order at once.
        unsafe {
            d().cuMemAllocFromPoolAsync(&mut p, size, pool.raw(), stream.raw())
                .unwrap();
            d().cuMemFreeAsync(p, stream.raw()).unwrap();
        }
    });
    stream.synchronize().unwrap();
    // One alloc+free of the next size of the mix.
    let mixed = |h: &CudaHal, k: &mut usize| {
        let size = sizes[*k % sizes.len()];
        *k += 1;
        drop(h.alloc::<u8>("mixed", size).unwrap());
    };
    let mut k = 0usize;
    let iters = if PHASES.pool_alloc { 2000 } else { 60 };
    let t = median_us(iters, 300, || mixed(hal, &mut k));
    hal.synchronize().unwrap();
    row(
        "alloc+free, mixed 4 KiB..256 MiB",
        t,
        "pool alloc+free pair",
        floor,
        -1,
        "<=1.5us",
    );
    // What binding a context costs where a call checks it: a cached alloc+free makes no
    // driver call at all, so it pays this nowhere.
    let mut current: cuda_sys::CUcontext = std::ptr::null_mut();
    let per_call = median_us(200, 200, || {
        for _ in 0..1000 {
            // SAFETY: out-pointer to a live local.
            unsafe { d().cuCtxGetCurrent(&mut current).unwrap() };
        }
    }) / 1000.0;
    info(&format!(
        "cuCtxGetCurrent: {:.1} ns a call (binding a context checks it; a cached alloc+free makes no driver call)",
        per_call * 1e3
    ));
    if PHASES.pool_alloc {
        // The same loop with the block cache off: every call reaches the driver's pool. Two
        // HALs timed in turns, one counting the pool's hits (a reserved-bytes read per
        // allocation) and one not.
        let cfg = |count_pool_hits| cuda_hal::HalConfig {
            block_cache_bytes: 0,
            count_pool_hits,
            ..Default::default()
        };
        let counting = CudaHal::with_config(0, cfg(true)).unwrap();
        let plain = CudaHal::with_config(0, cfg(false)).unwrap();
        let (mut k1, mut k2) = (0usize, 0usize);
        let (t, t_plain) = paired_median_us(
            2000,
            300,
            || mixed(&counting, &mut k1),
            || mixed(&plain, &mut k2),
        );
        counting.synchronize().unwrap();
        plain.synchronize().unwrap();
        hal.synchronize().unwrap();
        let rows = [
            ("alloc+free, mixed, block cache off", t),
            (
                "alloc+free, mixed, block cache off, pool hits not counted",
                t_plain,
            ),
        ];
        for (label, t) in rows {
            row(label, t, "pool alloc+free pair", floor, -1, "-");
        }
        info(&format!(
            "pool hit count: {:+.0} ns per pooled alloc+free ({:.3} us counted, {t_plain:.3} us not)",
            (t - t_plain) * 1e3,
            t
        ));
    }
}

fn bench_pipeline(hal: &CudaHal, stream: &Stream) {
    let bytes = 256 * MIB;
    let n = bytes / 4;
    let host: Vec<u32> = (0..n as u32).map(|x| x ^ 0x5555_5555).collect();
    let mut back = vec![0u32; n];
    let a = hal.alloc::<u32>("a", n).unwrap();
    let b = hal.copy_from("b", &host).unwrap();
    let out = hal.alloc::<u32>("out", n).unwrap();
    let sms = hal.info().multiprocessors;

    // Floors with raw driver calls on pinned memory.
    let mut pinned_in = PinnedMemory::new(bytes, PinnedFlags::default()).unwrap();
    pinned_in
        .as_mut_slice()
        .copy_from_slice(bytemuck::cast_slice(&host));
    let pinned_out = PinnedMemory::new(bytes, PinnedFlags::default()).unwrap();
    let module = Module::load(cuda_hal::FATBIN).unwrap();
    let add = module.function("eltwise_add_u32").unwrap();
    let (pa, pb, po) = (
        a.device_ptr_mut().unwrap().addr,
        b.device_ptr().unwrap().addr,
        out.device_ptr_mut().unwrap().addr,
    );
    hal.synchronize().unwrap();
    let dims = LaunchDims::for_elements(n, sms);
    let s = stream.raw();
    let h2d_floor = median_us(10, 300, || unsafe {
        // SAFETY: pinned_in holds `bytes`; pa is a live allocation of `bytes`.
        d().cuMemcpyHtoDAsync(pa, pinned_in.as_ptr().cast(), bytes, s)
            .unwrap();
        d().cuStreamSynchronize(s).unwrap();
    });
    let d2h_floor = floor_pinned_d2h(&pinned_out, po, bytes, s);
    let pipe_floor = median_us(10, 300, || unsafe {
        // SAFETY: as above; the kernel arguments match eltwise_add_u32(out, a, b, n).
        d().cuMemcpyHtoDAsync(pa, pinned_in.as_ptr().cast(), bytes, s)
            .unwrap();
        let (mut o, mut x, mut y, mut len) = (po, pa, pb, n as u64);
        let mut params = [
            (&mut o as *mut u64).cast(),
            (&mut x as *mut u64).cast(),
            (&mut y as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
        ];
        add.launch(dims.grid, dims.block, 0, stream, &mut params)
            .unwrap();
        d().cuMemcpyDtoHAsync(pinned_out.as_ptr().cast(), po, bytes, s)
            .unwrap();
        d().cuStreamSynchronize(s).unwrap();
    });
    // The driver's own pageable path, for reference.
    let pageable_up = median_us(5, 300, || unsafe {
        // SAFETY: host holds `bytes`; pa is a live allocation of `bytes`.
        d().cuMemcpyHtoD(pa, host.as_ptr().cast(), bytes).unwrap();
    });
    let pageable_down = median_us(5, 300, || unsafe {
        // SAFETY: back holds `bytes`; po is a live allocation of `bytes`.
        d().cuMemcpyDtoH(back.as_mut_ptr().cast(), po, bytes)
            .unwrap();
    });

    // Until the call returns: the `Vec` is free again (with phase 4 the last chunks may
    // still be on their way to the device, behind the next call's).
    let up = median_us(10, 500, || a.copy_from_slice(&host).unwrap());
    hal.synchronize().unwrap();
    // Until the bytes are on the device.
    let up_synced = median_us(10, 500, || {
        a.copy_from_slice(&host).unwrap();
        hal.synchronize().unwrap();
    });
    let down = median_us(10, 500, || {
        let _ = b.device_ptr_mut().unwrap(); // stale host copy: a real download
        b.copy_to_slice(&mut back).unwrap();
    });
    assert_eq!(back[12345], host[12345]);
    let pipe = median_us(10, 500, || {
        a.copy_from_slice(&host).unwrap();
        ops::add(&out, &a, &b).unwrap();
        out.copy_to_slice(&mut back).unwrap();
    });
    assert_eq!(back[777], host[777].wrapping_add(host[777]));
    row(
        "upload 256 MiB from Vec",
        up,
        "pinned H2D 256 MiB",
        h2d_floor,
        bytes as i64,
        ">=40 GB/s",
    );
    row(
        "upload 256 MiB from Vec, + sync",
        up_synced,
        "pinned H2D 256 MiB",
        h2d_floor,
        bytes as i64,
        "-",
    );
    row(
        "download 256 MiB into Vec",
        down,
        "pinned D2H 256 MiB",
        d2h_floor,
        bytes as i64,
        ">=40 GB/s",
    );
    row(
        "upload+kernel+download 256 MiB",
        pipe,
        "pinned H2D+kernel+D2H",
        pipe_floor,
        -1,
        "-",
    );
    info(&format!(
        "256 MiB bandwidth GB/s: crate up {:.1} down {:.1} | pinned floor up {:.1} down {:.1} | driver pageable up {:.1} down {:.1}",
        gbps(bytes, up),
        gbps(bytes, down),
        gbps(bytes, h2d_floor),
        gbps(bytes, d2h_floor),
        gbps(bytes, pageable_up),
        gbps(bytes, pageable_down)
    ));
}
