// Builds kernels/host_check/host_check.cpp with the first C++ compiler found (`CXX`, `c++`,
// `g++`, `clang++`) into `exe`; `None` (after saying why) when there is none. Included with
// `include!` by the tests that run the kernels' code on the host (tests/kernel_host_check.rs,
// the NTT test in src/prover_ops.rs), so both build it the same way.
fn build_host_check(exe: &std::path::Path) -> Option<()> {
    use std::process::Command;
    let cxx = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["c++", "g++", "clang++"].map(String::from))
        .find(|c| Command::new(c).arg("--version").output().is_ok());
    let Some(cxx) = cxx else {
        eprintln!("SKIPPED: no C++ compiler to build kernels/host_check");
        return None;
    };
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels/host_check/host_check.cpp");
    let out = Command::new(&cxx)
        .args(["-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", "-o"])
        .arg(exe)
        .arg(source)
        .output()
        .expect("run the C++ compiler");
    assert!(
        out.status.success(),
        "compiling host_check.cpp failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(())
}
