//! Loader behaviour without a GPU: a missing library, a driver that lacks symbols, and the
//! error table. A stand-in `libcuda` is compiled from C at test time with the system `cc`.

use std::path::PathBuf;
use std::process::Command;

use cuda_sys::{check, CUresult, Driver, Error, SYMBOLS};

/// Exports four entry points only: `cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount`,
/// and `cuEventElapsedTime` under its name from before 12.8 (no `_v2`).
const FAKE_DRIVER: &str = r#"
int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 0; return 100; /* CUDA_ERROR_NO_DEVICE */ }
int cuEventElapsedTime(float *ms, void *start, void *end) { *ms = 2.5f; return 0; }
"#;

/// The stand-in, built once per test process: tests run on threads of one process, and two
/// building the same file at once let one `dlopen` it half written ("file too short", seen
/// in CI).
fn build_fake_driver() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(compile_fake_driver).clone()
}

fn compile_fake_driver() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuda-sys-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake.c");
    let lib = dir.join("libcuda-fake.so");
    std::fs::write(&src, FAKE_DRIVER).unwrap();
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) is needed to build the stand-in driver");
    assert!(status.success(), "cc failed to build the stand-in driver");
    lib
}

#[test]
fn missing_library_is_driver_not_found_with_names_and_reason() {
    let err = Driver::load_from(&["libcuda-definitely-missing.so.9", "/nonexistent/libcuda.so"])
        .err()
        .expect("loading a missing library must fail");
    match &err {
        Error::DriverNotFound { tried, reason } => {
            assert_eq!(
                tried,
                &["libcuda-definitely-missing.so.9", "/nonexistent/libcuda.so"]
            );
            assert!(
                reason.contains("/nonexistent/libcuda.so"),
                "dlerror text: {reason}"
            );
        }
        other => panic!("expected DriverNotFound, got {other:?}"),
    }
    assert!(err.to_string().contains("libcuda-definitely-missing.so.9"));
}

#[test]
fn missing_symbol_is_an_error_and_other_calls_keep_working() {
    let lib = build_fake_driver();
    let driver = Driver::load_from(&[lib.to_str().unwrap()]).expect("the stand-in loads");

    // Present symbols work, before and after a missing one is called.
    // SAFETY: the stand-in's cuInit reads only its argument.
    unsafe { driver.cuInit(0) }.expect("cuInit is exported");
    let mut dptr = 0u64;
    // SAFETY: the call never reaches C: the symbol is absent.
    let err = unsafe { driver.cuMemAlloc(&mut dptr, 16) }.unwrap_err();
    assert_eq!(
        err,
        Error::MissingSymbol {
            symbol: "cuMemAlloc_v2"
        }
    );
    assert!(err.to_string().contains("cuMemAlloc_v2"));
    let mut version = 0;
    // SAFETY: `version` is a valid int for the stand-in to write.
    unsafe { driver.cuDriverGetVersion(&mut version) }.unwrap();
    assert_eq!(version, 13000);

    // A failing code from a present symbol is a typed driver error.
    let mut count = -1;
    // SAFETY: `count` is a valid int for the stand-in to write.
    let err = unsafe { driver.cuDeviceGetCount(&mut count) }.unwrap_err();
    assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_NO_DEVICE));
    match err {
        Error::Driver { call, name, .. } => {
            assert_eq!(call, "cuDeviceGetCount");
            assert_eq!(name, "CUDA_ERROR_NO_DEVICE");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    // SAFETY: as above; flags != 0 makes the stand-in return CUDA_ERROR_INVALID_VALUE.
    let err = unsafe { driver.cuInit(7) }.unwrap_err();
    assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));

    let missing = driver.missing_symbols();
    assert_eq!(missing.len(), SYMBOLS.len() - 4);
    assert!(missing.contains(&"cuMemAllocFromPoolAsync"));
    assert!(!missing.contains(&"cuInit"));
}

/// A driver from before 12.8 exports `cuEventElapsedTime` only: the table's
/// `cuEventElapsedTime_v2` (same arguments, same meaning) calls it.
#[test]
fn an_older_driver_gives_the_older_name_of_a_same_signature_entry_point() {
    let lib = build_fake_driver();
    let driver = Driver::load_from(&[lib.to_str().unwrap()]).expect("the stand-in loads");
    let mut ms = 0f32;
    // SAFETY: the stand-in writes `ms` and reads neither event.
    unsafe { driver.cuEventElapsedTime(&mut ms, std::ptr::null_mut(), std::ptr::null_mut()) }
        .expect("resolved under the older name");
    assert_eq!(ms, 2.5);
    assert!(!driver.missing_symbols().contains(&"cuEventElapsedTime_v2"));
    // An entry point whose arguments changed is not mapped to its older name.
    assert!(driver.missing_symbols().contains(&"cuMemAdvise_v2"));
}

#[test]
fn versioned_symbols_come_from_the_header() {
    for versioned in [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemcpyHtoD_v2",
        "cuCtxCreate_v4",
        "cuGetProcAddress_v2",
    ] {
        assert!(
            SYMBOLS.contains(&versioned),
            "{versioned} missing from the table"
        );
    }
    assert!(
        !SYMBOLS.contains(&"cuMemAlloc"),
        "unversioned cuMemAlloc must not be resolved"
    );
}

#[test]
fn error_codes_map_to_header_names_and_descriptions() {
    let cases = [
        (0, "CUDA_SUCCESS"),
        (1, "CUDA_ERROR_INVALID_VALUE"),
        (2, "CUDA_ERROR_OUT_OF_MEMORY"),
        (100, "CUDA_ERROR_NO_DEVICE"),
        (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        (999, "CUDA_ERROR_UNKNOWN"),
    ];
    for (code, name) in cases {
        let (got, description) = Error::describe(code).unwrap();
        assert_eq!(got, name);
        assert!(description.len() > 10, "{name} has no description");
    }
    assert!(Error::describe(123_456).is_none());
    let e = Error::from_code(CUresult(123_456), "cuFoo");
    assert!(e.to_string().contains("123456"));
    assert!(
        check(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize")
            .unwrap_err()
            .is_sticky()
    );
    assert!(!check(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2")
        .unwrap_err()
        .is_sticky());
}

#[test]
fn every_code_the_header_calls_fatal_is_sticky() {
    // The header's own words for "the context or process cannot go on".
    let fatal = [
        "must be terminated",
        "cannot be used anymore",
        "inconsistent state",
        // Data a kernel read or wrote is wrong: ECC, and NVLink between devices.
        "uncorrectable",
    ];
    let mut sticky = Vec::new();
    for code in 0..1000u32 {
        let Some((name, description)) = Error::describe(code) else {
            continue;
        };
        let flat = description.split_whitespace().collect::<Vec<_>>().join(" ");
        let says_fatal = fatal.iter().any(|f| flat.contains(f));
        let is = Error::from_code(CUresult(code), "cuFoo").is_sticky();
        assert!(
            !says_fatal || is,
            "{name} ({code}) is fatal by the header: {flat}"
        );
        if is {
            sticky.push(name);
        }
    }
    assert!(sticky.contains(&"CUDA_ERROR_ASSERT"), "{sticky:?}");
    assert!(
        sticky.contains(&"CUDA_ERROR_NVLINK_UNCORRECTABLE"),
        "{sticky:?}"
    );
}

#[test]
fn global_driver_never_panics() {
    // On a machine without a driver this is DriverNotFound; with one, it loads.
    match cuda_sys::driver() {
        Ok(d) => println!("driver loaded from {}", d.library()),
        Err(e) => {
            assert!(matches!(e, Error::DriverNotFound { .. }));
            // A second call returns the same remembered error.
            assert_eq!(cuda_sys::driver().err(), Some(e));
        }
    }
}
