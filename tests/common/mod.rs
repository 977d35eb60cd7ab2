//! Shared helpers for the integration tests.
#![allow(dead_code)]

use cuda_hal::CudaHal;

/// Environment variable that turns a missing GPU into a test failure (set on the GPU machine).
pub const REQUIRE_GPU: &str = "CUDA_HAL_REQUIRE_GPU";

/// Tests that fill the device take this exclusively; every other GPU test holds it shared,
/// so no test runs under memory pressure another one created.
static DEVICE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A GPU test's HAL with its share of the device lock. Dereferences to [`CudaHal`].
pub struct GpuTest {
    hal: CudaHal,
    _shared: Option<std::sync::RwLockReadGuard<'static, ()>>,
    _exclusive: Option<std::sync::RwLockWriteGuard<'static, ()>>,
}

impl std::ops::Deref for GpuTest {
    type Target = CudaHal;
    fn deref(&self) -> &CudaHal {
        &self.hal
    }
}

/// The HAL of device 0, or `None` (with the reason printed) where there is no GPU.
/// Panics when `CUDA_HAL_REQUIRE_GPU=1`, so a skipped GPU test never passes there.
pub fn gpu() -> Option<GpuTest> {
    let shared = DEVICE.read().unwrap_or_else(|e| e.into_inner());
    hal0().map(|hal| GpuTest {
        hal,
        _shared: Some(shared),
        _exclusive: None,
    })
}

/// As [`gpu`], with the device to itself (for tests that fill device memory).
pub fn gpu_exclusive() -> Option<GpuTest> {
    let excl = DEVICE.write().unwrap_or_else(|e| e.into_inner());
    hal0().map(|hal| GpuTest {
        hal,
        _shared: None,
        _exclusive: Some(excl),
    })
}

/// The device to itself with no HAL open on it: for tests of what a HAL's start does, which
/// a HAL beside it would change (the HALs of one device share the crate's kernels).
pub fn gpu_alone() -> Option<std::sync::RwLockWriteGuard<'static, ()>> {
    let excl = DEVICE.write().unwrap_or_else(|e| e.into_inner());
    hal0().map(|_| excl)
}

/// Whether the machine has two devices. With fewer, prints why the test skips and returns
/// false; fails instead when `CUDA_HAL_REQUIRE_GPUS` asks for two or more.
pub fn two_devices() -> bool {
    let n = cuda_hal::driver::device_count().unwrap_or(0);
    let required: usize = std::env::var("CUDA_HAL_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if n < 2 {
        assert!(
            required < 2,
            "CUDA_HAL_REQUIRE_GPUS={required} but {n} device(s)"
        );
        eprintln!("SKIPPED: {n} device(s); this test needs two");
    }
    n >= 2
}

fn hal0() -> Option<CudaHal> {
    match CudaHal::new(0) {
        Ok(h) => Some(h),
        Err(e) => {
            if std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE_GPU}=1 but no GPU HAL could be created: {e}");
            }
            eprintln!("SKIPPED (no GPU): {e}");
            None
        }
    }
}

/// A small deterministic generator (xorshift64*), seeded per test, for random inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u64() as u32).collect()
    }

    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next_u64() % 1_000_000) as f32 / 1000.0 - 500.0)
            .collect()
    }

    /// `n` BabyBear elements, uniform over the field.
    pub fn elems(&mut self, n: usize) -> Vec<cuda_hal::field::Elem> {
        (0..n)
            .map(|_| cuda_hal::field::Elem::from_u64(self.next_u64()))
            .collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub const MIB: usize = 1 << 20;

/// Runs test `child` of this test binary in a process of its own, with `env` set, and
/// checks that it passed and printed `CHILD-OK`. For what must not share a process with
/// the other tests: a poisoned context, a driver initialised with every device hidden, a
/// context that must really go. The child returns at once unless [`is_child`] says it
/// is the one asked for.
pub fn run_child(child: &str, env: &[(&str, &str)]) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CUDA_HAL_CHILD", child)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "child `{child}` failed");
    assert!(text.contains("CHILD-OK"), "child `{child}` did not finish");
}

/// Faults `hal`'s context on purpose (a kernel writes to address 0x10) and returns the
/// error its stream's synchronisation met, checked to be `ContextPoisoned`. For a child
/// process of its own ([`run_child`]): the fault ends CUDA for the whole process.
pub fn fault_context(hal: &CudaHal) -> cuda_hal::Error {
    // SAFETY: deliberately not: poke_address writes to address 0x10 to fault the context,
    // in a child process of its own that checks what the HALs report.
    unsafe {
        hal.launch("poke_address", cuda_hal::LaunchDims::for_elements(1, 1))
            .scalar(0x10u64)
            .scalar(1u32)
            .run()
    }
    .unwrap();
    let fault = hal.synchronize().unwrap_err();
    assert!(
        matches!(fault, cuda_hal::Error::ContextPoisoned { .. }),
        "{fault}"
    );
    fault
}

/// Whether this process is the child `child` that [`run_child`] started.
pub fn is_child(child: &str) -> bool {
    std::env::var("CUDA_HAL_CHILD").is_ok_and(|v| v == child)
}

/// Aborts the process (a hang fails loudly, rather than holding the run until its time
/// limit) unless dropped within `seconds`.
pub struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    pub fn start(what: String, seconds: u64) -> Self {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(std::time::Duration::from_secs(seconds))
            {
                eprintln!("{what}: no answer after {seconds} s (a hang)");
                std::process::abort();
            }
        });
        Watchdog(Some(done))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}
