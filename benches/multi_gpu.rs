//! Copies between two devices (all-features build), issue #5's multi-GPU part:
//! `copy_from_device` against the driver's peer copy, and the host route against a plain
//! download and upload. `ROW|multi_gpu|operation|crate_us|floor|floor_us|bytes|target`.
//!
//! With one device it times the same code between two HALs of device 0 (the copy path
//! without a second device: no context switch, no wait across devices), and says so in
//! every row; `CUDA_HAL_REQUIRE_GPUS=2` makes it fail there instead. With none it prints
//! `SKIPPED:` and no rows.

mod common;

use common::{gbps, paired_median_us};

use cuda_hal::cuda_sys;
use cuda_hal::driver::device_count;
use cuda_hal::CudaHal;

const MIB: usize = 1 << 20;

fn row(op: &str, crate_us: f64, floor: &str, floor_us: f64, bytes: i64, target: &str) {
    println!("ROW|multi_gpu|{op}|{crate_us:.3}|{floor}|{floor_us:.3}|{bytes}|{target}");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let devices = device_count().unwrap_or(0);
    let required: usize = std::env::var("CUDA_HAL_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        devices >= 2 || required < 2,
        "CUDA_HAL_REQUIRE_GPUS={required} but {devices} device(s)"
    );
    match devices {
        0 => println!("SKIPPED: no device here"),
        1 => {
            println!(
                "INFO|multi_gpu|one device: copies between two HALs of device 0 (no second device)"
            );
            peer(
                &CudaHal::new(0).unwrap(),
                &CudaHal::new(0).unwrap(),
                "HAL b <- HAL a, one device",
            );
        }
        _ => peer(
            &CudaHal::new(0).unwrap(),
            &CudaHal::new(1).unwrap(),
            "device 1 <- 0",
        ),
    }
}

/// A stream of the bench's own in `ctx`, for the floors that need one of the source's
/// device: the source HAL's own stream is not handed out (`stream_handle`), since a HAL
/// whose raw stream is out no longer knows it idle without asking the driver.
fn own_stream(ctx: cuda_sys::CUcontext) -> cuda_sys::CUstream {
    let api = cuda_sys::driver().unwrap();
    let mut stream = std::ptr::null_mut();
    // SAFETY: a live context made current; out-pointer to a local. Destroyed by the caller.
    unsafe {
        api.cuCtxSetCurrent(ctx).unwrap();
        api.cuStreamCreate(&mut stream, 1).unwrap();
    }
    stream
}

/// The current context: the one `hal`'s last operation bound.
fn current_context(hal: &CudaHal) -> cuda_sys::CUcontext {
    hal.synchronize().unwrap();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    unsafe {
        cuda_sys::driver()
            .unwrap()
            .cuCtxGetCurrent(&mut ctx)
            .unwrap()
    };
    ctx
}

/// Copies from `hal0`'s memory into `hal1`'s (`pair` says which): `copy_from_device`
/// against the driver's peer copy on the same stream (each followed by a stream
/// synchronize), and the host route against a plain download and upload through a
/// pageable `Vec`.
fn peer(hal0: &CudaHal, hal1: &CudaHal, pair: &str) {
    let peer = hal1.enable_peer_access(hal0).unwrap();
    println!("INFO|multi_gpu|peer copies: {pair}, peer access {peer}");
    let (ctx0, ctx1) = (current_context(hal0), current_context(hal1));
    let stream = hal1.stream_handle();
    let own0 = own_stream(ctx0);
    let api = cuda_sys::driver().unwrap();
    for (label, bytes) in [
        ("4 KiB", 4 << 10),
        ("1 MiB", MIB),
        ("64 MiB", 64 * MIB),
        ("256 MiB", 256 * MIB),
    ] {
        let n = bytes / 4;
        let src = hal0.alloc::<u32>("peer-src", n).unwrap();
        src.fill(7).unwrap();
        hal0.synchronize().unwrap();
        let dst = hal1.alloc::<u32>("peer-dst", n).unwrap();
        let (d, s) = (
            dst.device_ptr_mut().unwrap().addr,
            src.device_ptr().unwrap().addr,
        );
        let (budget, min) = if bytes >= 64 * MIB {
            (600, 20)
        } else {
            (300, 200)
        };
        let (t, floor) = paired_median_us(
            min,
            budget,
            || {
                dst.copy_from_device(&src).unwrap();
                hal1.synchronize().unwrap();
            },
            || {
                // SAFETY: both ranges are live allocations of `bytes`; the stream is
                // `hal1`'s, and its context is made current first.
                unsafe {
                    api.cuCtxSetCurrent(ctx1).unwrap();
                    api.cuMemcpyPeerAsync(d, ctx1, s, ctx0, bytes, stream)
                        .unwrap();
                    api.cuStreamSynchronize(stream).unwrap();
                }
            },
        );
        assert_eq!(dst.get_at(n - 1).unwrap(), 7, "the copy arrived");
        if bytes == 4 << 10 {
            // What ordering the copy after the source's stream costs the driver alone.
            let (ordered, _) = paired_median_us(
                200,
                300,
                || {
                    // SAFETY: as above; the event is recorded on a stream of `hal0`'s
                    // context (the bench's, idle as `hal0`'s is) and waited for by `hal1`'s.
                    unsafe {
                        let mut ev = std::ptr::null_mut();
                        api.cuCtxSetCurrent(ctx0).unwrap();
                        api.cuEventCreate(&mut ev, 2).unwrap();
                        api.cuEventRecord(ev, own0).unwrap();
                        api.cuCtxSetCurrent(ctx1).unwrap();
                        api.cuStreamWaitEvent(stream, ev, 0).unwrap();
                        api.cuMemcpyPeerAsync(d, ctx1, s, ctx0, bytes, stream)
                            .unwrap();
                        api.cuStreamSynchronize(stream).unwrap();
                        api.cuEventDestroy(ev).unwrap();
                    }
                },
                || {},
            );
            println!(
                "INFO|multi_gpu|  peer copy {label}: the driver's copy ordered after the source's stream (event create, record, wait, destroy) + sync: {ordered:.2} us"
            );
            small_copy_parts(hal1, own0, ctx0, ctx1);
        }
        row(
            &format!("copy_from_device {label}, {pair} (+ sync)"),
            t,
            "cuMemcpyPeerAsync + sync",
            floor,
            bytes as i64,
            "-",
        );
        println!(
            "INFO|multi_gpu|  peer copy {label}: crate {:.1} GB/s, driver {:.1} GB/s",
            gbps(bytes, t),
            gbps(bytes, floor)
        );
        if bytes == 64 * MIB {
            let mut host = vec![0u8; bytes];
            let (t, floor) = paired_median_us(
                10,
                600,
                || {
                    dst.copy_from_device_via_host(&src).unwrap();
                    hal1.synchronize().unwrap();
                },
                || {
                    // SAFETY: `host` holds `bytes`; both device ranges are live
                    // allocations of `bytes`; each copy runs with its device's context.
                    unsafe {
                        api.cuCtxSetCurrent(ctx0).unwrap();
                        api.cuMemcpyDtoH(host.as_mut_ptr().cast(), s, bytes)
                            .unwrap();
                        api.cuCtxSetCurrent(ctx1).unwrap();
                        api.cuMemcpyHtoD(d, host.as_ptr().cast(), bytes).unwrap();
                    }
                },
            );
            row(
                &format!("copy_from_device_via_host {label}, {pair} (+ sync)"),
                t,
                "cuMemcpyDtoH + cuMemcpyHtoD, pageable",
                floor,
                bytes as i64,
                "-",
            );
        }
    }
    // SAFETY: the bench's own stream, idle, destroyed once with its context current.
    unsafe {
        api.cuCtxSetCurrent(ctx0).unwrap();
        api.cuStreamDestroy(own0).unwrap();
    }
}

/// What the driver calls a small `copy_from_device` may make besides the copy cost alone,
/// each timed in turns with an empty closure: asking whether an idle stream of the
/// source's device (`s0`) is idle, recording an event on the destination's stream, the
/// two context switches (a no-op with one context), and the HAL's synchronize against
/// the bare stream synchronize.
fn small_copy_parts(
    hal1: &CudaHal,
    s0: cuda_sys::CUstream,
    ctx0: cuda_sys::CUcontext,
    ctx1: cuda_sys::CUcontext,
) {
    let api = cuda_sys::driver().unwrap();
    let s1 = hal1.stream_handle();
    hal1.synchronize().unwrap();
    // Each part's median less that of an empty closure timed in turns with it.
    let parts = |f: &mut dyn FnMut()| {
        let (t, empty) = paired_median_us(200, 200, f, || {});
        t - empty
    };
    // SAFETY: queries an idle live stream, with its context current.
    let query = parts(&mut || unsafe {
        api.cuCtxSetCurrent(ctx0).unwrap();
        api.cuStreamQuery(s0).unwrap();
    });
    let mut ev = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; hal1's context is current for the event's life.
    unsafe {
        api.cuCtxSetCurrent(ctx1).unwrap();
        api.cuEventCreate(&mut ev, 2).unwrap();
    }
    // SAFETY: a live event of hal1's context recorded on hal1's stream.
    let record = parts(&mut || unsafe { api.cuEventRecord(ev, s1).unwrap() });
    // SAFETY: the event belongs to hal1's context, which is current, and is not used again.
    unsafe {
        api.cuStreamSynchronize(s1).unwrap();
        api.cuEventDestroy(ev).unwrap();
    }
    // SAFETY: both contexts are live retained primary contexts.
    let switches = parts(&mut || unsafe {
        api.cuCtxSetCurrent(ctx0).unwrap();
        api.cuCtxSetCurrent(ctx1).unwrap();
    });
    let (hal_sync, raw_sync) = paired_median_us(
        200,
        200,
        || hal1.synchronize().unwrap(),
        // SAFETY: hal1's stream, with its context made current.
        || unsafe {
            api.cuCtxSetCurrent(ctx1).unwrap();
            api.cuStreamSynchronize(s1).unwrap();
        },
    );
    println!(
        "INFO|multi_gpu|  small copy parts: cuStreamQuery (idle) {query:.2} us, cuEventRecord {record:.2} us, two context switches {switches:.2} us, HAL synchronize {hal_sync:.2} us against cuStreamSynchronize {raw_sync:.2} us (idle streams)"
    );
}
