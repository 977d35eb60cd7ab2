#!/usr/bin/env bash
# Builds the GPU test and bench executables for the five feature builds and copies them
# into the git-ignored .gpu-bundle/, which travels to the GPU machine (no Rust there);
# scripts/gpu-run.sh runs them there.
#
#   scripts/gpu-pack.sh                # all five builds
#   scripts/gpu-pack.sh baseline all   # only these builds (the others are left as they are)
#
# Layout: .gpu-bundle/<build>/<test target>, .gpu-bundle/<build>/bench-phases,
#         .gpu-bundle/nokernels/gpu (tests/gpu.rs built without kernels, with the all build),
#         .gpu-faults/faults (tests/faults.rs with fault injection, with the all build; carried
#         on its own, for `scripts/gpu-run.sh faults`),
#         .gpu-bundle/prover_demo, .gpu-bundle/doctests.tar.xz (the doc examples, one
#         executable each), .gpu-bundle/manifest.txt. The executables are xz-compressed
#         (each embeds the kernel fatbin; packed they fit one 64 MiB carry), the doc examples
#         xz-compressed together (they share most of their bytes); scripts/gpu-unpack.sh,
#         which gpu-run.sh calls, unpacks them on the GPU machine.
set -euo pipefail

# Integration-test targets (tests/<name>.rs) that need a GPU; space separated.
GPU_TESTS="gpu transfers memory model"
# Test targets that do not depend on the phase features: packed for the all build only.
GPU_TESTS_ALL_ONLY="multi_gpu prover_ops"
# Benches run in every build, and benches run only in the all-features build.
GPU_BENCHES="phases"
GPU_BENCHES_ALL_ONLY="transfers memory stress prover multi_gpu"
# Fail when the packed bundle is larger than this (the carry limit is 64 MiB in all).
BUNDLE_LIMIT_MIB=61

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bundle="$root/.gpu-bundle"

ALL_BUILDS=(baseline p1 p12 p123 all)
declare -A FEATURE_ARGS=(
  [baseline]="--no-default-features"
  [p1]="--no-default-features --features phase1-offset-get-at"
  [p12]="--no-default-features --features phase1-offset-get-at,phase2-host-cache"
  [p123]="--no-default-features --features phase1-offset-get-at,phase2-host-cache,phase3-pool-alloc"
  [all]=""
)

builds=("$@")
if [ "${#builds[@]}" -eq 0 ]; then builds=("${ALL_BUILDS[@]}"); fi
for b in "${builds[@]}"; do
  if [ -z "${FEATURE_ARGS[$b]+set}" ]; then
    echo "gpu-pack: unknown build '$b' (known: ${ALL_BUILDS[*]})" >&2
    exit 2
  fi
done

# nvcc for the kernels (assign first so that a failure stops the script).
toolchain_env="$(scripts/install-cuda-toolchain.sh)"
eval "$toolchain_env"

# Small, stripped release binaries.
export CARGO_PROFILE_RELEASE_STRIP=true
export CARGO_PROFILE_RELEASE_DEBUG=false

# pick_exe KIND NAME: reads cargo's --message-format=json on stdin and prints the path
# of the executable of the target NAME of kind KIND (test, bench, example).
pick_exe() {
  python3 -c '
import json, sys
kind, name = sys.argv[1], sys.argv[2]
found = []
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    msg = json.loads(line)
    t = msg.get("target", {})
    if (msg.get("reason") == "compiler-artifact" and msg.get("executable")
            and t.get("name") == name and kind in t.get("kind", [])):
        found.append(msg["executable"])
if not found:
    sys.exit("gpu-pack: cargo built no %s executable named %r" % (kind, name))
print(found[-1])
' "$1" "$2"
}

for b in "${builds[@]}"; do
  # Word splitting of the feature arguments is intended.
  read -r -a fargs <<< "${FEATURE_ARGS[$b]}"
  echo "== [$b] cargo features: ${FEATURE_ARGS[$b]:-(default)}" >&2
  rm -rf "${bundle:?}/$b" "$bundle/$b.tar.xz"
  mkdir -p "$bundle/$b"
  tests="$GPU_TESTS"
  if [ "$b" = all ]; then tests="$tests $GPU_TESTS_ALL_ONLY"; fi
  for t in $tests; do
    exe="$(cargo test --release --no-run -p cuda-hal --test "$t" "${fargs[@]}" \
             --message-format=json | pick_exe test "$t")"
    cp "$exe" "$bundle/$b/$t"
    echo "   $b/$t  <- $exe" >&2
  done
  benches="$GPU_BENCHES"
  if [ "$b" = all ]; then benches="$benches $GPU_BENCHES_ALL_ONLY"; fi
  for bn in $benches; do
    exe="$(cargo bench --no-run -p cuda-hal --bench "$bn" "${fargs[@]}" \
             --message-format=json | pick_exe bench "$bn")"
    cp "$exe" "$bundle/$b/bench-$bn"
    echo "   $b/bench-$bn  <- $exe" >&2
  done
done

# The kernel lookup without embedded kernels (nvcc pointed nowhere; its own target folder,
# so that the builds above keep theirs): one test of tests/gpu.rs, run by gpu-run.sh with the
# all build.
if [[ " ${builds[*]} " == *" all "* ]]; then
  echo "== [nokernels] tests/gpu.rs built without kernels" >&2
  rm -rf "${bundle:?}/nokernels" "$bundle/nokernels.tar.xz"
  mkdir -p "$bundle/nokernels"
  exe="$(NVCC=/nonexistent CARGO_TARGET_DIR="$root/target/nokernels" \
           cargo test --release --no-run -p cuda-hal --test gpu --message-format=json \
           | pick_exe test gpu)"
  cp "$exe" "$bundle/nokernels/gpu"
  echo "   nokernels/gpu  <- $exe" >&2
fi

# The fault-injection tests (tests/faults.rs, feature fault-injection) in a folder of their
# own, .gpu-faults/, carried on their own (the bundle leaves no room): scripts/gpu-run.sh
# faults runs them.
if [[ " ${builds[*]} " == *" all "* ]]; then
  echo "== [faults] tests/faults.rs with fault injection" >&2
  rm -rf "$root/.gpu-faults"
  mkdir -p "$root/.gpu-faults"
  exe="$(cargo test --release --no-run -p cuda-hal --test faults --features fault-injection \
           --message-format=json | pick_exe test faults)"
  cp "$exe" "$root/.gpu-faults/faults"
  gzip -9 "$root/.gpu-faults/faults"
  echo "   .gpu-faults/faults  <- $exe" >&2
fi

echo "== prover_demo example (default features)" >&2
# (The examples' compressed copies of an earlier pack go: they are packed anew below.)
rm -f "$bundle"/prover_demo*.gz "$bundle"/prover_demo*.xz "$bundle"/alloc_free_loop* \
  "$bundle/examples.tar.xz"
exe="$(cargo build --release -p cuda-hal --example prover_demo --message-format=json \
         | pick_exe example prover_demo)"
cp "$exe" "$bundle/prover_demo"
# The same example with NVTX ranges, for checking them with `ncu --nvtx`.
exe="$(cargo build --release -p cuda-hal --example prover_demo --features nvtx --message-format=json \
         | pick_exe example prover_demo)"
cp "$exe" "$bundle/prover_demo_nvtx"
if [ -n "${CUDA_HAL_NVTX_LIB:-}" ]; then cp "$CUDA_HAL_NVTX_LIB" "$bundle/libnvtx3interop.so.1"; fi
echo "== alloc_free_loop example (default features)" >&2
exe="$(cargo build --release -p cuda-hal --example alloc_free_loop --message-format=json \
         | pick_exe example alloc_free_loop)"
cp "$exe" "$bundle/alloc_free_loop"

echo "== doc examples (default features), one executable each" >&2
# rustdoc keeps the doctests' executables only with unstable options (RUSTC_BOOTSTRAP lets
# the stable toolchain take them). Its own target folder keeps the flags from
# invalidating the builds above.
doc_target="$root/target/doctest-build"
rm -rf "$doc_target/doctests"
RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$doc_target" \
  RUSTDOCFLAGS="-Z unstable-options --persist-doctests $doc_target/doctests --no-run -C strip=symbols" \
  cargo test --release --doc -p cuda-hal --quiet >&2
n_doc="$(find "$doc_target/doctests" -name rust_out -type f | wc -l)"
if [ "$n_doc" -eq 0 ]; then
  echo "gpu-pack: rustdoc kept no doc example executables" >&2
  exit 1
fi
tar -cf - -C "$doc_target" doctests | xz -9e -T1 > "$bundle/doctests.tar.xz"
echo "   doctests.tar.xz: $n_doc doc examples" >&2

# (The embedded kernel image is not packed on its own: gpu-run.sh cuts it out of a test
# executable to list its SASS and PTX with cuobjdump.)
rm -f "$bundle/kernels.fatbin" "$bundle/kernels.fatbin.gz"

# What was packed, so that a run on the GPU machine can tell a stale bundle.
{
  echo "packed_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git_head: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "git_dirty_files: $(git status --porcelain 2>/dev/null | wc -l)"
  echo "rustc: $(rustc --version)"
  echo "nvcc: $("$NVCC" --version | tail -n 1)"
  echo "gpu_tests: $GPU_TESTS"
  echo "builds_packed_this_time: ${builds[*]}"
  echo "files:"
  (cd "$bundle" && find . -type f ! -name manifest.txt | sort | while read -r f; do
     echo "  $f $(stat -c %s "$f") $(sha256sum "$f" | cut -c1-16)"
   done)
} > "$bundle/manifest.txt"

# Compress the executables with xz, each build's in one archive (<build>.tar.xz, and
# examples.tar.xz for the examples): every executable embeds the same kernel image, which
# nvcc compresses already (2.1 MiB since each NTT pass is compiled per size), so files
# compressed one by one kept a copy each and no longer fit one carry; an archive keeps it
# once. The manifest above lists those built this time unpacked, and those of builds left
# from an earlier pack as they are (compressed).
compress_dir() {  # compress_dir NAME FILE...: FILEs (relative to the bundle) into NAME.tar.xz
  local name="$1"
  shift
  tar -cf - -C "$bundle" "$@" | xz -9 -T1 > "$bundle/$name.tar.xz"
  (cd "$bundle" && rm -rf "$@")
}
for dir in "$bundle"/*/; do
  d="$(basename "$dir")"
  [ "$d" = doctests ] && continue
  if [ -n "$(find "$dir" -type f -perm -u+x ! -name '*.gz' ! -name '*.xz' -print -quit)" ]; then
    compress_dir "$d" "$d"
  fi
done
mapfile -t loose < <(find "$bundle" -maxdepth 1 -type f -perm -u+x ! -name '*.gz' ! -name '*.xz' \
                       -printf '%f\n' | sort)
if [ "${#loose[@]}" -gt 0 ]; then
  compress_dir examples "${loose[@]}"
fi

total_bytes="$(du -sb "$bundle" | cut -f1)"
total_mib="$(awk -v b="$total_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
echo
du -sh "$bundle"/* | sort -k2
echo "gpu-pack: .gpu-bundle is $total_mib MiB packed ($total_bytes bytes); carry it whole"
if [ "$total_bytes" -gt $((BUNDLE_LIMIT_MIB * 1024 * 1024)) ]; then
  echo "gpu-pack: over the ${BUNDLE_LIMIT_MIB} MiB budget: it will not fit one carry" >&2
  exit 1
fi
