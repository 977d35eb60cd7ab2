//! GPU tests. Each one skips (printing why) where no driver or device is present, and fails
//! instead when `CUDA_HAL_REQUIRE_GPU=1`, as on the GPU machine.

mod common;

use common::{gpu, gpu_exclusive, Rng, MIB};
use cuda_hal::{driver, ops, CudaHal, Error, LaunchDims, PipelineMode, PHASES};

#[test]
fn driver_reports_device_properties() {
    let Some(hal) = gpu() else { return };
    let count = driver::device_count().unwrap();
    assert!(count >= 1);
    let info = hal.info();
    println!("{info:#?}");
    assert!(!info.name.is_empty());
    assert!(
        info.compute_capability.0 >= 7,
        "{:?}",
        info.compute_capability
    );
    assert!(info.total_memory > (1 << 30));
    assert!(info.driver_version >= 12000);
    assert!(
        info.memory_pools_supported,
        "the HAL's pool needs memory-pool support"
    );
    assert!(info.multiprocessors > 0);
    let again = cuda_hal::DeviceInfo::query(0).unwrap();
    assert_eq!(&again, info);
    assert!(matches!(
        cuda_hal::DeviceInfo::query(count + 3),
        Err(Error::NoDevice { .. })
    ));
}

#[test]
fn embedded_fatbin_loads_and_a_kernel_runs() {
    let Some(hal) = gpu() else { return };
    assert!(cuda_hal::kernels_available(), "built without nvcc");
    let mut rng = Rng::new(1);
    for n in [1usize, 255, 256, 257, 100_003] {
        let (x, y) = (rng.u32s(n), rng.u32s(n));
        let a = hal.copy_from("a", &x).unwrap();
        let b = hal.copy_from("b", &y).unwrap();
        let out = hal.copy_from("out", &vec![0xDEAD_BEEFu32; n]).unwrap();
        // SAFETY: eltwise_add_u32(out, a, b, n) over n elements of each.
        unsafe {
            hal.launch(
                "eltwise_add_u32",
                LaunchDims::for_elements(n, hal.info().multiprocessors),
            )
            .output(&out)
            .input(&a)
            .input(&b)
            .scalar(n as u64)
            .run()
        }
        .unwrap();
        let want: Vec<u32> = x.iter().zip(&y).map(|(a, b)| a.wrapping_add(*b)).collect();
        assert_eq!(out.to_vec().unwrap(), want, "n = {n}");
    }
    // SAFETY: a kernel that is not there is refused before anything is queued.
    let err = unsafe {
        hal.launch("no_such_kernel", LaunchDims::for_elements(1, 1))
            .run()
    }
    .unwrap_err();
    assert!(matches!(err, Error::KernelNotFound { .. }), "{err}");
}

/// PTX of `extern "C" __global__ void user_add_u32(unsigned *x, unsigned k, size_t n)`:
/// `x[i] += k` for every `i < n`, one thread per element.
const USER_ADD_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64
.visible .entry user_add_u32(.param .u64 x, .param .u32 k, .param .u64 n) {
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [x];
    ld.param.u32 %r1, [k];
    ld.param.u64 %rd2, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.u64.u32 %rd3, %r5;
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    shl.b64 %rd5, %rd3, 2;
    add.s64 %rd4, %rd4, %rd5;
    ld.global.u32 %r6, [%rd4];
    add.s32 %r7, %r6, %r1;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
"#;

#[test]
fn own_module_kernels_launch_like_embedded_ones() {
    let Some(hal) = gpu() else { return };
    let n = 100_003usize;
    let dims = LaunchDims {
        grid: (n.div_ceil(256) as u32, 1, 1),
        block: (256, 1, 1),
        shared_bytes: 0,
    };
    let data: Vec<u32> = (0..n as u32).collect();
    let x = hal.copy_from("x", &data).unwrap();
    let add = |k: u32| {
        // SAFETY: user_add_u32(io, k, n), loaded below, adds k to io[0..n); x has n elements.
        unsafe {
            hal.launch("user_add_u32", dims)
                .inout(&x)
                .scalar(k)
                .scalar(n as u64)
                .run()
        }
    };
    assert!(
        matches!(add(1), Err(Error::KernelNotFound { .. })),
        "not loaded yet"
    );
    // The caller need not end PTX with a NUL, whatever the text's length.
    let mut ptx = USER_ADD_PTX.to_string();
    while ptx.len() % 8 != 0 {
        ptx.push(' ');
    }
    hal.load_module(ptx.as_bytes()).unwrap();
    assert_eq!(
        x.get_at(7).unwrap(),
        7,
        "a host copy, where phase 2 keeps one"
    );
    add(5).unwrap();
    assert_eq!(
        x.get_at(7).unwrap(),
        12,
        "the launch invalidated the host copy"
    );
    let want: Vec<u32> = data.iter().map(|v| v + 5).collect();
    assert_eq!(x.to_vec().unwrap(), want);
    // A bad image: the driver's error; the HAL and the loaded kernels still work.
    let err = hal.load_module(b"not a module").unwrap_err();
    assert!(matches!(err, Error::Cuda(_)), "{err}");
    assert!(hal.poisoned().is_none());
    // A truncated fatbin: refused before the driver, which would read past its end.
    if cuda_hal::kernels_available() {
        let half = &cuda_hal::FATBIN[..cuda_hal::FATBIN.len() / 2];
        let err = hal.load_module(half).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
    add(1).unwrap();
    assert_eq!(x.get_at(n - 1).unwrap(), (n - 1) as u32 + 6);
    // Embedded kernels are still looked up first.
    let out = hal.alloc::<u32>("out", n).unwrap();
    // SAFETY: eltwise_add_u32(out, a, b, n) over n elements of each.
    unsafe {
        hal.launch("eltwise_add_u32", dims)
            .output(&out)
            .input(&x)
            .input(&x)
            .scalar(n as u64)
            .run()
    }
    .unwrap();
    assert_eq!(out.get_at(3).unwrap(), 2 * (3 + 6));
}

/// PTX of `extern "C" __global__ void fill_u32(unsigned *out)`: writes 0xBAD to `out[0]`. A
/// user's kernel with the name of the one behind the crate's `fill`, and other parameters.
const USER_FILL_U32_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64
.visible .entry fill_u32(.param .u64 out) {
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 2989;
    st.global.u32 [%rd2], %r1;
    ret;
}
"#;

/// The crate's own operations launch only the embedded kernels, never a loaded module's
/// kernel of the same name (which takes other arguments). With kernels embedded, the
/// embedded kernel is found first by every launch. Built without kernels (`NVCC` pointing
/// nowhere; gpu-run.sh runs this test so with `CUDA_HAL_EXPECT_NO_KERNELS=1`), the
/// operation fails with `KernelsUnavailable`, before and after the user's launch found the
/// user's kernel.
#[test]
fn the_crates_operations_launch_only_embedded_kernels() {
    let Some(hal) = gpu() else { return };
    let expect_none = std::env::var_os("CUDA_HAL_EXPECT_NO_KERNELS").is_some();
    assert_eq!(cuda_hal::kernels_available(), !expect_none);
    let b = hal.copy_from("b", &[1u32; 1024]).unwrap();
    hal.load_module(USER_FILL_U32_PTX.as_bytes()).unwrap();
    // SAFETY: with kernels embedded, fill_u32(out, value, n) over b's elements; without,
    // the user's fill_u32(out) writes b[0].
    let users_launch = || unsafe {
        hal.launch("fill_u32", LaunchDims::for_elements(b.len(), 1))
            .output(&b)
            .scalar(3u32)
            .scalar(b.len() as u64)
            .run()
    };
    if cuda_hal::kernels_available() {
        b.fill(7).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![7u32; 1024]);
        users_launch().unwrap();
        assert_eq!(
            b.to_vec().unwrap(),
            vec![3u32; 1024],
            "the embedded kernel first"
        );
        return;
    }
    assert_eq!(b.fill(7), Err(Error::KernelsUnavailable));
    assert_eq!(
        b.to_vec().unwrap(),
        vec![1u32; 1024],
        "the user's kernel did not run"
    );
    users_launch().unwrap();
    assert_eq!(
        b.get_at(0).unwrap(),
        0xBAD,
        "a user's launch finds the user's kernel"
    );
    b.copy_from_slice(&[1u32; 1024]).unwrap();
    // The lookup now remembers the user's kernel under the name; still refused.
    assert_eq!(b.fill(7), Err(Error::KernelsUnavailable));
    assert_eq!(
        b.to_vec().unwrap(),
        vec![1u32; 1024],
        "the user's kernel did not run"
    );
}

#[test]
fn round_trips_keep_every_byte_at_odd_sizes() {
    let Some(hal) = gpu() else { return };
    let mut rng = Rng::new(2);
    let chunk = hal.config().staging.chunk_bytes / 4;
    for n in [
        1usize,
        3,
        1000,
        4097,
        MIB + 7,
        3 * chunk + 5,
        16 * MIB / 4 * 5 + 1,
    ] {
        let data = rng.u32s(n);
        let b = hal.copy_from("rt", &data).unwrap();
        assert_eq!(b.to_vec().unwrap(), data, "n = {n}");
        let i = rng.below(n);
        assert_eq!(b.get_at(i).unwrap(), data[i]);
        // Overwrite in place with fresh data, then read back again.
        let data2 = rng.u32s(n);
        b.copy_from_slice(&data2).unwrap();
        assert_eq!(b.to_vec().unwrap(), data2, "n = {n} after copy_from_slice");
    }
}

#[test]
fn get_at_moves_what_the_phase_says() {
    let Some(hal) = gpu() else { return };
    let n = 64 * MIB / 4;
    let data = Rng::new(3).u32s(n);
    let b = hal.copy_from("col64", &data).unwrap();
    let before = hal.ledger();
    assert_eq!(b.get_at(12345).unwrap(), data[12345]);
    let first = hal.ledger().since(&before);
    if PHASES.offset_get_at {
        assert_eq!(first.d2h.bytes, 4, "phase 1 moves one element");
    } else {
        assert_eq!(
            first.d2h.bytes,
            (64 * MIB) as u64,
            "baseline moves the whole buffer"
        );
    }
    let before = hal.ledger();
    assert_eq!(b.get_at(777).unwrap(), data[777]);
    let second = hal.ledger().since(&before);
    match (PHASES.host_cache, PHASES.offset_get_at) {
        (true, false) => {
            assert_eq!(second.d2h.bytes, 0, "the first get_at filled the host copy");
            assert_eq!(second.cache_hits, 1);
        }
        (_, true) => assert_eq!(second.d2h.bytes, 4),
        (false, false) => assert_eq!(second.d2h.bytes, (64 * MIB) as u64),
    }
    if PHASES.host_cache {
        b.view(|_| ()).unwrap();
        let before = hal.ledger();
        assert_eq!(b.get_at(999).unwrap(), data[999]);
        let d = hal.ledger().since(&before);
        assert_eq!(
            (d.d2h.bytes, d.cache_hits),
            (0, 1),
            "a valid host copy serves get_at"
        );
    }
}

#[test]
fn repeated_view_of_unchanged_buffer() {
    let Some(hal) = gpu() else { return };
    let n = 64 * MIB / 4;
    let data = Rng::new(4).u32s(n);
    let b = hal.copy_from("view64", &data).unwrap();
    let s1 = hal.ledger();
    assert!(b.view(|s| s == &data[..]).unwrap());
    let s2 = hal.ledger();
    assert!(b.view(|s| s == &data[..]).unwrap());
    let second = hal.ledger().since(&s2);
    assert_eq!(s2.since(&s1).d2h.bytes, (64 * MIB) as u64);
    if PHASES.host_cache {
        assert_eq!(
            second.bytes_moved(),
            0,
            "second view of an unchanged buffer moves nothing"
        );
        assert_eq!(second.cache_hits, 1);
    } else {
        assert_eq!(second.d2h.bytes, (64 * MIB) as u64);
    }
}

#[test]
fn view_after_kernel_write_sees_new_data() {
    let Some(hal) = gpu() else { return };
    let mut rng = Rng::new(5);
    let n = 50_001;
    let (x, y) = (rng.u32s(n), rng.u32s(n));
    let a = hal.copy_from("a", &x).unwrap();
    let b = hal.copy_from("b", &y).unwrap();
    let out = hal.copy_from("out", &x).unwrap();
    assert_eq!(out.to_vec().unwrap(), x, "host copy now cached (phase 2)");
    ops::mul(&out, &a, &b).unwrap();
    let want: Vec<u32> = x.iter().zip(&y).map(|(a, b)| a.wrapping_mul(*b)).collect();
    assert_eq!(out.to_vec().unwrap(), want);
    assert_eq!(out.get_at(n - 1).unwrap(), want[n - 1]);
    // fill is a device write too.
    out.fill(7).unwrap();
    assert!(out.view(|s| s.iter().all(|v| *v == 7)).unwrap());
}

/// A new buffer's first `view_mut` downloads nothing (`alloc`'s contents are unspecified,
/// `alloc_zeroed`'s zeros) and starts from zeros, which the device then gets with the
/// view's edits; a buffer the device wrote first is downloaded as before.
#[test]
fn a_new_buffers_first_view_mut_downloads_nothing() {
    let Some(hal) = gpu() else { return };
    let n = MIB;
    // A block of the same size that held data, which the block cache may hand out again,
    // and (phase 2) a host copy holding it, which the next buffer's host copy reuses.
    let old = hal.copy_from("old", &vec![7u32; n]).unwrap();
    assert_eq!(old.view(|s| s[3]).unwrap(), 7);
    drop(old);
    let reused = hal.stats().unwrap().host_copies.reused;
    let b = hal.alloc::<u32>("new", n).unwrap();
    let before = hal.ledger();
    b.view_mut(|s| {
        assert!(s.iter().all(|x| *x == 0), "the view starts from zeros");
        (s[0], s[n - 1]) = (5, 6);
    })
    .unwrap();
    assert_eq!(
        hal.ledger().since(&before).d2h.bytes,
        0,
        "nothing downloaded"
    );
    if PHASES.host_cache {
        let now = hal.stats().unwrap().host_copies.reused;
        assert_eq!(now, reused + 1, "the old buffer's host copy");
    }
    // The device has the view's bytes, its zeros included (not the old block's sevens).
    let out = hal.alloc::<u32>("out", n).unwrap();
    ops::add(&out, &b, &b).unwrap();
    let v = out.to_vec().unwrap();
    assert_eq!((v[0], v[n - 1]), (10, 12));
    assert!(v[1..n - 1].iter().all(|x| *x == 0));
    // Written by the device first: downloaded, and the edit lands beside the device's bytes.
    let c = hal.alloc::<u32>("written", n).unwrap();
    c.fill(3).unwrap();
    let before = hal.ledger();
    c.view_mut(|s| {
        assert!(s.iter().all(|x| *x == 3));
        s[0] = 4;
    })
    .unwrap();
    assert_eq!(hal.ledger().since(&before).d2h.bytes, 4 * n as u64);
    ops::add(&out, &c, &c).unwrap();
    assert_eq!(out.get_many(&[0, 1, n - 1]).unwrap(), vec![8, 6, 6]);
    // A view of one part: that part goes up, the rest is the device's. (That only the
    // first view downloads nothing is a CPU test of the cache's state: a second view here
    // would download bytes nothing wrote, which initcheck rightly reports.)
    let d = hal.alloc::<u32>("parts", n).unwrap();
    let before = hal.ledger();
    d.slice(0, 16).unwrap().view_mut(|s| s.fill(1)).unwrap();
    assert_eq!(hal.ledger().since(&before).d2h.bytes, 0);
    d.slice(16, n - 16).unwrap().fill(2).unwrap();
    assert_eq!(d.get_many(&[0, 15, 16, n - 1]).unwrap(), vec![1, 1, 2, 2]);
    // A zeroed buffer's zeros are the host copy's: not downloaded either.
    let z = hal.alloc_zeroed::<u32>("zeroed", n).unwrap();
    let before = hal.ledger();
    z.view_mut(|s| s[1] = 1).unwrap();
    assert_eq!(hal.ledger().since(&before).d2h.bytes, 0);
    ops::add(&out, &z, &z).unwrap();
    assert_eq!(out.get_many(&[0, 1, n - 1]).unwrap(), vec![0, 2, 0]);
}

#[test]
fn view_mut_is_uploaded_before_the_device_reads() {
    let Some(hal) = gpu() else { return };
    let mut rng = Rng::new(6);
    let n = 10_000;
    let (x, y) = (rng.f32s(n), rng.f32s(n));
    let a = hal.copy_from("a", &x).unwrap();
    let b = hal.copy_from("b", &y).unwrap();
    let out = hal.alloc::<f32>("out", n).unwrap();
    a.view_mut(|s| {
        s[0] = 1.5;
        s[n - 1] = -2.25;
    })
    .unwrap();
    let mut x2 = x.clone();
    x2[0] = 1.5;
    x2[n - 1] = -2.25;
    if PHASES.host_cache {
        let before = hal.ledger();
        assert_eq!(a.get_at(0).unwrap(), 1.5);
        assert_eq!(
            hal.ledger().since(&before).bytes_moved(),
            0,
            "host copy is newest"
        );
    }
    ops::add(&out, &a, &b).unwrap();
    let want: Vec<f32> = x2.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_eq!(out.to_vec().unwrap(), want);
    // The device saw the edit: read back through a fresh D2D copy too.
    let c = hal.alloc::<f32>("c", n).unwrap();
    c.copy_from_buffer(&a).unwrap();
    assert_eq!(c.to_vec().unwrap(), x2);
}

#[test]
fn raw_write_pointer_invalidates_the_host_copy() {
    let Some(hal) = gpu() else { return };
    let b = hal.copy_from("raw", &vec![1u32; 4096]).unwrap();
    assert_eq!(b.get_at(5).unwrap(), 1);
    b.view(|_| ()).unwrap();
    let p = b.device_ptr_mut().unwrap();
    assert_eq!(p.bytes, 4096 * 4);
    let d = cuda_hal::cuda_sys::driver().unwrap();
    // SAFETY: p covers 4096 u32s of a live allocation; queued on the HAL's stream.
    unsafe { d.cuMemsetD32Async(p.addr, 9, 4096, hal.stream_handle()) }.unwrap();
    assert_eq!(b.get_at(5).unwrap(), 9);
    assert!(b.view(|s| s.iter().all(|v| *v == 9)).unwrap());
    // The read form uploads host-newer data first.
    b.view_mut(|s| s[0] = 42).unwrap();
    let p = b.device_ptr().unwrap();
    let mut v = 0u32;
    hal.synchronize().unwrap();
    // SAFETY: reads 4 bytes of a live allocation into a local.
    unsafe { d.cuMemcpyDtoH((&mut v as *mut u32).cast(), p.addr, 4) }.unwrap();
    assert_eq!(v, 42);
}

#[test]
fn slices_share_the_allocation_and_check_bounds() {
    let Some(hal) = gpu() else { return };
    let data: Vec<u32> = (0..1000).collect();
    let b = hal.copy_from("base", &data).unwrap();
    let s = b.slice(100, 500).unwrap();
    let ss = s.slice(50, 10).unwrap();
    assert_eq!(ss.len(), 10);
    assert_eq!(ss.to_vec().unwrap(), (150..160).collect::<Vec<u32>>());
    assert_eq!(
        s.to_vec().unwrap().len(),
        500,
        "to_vec returns only the slice"
    );
    assert_eq!(ss.get_at(3).unwrap(), 153);
    ss.copy_from_slice(&[7; 10]).unwrap();
    let v = b.to_vec().unwrap();
    assert_eq!(
        &v[148..162],
        &[148, 149, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 160, 161]
    );
    assert!(matches!(s.slice(495, 6), Err(Error::OutOfRange { .. })));
    assert!(matches!(
        s.slice(usize::MAX, 2),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(s.slice(0, 0), Err(Error::ZeroLength { .. })));
    assert!(matches!(ss.get_at(10), Err(Error::OutOfRange { .. })));
    ss.view_mut(|x| x.fill(1)).unwrap();
    assert_eq!(b.get_at(155).unwrap(), 1);
    assert_eq!(b.get_at(160).unwrap(), 160);
}

#[test]
fn allocation_kind_and_pool_statistics_follow_phase_3() {
    let Some(hal) = gpu() else { return };
    hal.synchronize().unwrap();
    let s0 = hal.stats().unwrap();
    let b = hal.alloc::<u8>("pooled", 8 * MIB).unwrap();
    hal.synchronize().unwrap();
    let s1 = hal.stats().unwrap();
    let d = s1.ledger.since(&s0.ledger);
    if PHASES.pool_alloc {
        assert_eq!((d.pool_allocs, d.driver_allocs), (1, 0));
        assert!(s1.pool.used_current >= s0.pool.used_current + (8 * MIB) as u64);
        assert!(s1.pool.reserved_current >= s1.pool.used_current);
        assert!(s1.pool.used_high >= s1.pool.used_current);
    } else {
        assert_eq!((d.pool_allocs, d.driver_allocs), (0, 1));
        assert_eq!(
            s1.pool.used_current, 0,
            "the pool is unused without phase 3"
        );
    }
    drop(b);
    hal.synchronize().unwrap();
    let s2 = hal.stats().unwrap();
    assert_eq!(s2.ledger.frees, s1.ledger.frees + 1);
    if PHASES.pool_alloc {
        // The freed block is kept for the next allocation of its size.
        assert_eq!(s2.cached_bytes, (8 * MIB) as u64);
        let again = hal.alloc::<u8>("pooled-again", 8 * MIB).unwrap();
        let s3 = hal.stats().unwrap();
        assert_eq!(
            s3.ledger.since(&s2.ledger).cached_allocs,
            1,
            "served from the block cache"
        );
        assert_eq!(s3.ledger.since(&s2.ledger).pool_allocs, 0);
        assert_eq!(s3.cached_bytes, 0);
        drop(again);
        hal.trim_pool(0).unwrap();
        let s4 = hal.stats().unwrap();
        assert_eq!(s4.cached_bytes, 0, "trim frees cached blocks");
        assert_eq!(
            s4.pool.used_current, s0.pool.used_current,
            "every byte went back to the pool"
        );
        assert!(s4.pool.reserved_current <= s1.pool.reserved_current);
        // With the cache off, a free goes straight back to the pool.
        let cfg = cuda_hal::HalConfig {
            block_cache_bytes: 0,
            ..Default::default()
        };
        let h2 = CudaHal::with_config(0, cfg).unwrap();
        let b = h2.alloc::<u8>("uncached", MIB).unwrap();
        drop(b);
        h2.synchronize().unwrap();
        let st = h2.stats().unwrap();
        assert_eq!((st.cached_bytes, st.pool.used_current), (0, 0));
        assert!(
            st.pool.reserved_current > 0,
            "default threshold keeps memory reserved"
        );
    } else {
        assert_eq!(s2.pool.used_current, 0);
        assert_eq!(s2.cached_bytes, 0);
    }
}

#[test]
fn bad_input_gets_typed_errors_and_the_hal_stays_usable() {
    let Some(hal) = gpu_exclusive() else { return };
    let b = hal.copy_from("b", &[1u32, 2, 3]).unwrap();
    // The last index there is: an error, not an overflow (a panic in debug builds before
    // 6e37837).
    assert!(matches!(
        b.get_at(usize::MAX),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        b.get_many(&[0, usize::MAX]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        b.get_at(3),
        Err(Error::OutOfRange {
            start: 3,
            end: 4,
            len: 3,
            ..
        })
    ));
    assert!(matches!(
        b.copy_from_slice(&[1, 2]),
        Err(Error::LengthMismatch {
            expected: 3,
            actual: 2,
            ..
        })
    ));
    assert!(matches!(
        hal.alloc::<u32>("empty", 0),
        Err(Error::ZeroLength { .. })
    ));
    assert!(matches!(
        hal.copy_from::<u32>("empty", &[]),
        Err(Error::ZeroLength { .. })
    ));
    let too_big = hal.info().total_memory + 1;
    assert!(matches!(
        hal.alloc::<u8>("huge", too_big),
        Err(Error::OutOfMemory { .. })
    ));
    let pib = 1usize << 50;
    assert!(matches!(
        hal.alloc::<u8>("pib", pib),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(matches!(
        hal.alloc::<u64>("overflow", usize::MAX / 4),
        Err(Error::OutOfMemory { .. })
    ));
    // Within the device size but beyond what is free: the driver refuses.
    let nearly_all = hal.info().total_memory - (1 << 20);
    match hal.alloc::<u8>("nearly-all", nearly_all) {
        Err(Error::OutOfMemory { driver, .. }) => assert!(driver.is_some()),
        other => panic!(
            "expected the driver's OutOfMemory, got {:?}",
            other.map(|b| b.len())
        ),
    }
    let short = hal.alloc::<u32>("short", 2).unwrap();
    assert!(matches!(
        ops::add(&short, &b, &b),
        Err(Error::LengthMismatch { .. })
    ));
    // Output overlapping an input.
    let x = hal.copy_from("x", &[1u32; 8]).unwrap();
    assert!(matches!(ops::add(&x, &x, &x), Err(Error::Aliasing { .. })));
    assert!(matches!(
        ops::add(
            &x.slice(0, 4).unwrap(),
            &x.slice(2, 4).unwrap(),
            &x.slice(4, 4).unwrap()
        ),
        Err(Error::Aliasing { .. })
    ));
    // Still usable.
    assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
    hal.synchronize().unwrap();
    assert!(hal.poisoned().is_none());
}

#[test]
fn misaligned_and_zero_length_requests_are_typed_errors() {
    let Some(hal) = gpu() else { return };
    let bytes = hal.copy_from("bytes", &[0u8; 64]).unwrap();
    assert!(
        matches!(
            bytes.reinterpret::<u32>(2, 4),
            Err(Error::InvalidArgument(_))
        ),
        "misaligned view"
    );
    // The error gives the bytes asked for, 4..68 of 64.
    match bytes.reinterpret::<u32>(4, 16) {
        Err(Error::OutOfRange {
            start, end, len, ..
        }) => {
            assert_eq!((start, end, len), (4, 68, 64), "past the end")
        }
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    let words = hal.copy_from("six-words", &[0u32; 6]).unwrap();
    match words.reinterpret::<u64>(8, 3) {
        Err(Error::OutOfRange {
            start, end, len, ..
        }) => {
            assert_eq!((start, end, len), (2, 8, 6), "u32 elements 2..8 of 6")
        }
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    assert!(matches!(
        bytes.reinterpret::<u32>(0, 0),
        Err(Error::ZeroLength { .. })
    ));
    let words = bytes.reinterpret::<u32>(4, 15).unwrap();
    words.fill(0x0101_0101).unwrap();
    assert_eq!(bytes.get_at(3).unwrap(), 0);
    assert_eq!(bytes.get_at(4).unwrap(), 1);
    assert!(matches!(bytes.get_many(&[]), Err(Error::ZeroLength { .. })));
    assert!(matches!(
        hal.upload_batch::<u8>(&[]),
        Err(Error::ZeroLength { .. })
    ));
    assert!(matches!(
        hal.alloc_pinned::<u8>("pinned", 0, Default::default()),
        Err(Error::ZeroLength { .. })
    ));
    assert!(matches!(
        hal.alloc_managed::<u8>("m", 0),
        Err(Error::ZeroLength { .. })
    ));
    let mut out = vec![0u8; 3];
    assert!(matches!(
        bytes.copy_to_slice(&mut out),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        hal.pipeline(
            &[1u32],
            &mut [0u32],
            0,
            cuda_hal::PipelineMode::Overlapped,
            |_, _, _| Ok(())
        ),
        Err(Error::ZeroLength { .. })
    ));
    // Still usable.
    assert_eq!(bytes.to_vec().unwrap()[4..8], [1, 1, 1, 1]);
}

#[test]
fn buffers_of_another_hal_are_rejected() {
    let Some(h1) = gpu() else { return };
    let h2 = CudaHal::new(0).unwrap();
    let a = h1.copy_from("a", &[1u32; 16]).unwrap();
    let b = h2.copy_from("b", &[2u32; 16]).unwrap();
    let out = h1.alloc::<u32>("out", 16).unwrap();
    assert!(matches!(
        ops::add(&out, &a, &b),
        Err(Error::ForeignBuffer { .. })
    ));
    assert!(matches!(
        out.copy_from_buffer(&b),
        Err(Error::ForeignBuffer { .. })
    ));
    // Columns of one point too, which change nothing (before, they returned Ok).
    {
        use cuda_hal::field::Elem;
        use cuda_hal::Hal;
        let points = h2.alloc::<Elem>("one-point-columns", 4).unwrap();
        for r in [
            h1.batch_ntt(&points, 0, false),
            h1.batch_ntt_radix2(&points, 0, true),
            h1.batch_bit_reverse(&points, 0),
        ] {
            assert!(matches!(r, Err(Error::ForeignBuffer { .. })), "{r:?}");
        }
    }
    // Pinned memory and streams of another HAL, each named as such (before, the error
    // said the device buffer was another HAL's).
    let pinned2 = h2
        .alloc_pinned::<u32>("pinned", 16, cuda_hal::PinnedFlags::default())
        .unwrap();
    let err = out.copy_from_pinned(&pinned2).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("pinned memory of another HAL")),
        "{err}"
    );
    let mut pinned1 = h1
        .alloc_pinned::<u32>("pinned", 16, cuda_hal::PinnedFlags::default())
        .unwrap();
    let err = out
        .copy_to_pinned_on(&mut pinned1, &h2.create_stream().unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("stream of another HAL")),
        "{err}"
    );
    // An event may be recorded on a stream of another HAL of its device (they share the
    // device's context), and timed against that HAL's events.
    let (start, end) = (h1.create_event().unwrap(), h2.create_event().unwrap());
    start.record(&h2.main_stream()).unwrap();
    end.record(&h2.main_stream()).unwrap();
    end.synchronize().unwrap();
    assert!(end.elapsed_ms(&start).unwrap() >= 0.0);
    // Both HALs keep working, independently.
    let out2 = h2.alloc::<u32>("out2", 16).unwrap();
    ops::add(&out2, &b, &b).unwrap();
    assert_eq!(out2.to_vec().unwrap(), vec![4; 16]);
    ops::add(&out, &a, &a).unwrap();
    assert_eq!(out.to_vec().unwrap(), vec![2; 16]);
}

#[test]
fn host_view_in_the_way_is_an_error_not_a_deadlock() {
    let Some(hal) = gpu() else { return };
    let a = hal.copy_from("a", &[1u32; 64]).unwrap();
    let out = hal.alloc::<u32>("out", 64).unwrap();
    let inner = a.view_mut(|s| {
        s[0] = 2;
        ops::add(&out, &a, &a)
    });
    // In every build (without phase 2 the kernel read the device's stale bytes before
    // 6e37837).
    assert!(matches!(inner.unwrap(), Err(Error::BufferBorrowed { .. })));
    // A device write into the view's bytes is refused too: without phase 2 the view's
    // upload used to overwrite it, and the write was lost.
    let before = a.to_vec().unwrap();
    let inner = a.view_mut(|s| {
        s[1] = 7;
        a.slice(2, 2).unwrap().copy_from_slice(&[5, 5])
    });
    assert!(matches!(inner.unwrap(), Err(Error::BufferBorrowed { .. })));
    let mut expect = before;
    expect[1] = 7;
    assert_eq!(a.to_vec().unwrap(), expect);
    a.slice(1, 1).unwrap().copy_from_slice(&[1]).unwrap();
    ops::add(&out, &a, &a).unwrap();
    assert_eq!(out.get_at(0).unwrap(), 4);
    // Nested shared views are fine.
    let total = a.view(|s| a.view(|t| s[1] + t[2]).unwrap()).unwrap();
    assert_eq!(total, 2);
    // An edit inside a view of the same elements is refused, in every build, as by
    // `CpuHal` (without phase 2 it went ahead through 8fdff46, the outer view then showing
    // stale elements); the device may still use them meanwhile.
    let (edit, device) = a
        .view(|_| {
            (
                a.slice(3, 2).unwrap().view_mut(|s| s[0] = 9),
                ops::add(&out, &a, &a),
            )
        })
        .unwrap();
    assert!(
        matches!(edit, Err(Error::BufferBorrowed { .. })),
        "{edit:?}"
    );
    device.unwrap();
    assert_eq!((a.get_at(3).unwrap(), out.get_at(3).unwrap()), (1, 2));
}

/// A `view_mut` whose closure panics leaves its edits and ends, in every build (before,
/// builds without phase 2 dropped them, and `CpuHal` did; phase 2 kept them).
#[test]
fn a_panicking_view_leaves_its_edits() {
    let Some(hal) = gpu() else { return };
    let b = hal.copy_from("edits", &[7u32; 1000]).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.slice(10, 5).unwrap().view_mut(|s| {
            s[0] = 99;
            panic!("a panicking view (expected by the test)");
        })
    }));
    assert!(unwound.is_err());
    let out = hal.alloc::<u32>("out", 1000).unwrap();
    ops::add(&out, &b, &b).unwrap();
    assert_eq!(
        (out.get_at(10).unwrap(), out.get_at(11).unwrap()),
        (198, 14)
    );
    assert_eq!(b.get_at(10).unwrap(), 99);
    b.view_mut(|s| s[11] = 1).unwrap();
    assert_eq!(b.get_at(11).unwrap(), 1, "the view ended");
}

/// A view of one part of a buffer leaves the rest to the device, even with host edits of
/// the whole buffer still to upload (refused with phase 2 through 737646b).
#[test]
fn a_view_of_one_part_leaves_the_rest_to_the_device() {
    let Some(hal) = gpu() else { return };
    let a = hal.copy_from("parts", &[0u32; 64]).unwrap();
    a.view_mut(|s| s[0] = 1).unwrap(); // with phase 2: every byte newer on the host
    let (head, tail) = (a.slice(0, 32).unwrap(), a.slice(32, 32).unwrap());
    let inner = head
        .view_mut(|h| {
            h[1] = 2;
            let write = tail.copy_from_slice(&[7; 32]);
            let whole = tail.hal().alloc::<u32>("whole", 64).unwrap();
            // The whole buffer includes the view's bytes: refused.
            let read_all = ops::add(&whole, &a, &a);
            (write, read_all)
        })
        .unwrap();
    inner.0.unwrap();
    assert!(matches!(inner.1, Err(Error::BufferBorrowed { .. })));
    let v = a.to_vec().unwrap();
    assert_eq!(&v[..3], &[1, 2, 0]);
    assert!(v[32..].iter().all(|x| *x == 7), "{v:?}");
}

#[test]
fn staging_memory_is_reused_not_reallocated() {
    let Some(hal) = gpu() else { return };
    let data = Rng::new(8).u32s(32 * MIB / 4);
    let b = hal.copy_from("stage", &data).unwrap();
    assert_eq!(b.to_vec().unwrap(), data);
    let s1 = hal.stats().unwrap().staging;
    for _ in 0..3 {
        b.copy_from_slice(&data).unwrap();
        assert_eq!(b.to_vec().unwrap(), data);
    }
    let s2 = hal.stats().unwrap().staging;
    if PHASES.async_copy {
        assert!(s1.slots_allocated > 0);
        assert!(s1.slots_allocated <= hal.config().staging.max_slots as u64);
        assert_eq!(
            s2.slots_allocated, s1.slots_allocated,
            "no new pinned memory"
        );
        assert!(s2.slot_reuses > s1.slot_reuses);
    } else {
        assert_eq!(s2.slots_allocated, 0, "no staging without phase 4");
    }
}

#[test]
fn one_hal_shared_by_threads() {
    let Some(hal) = gpu() else { return };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let hal = hal.clone();
            s.spawn(move || {
                let mut rng = Rng::new(100 + t);
                for _ in 0..20 {
                    let n = 1 + rng.below(200_000);
                    let (x, y) = (rng.u32s(n), rng.u32s(n));
                    let a = hal.copy_from("a", &x).unwrap();
                    let b = hal.copy_from("b", &y).unwrap();
                    let out = hal.alloc::<u32>("out", n).unwrap();
                    ops::add(&out, &a, &b).unwrap();
                    let i = rng.below(n);
                    assert_eq!(out.get_at(i).unwrap(), x[i].wrapping_add(y[i]));
                    let want: Vec<u32> =
                        x.iter().zip(&y).map(|(a, b)| a.wrapping_add(*b)).collect();
                    assert!(out.view(|v| v == &want[..]).unwrap());
                }
            });
        }
    });
}

/// A cached alloc+free makes no driver call and binds no context, so no operation may rely
/// on the one before it to have bound the HAL's context. Here nothing is current on the
/// thread before each step (as after another library, or a HAL of another device, changed
/// it): a step that reached the driver without binding would fail with an invalid context.
#[test]
fn every_operation_binds_the_context_whatever_is_current() {
    let Some(hal) = gpu() else { return };
    let unbind = || {
        // SAFETY: only makes no context current on this thread.
        unsafe {
            cuda_hal::cuda_sys::driver()
                .unwrap()
                .cuCtxSetCurrent(std::ptr::null_mut())
        }
        .unwrap();
    };
    let n = 4096;
    let data: Vec<u32> = (0..n as u32).collect();
    drop(hal.alloc::<u32>("rebind", n).unwrap()); // with phase 3 the next one is cached
    unbind();
    let b = hal.alloc::<u32>("rebind", n).unwrap();
    unbind();
    b.copy_from_slice(&data).unwrap();
    unbind();
    assert_eq!(b.to_vec().unwrap(), data);
    unbind();
    b.fill(7).unwrap();
    unbind();
    assert_eq!(b.get_at(5).unwrap(), 7);
    unbind();
    drop(hal.alloc::<u32>("rebind-zeroed", n).unwrap());
    unbind();
    let zeroed = hal.alloc_zeroed::<u32>("rebind-zeroed", n).unwrap(); // cached, then a memset
    unbind();
    assert!(zeroed.view(|v| v.iter().all(|&x| x == 0)).unwrap());
    unbind();
    let copy = hal.copy_from("rebind-copy", &data).unwrap();
    unbind();
    let grown = copy.resized(2 * n).unwrap();
    unbind();
    assert_eq!(grown.slice(0, n).unwrap().to_vec().unwrap(), data);
    unbind();
    // SAFETY: eltwise_add_u32(out, a, b, n) over n elements of each.
    unsafe {
        hal.launch(
            "eltwise_add_u32",
            LaunchDims::for_elements(n, hal.info().multiprocessors),
        )
        .output(&b)
        .input(&copy)
        .input(&zeroed)
        .scalar(n as u64)
        .run()
    }
    .unwrap();
    unbind();
    assert_eq!(b.to_vec().unwrap(), data);
    unbind();
    drop((b, copy, zeroed, grown));
    unbind();
    hal.trim_pool(0).unwrap();
    unbind();
    hal.synchronize().unwrap();
    // User code inside an operation may leave no context (or another HAL's) current: a
    // pipeline's `compute`, a view's closure. The steps after it bind again; before, the
    // next event or staging slot was made in the wrong context and kept.
    let input: Vec<u32> = (0..3 * n as u32).collect();
    let mut output = vec![0u32; 3 * n];
    hal.pipeline(
        &input,
        &mut output,
        n,
        PipelineMode::Overlapped,
        |s, i, o| {
            // SAFETY: lcg_rounds_u32(out, in, n, rounds) over the chunk's n elements.
            unsafe {
                hal.launch("lcg_rounds_u32", LaunchDims::for_elements(i.len(), 132))
                    .on(s)
                    .output(o)
                    .input(i)
                    .scalar(i.len() as u64)
                    .scalar(0u32)
                    .run()?
            };
            unbind();
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(output, input, "zero rounds: a copy");
    let side = hal.create_stream().unwrap();
    let c = hal.copy_from("rebind-side", &data).unwrap();
    c.view_mut(|v| {
        v[0] = 9;
        unbind();
    })
    .unwrap();
    for _ in 0..40 {
        // SAFETY: fill_u32(out, value, n) writes c's n elements.
        unsafe {
            hal.launch("fill_u32", LaunchDims::for_elements(n, 132))
                .on(&side)
                .output(&c)
                .scalar(3u32)
                .scalar(n as u64)
                .run()
        }
        .unwrap();
        unbind();
    }
    assert_eq!(c.to_vec().unwrap(), vec![3; n]);
}

/// Runs `poison_child` in a child process: a device fault poisons the process's primary
/// context, which would break the other tests running in this one. Afterwards this (other)
/// process creates a new HAL and runs a kernel: the device itself is fine.
#[test]
fn device_fault_poisons_the_hal_and_a_new_one_works() {
    let Some(_hal) = gpu() else { return };
    common::run_child("poison_child", &[]);
    let hal = CudaHal::new(0).unwrap();
    let b = hal.copy_from("after-fault", &[5u32; 4]).unwrap();
    ops::add(
        &b.slice(0, 2).unwrap(),
        &b.slice(2, 2).unwrap(),
        &b.slice(2, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![10, 10, 5, 5]);
}

/// With every device hidden (`CUDA_VISIBLE_DEVICES=`), `cuInit` itself reports no device:
/// the HAL says so as it does on a machine with none, in a child process (a process
/// initialises the driver once).
#[test]
fn hidden_devices_count_as_none() {
    let Some(_hal) = gpu() else { return };
    common::run_child("hidden_devices_child", &[("CUDA_VISIBLE_DEVICES", "")]);
}

#[test]
#[ignore = "run by hidden_devices_count_as_none in its own process"]
fn hidden_devices_child() {
    if !common::is_child("hidden_devices_child") {
        return;
    }
    // Before 6e37837 both failed with the CUDA_ERROR_NO_DEVICE of `cuInit`.
    assert_eq!(cuda_hal::driver::device_count().unwrap(), 0);
    match CudaHal::new(0) {
        Err(Error::NoDevice {
            ordinal: 0,
            count: 0,
        }) => {}
        Err(e) => panic!("expected NoDevice, got {e}"),
        Ok(_) => panic!("a HAL with every device hidden"),
    }
    println!("CHILD-OK");
}

#[test]
#[ignore = "run by device_fault_poisons_the_hal_and_a_new_one_works in its own process"]
fn poison_child() {
    if !common::is_child("poison_child") {
        return;
    }
    let hal = CudaHal::new(0).unwrap();
    let other = hal.clone();
    // Another HAL of the device: the same primary context, which the fault breaks too.
    let separate = CudaHal::new(0).unwrap();
    let cached = separate.alloc::<u32>("cached", 4).unwrap();
    drop(cached);
    let keep = hal.copy_from("keep", &[1u32; 4]).unwrap();
    common::fault_context(&hal);
    assert!(hal.poisoned().is_some());
    assert!(
        other.poisoned().is_some(),
        "every handle of the HAL sees it"
    );
    assert!(matches!(keep.to_vec(), Err(Error::ContextPoisoned { .. })));
    assert!(matches!(keep.get_at(0), Err(Error::ContextPoisoned { .. })));
    assert!(matches!(
        hal.alloc::<u32>("x", 4),
        Err(Error::ContextPoisoned { .. })
    ));
    assert!(matches!(
        other.synchronize(),
        Err(Error::ContextPoisoned { .. })
    ));
    // The other HAL knows of the fault (before 2026-11-26 it did not), and refuses at once,
    // even an allocation its block cache could serve without the driver.
    assert!(separate.poisoned().is_some(), "another HAL on the context");
    assert!(matches!(
        separate.alloc::<u32>("cached", 4),
        Err(Error::ContextPoisoned { .. })
    ));
    // A new HAL while the faulted context is still held: the driver hands the context out
    // and the first call in it fails. Before, that was the raw driver error of the stream's
    // creation, not the poisoning.
    match CudaHal::new(0) {
        Err(Error::ContextPoisoned { .. }) => {}
        Err(e) => panic!("expected ContextPoisoned, got {e}"),
        Ok(_) => panic!("a new HAL on a faulted context"),
    }
    drop((keep, hal, other, separate));
    // The driver keeps a fault for the rest of the process ("the process must be terminated
    // and relaunched"): a new HAL here is a typed error, never a panic or a hang.
    match CudaHal::new(0) {
        Ok(h) => {
            let b = h.copy_from("fresh", &[5u32; 4]).unwrap();
            assert_eq!(b.to_vec().unwrap(), vec![5; 4]);
            println!("RECOVERY: in-process");
        }
        Err(e) => {
            assert!(matches!(e, Error::ContextPoisoned { .. }), "{e}");
            println!("RECOVERY: needs a new process ({e})");
        }
    }
    println!("CHILD-OK");
}

/// Driver objects keep their context alive: with the last other reference to the primary
/// context gone (which makes the driver destroy it, and everything in it), pinned memory,
/// a stream, an event and a module still work, and their drops find them alive. In a
/// child process, where no other test holds the context. Before, writing the pinned
/// memory crashed the process (measured on an H200).
#[test]
fn driver_objects_keep_their_context_alive() {
    let Some(_hal) = gpu() else { return };
    common::run_child("driver_objects_child", &[]);
}

/// Nothing the crate makes outlives the HALs of a device: once they and their buffers,
/// streams and reads are dropped, the device's primary context is no longer retained by
/// anything (a leaked buffer, stream, event, module or HAL state would hold it). In a
/// process of its own, where no other test holds the context.
#[test]
fn nothing_outlives_the_hals_of_a_device() {
    let Some(_hal) = gpu() else { return };
    common::run_child("nothing_outlives_child", &[]);
}

#[test]
#[ignore = "run by nothing_outlives_the_hals_of_a_device in its own process"]
fn nothing_outlives_child() {
    if !common::is_child("nothing_outlives_child") {
        return;
    }
    assert!(
        !driver::PrimaryContext::is_active(0).unwrap(),
        "retained before any HAL"
    );
    {
        let a = CudaHal::new(0).unwrap();
        let lazy = cuda_hal::HalConfig {
            preload_kernels: false,
            ..cuda_hal::HalConfig::default()
        };
        let b = CudaHal::with_config(0, lazy).unwrap();
        let n = 1 << 20;
        let x = a
            .copy_from("x", &(0..n as u32).collect::<Vec<_>>())
            .unwrap();
        let y = a.alloc::<u32>("y", n).unwrap();
        ops::add(&y, &x, &x).unwrap();
        assert_eq!(y.get_at(7).unwrap(), 14);
        let side = a.create_stream().unwrap();
        let dims = LaunchDims::for_elements(n, a.info().multiprocessors);
        // SAFETY: fill_u32(out, value, n) writes y's n elements.
        unsafe {
            a.launch("fill_u32", dims)
                .output(&y)
                .scalar(3u32)
                .scalar(n as u64)
                .on(&side)
                .run()
        }
        .unwrap();
        // The read waits for the side stream's write.
        assert!(y
            .read_async()
            .unwrap()
            .wait()
            .unwrap()
            .iter()
            .all(|&v| v == 3));
        a.upload_batch(&[(&x, &vec![1u32; n][..])]).unwrap();
        let mut out = vec![0u32; n];
        a.download_batch(&mut [(&x, &mut out[..])]).unwrap();
        assert_eq!((out[5], x.view(|s| s[n - 1]).unwrap()), (1, 1));
        let z = b.copy_from("z", &[1u64; 4096]).unwrap();
        z.fill(9).unwrap();
        assert_eq!(z.get_at(4095).unwrap(), 9);
        let on_thread = a.clone();
        std::thread::spawn(move || drop(on_thread.alloc::<u8>("t", 1 << 16).unwrap()))
            .join()
            .unwrap();
        drop(x); // freed while its HAL lives; y and z go with the scope
        assert!(
            driver::PrimaryContext::is_active(0).unwrap(),
            "the HALs hold the context"
        );
    }
    // Anything released on another thread (a copy thread's last hold) has a moment to go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while driver::PrimaryContext::is_active(0).unwrap() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        !driver::PrimaryContext::is_active(0).unwrap(),
        "something the HALs made still holds the device's context"
    );
    println!("CHILD-OK");
}

#[test]
#[ignore = "run by driver_objects_keep_their_context_alive in its own process"]
fn driver_objects_child() {
    if !common::is_child("driver_objects_child") {
        return;
    }
    let ctx = driver::PrimaryContext::retain(0).unwrap();
    ctx.bind().unwrap();
    let mut pinned = driver::PinnedMemory::new(1 << 20, cuda_hal::PinnedFlags::default()).unwrap();
    let stream = driver::Stream::new_non_blocking().unwrap();
    let event = driver::Event::new().unwrap();
    let module =
        cuda_hal::kernels_available().then(|| driver::Module::load(cuda_hal::FATBIN).unwrap());
    let pool = driver::MemPool::new(0, 0).unwrap();
    drop(ctx); // the only reference but the objects'
    pinned.as_mut_slice().fill(7);
    event.record(&stream).unwrap();
    event.synchronize().unwrap();
    if let Some(m) = &module {
        m.function("fill_u32").unwrap();
    }
    assert_eq!(pool.reserved_bytes().unwrap(), 0);
    assert!(pinned.as_slice().iter().all(|b| *b == 7));
    drop((pinned, stream, event, module, pool));
    // Without a current context, objects cannot be made.
    // SAFETY: only makes no context current on this thread.
    unsafe {
        cuda_hal::cuda_sys::driver()
            .unwrap()
            .cuCtxSetCurrent(std::ptr::null_mut())
    }
    .unwrap();
    assert!(matches!(
        driver::Event::new(),
        Err(Error::InvalidArgument(_))
    ));
    println!("CHILD-OK");
}

/// Reads that meet another view get the same answers in every phase build, as on
/// `CpuHal`:
/// - `get_at` of an element outside an open `view_mut` of another part of the buffer is
///   served; before, builds without phase 1 (which read the whole buffer) refused it with
///   `BufferBorrowed`;
/// - `to_vec` and a nested `view` inside a shared view, after a device write since it
///   began, read the new data; before, phase-2 builds refused them (the host copy could
///   not be brought up to date under the open view);
/// - elements aligned past a page are read by `to_vec` and `get_at` in every build; before,
///   phase-2 builds refused them (they cannot be viewed in the host copy).
#[test]
fn reads_beside_other_views_work_in_every_build() {
    let Some(hal) = gpu() else { return };
    let b = hal.copy_from("rows", &[1u32, 2, 3, 4]).unwrap();
    let tail = b.slice(2, 2).unwrap();
    assert_eq!(tail.view_mut(|_| b.get_at(0)).unwrap().unwrap(), 1);
    assert!(matches!(
        tail.view_mut(|_| b.get_at(3)).unwrap(),
        Err(Error::BufferBorrowed { .. })
    ));
    tail.view_mut(|t| t[1] = 40).unwrap();
    assert_eq!(b.get_at(3).unwrap(), 40);

    let c = hal.copy_from("column", &[1u32; 64]).unwrap();
    let (all, first, one) = c
        .view(|old| {
            c.fill(9).unwrap();
            (c.to_vec(), c.view(|s| s[0]), (old[0], c.get_at(5)))
        })
        .unwrap();
    assert_eq!(all.unwrap(), vec![9; 64]);
    assert_eq!(first.unwrap(), 9);
    assert_eq!(
        (one.0, one.1.unwrap()),
        (1, 9),
        "the outer view keeps what it read"
    );
    assert_eq!(c.to_vec().unwrap(), vec![9; 64]);

    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(8192))]
    struct Page([[u8; 4096]; 2]);
    let mut page = Page([[0; 4096]; 2]);
    page.0[1][4095] = 7;
    let p = hal
        .copy_from("page", &[page, Page([[1; 4096]; 2])])
        .unwrap();
    let back = p.to_vec().unwrap();
    assert_eq!((back[0].0[1][4095], back[1].0[0][0]), (7, 1));
    assert_eq!(p.get_at(0).unwrap().0[1][4095], 7);
}

/// Resident bytes of this process.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A small view of a large buffer commits host memory for what it reads, not for the whole
/// buffer: a host copy mirrors its allocation, and before, a new one was zeroed through on
/// one thread (2 GiB committed, and seconds, for 4 KiB read here).
#[test]
fn a_small_view_of_a_large_buffer_commits_little_host_memory() {
    // The device to itself: no other test's host memory lands in the figure.
    let Some(hal) = gpu_exclusive() else { return };
    let big = hal.alloc::<u8>("big", 2048 * MIB).unwrap();
    big.slice(MIB, 4096).unwrap().fill(7).unwrap();
    let before = resident_bytes();
    let part = big.slice(MIB, 4096).unwrap();
    assert_eq!(part.to_vec().unwrap(), vec![7u8; 4096]);
    assert_eq!(part.view(|s| s[4095]).unwrap(), 7);
    assert_eq!(big.get_at(MIB + 5).unwrap(), 7);
    let grown = resident_bytes().saturating_sub(before);
    println!(
        "a 4 KiB view of a 2 GiB buffer committed {} KiB",
        grown >> 10
    );
    assert!(
        grown < 256 * MIB,
        "{grown} bytes committed for a 4 KiB view"
    );
}
