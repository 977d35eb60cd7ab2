//! Every driver call of an operation failing in turn (feature `fault-injection`; GPU).
//!
//! Each scenario runs once to list its driver calls (the scenario's, and then the HAL's own
//! as it goes: its trim, pool, stream and modules; not those of the checks in between), then
//! once per call with that call made to fail (`cuda_sys::fault`). A call is picked as the
//! `n`-th call of its entry point ([`Pick`]), so it stays the same call where a run skips or
//! adds a query (a stream whose work is known done asks the driver nothing). An allocation
//! fails before it reaches the driver with
//! `CUDA_ERROR_OUT_OF_MEMORY`; a release (free, destroy, unload, unregister) after the
//! driver made it, with `CUDA_ERROR_INVALID_VALUE`, so that a caller that took the error
//! for "not released" and tried again would double-free (memcheck's run sees that), and
//! one that gave up would leak; any other call before it reaches the driver with
//! `CUDA_ERROR_INVALID_VALUE`. Synchronisations are left alone (after a wait that failed,
//! the HAL keeps the memory the device may still use rather than free it). After every run:
//! - no panic, and the HAL is not poisoned (neither error is sticky);
//! - the HAL still works: a round trip and a kernel on a new buffer;
//! - nothing is left: no live allocation in the HAL's report once the scenario's objects
//!   are dropped, and the device's free memory is back (within 4 MiB) once the HAL is
//!   (but for managed memory: see [`Checks`]).
//!
//! Each release of those runs is then refused in turn instead, before the driver sees it
//! (`CUDA_ERROR_INVALID_VALUE`; but for `cuMemHostUnregister`, see [`release_refused`]):
//! what it releases stays allocated, and the HAL cannot know that it does. The same checks
//! hold, but that the device's free memory may come back short by what one allocation of
//! the scenario holds, or the pool's chunks it lies in ([`leak_bound`]): a refused release
//! costs that one allocation, and nothing else the HAL holds. (Skipped under memcheck, whose
//! leak check rightly reports those allocations: `CUDA_HAL_FAULTS_NO_REFUSED_RELEASES=1`.)
//!
//! Each scenario then runs once per call `k` (the `k`-th of all its calls) with a sticky error (`CUDA_ERROR_ILLEGAL_ADDRESS`,
//! as after a device fault) striking at call `k`: that call and every later one fail, as
//! [`once_stuck`] says (device work fails before the driver sees it; waits and releases are
//! made, then reported as failed). After every such run:
//! - no panic and no hang; an error the scenario returned is `ContextPoisoned`, and the HAL
//!   is poisoned then;
//! - the HAL is poisoned once it reaches the driver: `synchronize`, an allocation and a new
//!   HAL on the context are each refused with `ContextPoisoned`;
//! - once the injection stops, nothing is left: the device's free memory is back (within
//!   4 MiB) after the HAL goes, and a new HAL works.
//!
//! [`a_hals_start_alone`] fails each call of a HAL's start in turn with no other HAL of the
//! device alive, and checks after each that nothing holds the device's primary context and
//! that a HAL whose module failed to load gets its kernels at the first lookup.
//!
//! Each scenario runs in a HAL with the block cache and in one without, where every free
//! reaches the driver. Their HALs load kernels at first use ([`lazy`]); the scenario
//! [`kernels_loaded_up_front`] starts one that loads them all. `gpu-run.sh faults-memcheck`
//! runs the binary again under memcheck's leak check.
//!
//! Run with `cargo test --features fault-injection --test faults` (gpu-run.sh runs the
//! binary gpu-pack.sh builds so); without the feature this file is empty.
#![cfg(feature = "fault-injection")]

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use common::{Rng, Watchdog, MIB};
use cuda_hal::cuda_sys::fault::{self, FailOnce, OnceStuck};
use cuda_hal::cuda_sys::CUresult;
use cuda_hal::{
    ops, ArenaLayout, CudaHal, Error, GrowableBuffer, HalConfig, LaunchDims, PinnedFlags,
    PipelineMode, Result, StagingConfig,
};

/// The injection state is global: one scenario at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The scenarios' turn ([`ONE_AT_A_TIME`]), or `None` without a GPU. Taken before the check
/// for a GPU (which starts a HAL, and drops it): no HAL of another test lives during a
/// scenario (the HALs on a context share its poisoning while one lives, and
/// [`a_hals_start_alone`] asks that nothing hold the context).
fn one_at_a_time() -> Option<std::sync::MutexGuard<'static, ()>> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    common::gpu().map(|_| one)
}

/// Parts of the names of the entry points that release what a HAL holds.
const RELEASES: [&str; 5] = ["Destroy", "Free", "Unload", "Release", "Unregister"];

/// Whether entry point `symbol` releases something (see [`RELEASES`]).
fn is_release(symbol: &str) -> bool {
    RELEASES.iter().any(|s| symbol.contains(s))
}

/// How call `symbol` fails when it is the one picked (see the module doc).
fn injected_code(symbol: &'static str) -> FailOnce {
    if symbol.contains("Synchronize") {
        FailOnce::LeftAlone
    } else if is_release(symbol) {
        FailOnce::RunsThenFails(CUresult::CUDA_ERROR_INVALID_VALUE)
    } else if symbol.contains("Alloc") {
        FailOnce::Refused(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        FailOnce::Refused(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

/// How call `symbol` fails in the runs where a release is refused: only releases fail, before
/// the driver sees them; any other call picked goes ahead (see the module doc). But for the
/// caller's host memory given back by `cuMemHostUnregister`: refused, the range stays
/// registered after its owner frees it, and the driver refuses to register that range again
/// for the rest of the process, whoever asks (the driver's state, not the HAL's).
fn release_refused(symbol: &'static str) -> FailOnce {
    if is_release(symbol) && !symbol.contains("Unregister") {
        FailOnce::Refused(CUresult::CUDA_ERROR_INVALID_VALUE)
    } else {
        FailOnce::LeftAlone
    }
}

/// How call `symbol` behaves once a sticky error struck: the thread's context stack, device
/// queries and error texts are not the context's work and go ahead; waits and releases are
/// made and fail; everything else fails before the driver sees it.
fn once_stuck(symbol: &'static str) -> fault::OnceStuck {
    let unaffected = [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuCtxPushCurrent",
        "cuCtxPopCurrent",
        "cuCtxGetDevice",
        "cuGetError",
    ];
    let waits = ["Synchronize", "Query"];
    if unaffected.iter().any(|s| symbol.starts_with(s)) {
        fault::OnceStuck::Unaffected
    } else if is_release(symbol) || waits.iter().any(|s| symbol.contains(s)) {
        fault::OnceStuck::RunsThenFails
    } else {
        fault::OnceStuck::Fails
    }
}

/// The device's free memory, in `ctx` (held for the whole test: with the context kept,
/// memory a HAL leaks stays allocated after the HAL is gone).
fn free_device_bytes(ctx: &cuda_hal::driver::PrimaryContext) -> usize {
    let d = cuda_hal::cuda_sys::driver().unwrap();
    ctx.bind().unwrap();
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two valid places for the driver to write sizes.
    unsafe { d.cuMemGetInfo(&mut free, &mut total) }.unwrap();
    free
}

/// What a HAL must still do after a failure.
fn still_works(hal: &CudaHal) {
    let data: Vec<u32> = (0..100_000).collect();
    let b = hal.copy_from("after", &data).unwrap();
    assert_eq!(b.to_vec().unwrap(), data);
    let sum = hal.alloc::<u32>("after-sum", data.len()).unwrap();
    ops::add(&sum, &b, &b).unwrap();
    assert_eq!(sum.get_at(99_999).unwrap(), 2 * 99_999);
}

/// What a scenario's runs check beyond the module doc's first two points.
#[derive(Clone, Copy)]
struct Checks {
    /// The device's free memory back after the HAL goes. Not for managed memory: the
    /// driver keeps about 125 MiB for it at times, and gives it back at others (memcheck's
    /// leak check, which `gpu-run.sh faults-memcheck` runs over this binary, covers
    /// managed memory).
    free_memory: bool,
}

/// A scenario of one HAL configuration, and what its runs check.
struct Scenario<'a> {
    /// Held for the whole test: with the context kept, memory a HAL leaks stays allocated
    /// after the HAL is gone.
    ctx: &'a cuda_hal::driver::PrimaryContext,
    check: Checks,
    config: &'a HalConfig,
    name: &'a str,
    body: &'a dyn Fn(&CudaHal) -> Result<()>,
}

impl Scenario<'_> {
    /// An error unless the device's free memory is back to `before` (within 4 MiB, and
    /// `allowed` bytes more), where the scenario checks it; else the bytes it came back
    /// short (0 if it did not).
    fn memory_given_back(
        &self,
        before: usize,
        allowed: usize,
        what: &str,
    ) -> std::result::Result<usize, String> {
        let short = before.saturating_sub(free_device_bytes(self.ctx));
        match self.check.free_memory && short > 4 * MIB + allowed {
            true => Err(format!(
                "{what}: {} MiB of device memory not given back ({} MiB allowed)",
                short / MIB,
                (4 * MIB + allowed) / MIB
            )),
            false => Ok(short),
        }
    }
}

/// A driver call of a scenario: the `nth` call (from 1) of entry point `symbol`.
#[derive(Clone, Copy, Debug)]
struct Pick {
    symbol: &'static str,
    nth: u64,
}

impl std::fmt::Display for Pick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{}", self.symbol, self.nth)
    }
}

/// Each call of `called` (entry points in the order called) as a [`Pick`].
fn picks(called: &[&'static str]) -> Vec<Pick> {
    let mut seen = std::collections::HashMap::<&str, u64>::new();
    let mut pick = |symbol| {
        let nth = seen.entry(symbol).or_default();
        *nth += 1;
        Pick { symbol, nth: *nth }
    };
    called.iter().map(|&symbol| pick(symbol)).collect()
}

/// What one run with a call made to fail saw.
struct Run {
    injected: fault::Injected,
    /// The entry points called, in order (`fault::called`).
    called: Vec<&'static str>,
    /// Whether the scenario returned an error.
    returned_error: bool,
    /// Bytes of device memory not given back once the HAL went.
    short: usize,
    /// The most device memory a refused release may leave behind: [`leak_bound`].
    bound: usize,
}

/// The device memory the driver's pool reserves at a time for blocks of up to its size (seen
/// on driver 580, H100 and H200): it cannot give back a chunk that still holds a block, and
/// a block may lie across two chunks (one refused free of a block of at most 16 MiB kept 64
/// MiB).
const POOL_CHUNK: usize = 32 * MIB;

/// The most device memory a release refused in the scenario `report` describes may leave
/// behind: one allocation, which holds at most its name's peak (the largest of any name),
/// with the pool's chunks it lies in ([`POOL_CHUNK`]): those it fills, and one more where
/// it lies across two.
fn leak_bound(report: &cuda_hal::MemoryReport) -> usize {
    let largest = report.by_name.iter().map(|t| t.peak_bytes).max();
    largest.unwrap_or(0).next_multiple_of(POOL_CHUNK) + POOL_CHUNK
}

/// Runs the scenario on a new HAL with call `pick` failing (`None`: none) as `how` says,
/// checks what the module's doc says, and returns what it saw. The calls counted are the
/// scenario's and then the HAL's own as it goes (its trim, pool, stream and modules), not
/// those of the checks in between.
fn run(s: &Scenario<'_>, pick: Option<Pick>, how: fn(&'static str) -> FailOnce) -> Run {
    let (config, name, scenario) = (s.config, s.name, s.body);
    let free_before = free_device_bytes(s.ctx);
    let hal = CudaHal::with_config(0, config.clone()).unwrap();
    match pick {
        Some(p) => fault::arm_nth(p.symbol, p.nth, how),
        None => fault::arm(0, how),
    }
    let call = pick.map_or("no call".to_string(), |p| format!("call {p}"));
    let outcome = catch_unwind(AssertUnwindSafe(|| scenario(&hal)));
    let in_scenario = fault::pause();
    let what = format!("{name}, {call} ({:?})", in_scenario.failed);
    let result = outcome.unwrap_or_else(|_| panic!("{what}: panicked"));
    let returned_error = result.is_err();
    if pick.is_none() {
        result.unwrap_or_else(|e| panic!("{name} without a failure: {e}"));
    }
    assert!(hal.poisoned().is_none(), "{what}: poisoned");
    still_works(&hal);
    hal.synchronize().unwrap();
    // The prover's tables (twiddles, shift powers) stay with the HAL by design, until it goes.
    let report = hal.memory_report();
    let mut live = report.live.clone();
    live.retain(|a| !PROVER_TABLES.contains(&a.name.as_str()));
    assert!(live.is_empty(), "{what}: left alive: {live:?}");
    let pinned = hal.pinned_report().live;
    assert!(pinned.is_empty(), "{what}: pinned buffers left: {pinned:?}");
    fault::resume();
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(hal)));
    let injected = fault::disarm();
    let called = fault::called();
    let what = format!("{name}, {call} ({:?})", injected.failed);
    assert!(dropped.is_ok(), "{what}: panicked as the HAL went");
    let refused_release = injected
        .failed
        .is_some_and(|f| is_release(f) && matches!(how(f), FailOnce::Refused(_)));
    let bound = leak_bound(&report);
    let allowed = if refused_release { bound } else { 0 };
    let short = s
        .memory_given_back(free_before, allowed, &what)
        .unwrap_or_else(|e| panic!("{e}"));
    Run {
        injected,
        called,
        returned_error,
        short,
        bound,
    }
}

const PROVER_TABLES: [&str; 3] = ["prover-twiddles", "prover-shift-powers", "prover-poseidon2"];

/// Runs the scenario on a new HAL with a sticky error striking at call `fail_at`, and checks
/// what the module's doc says. The entry point it struck, if it struck in the scenario, or
/// what went wrong.
fn run_stuck(s: &Scenario<'_>, fail_at: u64) -> std::result::Result<Option<&'static str>, String> {
    let (config, name, scenario) = (s.config, s.name, s.body);
    let _watchdog = Watchdog::start(format!("{name}, sticky from call {fail_at}"), 60);
    let free_before = free_device_bytes(s.ctx);
    let hal = CudaHal::with_config(0, config.clone()).unwrap();
    fault::arm_sticky(fail_at, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, once_stuck);
    let outcome = catch_unwind(AssertUnwindSafe(|| scenario(&hal)));
    let in_scenario = fault::disarm();
    // Armed again for the checks, struck at once: the context stays broken for them.
    fault::arm_sticky(1, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, once_stuck);
    let checked = catch_unwind(AssertUnwindSafe(|| {
        let returned = outcome.map_err(|_| "the scenario panicked".to_string())?;
        if let Err(e) = returned {
            if !matches!(e, Error::ContextPoisoned { .. }) {
                return Err(format!("returned {e}, not ContextPoisoned"));
            }
            if hal.poisoned().is_none() {
                return Err(format!("returned {e}, but the HAL is not poisoned"));
            }
        }
        match hal.synchronize() {
            Err(Error::ContextPoisoned { .. }) => {}
            other => return Err(format!("synchronize: {other:?}")),
        }
        if hal.poisoned().is_none() {
            return Err("not poisoned after a sticky error".into());
        }
        match hal.alloc::<u32>("late", 1000) {
            Err(Error::ContextPoisoned { .. }) => {}
            other => return Err(format!("an allocation: {:?}", other.map(|_| ()))),
        }
        match CudaHal::with_config(0, config.clone()) {
            Err(Error::ContextPoisoned { .. }) => {}
            other => return Err(format!("a new HAL: {:?}", other.map(|_| ()))),
        }
        drop(hal);
        Ok(())
    }));
    fault::disarm();
    let what = format!(
        "{name}, sticky from call {fail_at} ({:?})",
        in_scenario.failed
    );
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(format!("{what}: {why}")),
        Err(_) => {
            return Err(format!(
                "{what}: panicked in the checks (or dropping the HAL)"
            ))
        }
    }
    still_works(&CudaHal::with_config(0, config.clone()).unwrap());
    s.memory_given_back(free_before, 0, &what)?;
    Ok(in_scenario.failed)
}

/// Runs `scenario` with each of its driver calls failing in turn, in a HAL with the block
/// cache (frees keep their blocks) and in one without (every free reaches the driver).
fn every_call_fails_in_turn(name: &str, scenario: impl Fn(&CudaHal) -> Result<()>) {
    let check = Checks { free_memory: true };
    every_call_fails_in_turn_checking(check, name, scenario);
}

fn every_call_fails_in_turn_checking(
    check: Checks,
    name: &str,
    scenario: impl Fn(&CudaHal) -> Result<()>,
) {
    let Some(_one) = one_at_a_time() else { return };
    let ctx = cuda_hal::driver::PrimaryContext::retain(0).unwrap();
    // The second run also takes the copied route of small batches (a device scratch).
    let no_cache = HalConfig {
        block_cache_bytes: 0,
        mapped_batches: false,
        ..lazy()
    };
    let runs = [(lazy(), ""), (no_cache, ", no block cache, batches copied")];
    for (config, which) in runs {
        every_call_of(&ctx, check, &config, &format!("{name}{which}"), &scenario);
    }
}

/// The configuration the scenarios start from: the defaults, with kernels loaded at their
/// first use. Every run starts a HAL (outside the injection), thousands in all; loading
/// each of the module's kernels at each start made memcheck's pass run for more than
/// ten minutes. [`kernels_loaded_up_front`] injects into a start that loads them.
fn lazy() -> HalConfig {
    HalConfig {
        preload_kernels: false,
        ..HalConfig::default()
    }
}

fn every_call_of(
    ctx: &cuda_hal::driver::PrimaryContext,
    check: Checks,
    config: &HalConfig,
    name: &str,
    scenario: &dyn Fn(&CudaHal) -> Result<()>,
) {
    // Once first, unchecked: the driver keeps memory for what a process uses first (managed
    // memory's first allocation took 126 MiB on an H200, and kept it).
    fault::arm(0, injected_code);
    let warm_up = CudaHal::with_config(0, config.clone()).and_then(|hal| scenario(&hal));
    fault::disarm();
    warm_up.unwrap_or_else(|e| panic!("{name}, the first time: {e}"));
    let s = Scenario {
        ctx,
        check,
        config,
        name,
        body: scenario,
    };
    let all = picks(&run(&s, None, injected_code).called);
    let calls = all.len() as u64;
    let (mut failed, mut errors, mut releases) = (0, 0, Vec::new());
    for &pick in &all {
        let r = run(&s, Some(pick), injected_code);
        if let Some(symbol) = r.injected.failed {
            failed += 1;
            errors += usize::from(r.returned_error);
            if matches!(release_refused(symbol), FailOnce::Refused(_)) {
                releases.push(pick);
            }
        }
    }
    // The others were absorbed: another way taken (a copy staged when asking whether
    // memory is page-locked failed), or a failure after the result was ready.
    println!(
        "{name}: {calls} driver calls, {failed} made to fail in turn: {errors} returned the \
         error, {} recovered",
        failed - errors
    );
    assert!(failed > 0, "{name}: no call failed");
    if std::env::var_os("CUDA_HAL_FAULTS_NO_REFUSED_RELEASES").is_some() {
        println!("{name}: refused releases skipped (CUDA_HAL_FAULTS_NO_REFUSED_RELEASES)");
    } else {
        every_release_refused(&s, &releases);
    }
    // Every run, then every finding at once.
    let (mut struck, mut findings) = (0, Vec::new());
    for k in 1..=calls {
        match run_stuck(&s, k) {
            Ok(s) => struck += usize::from(s.is_some()),
            Err(finding) => {
                println!("FINDING: {finding}");
                findings.push(finding);
            }
        }
    }
    println!("{name}: a sticky error struck at {struck} of the {calls} calls in turn");
    assert!(
        findings.is_empty(),
        "{name}: {} findings: {findings:#?}",
        findings.len()
    );
    assert!(struck > 0, "{name}: no sticky error struck");
}

/// Runs the scenario once per release call of `releases` with that call refused
/// before the driver (see the module doc), and says what each left behind.
fn every_release_refused(s: &Scenario<'_>, releases: &[Pick]) {
    let (mut refused, mut worst) = (0, (0, 0, ""));
    for &pick in releases {
        let r = run(s, Some(pick), release_refused);
        if let Some(symbol) = r.injected.failed {
            println!(
                "{}, call {pick} ({symbol}) refused: {:.1} MiB left behind",
                s.name,
                r.short as f64 / MIB as f64
            );
            refused += 1;
            if r.short >= worst.0 {
                worst = (r.short, r.bound, symbol);
            }
        }
    }
    let (short, bound, symbol) = worst;
    let limit = match s.check.free_memory {
        true => format!("a refused release may leave at most {} MiB", bound / MIB),
        false => "not checked: see Checks".to_string(),
    };
    println!(
        "{}: {} of {} releases refused in turn; the most memory left behind {} MiB ({symbol}; \
         {limit})",
        s.name,
        refused,
        releases.len(),
        short / MIB,
    );
    assert!(
        releases.is_empty() || refused > 0,
        "{}: no release refused",
        s.name
    );
}

#[test]
fn buffers_and_copies() {
    every_call_fails_in_turn("buffers and copies", |hal| {
        let data = Rng::new(1).u32s(3 * MIB);
        let b = hal.copy_from("b", &data)?;
        let z = hal.alloc_zeroed::<u32>("z", 1000)?;
        z.view_mut(|s| s[0] = 5)?;
        assert_eq!(b.get_at(7)?, data[7]);
        assert_eq!(b.slice(10, 3)?.to_vec()?, data[10..13].to_vec());
        b.fill(3)?;
        let c = b.resized(4 * MIB)?;
        assert_eq!(c.get_at(5)?, 3);
        let mut back = vec![0u32; data.len()];
        b.copy_to_slice(&mut back)?;
        Ok(())
    });
}

#[test]
fn reads_batches_and_gathers() {
    every_call_fails_in_turn("reads, batches and gathers", |hal| {
        let data = Rng::new(2).u32s(2 * MIB);
        let b = hal.copy_from("b", &data)?;
        assert_eq!(b.read_async()?.wait()?, data);
        let (x, y) = (hal.alloc::<u32>("x", 1000)?, hal.alloc::<u32>("y", 3)?);
        hal.upload_batch(&[(&x, &data[..1000]), (&y, &data[..3])])?;
        assert_eq!(b.get_many(&[0, 5, 2 * MIB - 1])?[1], data[5]);
        assert_eq!(hal.gather(&[(&x, 4), (&y, 2)])?, vec![data[4], data[2]]);
        let (mut xs, mut ys) = (vec![0u32; 1000], vec![0u32; 3]);
        let _ = x.device_ptr_mut()?; // as after a kernel's write: read from the device
        hal.download_batch(&mut [(&x, &mut xs[..]), (&y, &mut ys[..])])?;
        assert!(xs == data[..1000] && ys == data[..3]);
        Ok(())
    });
}

#[test]
fn streams_pinned_memory_and_launches() {
    every_call_fails_in_turn("streams, pinned memory and launches", |hal| {
        let s = hal.create_stream()?;
        let a = hal.copy_from("a", &vec![1u32; MIB])?;
        let out = hal.alloc::<u32>("out", MIB)?;
        // SAFETY: eltwise_add_u32(out, a, b, n) over MIB elements of each.
        unsafe {
            hal.launch("eltwise_add_u32", LaunchDims::for_elements(MIB, 132))
                .on(&s)
                .output(&out)
                .input(&a)
                .input(&a)
                .scalar(MIB as u64)
                .run()?
        };
        let mut pinned = hal.alloc_pinned::<u32>("pinned", MIB, PinnedFlags::default())?;
        out.copy_to_pinned_on(&mut pinned, &s)?;
        s.synchronize()?;
        assert_eq!(pinned.host()?[9], 2);
        let mut data = vec![4u32; MIB];
        hal.with_registered_host(&mut data, |registered| a.copy_from_registered(registered))??;
        assert_eq!(a.get_at(3)?, 4);
        Ok(())
    });
}

#[test]
fn pipelines() {
    every_call_fails_in_turn("pipelines", |hal| {
        let input: Vec<u32> = (0..300_000).collect();
        let mut output = vec![0u32; input.len()];
        hal.pipeline(
            &input,
            &mut output,
            100_000,
            PipelineMode::Overlapped,
            |s, i, o| {
                // SAFETY: eltwise_add_u32(out, a, b, n) over the chunk's n elements.
                unsafe {
                    hal.launch("eltwise_add_u32", LaunchDims::for_elements(i.len(), 132))
                        .on(s)
                        .output(o)
                        .input(i)
                        .input(i)
                        .scalar(i.len() as u64)
                        .run()
                }
            },
        )?;
        assert_eq!(output[7], 14);
        Ok(())
    });
}

#[test]
fn arenas_and_growth() {
    every_call_fails_in_turn("arenas and growth", |hal| {
        let mut arena = hal.batch_arena("arena", 4 * MIB, ArenaLayout::Bump)?;
        {
            let batch = arena.begin_batch();
            let views = batch.upload(&[("p", &[1u32; 1000][..]), ("q", &[2u32; 10][..])])?;
            assert_eq!(views[1].get_at(3)?, 2);
        }
        let mut g = GrowableBuffer::<u32>::new(hal, "grow", 1000, 2.0)?;
        g.extend_from_slice(&vec![6u32; 5000])?;
        assert_eq!(g.buffer()?.get_at(4999)?, 6);
        Ok(())
    });
}

#[test]
fn managed_memory() {
    let check = Checks { free_memory: false };
    every_call_fails_in_turn_checking(check, "managed memory", |hal| {
        let mut m = hal.alloc_managed::<u32>("managed", MIB)?;
        m.host_mut()?.fill(8);
        m.prefetch_to_device()?;
        m.advise(cuda_hal::ManagedAdvice::PreferDevice)?;
        assert_eq!(m.host()?[5], 8);
        Ok(())
    });
}

#[test]
fn prover_operations() {
    use cuda_hal::field::Elem;
    use cuda_hal::Hal;
    every_call_fails_in_turn("prover operations", |hal| {
        let v: Vec<Elem> = (0..4u32 << 14).map(Elem::new).collect();
        let io = hal.copy_from("io", &v)?;
        hal.batch_ntt(&io, 14, false)?;
        hal.batch_ntt(&io, 14, true)?;
        assert_eq!(cuda_hal::HalBuffer::to_vec(&io)?, v);
        let out = hal.alloc::<Elem>("lde", 4 << 15)?;
        hal.coset_lde(&out, &io, 14, 1)?;
        Ok(())
    });
}

#[test]
fn copies_between_hals() {
    every_call_fails_in_turn("copies between HALs", |hal| {
        // Another HAL of the same device: the copies between HALs, without a second GPU.
        let other = CudaHal::with_config(0, hal.config().clone())?;
        let data = Rng::new(3).u32s(3 * MIB);
        let a = hal.copy_from("a", &data)?;
        let b = other.alloc::<u32>("b", data.len())?;
        b.copy_from_device(&a)?;
        assert_eq!(b.get_at(12_345)?, data[12_345]);
        let c = hal.alloc::<u32>("c", data.len())?;
        c.copy_from_device_via_host(&b)?;
        assert_eq!(c.get_at(3 * MIB - 1)?, data[3 * MIB - 1]);
        Ok(())
    });
}

/// Where the driver refuses to connect two devices that could access each other (too many
/// peers: `cuCtxEnablePeerAccess`; or the source's pool refuses the destination:
/// `cuMemPoolSetAccess`), `copy_from_device` takes the host route: the ledgers show a
/// download on the source's HAL and an upload on the destination's, and no device-to-device
/// copy. The answer is remembered for the pair (no second driver call), neither HAL is
/// poisoned, and a new pair of HALs asks again and copies peer to peer. Needs two devices
/// that can access each other (skipped otherwise; `CUDA_HAL_REQUIRE_GPUS=2` makes fewer than
/// two a failure).
#[test]
fn two_devices_a_refused_peer_access_sends_copies_through_the_host() {
    let Some(_one) = one_at_a_time() else { return };
    if !common::two_devices() {
        return;
    }
    // 12 MiB: three of the host route's 4 MiB chunks.
    let data = Rng::new(11).u32s(3 * MIB);
    let bytes = 4 * data.len() as u64;
    for refused in ["cuCtxEnablePeerAccess", "cuMemPoolSetAccess"] {
        let (h0, h1) = (CudaHal::new(0).unwrap(), CudaHal::new(1).unwrap());
        if !h0.can_access_peer(&h1).unwrap() {
            eprintln!("SKIPPED: devices 0 and 1 cannot access each other: nothing to refuse");
            return;
        }
        let src = h1.copy_from("on-1", &data).unwrap();
        let dst = h0.alloc::<u32>("on-0", data.len()).unwrap();
        let (before0, before1) = (h0.ledger(), h1.ledger());
        fault::arm_nth(refused, 1, |_| {
            FailOnce::Refused(CUresult::CUDA_ERROR_TOO_MANY_PEERS)
        });
        let copied = dst.copy_from_device(&src);
        let injected = fault::disarm();
        assert_eq!(injected.failed, Some(refused));
        copied.unwrap();
        assert_eq!(dst.to_vec().unwrap(), data, "{refused} refused");
        let (d0, d1) = (h0.ledger().since(&before0), h1.ledger().since(&before1));
        assert_eq!(
            (d0.d2d.bytes, d0.h2d.bytes, d1.d2h.bytes),
            (0, bytes, bytes),
            "{refused} refused: the route (device-to-device, up on 0, down from 1)"
        );
        // Remembered: asking again makes no driver call, and the next copy goes the same way.
        fault::arm(0, |_| FailOnce::LeftAlone);
        assert!(!h0.enable_peer_access(&h1).unwrap());
        let again = h0.alloc::<u32>("again-on-0", data.len()).unwrap();
        let before0 = h0.ledger();
        again.copy_from_device(&src).unwrap();
        let called = fault::called();
        fault::disarm();
        assert!(
            !called
                .iter()
                .any(|c| c.contains("Peer") || *c == "cuMemPoolSetAccess"),
            "{refused} refused: asked the driver again: {called:?}"
        );
        assert_eq!(h0.ledger().since(&before0).h2d.bytes, bytes);
        assert_eq!(again.to_vec().unwrap(), data);
        assert!(h0.poisoned().is_none() && h1.poisoned().is_none());
        still_works(&h0);
        still_works(&h1);
    }
    // A new pair asks again, and is connected.
    let (h0, h1) = (CudaHal::new(0).unwrap(), CudaHal::new(1).unwrap());
    let src = h1.copy_from("on-1", &data).unwrap();
    let dst = h0.alloc::<u32>("on-0", data.len()).unwrap();
    let before0 = h0.ledger();
    dst.copy_from_device(&src).unwrap();
    let d0 = h0.ledger().since(&before0);
    assert_eq!(
        (d0.d2d.bytes, d0.h2d.bytes),
        (bytes, 0),
        "a new pair: peer to peer"
    );
    assert_eq!(dst.to_vec().unwrap(), data);
}

/// A HAL that loads every kernel as it starts (`HalConfig::preload_kernels`), each of its
/// calls failing in turn: where loading a kernel fails, the kernel loads at its first use.
/// It shares the module of the HAL beside it, so the module's load is not among its calls
/// ([`a_hals_start_alone`] has it). One configuration: the block cache plays no part.
#[test]
fn kernels_loaded_up_front() {
    let Some(_one) = one_at_a_time() else { return };
    let ctx = cuda_hal::driver::PrimaryContext::retain(0).unwrap();
    let check = Checks { free_memory: true };
    let name = "kernels loaded up front";
    every_call_of(&ctx, check, &lazy(), name, &|hal| {
        let preloading = HalConfig {
            preload_kernels: true,
            ..hal.config().clone()
        };
        let other = CudaHal::with_config(0, preloading)?;
        let b = other.alloc::<u64>("b", 4096)?;
        b.fill(u64::MAX - 1)?;
        assert_eq!(b.get_at(4095)?, u64::MAX - 1);
        Ok(())
    });
}

/// A HAL's start with no other HAL of the device alive, each of its driver calls failing in
/// turn (as [`injected_code`] says), with its kernels loaded up front and at first use. The
/// scenarios' HALs start outside the injection and hold the crate's module, which the HALs
/// they start share; this start loads the module itself. Each start returns the error or a
/// HAL that works (where the module's load failed, its first kernel lookup loads the module
/// again), and once it is gone nothing holds the device's primary context (a module, stream,
/// event, pool or pinned block left behind would): checked after every run.
#[test]
fn a_hals_start_alone() {
    let Some(_one) = one_at_a_time() else { return };
    let up_front = HalConfig::default();
    assert!(up_front.preload_kernels);
    for (config, which) in [
        (up_front, "kernels up front"),
        (lazy(), "kernels at first use"),
    ] {
        let name = format!("a HAL's start alone, {which}");
        context_released(&format!("{name}, before it"));
        fault::arm(0, injected_code);
        let started = CudaHal::with_config(0, config.clone());
        fault::disarm();
        let all = picks(&fault::called());
        drop(started.unwrap_or_else(|e| panic!("{name} without a failure: {e}")));
        context_released(&format!("{name} without a failure"));
        let (mut failed, mut errors, mut reloaded) = (0, 0, 0);
        for &pick in &all {
            fault::arm_nth(pick.symbol, pick.nth, injected_code);
            let started =
                catch_unwind(AssertUnwindSafe(|| CudaHal::with_config(0, config.clone())));
            let injected = fault::disarm();
            let what = format!("{name}, call {pick} ({:?})", injected.failed);
            let started = started.unwrap_or_else(|_| panic!("{what}: panicked"));
            failed += usize::from(injected.failed.is_some());
            match started {
                Ok(hal) => {
                    assert!(hal.poisoned().is_none(), "{what}: poisoned");
                    // Where the module's load failed (any of its calls: seen on the GPU at
                    // 17:37, a failed cuCtxGetCurrent as the module retains its context),
                    // the HAL started without its kernels, its memory working; the failure
                    // may pass, so the first kernel lookup loads the module again.
                    fault::arm(0, injected_code);
                    let kernel = hal.kernel("fill_u32");
                    fault::disarm();
                    let loads = fault::called();
                    if loads.contains(&"cuModuleLoadData") {
                        assert!(injected.failed.is_some(), "{what}: loaded twice");
                        reloaded += 1;
                    }
                    if let Err(e) = kernel {
                        panic!("{what}: no kernels once the failure passed: {e} ({loads:?})");
                    }
                    still_works(&hal);
                }
                Err(e) => {
                    errors += 1;
                    assert!(!matches!(e, Error::ContextPoisoned { .. }), "{what}: {e}");
                }
            }
            context_released(&what);
        }
        println!(
            "{name}: {} driver calls, {failed} made to fail in turn: {errors} returned the \
             error, {} recovered ({reloaded} of them without kernels, loaded at the first \
             lookup)",
            all.len(),
            failed - errors
        );
        assert!(failed > 0, "{name}: no call failed");
        assert!(
            reloaded > 0,
            "{name}: no failed module load recovered at a lookup"
        );
        still_works(&CudaHal::with_config(0, config).unwrap());
    }
}

/// Panics unless the device's primary context is released (within 2 s: a copy thread's last
/// hold goes on its own thread), saying after `what`.
fn context_released(what: &str) {
    let active = || cuda_hal::driver::PrimaryContext::is_active(0).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while active() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        !active(),
        "{what}: something still holds the device's primary context"
    );
}

/// A read, an arena batch and an upload batch past what a 1 MiB pinned pool keeps: each goes
/// through the staging slots.
#[test]
fn reads_and_batches_past_the_pinned_pool() {
    let Some(_one) = one_at_a_time() else { return };
    let ctx = cuda_hal::driver::PrimaryContext::retain(0).unwrap();
    let config = HalConfig {
        pinned_pool_bytes: MIB,
        staging: small_staging(),
        ..lazy()
    };
    let check = Checks { free_memory: true };
    let copied = HalConfig {
        mapped_batches: false,
        ..config.clone()
    };
    let runs = [
        (config, "reads and batches past the pinned pool"),
        (
            copied,
            "reads and batches past the pinned pool, batches copied",
        ),
    ];
    for (config, name) in &runs {
        every_call_of(&ctx, check, config, name, &reads_and_batches);
    }
}

/// Staging of 1 MiB chunks, two workers and at most four slots: a few tens of MiB go through
/// many chunks, and every slot is taken in turn.
fn small_staging() -> StagingConfig {
    StagingConfig {
        chunk_bytes: MIB,
        workers: 2,
        max_slots: 4,
        ..StagingConfig::default()
    }
}

/// The scenario of [`reads_and_batches_past_the_pinned_pool`].
fn reads_and_batches(hal: &CudaHal) -> Result<()> {
    let data = Rng::new(4).u32s(2 * MIB + 3);
    let b = hal.copy_from("b", &data)?;
    assert_eq!(b.read_async()?.wait()?, data);
    drop(b.read_async()?);
    let mut arena = hal.batch_arena("arena", 16 * MIB, ArenaLayout::Bump)?;
    let batch = arena.begin_batch();
    let v = batch.upload(&[("p", &data[..]), ("q", &data[..5])])?;
    assert_eq!(v[0].get_at(2 * MIB + 2)?, data[2 * MIB + 2]);
    assert_eq!(v[1].get_at(4)?, data[4]);
    let (x, y) = (
        hal.alloc::<u32>("x", data.len())?,
        hal.alloc::<u32>("y", 7)?,
    );
    hal.upload_batch(&[(&x, &data[..]), (&y, &data[..7])])?;
    assert_eq!((x.get_at(2 * MIB)?, y.get_at(6)?), (data[2 * MIB], data[6]));
    let (mut xs, mut ys) = (vec![0u32; data.len()], vec![0u32; 7]);
    hal.download_batch(&mut [(&y, &mut ys[..]), (&x, &mut xs[..])])?;
    assert!(xs == data && ys == data[..7]);
    Ok(())
}

/// A download into a new allocation's host copy that fails part way leaves device bytes in
/// it: a mutable view of the allocation, which starts from zeros (the README's promise),
/// must zero them. Before, the host copy still counted as never written, and the view got
/// the chunks that had arrived: the bytes of the block's last owner.
#[test]
fn a_new_allocations_view_starts_from_zeros_after_a_failed_download() {
    let Some(_one) = one_at_a_time() else { return };
    let config = HalConfig {
        staging: small_staging(),
        ..lazy()
    };
    const N: usize = 16 * MIB;
    // A block the cache keeps, holding 0xab: the next allocation of its size gets it back.
    let fresh_over_stale = |hal: &CudaHal| {
        drop(hal.copy_from("stale", &vec![0xabu8; N]).unwrap());
        hal.synchronize().unwrap();
        hal.alloc::<u8>("fresh", N).unwrap()
    };
    // The download's calls, counted in a run that fails none (in a HAL of its own: the
    // next one's host copy must be new, not one this HAL keeps for reuse).
    let counting = CudaHal::with_config(0, config.clone()).unwrap();
    let b = fresh_over_stale(&counting);
    fault::arm(0, injected_code);
    b.view(|v| assert_eq!(v[N - 1], 0xab, "the block's last owner's bytes"))
        .unwrap();
    fault::disarm();
    let called = fault::called();
    let dtoh = *called
        .iter()
        .find(|s| s.contains("DtoH"))
        .expect("a download");
    let chunks = called.iter().filter(|s| **s == dtoh).count() as u64;
    assert!(chunks >= 4, "{chunks} chunks: {called:?}");
    drop((b, counting));
    // The same with the last chunk's copy refused: the others have arrived.
    let hal = CudaHal::with_config(0, config).unwrap();
    let b = fresh_over_stale(&hal);
    fault::arm_nth(dtoh, chunks, injected_code);
    let read = b.view(|_| ());
    let injected = fault::disarm();
    assert_eq!(injected.failed, Some(dtoh));
    assert!(read.is_err(), "the refused copy is the view's error");
    let zeros = b.view_mut(|v| v.iter().all(|&x| x == 0)).unwrap();
    assert!(zeros, "a new allocation's mutable view starts from zeros");
    assert!(hal.poisoned().is_none());
    drop(b);
    still_works(&hal);
}

/// A pinned block whose wait failed without breaking the context may still be in use by
/// the device: it goes back neither to the pool nor to the driver (it is leaked, as device
/// memory is in that case). The wait is made to fail after it ran (the work is over, but
/// the HAL cannot know it). Before, the block went back to the pool, and the next batch
/// reused it.
#[test]
fn a_pinned_block_a_failed_wait_leaves_in_doubt_is_never_reused() {
    let Some(_one) = one_at_a_time() else { return };
    let hal = CudaHal::with_config(0, lazy()).unwrap();
    let b = hal.alloc::<u32>("b", MIB).unwrap();
    // Device-written: no host copy serves the gathers.
    b.fill(7).unwrap();
    let picks: Vec<(&cuda_hal::Buffer<u32>, usize)> = (0..1000).map(|i| (&b, 997 * i)).collect();
    // The gather's calls, counted in a run that fails none; its block is then in the pool.
    fault::arm(0, injected_code);
    assert_eq!(hal.gather(&picks).unwrap(), vec![7; 1000]);
    fault::disarm();
    let called = fault::called();
    let sync = "cuStreamSynchronize";
    let waits = called.iter().filter(|s| **s == sync).count() as u64;
    assert!(waits >= 1, "{called:?}");
    let before = hal.stats().unwrap().pinned;
    assert!(before.cached_bytes > 0, "{before:?}");
    // The gather's last wait, made to fail after it ran.
    fault::arm_nth(sync, waits, |_| {
        FailOnce::RunsThenFails(CUresult::CUDA_ERROR_INVALID_VALUE)
    });
    let failed = hal.gather(&picks);
    let injected = fault::disarm();
    assert_eq!(injected.failed, Some(sync));
    assert!(failed.is_err(), "the failed wait is the gather's error");
    let after = hal.stats().unwrap().pinned;
    assert_eq!(
        after.hits,
        before.hits + 1,
        "the gather took the pool's block"
    );
    assert!(
        after.cached_bytes < before.cached_bytes,
        "the block did not come back: {before:?} then {after:?}"
    );
    // The next gather pins a new block, and the HAL works on.
    assert_eq!(hal.gather(&picks).unwrap(), vec![7; 1000]);
    let next = hal.stats().unwrap().pinned;
    assert_eq!(next.misses, after.misses + 1, "{after:?} then {next:?}");
    assert!(hal.poisoned().is_none());
    still_works(&hal);
}

/// A managed request the driver refuses for memory is asked once more after room is made,
/// as a device allocation is; refused again, it is `OutOfMemory` carrying the driver's
/// error, and nothing of it stays tracked. (Before, the refusal came back as `Error::Cuda`
/// at once.)
#[test]
fn a_managed_request_the_driver_refuses_for_memory_is_retried_after_making_room() {
    let Some(_one) = one_at_a_time() else { return };
    let hal = CudaHal::with_config(0, lazy()).unwrap();
    let managed = "cuMemAllocManaged";
    // A block freed into the cache (phase 3): making room gives it back.
    drop(hal.alloc::<u8>("freed", MIB).unwrap());
    let before = hal.ledger();
    fault::arm_nth(managed, 1, |_| {
        FailOnce::Refused(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    });
    let served = hal.alloc_managed::<u32>("served", 1024);
    let injected = fault::disarm();
    assert_eq!(injected.failed, Some(managed));
    let mut served = served.expect("served on the retry");
    served.host_mut().unwrap().fill(3);
    assert_eq!(served.host().unwrap()[1023], 3);
    let d = hal.ledger().since(&before);
    assert_eq!((d.oom_retries, d.out_of_memory), (1, 0));
    assert_eq!(hal.stats().unwrap().cached_bytes, 0, "room was made");
    // Every managed request refused: the retry too.
    let before = hal.ledger();
    fault::arm_sticky(1, CUresult::CUDA_ERROR_OUT_OF_MEMORY, |s| {
        match s == "cuMemAllocManaged" {
            true => OnceStuck::Fails,
            false => OnceStuck::Unaffected,
        }
    });
    let refused = hal.alloc_managed::<u32>("refused", 1024);
    fault::disarm();
    match refused {
        Err(Error::OutOfMemory {
            requested, driver, ..
        }) => {
            assert_eq!(requested, 4096);
            let driver = driver.expect("the driver's refusal");
            assert!(driver.is_out_of_memory(), "{driver}");
        }
        other => panic!("expected OutOfMemory, got {:?}", other.map(|m| m.len())),
    }
    let d = hal.ledger().since(&before);
    assert_eq!((d.oom_retries, d.out_of_memory), (1, 1));
    assert!(hal.live_allocations().iter().all(|a| a.name != "refused"));
    assert!(hal.poisoned().is_none());
    drop(served);
    still_works(&hal);
}
