#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over the GPU test
# binaries of the all-features build, ON THE GPU MACHINE (after scripts/gpu-pack.sh and with
# .gpu-bundle carried). Writes $OUT/sanitizer.log and prints one summary line per run.
#
#   OUT=$OUT scripts/gpu-sanitize.sh [test binaries...]     (default: gpu transfers memory)
#
# Left out on purpose: the test that faults a kernel on purpose (memcheck would rightly
# report it) and the test that fills the whole device (slow under the tools).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
bundle="${GPU_BUNDLE:-.gpu-bundle}/all"
bins=("$@")
[ "${#bins[@]}" -eq 0 ] && bins=(gpu transfers memory)
skip=(--skip device_fault --skip poison_child --skip filling_the_device)
export CUDA_HAL_REQUIRE_GPU=1
log="$OUT/sanitizer.log"
: > "$log"
status=0
summary=()
for tool in memcheck racecheck synccheck initcheck; do
  for b in "${bins[@]}"; do
    echo "#### $tool $b" >> "$log"
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    timeout 300 compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 20 \
      "$bundle/$b" "${skip[@]}" --test-threads=4 >> "$log" 2>&1
    rc=$?
    errors="$(tac "$log" | grep -m1 -oE 'ERROR SUMMARY: [0-9]+ error' | grep -oE '[0-9]+' || echo '?')"
    tests="$(tac "$log" | grep -m1 -oE 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' || echo 'no test result')"
    line="$tool $b: exit $rc, sanitizer errors $errors, $tests"
    summary+=("$line")
    echo "$line" | tee -a "$log"
    [ "$rc" -ne 0 ] && status=1
  done
done
printf '%s\n' "${summary[@]}" > "$OUT/sanitizer-summary.txt"
exit $status
