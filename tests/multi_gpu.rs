//! Several GPUs in one process. The tests named `two_devices_*` need two: they skip with
//! fewer (`scripts/gpu-run.sh` then leaves them out and says so), and fail instead when
//! `CUDA_HAL_REQUIRE_GPUS` asks for more than the machine has. The same copies between two
//! HALs of one device (their own streams, pools, pinned slots and events) run wherever there
//! is a GPU.

mod common;

use common::{Rng, MIB};
use std::sync::{Mutex, MutexGuard};

use cuda_hal::{driver, Buffer, CudaHal, Error, HalSet, PHASES};

/// Taken by every two-device test, so that they run one at a time: a test that reads
/// device 1's free memory (a device-wide figure) must see only its own allocations, not
/// those of another test of this process running meanwhile.
static TWO_DEVICE_TESTS: Mutex<()> = Mutex::new(());

/// A HAL per device, and this test's turn at device 1.
struct TwoDevices {
    set: HalSet,
    // Dropped after `set` (fields drop in order).
    turn: MutexGuard<'static, ()>,
}

impl TwoDevices {
    /// Drops the HALs and keeps the turn, for a test that runs its own process.
    fn hals_dropped(self) -> MutexGuard<'static, ()> {
        drop(self.set);
        self.turn
    }
}

fn need_two() -> Option<TwoDevices> {
    if !common::two_devices() {
        return None;
    }
    // A test that failed while holding the turn leaves the lock poisoned, not the devices.
    let turn = TWO_DEVICE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    Some(TwoDevices {
        set: HalSet::all().unwrap(),
        turn,
    })
}

#[test]
fn two_devices_one_hal_each_round_robin() {
    let Some(two) = need_two() else { return };
    let set = &two.set;
    let n = set.len();
    let order: Vec<usize> = (0..2 * n).map(|_| set.next().info().ordinal).collect();
    let want: Vec<usize> = (0..2 * n).map(|i| i % n).collect();
    assert_eq!(order, want);
    // Events and streams of two devices do not mix: typed errors, not the driver's
    // invalid handle, and both HALs usable after.
    let (h0, h1) = (set.get(0).unwrap(), set.get(1).unwrap());
    let (e0, e1) = (h0.create_event().unwrap(), h1.create_event().unwrap());
    let err = e0.record(&h1.main_stream()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    e0.record(&h0.main_stream()).unwrap();
    e1.record(&h1.main_stream()).unwrap();
    e1.synchronize().unwrap();
    e0.synchronize().unwrap();
    let err = e1.elapsed_ms(&e0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(h0.poisoned().is_none() && h1.poisoned().is_none());
    for i in 0..n {
        assert_eq!(set.get(i).unwrap().info().ordinal, i);
        assert!(set.peer_access(i, i));
        for j in 0..n {
            // Enabled wherever the driver says the pair can be.
            let can = set
                .get(i)
                .unwrap()
                .can_access_peer(set.get(j).unwrap())
                .unwrap();
            println!(
                "peer access {i} -> {j}: {} (possible: {can})",
                set.peer_access(i, j)
            );
            assert_eq!(set.peer_access(i, j), can, "peer access {i} -> {j}");
        }
    }
    // Each device works on its own, concurrently.
    std::thread::scope(|s| {
        for i in 0..n {
            let hal = set.get(i).unwrap().clone();
            s.spawn(move || {
                let data = Rng::new(i as u64).u32s(MIB);
                let b = hal.copy_from("per-device", &data).unwrap();
                b.view_mut(|v| v[0] = 1).unwrap();
                cuda_hal::ops::add(
                    &b,
                    &hal.copy_from("x", &data).unwrap(),
                    &hal.copy_from("y", &data).unwrap(),
                )
                .unwrap();
                assert_eq!(b.get_at(5).unwrap(), data[5].wrapping_add(data[5]));
            });
        }
    });
}

/// Staged transfers on both devices at once share the process's copy threads, each task
/// binding its own transfer's context: every byte arrives on the right device.
#[test]
fn two_devices_staged_transfers_at_once_keep_every_byte() {
    let Some(two) = need_two() else { return };
    let set = &two.set;
    std::thread::scope(|s| {
        for i in 0..2 {
            let hal = set.get(i).unwrap().clone();
            s.spawn(move || {
                let mut rng = Rng::new(40 + i as u64);
                for round in 0..12 {
                    let n = [1usize, 300_001, MIB + 3, 3 * MIB - 1][round % 4];
                    let data = rng.u32s(n);
                    let b = hal.copy_from("both-at-once", &data).unwrap();
                    assert_eq!(b.to_vec().unwrap(), data, "device {i}, round {round}");
                    let data2 = rng.u32s(n);
                    b.upload_async(&data2).unwrap();
                    let mut back = vec![0u32; n];
                    let _ = b.device_ptr_mut().unwrap();
                    b.copy_to_slice(&mut back).unwrap();
                    assert_eq!(back, data2, "device {i}, round {round}, again");
                }
            });
        }
    });
}

#[test]
fn two_devices_buffers_copy_both_ways() {
    let Some(two) = need_two() else { return };
    let set = &two.set;
    let (h0, h1) = (set.get(0).unwrap(), set.get(1).unwrap());
    copies_both_ways(h0, h1);
    copies_from_an_idle_source(h0, h1);
    // Two HALs on one device copy directly.
    let b = h1.copy_from("on-1", &[99u32; 64]).unwrap();
    let other = CudaHal::new(1).unwrap();
    let d = other.alloc::<u32>("same-device", 64).unwrap();
    d.copy_from_device(&b).unwrap();
    assert_eq!(d.get_at(63).unwrap(), 99);
}

/// A source buffer outlives the destination device's last HAL, whose context the driver
/// then destroys: the copies' events must not outlive it in the source's pending uses
/// (before 6e37837 every later access to the source failed with CONTEXT_IS_DESTROYED).
/// In a child process, so that no other test holds a HAL of device 1.
#[test]
fn two_devices_a_source_outlives_the_destination_hal() {
    let Some(two) = need_two() else { return };
    let _turn = two.hals_dropped();
    common::run_child("outliving_source_child", &[]);
}

#[test]
#[ignore = "run by two_devices_a_source_outlives_the_destination_hal in its own process"]
fn outliving_source_child() {
    if !common::is_child("outliving_source_child") {
        return;
    }
    let h0 = CudaHal::new(0).unwrap();
    let a = h0.copy_from("a", &[1u32; 1024]).unwrap();
    for via_host in [false, true] {
        // Device 1's last HAL and buffer go when it returns: its context goes.
        copy_into_a_new_hal_of_device_1(&a, via_host, 1);
        a.fill(2).unwrap();
        assert_eq!(a.to_vec().unwrap(), vec![2; 1024], "via host: {via_host}");
        a.fill(1).unwrap();
    }
    assert!(h0.poisoned().is_none());
    println!("CHILD-OK");
}

/// A device fault on device 0, and what device 1's HAL makes of it, in three set-ups: the
/// two HALs never met (`none`), a copy between them through the host (`via-host`: device
/// 0's events among the pending uses of device 1's buffer), and a peer copy (`peer`: peer
/// access on). The driver decides whether device 1's context is broken too; the test asks
/// it directly (a raw stream creation in that context) and checks that the HAL agrees: on
/// a broken device 1 each operation returns `ContextPoisoned`, never another error, a
/// panic or a hang, and the HAL is poisoned; on a healthy one every operation works and
/// nothing is charged to it (the crate charges a sticky error to the context current on
/// the thread, which a driver that kept contexts apart would make wrong for device 0's
/// events met from device 1). On the H200s' driver (580.159.04, CUDA 13.0), on
/// 2026-11-28, device 1 was broken in all three: a fault ends CUDA for the whole process.
/// Each set-up in a child process of its own.
#[test]
fn two_devices_a_fault_on_one_and_the_other() {
    let Some(two) = need_two() else { return };
    let _turn = two.hals_dropped();
    for mode in ["none", "via-host", "peer"] {
        common::run_child("peer_fault_child", &[("CUDA_HAL_PEER_FAULT", mode)]);
    }
}

#[test]
#[ignore = "run by two_devices_a_fault_on_one_and_the_other in its own process"]
fn peer_fault_child() {
    if !common::is_child("peer_fault_child") {
        return;
    }
    let mode = std::env::var("CUDA_HAL_PEER_FAULT").unwrap();
    let _watchdog = common::Watchdog::start(format!("a fault on device 0 ({mode})"), 120);
    const N: usize = 4 * MIB / 4;
    let (h0, h1) = (CudaHal::new(0).unwrap(), CudaHal::new(1).unwrap());
    let src = h1.copy_from("src", &vec![3u32; N]).unwrap();
    let on0 = h0.alloc::<u32>("on-0", N).unwrap();
    match mode.as_str() {
        "none" => on0.fill(3).unwrap(),
        "via-host" => on0.copy_from_device_via_host(&src).unwrap(),
        "peer" => on0.copy_from_device(&src).unwrap(),
        other => panic!("unknown mode {other}"),
    }
    common::fault_context(&h0);

    // The driver's word on device 1's context, raw (the crate's wrappers would record it).
    let ctx1 = driver::PrimaryContext::retain(1).unwrap();
    ctx1.bind().unwrap();
    let d = cuda_hal::cuda_sys::driver().unwrap();
    let mut raw: cuda_hal::cuda_sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointer is a valid local; device 1's context is current.
    let created = unsafe { d.cuStreamCreate(&mut raw, 1) };
    if created.is_ok() {
        // SAFETY: the stream just made, destroyed once.
        unsafe { d.cuStreamDestroy(raw) }.unwrap();
    }
    let healthy = created.is_ok();
    println!(
        "{mode}: after device 0's fault, device 1's context by the driver's word: {}",
        match &created {
            Ok(()) => "healthy (a stream made)".to_string(),
            Err(e) => format!("broken too ({e})"),
        }
    );

    // Device 1's HAL: a write of `src` (ordered after device 0's uses of it, if any), a read,
    // the free, a new buffer and a kernel, a copy from device 0, a wait.
    let mut answers: Vec<(&str, cuda_hal::Result<()>)> = Vec::new();
    answers.push(("fill", src.fill(5)));
    answers.push((
        "to_vec",
        src.to_vec()
            .map(|v| assert!(v.iter().all(|&x| x == 5), "{mode}: src after the fill")),
    ));
    drop(src);
    answers.push((
        "new buffer and a kernel",
        h1.copy_from("after", &[7u32; 4]).and_then(|b| {
            let (x, y) = (b.slice(0, 2)?, b.slice(2, 2)?);
            cuda_hal::ops::add(&x, &y, &y)?;
            assert_eq!(b.to_vec()?, vec![14, 14, 7, 7], "{mode}");
            Ok(())
        }),
    ));
    let from0 = h1
        .alloc::<u32>("from-0", N)
        .and_then(|back| back.copy_from_device(&on0));
    println!("{mode}: a copy from device 0 onto device 1: {from0:?}");
    assert!(
        matches!(from0, Err(Error::ContextPoisoned { .. })),
        "{mode}: {from0:?}"
    );
    answers.push(("synchronize", h1.synchronize()));
    for (what, answer) in &answers {
        println!("{mode}: device 1's {what}: {answer:?}");
        if healthy {
            assert!(
                answer.is_ok(),
                "{mode}: {what} on a healthy device 1: {answer:?}"
            );
        } else {
            assert!(
                matches!(answer, Ok(()) | Err(Error::ContextPoisoned { .. })),
                "{mode}: {what} on a broken device 1: {answer:?}"
            );
        }
    }
    assert!(h0.poisoned().is_some());
    assert_eq!(
        h1.poisoned().is_none(),
        healthy,
        "{mode}: {:?}",
        h1.poisoned()
    );
    println!("CHILD-OK");
}

/// A destination HAL that goes away gives its memory back at once, although the source
/// still holds an event of its context (the copy's, until the source is next used): the
/// source keeps that context alive, not the whole HAL with its pool and cached blocks
/// (before fe9e29c it kept the HAL, so its 256 MiB block stayed reserved on device 1).
/// In a child process, so that this process's HALs are gone, and with the two-device
/// tests' turn, so that none of them allocates on device 1 meanwhile (in the first run on
/// two H100s, at 0e33894, one did: the child saw 416 MiB less on the host route).
#[test]
fn two_devices_a_dropped_destination_gives_its_memory_back() {
    let Some(two) = need_two() else { return };
    let _turn = two.hals_dropped();
    common::run_child("dropped_destination_child", &[]);
}

#[test]
#[ignore = "run by two_devices_a_dropped_destination_gives_its_memory_back in its own process"]
fn dropped_destination_child() {
    if !common::is_child("dropped_destination_child") {
        return;
    }
    const N: usize = 256 * MIB / 4;
    let h0 = CudaHal::new(0).unwrap();
    let a = h0.copy_from("a", &vec![7u32; N]).unwrap();
    // Device 1's free memory, read in its primary context (held here throughout).
    let ctx1 = driver::PrimaryContext::retain(1).unwrap();
    let free_on_1 = || {
        ctx1.bind().unwrap();
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers are valid locals; device 1's context is current.
        unsafe {
            cuda_hal::cuda_sys::driver()
                .unwrap()
                .cuMemGetInfo(&mut free, &mut total)
                .unwrap()
        };
        free
    };
    let before = free_on_1();
    for via_host in [false, true] {
        // `a` still holds the copy's event of device 1's context afterwards.
        copy_into_a_new_hal_of_device_1(&a, via_host, 7);
        let after = free_on_1();
        println!(
            "via host: {via_host}: device 1 free: {} MiB before, {} MiB after",
            before / MIB,
            after / MIB
        );
        assert!(
            after + 64 * MIB >= before,
            "via host: {via_host}: device 1 has {} MiB less free after its HAL went",
            (before - after) / MIB
        );
        a.fill(7).unwrap(); // clears the pending use
    }
    assert_eq!(a.get_at(N - 1).unwrap(), 7);
    println!("CHILD-OK");
}

/// The copies of `two_devices_buffers_copy_both_ways` between two HALs of device 0: every
/// route's code (the remembered peer answer, the idle-source check, the events that order
/// the two streams, the host route's pinned slots taking turns) runs on one device too.
#[test]
fn buffers_copy_between_hals_of_one_device() {
    let Some(h0) = common::gpu() else { return };
    let h1 = CudaHal::new(0).unwrap();
    copies_both_ways(&h0, &h1);
    copies_from_an_idle_source(&h0, &h1);
}

/// Copying a buffer onto an overlapping part of itself through the host is refused: the
/// chunks would read bytes an earlier chunk already overwrote.
#[test]
fn a_copy_through_the_host_onto_itself_is_refused() {
    let Some(h) = common::gpu() else { return };
    let b = h.copy_from("b", &(0..4096u32).collect::<Vec<_>>()).unwrap();
    let (lo, hi) = (b.slice(0, 3000).unwrap(), b.slice(1000, 3000).unwrap());
    let err = hi.copy_from_device_via_host(&lo).unwrap_err();
    assert!(matches!(err, Error::Aliasing { .. }), "{err}");
    let apart = b.slice(3000, 1000).unwrap();
    apart
        .copy_from_device_via_host(&b.slice(0, 1000).unwrap())
        .unwrap();
    assert_eq!(b.get_at(3999).unwrap(), 999);
}

/// Copies from `h0`'s buffers into `h1`'s and back, by both routes, at sizes from one
/// element to eleven pinned slots.
/// Copies `src` into a buffer of a new HAL of device 1, by the peer route or through the
/// host, and checks its last element is `last`; the HAL and the buffer go on return.
fn copy_into_a_new_hal_of_device_1(src: &Buffer<u32>, via_host: bool, last: u32) {
    let h1 = CudaHal::new(1).unwrap();
    let b = h1.alloc::<u32>("b", src.len()).unwrap();
    if via_host {
        b.copy_from_device_via_host(src).unwrap();
    } else {
        b.copy_from_device(src).unwrap();
    }
    h1.synchronize().unwrap();
    assert_eq!(b.get_at(src.len() - 1).unwrap(), last);
}

fn copies_both_ways(h0: &CudaHal, h1: &CudaHal) {
    let ordinal0 = h0.info().ordinal;
    // Through the host, 16 MiB + 12 B is five 4 MiB chunks over four pinned slots (the
    // first reused), and 40 MiB + 4 B eleven.
    for n in [1usize, 1000, 16 * MIB / 4 + 3, 40 * MIB / 4 + 1] {
        let data = Rng::new(n as u64).u32s(n);
        let a = h0.copy_from("on-0", &data).unwrap();
        let b = h1.copy_from("on-1", &vec![0xDEAD_BEEFu32; n]).unwrap();
        let (before0, before1) = (h0.ledger(), h1.ledger());
        b.copy_from_device(&a).unwrap();
        // The route: a peer copy where the devices can access each other, else through
        // the host (D2H on the source's HAL, H2D on the destination's).
        let (d0, d1) = (h0.ledger().since(&before0), h1.ledger().since(&before1));
        let bytes = (4 * n) as u64;
        if h1.can_access_peer(h0).unwrap() {
            assert_eq!((d1.d2d.bytes, d1.h2d.bytes, d0.d2h.bytes), (bytes, 0, 0));
        } else {
            assert_eq!(
                (d1.d2d.bytes, d1.h2d.bytes, d0.d2h.bytes),
                (0, bytes, bytes)
            );
        }
        assert_eq!(b.to_vec().unwrap(), data, "0 -> 1, n = {n}");
        let c = h0.alloc::<u32>("back-on-0", n).unwrap();
        // The source buffer can be dropped right after: the copy keeps it alive in order.
        let tmp = h1.copy_from("tmp-on-1", &data).unwrap();
        c.copy_from_device(&tmp).unwrap();
        drop(tmp);
        assert_eq!(c.to_vec().unwrap(), data, "1 -> 0, n = {n}");
        // Through the host, whatever the devices can do: the route between devices that
        // cannot access each other.
        let e = h1.alloc::<u32>("via-host-on-1", n).unwrap();
        e.copy_from_device_via_host(&a).unwrap();
        assert_eq!(e.to_vec().unwrap(), data, "0 -> 1 via the host, n = {n}");
        let f = h0.copy_from("via-host-on-0", &vec![0u32; n]).unwrap();
        f.copy_from_device_via_host(&e).unwrap();
        assert_eq!(f.to_vec().unwrap(), data, "1 -> 0 via the host, n = {n}");
        // Queued in order on both streams: a later write to the source does not reach the
        // copy, and the source may go at once.
        let g = h1.alloc::<u32>("via-host-again", n).unwrap();
        g.copy_from_device_via_host(&f).unwrap();
        f.fill(0xABCD).unwrap();
        drop(f);
        assert_eq!(
            g.to_vec().unwrap(),
            data,
            "queued before the write, n = {n}"
        );
        let f = h0.copy_from("via-host-on-0", &data).unwrap();
        let short = h1.alloc::<u32>("short", n + 1).unwrap();
        assert!(matches!(
            f.copy_from_device_via_host(&short),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(f.get_at(n - 1).unwrap(), data[n - 1], "left as it was");
    }
    // A host-newer source (phase 2) is uploaded before the peer copy reads it.
    let a = h0.copy_from("edited", &[1u32; 64]).unwrap();
    a.view_mut(|v| v[63] = 99).unwrap();
    let b = h1.alloc::<u32>("dst", 64).unwrap();
    b.copy_from_device(&a).unwrap();
    assert_eq!(b.get_at(63).unwrap(), 99);
    println!("phases {}", PHASES.label());
    // A source still being written when the copy is asked for: both routes wait for it.
    let busy = h0.alloc::<u32>("busy-src", 16 * MIB).unwrap();
    for (round, value) in [5u32, 6].into_iter().enumerate() {
        busy.fill(value).unwrap();
        let into = h1.alloc::<u32>("after-busy", 16 * MIB).unwrap();
        if round == 0 {
            into.copy_from_device(&busy).unwrap();
        } else {
            into.copy_from_device_via_host(&busy).unwrap();
        }
        let got = into.to_vec().unwrap();
        assert!(got.iter().all(|&x| x == value), "round {round}");
    }
    // Peer access is remembered per pair of HALs, not per device: a new HAL on h0's device
    // (a new pool, which must grant h1's device access) after the last one went.
    for round in 0..3u32 {
        let fresh = CudaHal::new(ordinal0).unwrap();
        let src = fresh.copy_from("fresh-src", &[round; 4096]).unwrap();
        let dst = h1.alloc::<u32>("from-fresh", 4096).unwrap();
        dst.copy_from_device(&src).unwrap();
        assert_eq!(dst.to_vec().unwrap(), vec![round; 4096], "round {round}");
    }
}

/// Copies from a source whose stream the host has waited for: the copy queues no wait for
/// that stream, nor for the events of earlier copies the host has seen done. Work queued
/// on it after the wait, by the crate or by the caller on the raw stream (which the crate
/// does not count), is waited for. Hands out `h0`'s raw stream.
fn copies_from_an_idle_source(h0: &CudaHal, h1: &CudaHal) {
    let n = 16 * MIB;
    let src = h0.alloc::<u32>("idle-src", n).unwrap();
    src.fill(1).unwrap();
    h0.synchronize().unwrap();
    let dst = h1.alloc::<u32>("from-idle", n).unwrap();
    for round in 0..3 {
        dst.copy_from_device(&src).unwrap();
        h1.synchronize().unwrap();
        let got = dst.to_vec().unwrap();
        assert!(got.iter().all(|&x| x == 1), "idle source, round {round}");
    }
    // Fills queued after the wait, long enough (eight of 64 MiB) to be running still when
    // the copy is queued: it must wait for them.
    for value in [2u32, 3] {
        for v in [7, 8, 9, 10, 11, 12, 13, value] {
            src.fill(v).unwrap();
        }
        dst.copy_from_device(&src).unwrap();
        let got = dst.to_vec().unwrap();
        assert!(
            got.iter().all(|&x| x == value),
            "after fills, value {value}"
        );
        h0.synchronize().unwrap();
    }
    // The same fills queued by the caller on the raw stream.
    let (stream, ptr) = (h0.stream_handle(), src.device_ptr_mut().unwrap().addr);
    let api = cuda_hal::cuda_sys::driver().unwrap();
    for v in [7u32, 8, 9, 10, 11, 12, 13, 4] {
        // SAFETY: `ptr` is `src`'s live allocation of `n` u32s; the stream is `h0`'s, and
        // `device_ptr_mut` left its context current.
        unsafe { api.cuMemsetD32Async(ptr, v, n, stream).unwrap() };
    }
    dst.copy_from_device(&src).unwrap();
    let got = dst.to_vec().unwrap();
    assert!(got.iter().all(|&x| x == 4), "after the caller's own fills");
}
