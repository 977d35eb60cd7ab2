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
        "NVCC_PREPEND_FLAGS",
        "NVCC_APPEND_FLAGS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let mut sources: Vec<PathBuf> = fs::read_dir(manifest.join("kernels"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    sources.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    sources.sort();

    let Some(nvcc) = find_nvcc(&manifest) else {
        match env::var("NVCC") {
            Ok(set) => println!("cargo:warning=NVCC={set} is no executable file (nor a name on PATH): building without kernels"),
            Err(_) => println!("cargo:warning=nvcc not found (set NVCC or CUDA_PATH, or run scripts/install-cuda-toolchain.sh): building without kernels"),
        }
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

    // Compressed images (the driver inflates them at load). -lineinfo is left to
    // CUDA_HAL_NVCC_FLAGS: it makes the image five times larger.
    let mut flags: Vec<String> = ["--fatbin", "-O3", "-std=c++17", "-Xfatbin", "-compress-all"]
        .map(String::from)
        .to_vec();
    for arch in SASS_ARCHS {
        flags.push(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    flags.push(format!(
        "-gencode=arch=compute_{PTX_ARCH},code=compute_{PTX_ARCH}"
    ));
    let extra = env::var("CUDA_HAL_NVCC_FLAGS").unwrap_or_default();
    flags.extend(extra.split_whitespace().map(String::from));

    // The fatbin depends only on the kernels' files, nvcc and its flags, not on cargo
    // features: reuse it across feature sets and profiles (CI builds 16 feature subsets).
    // Every file under kernels/ counts, whatever its name: any may be included.
    let mut hasher = std::hash::DefaultHasher::new();
    let mut files = Vec::new();
    files_under(&manifest.join("kernels"), &mut files);
    files.sort();
    for f in &files {
        f.strip_prefix(&manifest).unwrap_or(f).hash(&mut hasher);
        fs::read(f).unwrap_or_default().hash(&mut hasher);
    }
    fixed_passes.hash(&mut hasher);
    // The compiler's own version, not only its path: an nvcc upgraded in place must not
    // reuse the kernels the old one built.
    let nvcc_version = Command::new(&nvcc)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    // (nvcc adds these to every command line it is given.)
    let env_flags = ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"].map(|v| env::var(v).ok());
    (nvcc.display().to_string(), nvcc_version, &flags, env_flags).hash(&mut hasher);
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
    cmd.args(&flags);
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

/// Every file under `dir`, its subfolders' included.
fn files_under(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.is_dir() {
            files_under(&path, into);
        } else {
            into.push(path);
        }
    }
}

fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    let exe = |p: PathBuf| p.is_file().then_some(p);
    let on_path = |name: &std::ffi::OsStr| {
        env::var_os("PATH")
            .and_then(|paths| env::split_paths(&paths).find_map(|dir| exe(dir.join(name))))
    };
    if let Some(p) = env::var_os("NVCC") {
        // A bare name (`NVCC=nvcc`) is looked up on PATH, as a shell would.
        let p = PathBuf::from(p);
        if p.components().count() == 1 && !p.is_file() {
            return on_path(p.as_os_str());
        }
        return exe(p);
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
    on_path("nvcc".as_ref())
}
