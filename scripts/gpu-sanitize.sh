#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over the GPU test
# binaries of the all-features build, ON THE GPU MACHINE (after scripts/gpu-pack.sh and with
# .gpu-bundle carried). Writes $OUT/sanitizer.log and $OUT/sanitizer-summary.txt.
#
#   OUT=$OUT scripts/gpu-sanitize.sh [test binaries...]     (default: gpu transfers memory model prover_ops)
#
# Left out on purpose: the test that faults a kernel on purpose (memcheck would rightly
# report it) and the tests that allocate (nearly) the whole device: the tools keep shadow
# state per allocation, and racecheck stalls on an 80 GB one. memcheck runs
# with --report-api-errors no: the suite makes failing API calls on purpose (a missing
# kernel, out-of-memory requests), which are bad-input tests, not memory errors; a second
# memcheck pass with API-error reporting on lists them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
scripts/gpu-unpack.sh "${GPU_BUNDLE:-.gpu-bundle}" || exit 2
bundle="${GPU_BUNDLE:-.gpu-bundle}/all"
bins=("$@")
[ "${#bins[@]}" -eq 0 ] && bins=(gpu transfers memory model prover_ops)
skip=(--skip device_fault --skip poison_child --skip filling_the_device --skip bad_input)
export CUDA_HAL_REQUIRE_GPU=1
log="$OUT/sanitizer.log"
: > "$log"
run_log="$(mktemp)"
trap 'rm -f "$run_log"' EXIT
status=0
summary=()
run() {  # run LABEL compute-sanitizer-args...
  local label="$1"; shift
  echo "#### $label" >> "$log"
  timeout 300 compute-sanitizer "$@" > "$run_log" 2>&1
  local rc=$?
  cat "$run_log" >> "$log"
  local findings
  findings="$(grep -oE 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard' "$run_log" | grep -oE '[0-9]+' | head -n 1)"
  local tests
  tests="$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$run_log" | tail -n 1)"
  local line="$label: exit $rc, findings ${findings:-?}, ${tests:-no test result}"
  summary+=("$line")
  echo "$line" | tee -a "$log"
  if [ "$rc" -ne 0 ] || [ "${findings:-1}" != 0 ] || [ -z "$tests" ]; then status=1; fi
}
# One test thread under racecheck, for every suite. Over the gpu tests with four threads,
# about one run in four hangs inside the driver: one test thread frees pinned memory
# (cuMemFreeHost, a HAL's staging slots going away) and spins in racecheck's callback while
# it holds a driver lock; the other threads wait on that lock or spin in cuEventSynchronize
# on their copies. The stacks (cuda-gdb, RESULTS.md "The racecheck hang") show no lock of
# this crate held. The transfers tests hang the same way (2 of 9 runs with four threads on
# 2026-11-23 at 026da8e; their stacks show a cuMemFreeHost in racecheck's callback too).
# Racecheck checks shared-memory hazards inside kernels, which one thread covers as well.
# scripts/racecheck-hangs.sh reproduces the hang with four threads and takes the stacks.
racecheck_threads=1
for b in "${bins[@]}"; do
  bin="$bundle/$b"
  run "memcheck $b" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99 "$bin" "${skip[@]}" --test-threads=4
  run "racecheck $b" --tool racecheck --error-exitcode 99 "$bin" "${skip[@]}" --test-threads="$racecheck_threads"
  run "synccheck $b" --tool synccheck --error-exitcode 99 "$bin" "${skip[@]}" --test-threads=4
  run "initcheck $b" --tool initcheck --error-exitcode 99 "$bin" "${skip[@]}" --test-threads=4
done
# The deliberate API errors, for the record (not counted as findings).
echo "#### api-errors gpu (expected: the bad-input tests)" >> "$log"
timeout 300 compute-sanitizer --tool memcheck --report-api-errors explicit "$bundle/gpu" "${skip[@]}" 2>&1 \
  | grep -E "Program hit" | sort | uniq -c | tee -a "$log" > "$OUT/sanitizer-api-errors.txt"
printf '%s\n' "${summary[@]}" > "$OUT/sanitizer-summary.txt"
exit $status
