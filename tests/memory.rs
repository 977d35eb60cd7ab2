//! GPU tests of issue #5: tracking, limits, pool statistics, arena, resize, managed memory
//! and log traces. Skip without a GPU (fail with `CUDA_HAL_REQUIRE_GPU=1`).

mod common;

use std::sync::{Mutex, Once};

use common::{gpu, gpu_exclusive, Rng, MIB};
use cuda_hal::{
    ArenaLayout, CudaHal, Error, GrowableBuffer, HalConfig, LaunchDims, ManagedAdvice,
    ManagedLocation, ManagedRangeInfo, PinnedFlags, StagingConfig, PHASES,
};

/// Captures log records so tests can read the allocation traces and the leak report.
struct Capture;
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        if r.target().starts_with("cuda_hal") {
            LINES
                .lock()
                .unwrap()
                .push(format!("{} {}", r.level(), r.args()));
        }
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        static CAPTURE: Capture = Capture;
        log::set_logger(&CAPTURE).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn logged(needle: &str) -> bool {
    logged_both(needle, needle)
}

fn logged_both(a: &str, b: &str) -> bool {
    LINES
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains(a) && l.contains(b))
}

#[test]
fn live_allocations_are_tracked_by_name_with_peaks() {
    let Some(hal) = gpu() else { return };
    capture_logs();
    let base = hal.memory_report();
    assert!(base.live.is_empty());
    let a = hal.alloc::<u8>("trace-column", MIB).unwrap();
    let b = hal.alloc::<u8>("trace-column", 2 * MIB).unwrap();
    let c = hal.alloc::<u32>(format!("trace-tree-{}", 3), 1000).unwrap();
    let live = hal.live_allocations();
    assert_eq!(live.len(), 3);
    assert_eq!(
        (live[0].name.as_str(), live[0].bytes),
        ("trace-column", 2 * MIB)
    );
    drop(b);
    let r = hal.memory_report();
    assert_eq!(r.current_bytes, MIB + 4000);
    assert_eq!(r.peak_bytes, 3 * MIB + 4000);
    let col = r.by_name.iter().find(|n| n.name == "trace-column").unwrap();
    assert_eq!(
        (col.live, col.current_bytes, col.peak_bytes, col.allocations),
        (1, MIB, 3 * MIB, 2)
    );
    assert!(r.to_string().contains("trace-tree-3"));
    assert!(
        logged("alloc `trace-column`: 1048576 bytes"),
        "allocation traces are logged"
    );
    assert!(logged("free `trace-column`: 2097152 bytes"));
    // A block the cache kept serves the next request of its size: logged as such.
    let before = hal.ledger();
    let again = hal.alloc::<u8>("trace-again", 2 * MIB).unwrap();
    let cached = hal.ledger().since(&before).cached_allocs == 1;
    assert!(logged("alloc `trace-again`: 2097152 bytes at 0x"));
    assert_eq!(
        logged_both("alloc `trace-again`", "(cached block)"),
        cached,
        "the trace says where the block came from"
    );
    // Managed memory: its allocation and its free.
    drop(hal.alloc_managed::<u8>("trace-managed", 4096).unwrap());
    assert!(logged(
        "alloc `trace-managed`: 4096 bytes of managed memory"
    ));
    assert!(logged("free `trace-managed`: 4096 bytes of managed memory"));
    // A refusal says what was asked, what was in use and the limit.
    let limited = CudaHal::with_config(
        0,
        HalConfig {
            memory_limit: Some(MIB),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        limited.alloc::<u8>("trace-refused", 2 * MIB),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(
        logged("refused `trace-refused`: 2097152 bytes, 0 in use, limit Some(1048576)"),
        "{:?}",
        LINES.lock().unwrap()
    );
    drop((a, c, again));
    assert_eq!(hal.memory_report().current_bytes, 0);
}

#[test]
fn the_last_handle_going_away_reports_what_is_still_alive() {
    let Some(hal) = gpu() else { return };
    capture_logs();
    let own = CudaHal::new(0).unwrap();
    let leak = own.alloc::<u8>("leaky-buffer", 12345).unwrap();
    let leaky_managed = own.alloc_managed::<u8>("leaky-managed", 4096).unwrap();
    let second = own.clone();
    drop(own);
    assert!(
        !logged_both("buffers remain", "leaky-buffer"),
        "a handle is still alive"
    );
    drop(second);
    assert!(
        logged_both("buffers remain", "leaky-buffer"),
        "{:?}",
        LINES.lock().unwrap()
    );
    assert!(
        logged_both("buffers remain", "leaky-managed"),
        "managed memory is in the report: {:?}",
        LINES.lock().unwrap()
    );
    drop(leaky_managed);
    // The buffer still works: it keeps the HAL's state alive.
    assert_eq!(leak.len(), 12345);
    leak.fill(1).unwrap();
    assert_eq!(leak.get_at(12344).unwrap(), 1);
    // Operations that use the HAL inside the call do not count as handles: the report is
    // not logged again (it was, once for each such call, before 6e37837).
    let grown = leak.resized(20000).unwrap();
    assert_eq!(leak.read_async().unwrap().wait().unwrap()[7], 1);
    assert_eq!(grown.get_at(12344).unwrap(), 1);
    let reports = || {
        LINES
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("buffers remain") && l.contains("leaky-buffer"))
            .count()
    };
    assert_eq!(reports(), 1, "{:?}", LINES.lock().unwrap());
    // A handle the user takes from a buffer counts: dropping it reports again.
    drop(grown.hal());
    assert_eq!(reports(), 2, "{:?}", LINES.lock().unwrap());
    drop(hal);
}

/// Pinned buffers are tracked by name and size as device buffers are, in a report of their
/// own (host memory: the HAL's device limit does not apply to them), with traces, and in the
/// report the last handle logs; the HAL's own pool of pinned blocks is not in it.
#[test]
fn pinned_buffers_are_tracked_by_name_apart_from_device_memory() {
    let Some(_gpu) = gpu() else { return };
    capture_logs();
    let own = CudaHal::with_config(
        0,
        HalConfig {
            memory_limit: Some(MIB),
            ..Default::default()
        },
    )
    .unwrap();
    let flags = PinnedFlags::default();
    // Past the device limit: not device memory.
    let a = own
        .alloc_pinned::<u8>("pinned-witness", 2 * MIB, flags)
        .unwrap();
    let mut b = own
        .alloc_pinned::<u32>("pinned-witness", 1000, flags)
        .unwrap();
    let wc = PinnedFlags {
        write_combined: true,
        ..flags
    };
    let c = own
        .alloc_pinned::<u64>(format!("pinned-out-{}", 1), 16, wc)
        .unwrap();
    assert_eq!((a.name(), c.name()), ("pinned-witness", "pinned-out-1"));
    let r = own.pinned_report();
    let live: Vec<_> = r.live.iter().map(|l| (l.name.as_str(), l.bytes)).collect();
    assert_eq!(
        live,
        [
            ("pinned-witness", 2 * MIB),
            ("pinned-witness", 4000),
            ("pinned-out-1", 128)
        ]
    );
    assert_eq!(r.current_bytes, 2 * MIB + 4128);
    assert!(own.memory_report().live.is_empty(), "no device memory");
    drop(a);
    let r = own.pinned_report();
    assert_eq!((r.current_bytes, r.peak_bytes), (4128, 2 * MIB + 4128));
    let w = r
        .by_name
        .iter()
        .find(|n| n.name == "pinned-witness")
        .unwrap();
    assert_eq!(
        (w.live, w.current_bytes, w.peak_bytes, w.allocations),
        (1, 4000, 2 * MIB + 4000, 2)
    );
    assert!(logged(
        "alloc `pinned-witness`: 2097152 bytes of pinned memory at 0x"
    ));
    assert!(logged(
        "free `pinned-witness`: 2097152 bytes of pinned memory at 0x"
    ));
    match own.alloc_pinned::<u8>("pinned-empty", 0, flags) {
        Err(Error::ZeroLength { name }) => assert_eq!(name, "pinned-empty"),
        other => panic!("expected ZeroLength, got {:?}", other.map(|p| p.len())),
    }
    assert!(own
        .pinned_report()
        .live
        .iter()
        .all(|l| l.name != "pinned-empty"));
    // The HAL's own pinned blocks (a read borrows one) are not the user's buffers.
    let dev = own.copy_from("pinned-dev", &[5u32; 1 << 16]).unwrap();
    assert_eq!(dev.read_async().unwrap().wait().unwrap()[9], 5);
    let pool = own.stats().unwrap().pinned;
    assert!(
        pool.hits + pool.misses > 0,
        "a pool block was lent: {pool:?}"
    );
    assert_eq!(own.pinned_report().live.len(), 2);
    // The last handle gone: the pinned buffers left are logged by name.
    drop(own);
    assert!(
        logged_both("pinned buffers remain", "pinned-out-1"),
        "{:?}",
        LINES.lock().unwrap()
    );
    // They still work, and are freed with their buffer.
    b.host_mut().unwrap().fill(7);
    dev.slice(0, 1000).unwrap().copy_from_pinned(&b).unwrap();
    assert_eq!(dev.get_at(999).unwrap(), 7);
    let hal = dev.hal();
    drop(b);
    assert_eq!(hal.pinned_report().current_bytes, 128);
    drop(c);
    assert_eq!(hal.pinned_report().current_bytes, 0);
}

/// A HAL whose limit is 64 MiB.
fn limited_to_64_mib() -> CudaHal {
    let config = HalConfig {
        memory_limit: Some(64 * MIB),
        ..Default::default()
    };
    CudaHal::with_config(0, config).unwrap()
}

/// Checks that `r` is the refusal of 30 MiB by [`limited_to_64_mib`]'s limit, with 40 MiB
/// in use, all of it `live`, before the driver was asked.
fn refused_past_64_mib(r: cuda_hal::Result<usize>, live: &str) {
    match r {
        Err(Error::OutOfMemory {
            requested,
            in_use,
            limit,
            largest,
            driver,
            ..
        }) => {
            assert_eq!(
                (requested, in_use, limit),
                (30 * MIB, 40 * MIB, Some(64 * MIB))
            );
            assert_eq!(largest, vec![(live.to_string(), 40 * MIB)]);
            assert!(driver.is_none(), "refused before the driver");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn the_limit_refuses_before_the_driver_is_asked() {
    let Some(_g) = gpu() else { return };
    let hal = limited_to_64_mib();
    let big = hal.alloc::<u8>("big", 40 * MIB).unwrap();
    let before = hal.ledger();
    refused_past_64_mib(
        hal.alloc::<u8>("too-much", 30 * MIB).map(|b| b.len()),
        "big",
    );
    let d = hal.ledger().since(&before);
    assert_eq!(d.driver_allocs + d.pool_allocs + d.cached_allocs, 0);
    assert_eq!(
        (d.oom_retries, d.out_of_memory),
        (0, 1),
        "refused, not retried"
    );
    let fits = hal.alloc::<u8>("fits", 24 * MIB).unwrap();
    drop((big, fits));
    let again = hal.alloc::<u8>("after", 60 * MIB).unwrap();
    assert_eq!(again.len(), 60 * MIB);
}

#[test]
#[cfg_attr(
    not(feature = "phase3-pool-alloc"),
    ignore = "pool statistics need phase 3"
)]
fn pool_hits_and_misses_follow_pool_growth() {
    let Some(_g) = gpu() else { return };
    let hal = CudaHal::with_config(
        0,
        HalConfig {
            block_cache_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let s0 = hal.ledger();
    let a = hal.alloc::<u8>("a", 32 * MIB).unwrap();
    hal.synchronize().unwrap();
    let s1 = hal.ledger().since(&s0);
    assert_eq!(
        (s1.pool_hits, s1.pool_misses),
        (0, 1),
        "the first allocation grows the pool"
    );
    drop(a);
    hal.synchronize().unwrap();
    let s2 = hal.ledger();
    let b = hal.alloc::<u8>("b", 32 * MIB).unwrap();
    let d = hal.ledger().since(&s2);
    assert_eq!(
        (d.pool_hits, d.pool_misses),
        (1, 0),
        "reuse without growing"
    );
    drop(b);
    let reserved = hal.stats().unwrap().pool.reserved_current;
    hal.trim_pool(0).unwrap();
    assert!(
        hal.stats().unwrap().pool.reserved_current < reserved,
        "trim returns memory"
    );
    let s3 = hal.ledger();
    let c = hal.alloc::<u8>("c", MIB).unwrap();
    let d = hal.ledger().since(&s3);
    assert_eq!(
        (d.pool_hits, d.pool_misses),
        (0, 1),
        "growing back after a trim is a miss"
    );
    drop(c);
    // A pool that gives memory back at each synchronisation grows again afterwards.
    let releasing = CudaHal::with_config(
        0,
        HalConfig {
            block_cache_bytes: 0,
            release_threshold: 0,
            ..Default::default()
        },
    )
    .unwrap();
    for round in 0..3 {
        let s = releasing.ledger();
        let a = releasing.alloc::<u8>("a", 32 * MIB).unwrap();
        let d = releasing.ledger().since(&s);
        assert_eq!((d.pool_hits, d.pool_misses), (0, 1), "round {round}");
        drop(a);
        releasing.synchronize().unwrap();
    }
}

#[test]
fn a_request_the_driver_refuses_leaves_the_peak_alone() {
    // The device to itself: while the driver weighs a request for nearly all of it (under
    // compute-sanitizer's synccheck, at 2026-11-25 17:37), another test's 4 KiB
    // allocation was refused.
    let Some(hal) = gpu_exclusive() else { return };
    let a = hal.alloc::<u8>("a", MIB).unwrap();
    let peak = hal.memory_report().peak_bytes;
    let before = hal.ledger();
    // Within the device's size, so the HAL asks; more than it has free, so the driver
    // refuses.
    let err = hal
        .alloc::<u8>("huge", hal.info().total_memory - MIB)
        .unwrap_err();
    // Asked again once room was made in this HAL (and once more if the device has other
    // HALs), then refused.
    let d = hal.ledger().since(&before);
    assert!((1..=2).contains(&d.oom_retries), "{d:?}");
    assert_eq!(d.out_of_memory, 1);
    match &err {
        Error::OutOfMemory { in_use, driver, .. } => {
            assert_eq!((*in_use, driver.is_some()), (MIB, true), "{err}")
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    let r = hal.memory_report();
    assert_eq!((r.peak_bytes, r.current_bytes), (peak, MIB));
    if let Some(huge) = r.by_name.iter().find(|t| t.name == "huge") {
        assert_eq!((huge.peak_bytes, huge.allocations), (0, 0));
    }
    drop(a);
}

/// An upload into some slots leaves the batch's other slots as they were: the slots it
/// skips between its views hold data of this batch (zeroed before 2026-11-25).
#[test]
fn an_arena_upload_leaves_the_batchs_other_slots_alone() {
    let Some(hal) = gpu() else { return };
    let slots = ["x", "y", "z"].map(|n| (n.to_string(), 256)).to_vec();
    let mut arena = hal
        .batch_arena("slots", 0, ArenaLayout::Slots(slots))
        .unwrap();
    let batch = arena.begin_batch();
    let y = batch.alloc::<u32>("y", 64).unwrap();
    y.copy_from_slice(&[7; 64]).unwrap();
    let before = hal.ledger();
    let views = batch
        .upload(&[("x", &[1u32; 64][..]), ("z", &[2u32; 64][..])])
        .unwrap();
    assert_eq!(
        hal.ledger().since(&before).h2d.calls,
        2,
        "one copy each side of y"
    );
    assert_eq!(y.to_vec().unwrap(), vec![7; 64]);
    assert_eq!(views[0].to_vec().unwrap(), vec![1; 64]);
    assert_eq!(views[1].to_vec().unwrap(), vec![2; 64]);
}

/// A batch larger than the pinned pool keeps two blocks of is packed window by window into
/// the staging slots, on several threads: before, every such batch pinned a block of its
/// own size with `cuMemHostAlloc` (about 850 ms a GiB on the H100 host) and freed it after
/// the copy.
#[test]
fn a_batch_past_the_pinned_pool_pins_no_memory_of_its_own() {
    let Some(_device) = gpu() else { return };
    let staging = StagingConfig {
        chunk_bytes: MIB,
        workers: 4,
        max_slots: 8,
        ..StagingConfig::default()
    };
    let hal = CudaHal::with_config(
        0,
        HalConfig {
            pinned_pool_bytes: MIB,
            staging,
            ..HalConfig::default()
        },
    )
    .unwrap();
    let mut arena = hal.batch_arena("big", 16 * MIB, ArenaLayout::Bump).unwrap();
    let mut rng = Rng::new(78);
    let mut after_first = None;
    for round in 0..3 {
        let batch = arena.begin_batch();
        // A small upload first (through a pinned pool block), which the large one's
        // windows must leave alone.
        let early = batch
            .upload(&[("early", &[round as u32; 1000][..])])
            .unwrap();
        // Odd sizes, so that windows end inside views and inside the gaps between them.
        let (a, b, c) = (
            rng.u32s(3 * MIB / 4 + 1001 + round),
            rng.u32s(MIB / 2 + 77),
            rng.u32s(5),
        );
        let bytes = rng.u32s(777).iter().map(|&x| x as u8).collect::<Vec<u8>>();
        let before = hal.ledger();
        let views = batch
            .upload(&[("a", &a[..]), ("b", &b[..]), ("c", &c[..])])
            .unwrap();
        let odd = batch.upload(&[("odd", &bytes[..])]).unwrap();
        let d = hal.ledger().since(&before);
        assert_eq!(d.h2d.calls, 2, "one staged upload each");
        assert_eq!(d.driver_allocs + d.pool_allocs + d.cached_allocs, 0);
        assert!(views[0].to_vec().unwrap() == a, "round {round}: a");
        assert!(views[1].to_vec().unwrap() == b, "round {round}: b");
        assert_eq!(views[2].to_vec().unwrap(), c);
        assert_eq!(odd[0].to_vec().unwrap(), bytes);
        assert_eq!(early[0].to_vec().unwrap(), vec![round as u32; 1000]);
        let st = hal.stats().unwrap();
        let now = (st.pinned.misses, st.staging.slots_allocated);
        match after_first {
            None => after_first = Some(now),
            Some(first) => assert_eq!(
                now, first,
                "round {round}: no pinned memory per batch (pinned misses, staging slots)"
            ),
        }
    }
}

/// A run of views larger than one staging chunk is packed by the staging workers side by
/// side, while earlier chunks are copied; before, the calling thread packed it alone into
/// one pinned block wherever the pinned pool kept two of its size. A run of one chunk's
/// bytes still takes one block, with one copy.
#[test]
fn a_large_arena_run_is_packed_by_the_staging_workers() {
    let Some(hal) = gpu() else { return };
    let mut arena = hal
        .batch_arena("runs", 16 * MIB, ArenaLayout::Bump)
        .unwrap();
    let half_chunk = hal.config().staging.min_chunk_bytes / 2;
    let blocks = |s: &cuda_hal::HalStats| s.pinned.hits + s.pinned.misses;
    let slots = |s: &cuda_hal::HalStats| s.staging.slots_allocated + s.staging.slot_reuses;
    let mut rng = Rng::new(91);
    for round in 0..2 {
        let batch = arena.begin_batch();
        let small = rng.u32s(half_chunk / 4);
        let before = hal.stats().unwrap();
        let one = batch.upload(&[("small", &small[..])]).unwrap();
        let after = hal.stats().unwrap();
        assert_eq!(
            blocks(&after),
            blocks(&before) + 1,
            "round {round}: one block"
        );
        assert_eq!(
            slots(&after),
            slots(&before),
            "round {round}: no staging slot"
        );
        // Odd sizes: windows end inside views and inside the gap between them.
        let (a, b) = (rng.u32s(3 * MIB / 4 + 333), rng.u32s(MIB + 5));
        let before = hal.stats().unwrap();
        let views = batch.upload(&[("a", &a[..]), ("b", &b[..])]).unwrap();
        let after = hal.stats().unwrap();
        assert_eq!(
            blocks(&after),
            blocks(&before),
            "round {round}: no pinned block"
        );
        assert!(
            slots(&after) > slots(&before),
            "round {round}: staging slots"
        );
        assert!(views[0].to_vec().unwrap() == a, "round {round}: a");
        assert!(views[1].to_vec().unwrap() == b, "round {round}: b");
        assert!(one[0].to_vec().unwrap() == small, "round {round}: small");
    }
}

#[test]
fn arena_refusals_leave_the_batch_as_it_was() {
    let Some(hal) = gpu() else { return };
    // Slot capacities past the address space are refused, not wrapped around.
    let wrapping = ArenaLayout::Slots(vec![("a".into(), usize::MAX - 10), ("b".into(), 1024)]);
    assert!(matches!(
        hal.batch_arena("wrap", 0, wrapping),
        Err(Error::InvalidArgument(_))
    ));
    let mut arena = hal.batch_arena("bump", MIB, ArenaLayout::Bump).unwrap();
    assert!(!arena.can_fit(&[usize::MAX - 100, 1024]));
    {
        let batch = arena.begin_batch();
        let x = batch.alloc::<u8>("x", 1000).unwrap();
        // A request whose end is past the address space: refused, the cursor unmoved.
        assert!(matches!(
            batch.alloc::<u8>("huge", usize::MAX - 1023),
            Err(Error::ArenaFull { .. })
        ));
        assert_eq!(batch.used(), 1000);
        let y = batch.alloc::<u8>("y", 1000).unwrap();
        let (px, py) = (x.device_ptr().unwrap().addr, y.device_ptr().unwrap().addr);
        assert!(py >= px + 1000, "views do not overlap");
        // An upload is all or nothing.
        let used = batch.used();
        let too_big = vec![0u8; MIB];
        let err = batch.upload(&[("fits", &[1u8; 100][..]), ("too-big", &too_big[..])]);
        assert!(matches!(err, Err(Error::ArenaFull { .. })));
        assert_eq!(batch.used(), used);
        let z = batch.upload(&[("z", &[3u8; 10][..])]).unwrap();
        assert_eq!(z[0].to_vec().unwrap(), vec![3u8; 10]);
    }
    assert_eq!(arena.stats().reallocations_avoided, 3, "x, y and z");
    // A slot refused for alignment is still free for another element type.
    let slots = vec![("a".into(), 10), ("b".into(), 30)];
    let mut slots = hal.batch_arena("s", 0, ArenaLayout::Slots(slots)).unwrap();
    {
        let b = slots.begin_batch();
        assert!(matches!(
            b.alloc::<[u8; 3]>("b", 10),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(b.used(), 0);
        let v = b.alloc::<u8>("b", 30).unwrap();
        assert_eq!(v.len(), 30);
    }
    assert_eq!(slots.stats().slot_peaks, vec![0, 30]);
}

/// `can_fit` and `can_fit_as` answer exactly what a batch then places: before 6e37837
/// `can_fit` padded every request to 256 bytes, the last too, and ignored element sizes
/// that do not divide 256 (12- and 24-byte extension-field elements).
#[test]
fn can_fit_says_exactly_what_a_batch_places() {
    let Some(hal) = gpu() else { return };
    fn check<T: bytemuck::Pod>(arena: &mut cuda_hal::BatchArena, rng: &mut Rng, cap: usize) {
        let sz = std::mem::size_of::<T>();
        for _ in 0..200 {
            let n = 1 + (rng.next_u64() % 4) as usize;
            let lens: Vec<usize> = (0..n)
                .map(|_| 1 + (rng.next_u64() % (cap / sz) as u64) as usize / n)
                .collect();
            let says = arena.can_fit_as::<T>(&lens);
            let batch = arena.begin_batch();
            let placed = lens.iter().all(|len| batch.alloc::<T>("v", *len).is_ok());
            assert_eq!(says, placed, "{sz}-byte elements, lengths {lens:?}");
            if sz == 1 {
                drop(batch);
                assert_eq!(arena.can_fit(&lens), placed, "bytes {lens:?}");
            }
        }
    }
    let cap = 4096;
    let mut arena = hal.batch_arena("fit", cap, ArenaLayout::Bump).unwrap();
    let mut rng = Rng::new(7);
    check::<u8>(&mut arena, &mut rng, cap);
    check::<u32>(&mut arena, &mut rng, cap);
    check::<[u32; 3]>(&mut arena, &mut rng, cap);
    check::<[u64; 3]>(&mut arena, &mut rng, cap);
    // The slot layout: a slot whose start is not a multiple of the element size.
    let slots = vec![("a".into(), 24), ("b".into(), 256)];
    let mut arena = hal
        .batch_arena("fit-slots", 0, ArenaLayout::Slots(slots))
        .unwrap();
    let fits = arena.can_fit_as::<[u64; 3]>(&[1, 1]);
    let batch = arena.begin_batch();
    let placed = batch.alloc::<[u64; 3]>("a", 1).is_ok() && batch.alloc::<[u64; 3]>("b", 1).is_ok();
    assert_eq!(fits, placed);
}

/// `get_many` on a slice checks the slice's own bytes against open views: a view of the
/// parent's first element does not block reading the slice's.
#[test]
fn get_many_on_a_slice_checks_its_own_bytes() {
    let Some(hal) = gpu() else { return };
    let data: Vec<u32> = (0..1024).collect();
    let src = hal.copy_from("src", &data).unwrap();
    let parent = hal.alloc::<u32>("parent", 1024).unwrap();
    parent.copy_from_buffer(&src).unwrap(); // written on the device: no host copy
    let half = parent.slice(512, 512).unwrap();
    let first = parent.slice(0, 1).unwrap();
    first
        .view_mut(|s| {
            s[0] = 9;
            assert_eq!(half.get_many(&[0, 5, 511]).unwrap(), vec![512, 517, 1023]);
        })
        .unwrap();
    assert_eq!(parent.get_many(&[0, 512]).unwrap(), vec![9, 512]);
}

#[test]
#[cfg_attr(
    not(feature = "phase3-pool-alloc"),
    ignore = "pool statistics need phase 3"
)]
fn pool_allocations_go_unclassified_when_hits_are_not_counted() {
    let Some(_g) = gpu() else { return };
    let cfg = |count_pool_hits| HalConfig {
        block_cache_bytes: 1 << 30,
        count_pool_hits,
        ..Default::default()
    };
    let hal = CudaHal::with_config(0, cfg(false)).unwrap();
    let s0 = hal.ledger();
    // Two requests reach the pool (32 and 16 MiB); the freed 16 MiB block stays in the
    // block cache and serves the third request.
    let a = hal.alloc::<u8>("a", 32 * MIB).unwrap();
    let b = hal.alloc::<u8>("b", 16 * MIB).unwrap();
    drop(b);
    let c = hal.alloc::<u8>("c", 16 * MIB).unwrap();
    let d = hal.ledger().since(&s0);
    assert_eq!(
        (d.pool_allocs, d.cached_allocs, d.pool_hits, d.pool_misses),
        (2, 1, 1, 0),
        "the pool's allocations counted, only the cache hit classified"
    );
    drop((a, c));
    // On a HAL that counts, the first request grows its new pool: a miss.
    let counting = CudaHal::with_config(0, cfg(true)).unwrap();
    let s0 = counting.ledger();
    let a = counting.alloc::<u8>("a", 32 * MIB).unwrap();
    let d = counting.ledger().since(&s0);
    assert_eq!((d.pool_allocs, d.pool_hits, d.pool_misses), (1, 0, 1));
    drop(a);
}

#[test]
fn filling_the_device_then_freeing_returns_the_pool_to_where_it_started() {
    let Some(hal) = gpu_exclusive() else { return };
    hal.synchronize().unwrap();
    let start = hal.stats().unwrap().pool.used_current;
    let chunk = 2048 * MIB;
    let mut held = Vec::new();
    let err = loop {
        match hal.alloc::<u8>(format!("fill-{}", held.len()), chunk) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() < 1000, "never ran out");
    };
    match &err {
        Error::OutOfMemory {
            in_use,
            largest,
            driver,
            ..
        } => {
            assert_eq!(*in_use, held.len() * chunk);
            assert_eq!(largest.len(), 5.min(held.len()));
            assert!(driver.is_some(), "the driver ran out: {err}");
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    println!("filled {} GiB before: {err}", held.len() * 2);
    assert!(held.len() * chunk > hal.info().total_memory / 2);
    // Still usable while full (small allocations may fail; reads work).
    held[0].fill(7).unwrap();
    assert_eq!(held[0].get_at(chunk - 1).unwrap(), 7);
    drop(held);
    hal.trim_pool(0).unwrap();
    assert_eq!(hal.stats().unwrap().pool.used_current, start);
    assert_eq!(hal.memory_report().current_bytes, 0);
    let again = hal.alloc::<u8>("after-fill", 8 * chunk).unwrap();
    again.fill(1).unwrap();
}

#[test]
fn batch_arena_reuses_one_region() {
    let Some(hal) = gpu() else { return };
    let mut rng = Rng::new(31);
    let mut arena = hal
        .batch_arena("arena", 4 * MIB, ArenaLayout::Bump)
        .unwrap();
    assert!(arena.can_fit(&[MIB, MIB, MIB]));
    assert!(!arena.can_fit(&[3 * MIB, 2 * MIB]));
    let before = hal.ledger();
    for round in 0..10 {
        let atoms = rng.u32s(1000 + round);
        let ids = rng.u32s(77);
        let batch = arena.begin_batch();
        let views = batch
            .upload(&[("atoms", &atoms[..]), ("ids", &ids[..])])
            .unwrap();
        assert_eq!(views[0].to_vec().unwrap(), atoms);
        assert_eq!(views[1].to_vec().unwrap(), ids);
        let scratch = batch.alloc::<u64>("scratch", 100).unwrap();
        scratch.fill(round as u64).unwrap();
        assert_eq!(scratch.get_at(99).unwrap(), round as u64);
        match batch.alloc::<u8>("huge", 4 * MIB) {
            Err(Error::ArenaFull {
                requested,
                capacity,
                used,
                ..
            }) => {
                assert_eq!((requested, capacity), (4 * MIB, 4 * MIB));
                assert!(used > 0);
            }
            other => panic!("expected ArenaFull, got {:?}", other.map(|_| ())),
        }
    }
    let d = hal.ledger().since(&before);
    assert_eq!(
        d.driver_allocs + d.pool_allocs + d.cached_allocs,
        0,
        "no allocation per batch"
    );
    let st = arena.stats();
    assert_eq!(st.batches, 10);
    assert_eq!(st.reallocations_avoided, 30);
    assert!(st.peak_bytes >= 1009 * 4 + 77 * 4 + 800);

    let mut slots = hal
        .batch_arena(
            "slots",
            0,
            ArenaLayout::Slots(vec![("x".into(), 4096), ("y".into(), 1000)]),
        )
        .unwrap();
    assert!(slots.can_fit(&[4096, 1000]) && !slots.can_fit(&[4097]));
    let b = slots.begin_batch();
    let x = b.upload(&[("x", &[1u32; 1024][..])]).unwrap();
    assert_eq!(x[0].get_at(1023).unwrap(), 1);
    assert!(matches!(
        b.alloc::<u8>("y", 1001),
        Err(Error::ArenaFull { .. })
    ));
    assert!(
        matches!(b.alloc::<u8>("x", 1), Err(Error::InvalidArgument(_))),
        "a slot once per batch"
    );
    assert!(matches!(
        b.alloc::<u8>("z", 1),
        Err(Error::InvalidArgument(_))
    ));
    drop(x);
    drop(b);
    assert_eq!(slots.stats().slot_peaks, vec![4096, 0]);
    // Items in another order than their slots, of odd sizes: each lands in its own slot
    // (the staging block is packed in one pass, gaps zeroed).
    let b = slots.begin_batch();
    let v = b
        .upload(&[("y", &[2u8; 999][..]), ("x", &[1u8; 4095][..])])
        .unwrap();
    assert_eq!(v[0].to_vec().unwrap(), vec![2u8; 999]);
    assert_eq!(v[1].to_vec().unwrap(), vec![1u8; 4095]);
}

#[test]
fn resize_keeps_contents_and_grows_by_the_factor() {
    let Some(hal) = gpu() else { return };
    let data = Rng::new(32).u32s(100_001);
    let b = hal.copy_from("resize", &data).unwrap();
    let grown = b.resized(250_000).unwrap();
    assert_eq!(grown.slice(0, data.len()).unwrap().to_vec().unwrap(), data);
    let shrunk = grown.resized(10).unwrap();
    assert_eq!(shrunk.to_vec().unwrap(), data[..10].to_vec());
    let mut g = GrowableBuffer::<u32>::new(&hal, "grow", 100, 1.5).unwrap();
    let mut want = Vec::new();
    for k in 0..20 {
        let part = Rng::new(k).u32s(37 * (k as usize + 1));
        g.extend_from_slice(&part).unwrap();
        want.extend_from_slice(&part);
    }
    assert_eq!(g.len(), want.len());
    assert_eq!(g.buffer().unwrap().to_vec().unwrap(), want);
    assert!(
        g.reallocations() >= 5 && g.reallocations() <= 12,
        "{} reallocations",
        g.reallocations()
    );
    g.shrink_to_fit().unwrap();
    assert_eq!(g.capacity(), want.len());
    assert_eq!(
        g.buffer().unwrap().get_at(want.len() - 1).unwrap(),
        *want.last().unwrap()
    );
    assert!(matches!(
        GrowableBuffer::<u32>::new(&hal, "bad", 1, 0.5),
        Err(Error::InvalidArgument(_))
    ));
}

/// Where the limit does not hold the grown capacity beside the old buffer, a growable
/// buffer grows to exactly enough. Before, it asked only for the grown capacity and failed
/// with `OutOfMemory`.
#[test]
fn a_growable_buffer_grows_to_exactly_enough_where_the_factor_does_not_fit() {
    let Some(_device) = gpu() else { return };
    const MIB: usize = 1 << 20;
    let config = HalConfig {
        memory_limit: Some(3 * MIB),
        ..HalConfig::default()
    };
    let hal = CudaHal::with_config(0, config).unwrap();
    // 1 MiB now; growing by 4x would hold 1 + 4 MiB, exactly enough 1 + 1 MiB and 4 bytes.
    let mut g = GrowableBuffer::<u32>::new(&hal, "grow", MIB / 4, 4.0).unwrap();
    let data = Rng::new(33).u32s(MIB / 4 + 1);
    g.extend_from_slice(&data[..MIB / 4]).unwrap();
    g.extend_from_slice(&data[MIB / 4..]).unwrap();
    assert_eq!((g.capacity(), g.reallocations()), (MIB / 4 + 1, 1));
    assert_eq!(g.buffer().unwrap().to_vec().unwrap(), data);
    // Past the limit even then: the typed error, and the buffer as it was.
    let more = vec![7u32; MIB / 2];
    assert!(matches!(
        g.extend_from_slice(&more),
        Err(Error::OutOfMemory { .. })
    ));
    assert_eq!(g.buffer().unwrap().to_vec().unwrap(), data);
}

/// Where the driver's free memory holds what a growable buffer needs but not its grown
/// capacity, the buffer grows to exactly enough at once: the grown capacity is never asked
/// for, so no refusal frees the HAL's prover tables or trims its cache. Before, it asked
/// for the grown capacity first, and the driver's refusal made room (in every HAL of the
/// device) for a request that then fell back to exactly enough anyway.
#[test]
fn a_growable_buffer_past_the_drivers_free_memory_grows_to_exactly_enough_making_no_room() {
    use cuda_hal::Hal;
    let Some(hal) = gpu_exclusive() else { return };
    capture_logs();
    // A twiddle table of 2^19 words (2 MiB), which making room would free.
    let log_n = 20;
    let io = hal
        .copy_from("io", &Rng::new(0x9e0).elems(1 << log_n))
        .unwrap();
    hal.batch_ntt(&io, log_n, false).unwrap();
    drop(io);
    let table = live_bytes_named(&hal, "prover-twiddles");
    assert_eq!(table, 2 * MIB);
    // 64 MiB held (16 Mi words); 1 MiB more needs 65 MiB, growing by 4 would ask for
    // 256 MiB.
    let data = Rng::new(0x9e1).u32s(16 * MIB + MIB / 4);
    let mut g = GrowableBuffer::<u32>::new(&hal, "grown-past-free", 16 * MIB, 4.0).unwrap();
    g.extend_from_slice(&data[..16 * MIB]).unwrap();
    hal.synchronize().unwrap();
    // Free memory for the 65 MiB and some to spare, but far from 256 MiB: the ballast is
    // given back from its smallest blocks (2 MiB, then 64 MiB) until it is.
    let mut ballast = Ballast::fill();
    while device_free_bytes() < 65 * MIB + 16 * MIB {
        assert!(ballast.release_one(), "the device has less than 81 MiB");
    }
    let free = device_free_bytes();
    assert!(free < 256 * MIB, "{free} bytes free: the test cannot tell");
    let before = driver_refusals("grown-past-free");
    let counts = hal.ledger();
    g.extend_from_slice(&data[16 * MIB..]).unwrap();
    let d = hal.ledger().since(&counts);
    assert_eq!(
        (d.oom_retries, d.out_of_memory),
        (0, 0),
        "the driver was never refused"
    );
    assert_eq!(driver_refusals("grown-past-free"), before);
    assert_eq!((g.capacity(), g.reallocations()), (16 * MIB + MIB / 4, 1));
    assert_eq!(
        live_bytes_named(&hal, "prover-twiddles"),
        table,
        "the table kept"
    );
    drop(ballast);
    assert!(g.buffer().unwrap().to_vec().unwrap() == data);
    // With memory to spare again, the next growth takes the factor.
    g.extend_from_slice(&[1]).unwrap();
    assert_eq!((g.capacity(), g.reallocations()), (65 * MIB, 2));
    assert!(hal.poisoned().is_none());
}

#[test]
fn managed_memory_is_shared_prefetched_and_advised() {
    let Some(hal) = gpu() else { return };
    let info = hal.info().clone();
    println!(
        "integrated {} pageable_memory_access {} uses host page tables {} \
         concurrent_managed_access {} coherent {}",
        info.integrated,
        info.pageable_memory_access,
        info.pageable_access_uses_host_page_tables,
        info.concurrent_managed_access,
        info.is_coherent_unified()
    );
    // Hopper on x86_64 (the test machines): coherent at most through HMM's software
    // mirror, never in hardware.
    if info.name.starts_with("NVIDIA H100") || info.name.starts_with("NVIDIA H200") {
        assert!(!info.integrated && !info.pageable_access_uses_host_page_tables);
        assert!(!info.is_coherent_unified());
    }
    let n = 1_000_003;
    let x = Rng::new(33).u32s(n);
    let mut a = hal.alloc_managed::<u32>("m-a", n).unwrap();
    let mut out = hal.alloc_managed::<u32>("m-out", n).unwrap();
    a.host_mut().unwrap().copy_from_slice(&x);
    out.host_mut().unwrap().fill(0xDEAD_BEEF);
    let device = ManagedLocation::Device(info.ordinal);
    let none_yet = a.range_info().unwrap();
    assert_eq!(
        none_yet,
        ManagedRangeInfo {
            read_mostly: false,
            preferred_location: None,
            accessed_by_device: false,
            last_prefetch_location: None,
        }
    );
    a.advise(ManagedAdvice::ReadMostly).unwrap();
    a.advise(ManagedAdvice::AccessedByDevice).unwrap();
    out.advise(ManagedAdvice::PreferDevice).unwrap();
    a.prefetch_to_device().unwrap();
    out.prefetch_to_device().unwrap();
    let (ai, oi) = (a.range_info().unwrap(), out.range_info().unwrap());
    assert!(ai.read_mostly && ai.accessed_by_device, "{ai:?}");
    assert_eq!(ai.last_prefetch_location, Some(device), "{ai:?}");
    assert_eq!(ai.preferred_location, None, "{ai:?}");
    assert!(!oi.read_mostly && !oi.accessed_by_device, "{oi:?}");
    assert_eq!(oi.preferred_location, Some(device), "{oi:?}");
    assert_eq!(oi.last_prefetch_location, Some(device), "{oi:?}");
    // SAFETY: eltwise_add_u32(out, a, b, n) over the n elements of the two managed
    // buffers, which stay allocated and unborrowed on the host until `host()` waits.
    unsafe {
        hal.launch(
            "eltwise_add_u32",
            LaunchDims::for_elements(n, info.multiprocessors),
        )
        .scalar(out.device_ptr().addr)
        .scalar(a.device_ptr().addr)
        .scalar(a.device_ptr().addr)
        .scalar(n as u64)
        .run()
    }
    .unwrap();
    out.prefetch_to_host().unwrap();
    out.advise(ManagedAdvice::PreferHost).unwrap();
    let oi = out.range_info().unwrap();
    assert_eq!(oi.preferred_location, Some(ManagedLocation::Host), "{oi:?}");
    assert_eq!(
        oi.last_prefetch_location,
        Some(ManagedLocation::Host),
        "{oi:?}"
    );
    let got = out.host().unwrap();
    assert!(got.iter().zip(&x).all(|(o, v)| *o == v.wrapping_add(*v)));
    assert_eq!(
        hal.memory_report()
            .by_name
            .iter()
            .filter(|t| t.name.starts_with("m-"))
            .count(),
        2
    );
    let too_big = info.total_memory * 2;
    assert!(matches!(
        hal.alloc_managed::<u8>("too-big", too_big),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(matches!(
        hal.alloc_managed::<u8>("empty", 0),
        Err(Error::ZeroLength { .. })
    ));
}

/// A managed request past what the device holds is refused at once: making room first
/// would free every HAL's cached blocks and prover tables for a request that cannot fit.
/// (Before, it trimmed every HAL of the device, then was refused.)
#[test]
fn a_managed_request_past_the_device_is_refused_without_making_room() {
    use cuda_hal::Hal;
    let Some(hal) = gpu() else { return };
    capture_logs();
    let io = hal
        .copy_from("io", &Rng::new(0x3c1).elems(1 << 12))
        .unwrap();
    hal.batch_ntt(&io, 12, false).unwrap();
    let table = live_bytes_named(&hal, "prover-twiddles");
    assert!(table > 0);
    let too_big = hal.info().total_memory + 1;
    let before = hal.ledger();
    assert!(matches!(
        hal.alloc_managed::<u8>("past-the-device", too_big),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(
        !logged("alloc_managed `past-the-device`"),
        "it made room first"
    );
    assert!(logged("refused `past-the-device`"), "the refusal is logged");
    let d = hal.ledger().since(&before);
    assert_eq!((d.oom_retries, d.out_of_memory), (0, 1));
    assert_eq!(live_bytes_named(&hal, "prover-twiddles"), table);
}

/// A managed request past the HAL's limit is refused before the driver is asked and
/// without making room. (Before, the driver's free memory was read and, where the request
/// did not fit it, every HAL of the device was trimmed; the limit was checked after.)
#[test]
fn a_managed_request_past_the_limit_is_refused_before_the_driver_is_asked() {
    let Some(_g) = gpu() else { return };
    capture_logs();
    let hal = limited_to_64_mib();
    let column = hal.alloc::<u8>("limited-column", 40 * MIB).unwrap();
    // A freed block the cache may keep: making room would give it back.
    drop(hal.alloc::<u8>("limited-freed", MIB).unwrap());
    let cached = hal.stats().unwrap().cached_bytes;
    let before = hal.ledger();
    let refused = hal.alloc_managed::<u8>("managed-past-the-limit", 30 * MIB);
    refused_past_64_mib(refused.map(|m| m.len()), "limited-column");
    let d = hal.ledger().since(&before);
    assert_eq!((d.oom_retries, d.out_of_memory), (0, 1));
    assert_eq!(
        hal.stats().unwrap().cached_bytes,
        cached,
        "no room was made"
    );
    assert!(!logged("alloc_managed `managed-past-the-limit`"));
    // Within the limit it is served, and counts against it.
    let m = hal.alloc_managed::<u8>("managed-within", 20 * MIB).unwrap();
    assert!(matches!(
        hal.alloc::<u8>("past-with-managed", 8 * MIB),
        Err(Error::OutOfMemory { .. })
    ));
    drop((m, column));
}

/// Managed memory takes no device memory until its pages are touched, so the free memory
/// the driver reports does not fall: what is handed out counts against it.
#[test]
fn managed_memory_handed_out_counts_against_what_is_free() {
    let Some(hal) = gpu_exclusive() else { return };
    hal.synchronize().unwrap(); // binds the HAL's context on this thread
    let free = device_free_bytes;
    let part = free() / 10 * 6;
    let first = hal.alloc_managed::<u8>("m-first", part).unwrap();
    // Nothing touched: the driver still reports about as much free (before 6e37837 the
    // second request was made, and the two oversubscribed the device).
    assert!(free() > part);
    match hal.alloc_managed::<u8>("m-second", part) {
        Err(Error::OutOfMemory { requested, .. }) => assert_eq!(requested, part),
        other => panic!("expected OutOfMemory, got {:?}", other.map(|m| m.len())),
    }
    // Another HAL of the device sees the same managed memory handed out.
    let other = CudaHal::new(0).unwrap();
    assert!(matches!(
        other.alloc_managed::<u8>("m-other", part),
        Err(Error::OutOfMemory { .. })
    ));
    drop(first);
    let second = other.alloc_managed::<u8>("m-second", part).unwrap();
    assert_eq!(second.len(), part);
}

/// The driver's free memory on the current context's device.
fn device_free_bytes() -> usize {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers are valid locals; the caller made a context current.
    unsafe {
        cuda_hal::cuda_sys::driver()
            .unwrap()
            .cuMemGetInfo(&mut free, &mut total)
    }
    .unwrap();
    free
}

/// Device buffers freed into the block cache and the pool (phase 3) stay reserved, and the
/// driver counts them as used: a managed request that fits once they are given back is
/// served, as without phase 3. (Before, it failed with `OutOfMemory` in every phase-3
/// build: only device allocations trimmed and retried.)
#[test]
fn a_managed_request_trims_memory_freed_device_buffers_hold() {
    let Some(hal) = gpu_exclusive() else { return };
    hal.synchronize().unwrap(); // binds the HAL's context on this thread
    let part = device_free_bytes() / 10 * 6;
    drop(hal.alloc::<u8>("device", part).unwrap());
    let before = hal.ledger();
    let m = hal.alloc_managed::<u8>("managed", part).unwrap();
    assert_eq!(m.len(), part);
    // Served after room was made where the pool kept the freed block; at once where the
    // free gave it back to the driver.
    let d = hal.ledger().since(&before);
    let retried = u64::from(PHASES.pool_alloc);
    assert_eq!((d.oom_retries, d.out_of_memory), (retried, 0));
    drop(m);
    // Another HAL of the device holding the freed memory: trimmed too.
    let other = CudaHal::new(0).unwrap();
    drop(other.alloc::<u8>("other-device", part).unwrap());
    let m = hal.alloc_managed::<u8>("managed-again", part).unwrap();
    assert_eq!(m.len(), part);
}

/// Two HALs of one device: memory one freed into its cache and pool is trimmed when the
/// other runs out, as its own would be. (Before, only the asking HAL's pool was trimmed,
/// and the request failed with `OutOfMemory` in every phase-3 build.)
#[test]
fn a_hal_out_of_memory_trims_the_other_hals_of_its_device() {
    let Some(a) = gpu_exclusive() else { return };
    a.synchronize().unwrap();
    let b = CudaHal::new(0).unwrap();
    let part = device_free_bytes() / 10 * 6;
    drop(a.alloc::<u32>("a-column", part / 4).unwrap());
    let before = b.ledger();
    let got = b.alloc::<u32>("b-column", part / 4).unwrap();
    // With phase 3, asked again after `b` made room in itself (nothing), then after `a`
    // did (served); without it, `a`'s free gave the memory back at once.
    let d = b.ledger().since(&before);
    let retries = if PHASES.pool_alloc { 2 } else { 0 };
    assert_eq!((d.oom_retries, d.out_of_memory), (retries, 0));
    got.fill(5).unwrap();
    assert_eq!(got.get_at(part / 4 - 1).unwrap(), 5);
    // And back: `a` gets its memory again once `b` lets it go.
    drop(got);
    let again = a.alloc::<u32>("a-column", part / 4).unwrap();
    assert_eq!(again.len(), part / 4);
    assert!(a.poisoned().is_none() && b.poisoned().is_none());
}

/// Elements aligned past what the driver promises managed memory (256 bytes) are refused:
/// `host` would hand out a misaligned `&[T]` (small managed allocations share pages at
/// 512-byte steps, measured on an H200).
#[test]
fn managed_elements_aligned_past_256_bytes_are_refused() {
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(1024))]
    struct Big([u8; 1024]);
    let Some(hal) = gpu() else { return };
    let _small = hal.alloc_managed::<u8>("small", 3).unwrap();
    let before = hal.memory_report().current_bytes;
    assert!(matches!(
        hal.alloc_managed::<Big>("big", 1),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(hal.memory_report().current_bytes, before, "nothing tracked");
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(256))]
    struct Row([u8; 256]);
    let mut rows = hal.alloc_managed::<Row>("rows", 2).unwrap();
    rows.host_mut().unwrap()[1].0[255] = 9;
    assert_eq!(rows.host().unwrap()[1].0[255], 9);
}

/// Device memory taken straight from the driver, outside any HAL (no trim gives it back),
/// for tests that bring the driver to refuse; every block is freed when this goes.
struct Ballast(Vec<cuda_hal::cuda_sys::CUdeviceptr>);

impl Ballast {
    /// Takes all the driver will give: blocks of 1 GiB, then 64 MiB, then 2 MiB.
    fn fill() -> Ballast {
        let d = cuda_hal::cuda_sys::driver().unwrap();
        let mut blocks = Vec::new();
        for size in [1024 * MIB, 64 * MIB, 2 * MIB] {
            loop {
                let mut ptr = 0;
                // SAFETY: an out-pointer to a local; the block is freed on drop.
                match unsafe { d.cuMemAlloc(&mut ptr, size) } {
                    Ok(()) => blocks.push(ptr),
                    Err(e) if e.is_out_of_memory() => break,
                    Err(e) => panic!("cuMemAlloc: {e}"),
                }
            }
        }
        Ballast(blocks)
    }

    /// Frees the block taken last (the smallest); false if none is left.
    fn release_one(&mut self) -> bool {
        let Some(ptr) = self.0.pop() else {
            return false;
        };
        // SAFETY: taken by `fill`, freed once (popped).
        unsafe { cuda_hal::cuda_sys::driver().unwrap().cuMemFree(ptr) }.unwrap();
        true
    }
}

impl Drop for Ballast {
    fn drop(&mut self) {
        while self.release_one() {}
    }
}

/// Log lines of allocations the driver refused (each one trims the HAL and waits for its
/// stream before the retry) for buffers named `name`.
fn driver_refusals(name: &str) -> usize {
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&format!("`{name}`")) && l.contains("out of memory; trimming"))
        .count()
}

/// Past the driver's own memory (not a HAL's limit) for a whole batch's NTT scratch, the
/// NTT runs in column groups, and the next NTT of that shape asks for the group that
/// fitted first. Before, every call asked for the whole batch's scratch again, and each
/// refusal trimmed the HAL (its block cache freed, its stream waited for) before the
/// group was halved. The device is filled until one column's scratch just fits, and the
/// first call must itself have been refused, so the test cannot pass without reaching the
/// driver's limit. Another allocation the driver refuses between the two calls leaves the
/// group remembered (at fd8bcae its room-making forgot it).
#[test]
fn an_ntt_past_the_drivers_memory_asks_first_for_the_group_that_fitted() {
    use cuda_hal::field::Elem;
    use cuda_hal::Hal;
    let Some(hal) = gpu_exclusive() else { return };
    capture_logs();
    // 64 columns of 2^20 points: a whole batch's scratch is 256 MiB, one column's 4 MiB.
    let (log_n, cols) = (20, 64);
    let v = Rng::new(0x6a8).elems(cols << log_n);
    let io = hal.copy_from("io", &v).unwrap();
    // The expected output, from the whole batch at once while memory is plentiful.
    hal.batch_ntt(&io, log_n, false).unwrap();
    let want = io.to_vec().unwrap();
    io.copy_from_slice(&v).unwrap();
    // The whole batch's scratch given back to the driver; the trim frees the twiddle table
    // too, which an NTT of one column makes again (its scratch and data, 4 MiB each, may
    // stay in the block cache).
    hal.trim_pool(0).unwrap();
    let one = hal.copy_from("one", &v[..1 << log_n]).unwrap();
    hal.batch_ntt(&one, log_n, false).unwrap();
    drop(one);
    let mut ballast = Ballast::fill();
    // Free ballast until one column's scratch fits, and the twiddle table besides (probes
    // through the HAL, freed to the block cache or the driver): a refused probe makes
    // room, which frees the table, and the NTT makes it again.
    loop {
        let probe = hal.alloc::<Elem>("probe", 1 << log_n).and_then(|scratch| {
            let table = hal.alloc::<u32>("probe-table", 1 << (log_n - 1))?;
            Ok((scratch, table))
        });
        match probe {
            Ok(probe) => {
                drop(probe);
                break;
            }
            Err(Error::OutOfMemory { .. }) => {
                assert!(ballast.release_one(), "nothing fits with no ballast left");
            }
            Err(e) => panic!("probe: {e}"),
        }
    }
    let before = driver_refusals("prover-ntt-scratch");
    hal.batch_ntt(&io, log_n, false).unwrap();
    let first = driver_refusals("prover-ntt-scratch") - before;
    let first_out = io.to_vec().unwrap();
    io.copy_from_slice(&v).unwrap();
    // Another allocation the driver refuses in between makes room, and the group that
    // fitted stays remembered: memory is no less short.
    match hal.alloc::<u8>("refused-between", hal.info().total_memory / 2) {
        Err(Error::OutOfMemory { driver, .. }) => assert!(driver.is_some(), "the driver's"),
        other => panic!("expected OutOfMemory, got {:?}", other.map(|b| b.len())),
    }
    hal.batch_ntt(&io, log_n, false).unwrap();
    let second = driver_refusals("prover-ntt-scratch") - before - first;
    let second_out = io.to_vec().unwrap();
    drop(ballast);
    println!(
        "driver refusals of the NTT scratch: {first} in the first call, {second} in the second"
    );
    assert!(
        first > 0,
        "the driver gave the whole batch's scratch: the test did not reach its limit"
    );
    assert!(first_out == want, "the first NTT in column groups");
    assert!(second_out == want, "the second NTT in column groups");
    assert_eq!(second, 0, "the second NTT asked for more than had fitted");
    assert!(hal.poisoned().is_none());
}

/// The bytes of `hal`'s live allocations named `name`.
fn live_bytes_named(hal: &CudaHal, name: &str) -> usize {
    let report = hal.memory_report();
    let t = report.by_name.iter().find(|t| t.name == name);
    t.map_or(0, |t| t.current_bytes)
}

/// `trim_pool` frees the prover operations' tables as well, and they are made again when
/// next needed. Before, a twiddle table stayed for the HAL's life, out of any trim's reach.
#[test]
fn trim_pool_frees_the_prover_tables() {
    use cuda_hal::Hal;
    let Some(hal) = gpu() else { return };
    let log_n = 16;
    let v = Rng::new(0x7b1).elems(4 << log_n);
    let io = hal.copy_from("io", &v).unwrap();
    hal.batch_ntt(&io, log_n, false).unwrap();
    let want = io.to_vec().unwrap();
    hal.batch_ntt(&io, log_n, true).unwrap();
    assert!(io.to_vec().unwrap() == v, "the inverse undoes it");
    let live = || hal.memory_report().current_bytes;
    let twiddles = || live_bytes_named(&hal, "prover-twiddles");
    assert!(twiddles() > 0, "forward and inverse tables");
    assert_eq!(live(), io.size_bytes() + twiddles());
    hal.trim_pool(0).unwrap();
    assert_eq!(twiddles(), 0, "freed by the trim");
    assert_eq!(live(), io.size_bytes(), "only the data is left");
    hal.batch_ntt(&io, log_n, false).unwrap();
    assert!(io.to_vec().unwrap() == want, "the table made again");
    assert!(twiddles() > 0);
}

/// An allocation the driver refuses frees the HAL's prover tables before its retry, as
/// `trim_pool` does, and they are made again when next needed. Before, the retry trimmed
/// only the block cache and the pool, so a request that fitted only without the tables
/// failed with `OutOfMemory` while a twiddle table nobody used held its memory.
#[test]
fn an_allocation_the_driver_refuses_frees_the_prover_tables_for_its_retry() {
    use cuda_hal::Hal;
    let Some(_device) = gpu_exclusive() else {
        return;
    };
    capture_logs();
    // Nothing freed is kept (no block cache; the pool gives its memory back at each
    // synchronisation): past the NTT, the HAL holds its twiddle table alone.
    let config = HalConfig {
        block_cache_bytes: 0,
        release_threshold: 0,
        ..HalConfig::default()
    };
    let hal = CudaHal::with_config(0, config).unwrap();
    // One column of 2^26 points: its twiddle table is 2^25 words, 128 MiB.
    let log_n = 26;
    let v = Rng::new(0x7ab).elems(1 << log_n);
    let io = hal.copy_from("io", &v).unwrap();
    hal.batch_ntt(&io, log_n, false).unwrap();
    let want = io.to_vec().unwrap();
    drop(io);
    hal.synchronize().unwrap();
    let twiddles = || live_bytes_named(&hal, "prover-twiddles");
    let table = twiddles();
    assert_eq!(table, 128 * MIB);
    assert_eq!(hal.memory_report().current_bytes, table, "the table alone");
    let ballast = Ballast::fill();
    // Half the table past what the driver has free: it fits only once the table is gone.
    let ask = device_free_bytes() + table / 2;
    let before = driver_refusals("past-the-table");
    let counts = hal.ledger();
    let got = hal.alloc::<u8>("past-the-table", ask);
    let refused = driver_refusals("past-the-table") - before;
    let d = hal.ledger().since(&counts);
    assert_eq!(
        (d.oom_retries, d.out_of_memory),
        (1, 0),
        "served by its first retry"
    );
    let got = got.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        refused > 0,
        "the driver gave it at once: the test did not reach its limit"
    );
    assert_eq!(twiddles(), 0, "freed for the retry");
    got.fill(3).unwrap();
    assert_eq!(got.get_at(ask - 1).unwrap(), 3);
    drop(got);
    drop(ballast);
    // Made again by the next NTT.
    let io = hal.copy_from("io", &v).unwrap();
    hal.batch_ntt(&io, log_n, false).unwrap();
    assert!(io.to_vec().unwrap() == want, "the table made again");
    assert_eq!(twiddles(), table);
    assert!(hal.poisoned().is_none());
}
