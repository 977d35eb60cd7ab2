//! Compiles `kernels/*.cu` with nvcc into one fatbin embedded in the crate.
//!
//! The fatbin carries SASS for sm_90, sm_100, sm_120 and sm_121 and compute_90 PTX as a
//! fallback for newer GPUs. nvcc is found through `NVCC`, `CUDA_PATH`, `CUDA_HOME`, the
//! project's `.toolchain/` (see `scripts/install-cuda-toolchain.sh`) or `PATH`. Without
//! nvcc the build warns and embeds an empty image: kernel calls then return
//! `Error::KernelsUnavailable` while memory operations keep working.

use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)]
#[path = "src/ntt_plan.rs"]
mod ntt_plan;

/// SASS targets, plus the PTX fallback below.
const SASS_ARCHS: [&str; 4] = ["90", "100", "120", "121"];
const PTX_ARCH: &str = "90";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let fatbin = out.join("kernels.fatbin");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=src/ntt_plan.rs");
    for var in [
        "NVCC",
        "CUDA_PATH",
        "CUDA_HOME",
        "PATH",
        "CUDA_HAL_NVCC_FLAGS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let mut sources: Vec<PathBuf> = fs::read_dir(manifest.join("kernels"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    sources.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    sources.sort();

    let Some(nvcc) = find_nvcc(&manifest) else {
        println!("cargo:warning=nvcc not found (set NVCC or CUDA_PATH, or run scripts/install-cuda-toolchain.sh): building without kernels");
        fs::write(&fatbin, []).expect("write empty fatbin");
        return;
    };
    // A reinstalled or upgraded nvcc rebuilds the kernels.
    println!("cargo:rerun-if-changed={}", nvcc.display());

    // One translation unit that includes every kernel source, compiled into one fatbin,
    // then the NTT passes compiled for their sizes (`NTT_FIXED_PASS` in babybear.cu).
    let unit = out.join("all_kernels.cu");
    let mut body: String = sources
        .iter()
        .map(|p| format!("#include \"{}\"\n", p.display()))
        .collect();
    // Each first pass also reading a coset LDE's coefficients (`NTT_FIXED_LDE_PASS`).
    let fixed_passes: String = ntt_plan::fixed_passes()
        .map(|(log_n, i, p)| {
            let shape = p.shape().map(|v| v.to_string()).join(", ");
            let lde = if i == 0 {
                format!("NTT_FIXED_LDE_PASS({log_n}, {shape})\n")
            } else {
                String::new()
            };
            format!("NTT_FIXED_PASS({log_n}, {i}, {shape})\n{lde}")
        })
        .collect();
    body.push_str(&fixed_passes);
    fs::write(&unit, body).expect("write kernel unit");

    // The fatbin depends only on the sources, nvcc and the flags, not on cargo features:
    // reuse it across feature sets and profiles (CI builds 16 feature subsets).
    let extra = env::var("CUDA_HAL_NVCC_FLAGS").unwrap_or_default();
    let mut hasher = std::hash::DefaultHasher::new();
    for src in &sources {
        src.hash(&mut hasher);
        fs::read(src).unwrap_or_default().hash(&mut hasher);
    }
    let mut headers: Vec<PathBuf> = fs::read_dir(manifest.join("kernels"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    headers.retain(|p| p.extension().is_some_and(|e| e == "cuh"));
    headers.sort();
    for h in &headers {
        fs::read(h).unwrap_or_default().hash(&mut hasher);
    }
    fixed_passes.hash(&mut hasher);
    // The compiler's own version, not only its path: an nvcc upgraded in place must not
    // reuse the kernels the old one built.
    let nvcc_version = Command::new(&nvcc)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    (
        nvcc.display().to_string(),
        nvcc_version,
        &extra,
        SASS_ARCHS,
        PTX_ARCH,
        2u32,
    )
        .hash(&mut hasher);
    let cache_dir = out
        .ancestors()
        .nth(4)
        .map(|t| t.join("cuda-hal-fatbin-cache"));
    let cached = cache_dir
        .as_ref()
        .map(|d| d.join(format!("{:016x}.fatbin", hasher.finish())));
    if let Some(c) = cached.as_ref().filter(|c| c.is_file()) {
        fs::copy(c, &fatbin).expect("copy cached fatbin");
        return;
    }

    let mut cmd = Command::new(&nvcc);
    // Compressed images (the driver inflates them at load). -lineinfo is left to
    // CUDA_HAL_NVCC_FLAGS: it makes the image five times larger.
    cmd.arg("--fatbin")
        .arg("-O3")
        .arg("-std=c++17")
        .arg("-Xfatbin")
        .arg("-compress-all");
    for arch in SASS_ARCHS {
        cmd.arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    cmd.arg(format!(
        "-gencode=arch=compute_{PTX_ARCH},code=compute_{PTX_ARCH}"
    ));
    cmd.args(extra.split_whitespace());
    cmd.arg("-I").arg(manifest.join("kernels"));
    cmd.arg("-o").arg(&fatbin).arg(&unit);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed to compile kernels/:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    if let (Some(dir), Some(c)) = (cache_dir, cached) {
        if fs::create_dir_all(&dir).is_ok() {
            let tmp = dir.join(format!("{}.tmp", std::process::id()));
            if fs::copy(&fatbin, &tmp).is_ok() {
                let _ = fs::rename(&tmp, &c);
            }
        }
    }
}

fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    let exe = |p: PathBuf| p.is_file().then_some(p);
    if let Some(p) = env::var_os("NVCC") {
        return exe(PathBuf::from(p));
    }
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = env::var_os(var) {
            if let Some(p) = exe(PathBuf::from(root).join("bin/nvcc")) {
                return Some(p);
            }
        }
    }
    if let Some(p) = exe(manifest.join(".toolchain/site/nvidia/cu13/bin/nvcc")) {
        return Some(p);
    }
    env::var_os("PATH")
        .and_then(|paths| env::split_paths(&paths).find_map(|dir| exe(dir.join("nvcc"))))
}
