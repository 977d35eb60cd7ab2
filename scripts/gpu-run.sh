#!/usr/bin/env bash
# Runs the packed GPU tests and benches ON THE GPU MACHINE, from the repo root, using the
# executables in .gpu-bundle/ made by scripts/gpu-pack.sh.
#
#   scripts/gpu-run.sh [tests|bench|all] [build names...]    (default: all, all five builds)
#   scripts/gpu-run.sh faults     the fault-injection tests of .gpu-faults/ (carried instead
#                                 of .gpu-bundle: the two do not fit one carry)
#   scripts/gpu-run.sh faults-memcheck [test names...]
#                                 the same under memcheck's leak check (all, or those named),
#                                 spread over the visible GPUs, a call of its own; logs
#                                 faults-memcheck/<test>.log, verdicts faults-memcheck/gpuN.txt
#
# Environment:
#   OUT             where the results go (default ./gpu-out)
#   GPU_TEST_ARGS   extra arguments for every test binary (e.g. "--test-threads=1 pool")
#   GPU_BIN_TIMEOUT seconds one binary may run before it is killed (default 240)
#   GPU_BUNDLE      the bundle folder (default .gpu-bundle)
#
# Files under $OUT: env.txt, tests.log, doctests.log (the doc examples), demo.log (prover_demo,
# alloc_free_loop), nvtx.log and nvtx-check.txt (scripts/nvtx-check.py), bench.log,
# results.md, summary.txt.
# The summary is the last thing printed; exits non-zero if anything failed.
set -uo pipefail   # no -e: keep going after a failing binary

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

ALL_BUILDS=(baseline p1 p12 p123 all)

mode=all
case "${1:-}" in
  tests|bench|all) mode="$1"; shift ;;
  faults|faults-memcheck)
    # Every driver call of each scenario failing in turn (tests/faults.rs).
    which="$1"; shift
    OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
    [ -f .gpu-faults/faults.gz ] && gzip -d -f .gpu-faults/faults.gz && chmod +x .gpu-faults/faults
    [ -x .gpu-faults/faults ] || { echo "gpu-run: .gpu-faults/faults not found: run scripts/gpu-pack.sh all and carry .gpu-faults" >&2; exit 2; }
    echo "gpu-run: $(date -u '+%F %T UTC') on $(uname -n), fault injection ($which${1:+: $*})"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 4
    # Tests named two_devices_* skip themselves on one device, which would count as
    # passing: with fewer than two devices visible they are left out, and said so.
    fault_gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
      visible="$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)"
      [ "$visible" -lt "${fault_gpus:-0}" ] && fault_gpus="$visible"
    fi
    two_device_tests="$(.gpu-faults/faults --list 2>/dev/null | grep -c '^two_devices_' || true)"
    if [ "$which" = faults ]; then
      skip_two=()
      if [ "${fault_gpus:-0}" -lt 2 ] && [ "${CUDA_HAL_REQUIRE_GPUS:-0}" -lt 2 ] \
         && [ "${two_device_tests:-0}" -gt 0 ]; then
        skip_two=(--skip two_devices_)
      fi
      CUDA_HAL_REQUIRE_GPU=1 RUST_BACKTRACE=1 timeout --kill-after=10 "${GPU_BIN_TIMEOUT:-540}" \
        .gpu-faults/faults --test-threads=1 --nocapture "${skip_two[@]}" "$@" > "$OUT/faults.log" 2>&1
      rc=$?
      grep -aE "driver calls|releases refused|panicked|test result|^test " "$OUT/faults.log"
      not_run=""
      [ "${#skip_two[@]}" -gt 0 ] && not_run="; $two_device_tests two-device tests not run: ${fault_gpus:-0} device(s)"
      if [ "$rc" -eq 0 ] && grep -aq "test result: ok" "$OUT/faults.log"; then
        echo "RESULT: PASS (fault injection$not_run)"
      else
        echo "RESULT: FAIL (fault injection, exit $rc)"
        [ "$rc" -eq 0 ] && rc=1
      fi
      exit "$rc"
    fi
    # Under memcheck with its leak check: device memory (managed memory included, which
    # the free memory the tests compare does not show) and driver errors the tests do not
    # see, such as a registration left behind. Without the runs whose refused releases
    # leave their allocations behind on purpose.
    command -v compute-sanitizer > /dev/null || { echo "RESULT: FAIL (no compute-sanitizer)"; exit 2; }
    # The tests (those named, else all) spread over the visible GPUs: one worker per GPU
    # takes the next test from a shared queue and runs it in a memcheck process of its own,
    # so the GPUs finish close together whatever the tests' lengths (on one H200 the ten
    # scenarios take about 320 s under memcheck; split in turn over two, 89 and 219 s).
    if [ "$#" -gt 0 ]; then tests=("$@"); else
      # Each worker sees one GPU: the two-device tests would only skip. Left out, and said so.
      mapfile -t tests < <(.gpu-faults/faults --list 2>/dev/null | sed -n 's/: test$//p' \
        | grep -v '^two_devices_')
      [ "${two_device_tests:-0}" -gt 0 ] \
        && echo "gpu-run: $two_device_tests two-device tests not run under memcheck (one GPU a worker)"
    fi
    [ "${#tests[@]}" -gt 0 ] || { echo "RESULT: FAIL (no fault tests listed)"; exit 2; }
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    [ "${gpus:-0}" -ge 1 ] || gpus=1
    # GPUs chosen by the caller: all on what they see.
    [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=1
    [ "$gpus" -gt "${#tests[@]}" ] && gpus="${#tests[@]}"
    mc="$OUT/faults-memcheck"; rm -rf "$mc"; mkdir -p "$mc"
    printf '%s\n' "${tests[@]}" > "$mc/queue"
    # Prints the queue's first test and removes it, under a lock; nothing once it is empty.
    # Without flock, one worker: no lock needed.
    command -v flock > /dev/null || gpus=1
    next_test() {
      if [ "$gpus" -gt 1 ]; then
        flock "$mc/queue.lock" sh -c 'head -n 1 "$1"; sed -i 1d "$1"' sh "$mc/queue"
      else
        head -n 1 "$mc/queue"; sed -i 1d "$mc/queue"
      fi
    }
    # One GPU's worker: each test's output in faults-memcheck/<test>.log, and a line per
    # test (its verdict and seconds) in faults-memcheck/gpuN.txt.
    # Tests that leak on purpose, run without the leak check (memory errors still
    # checked): a_pinned_block_a_failed_wait_leaves_in_doubt_is_never_reused leaks the
    # 64 KiB pinned block a failed wait left in doubt, which is what it tests (memcheck's
    # leak check reported exactly that block, 2026-11-28 23:27).
    leaks_on_purpose=" a_pinned_block_a_failed_wait_leaves_in_doubt_is_never_reused "
    memcheck_worker() {
      local g="$1" t log start trc summary leak
      while t="$(next_test)" && [ -n "$t" ]; do
        log="$mc/$t.log"; start=$SECONDS
        leak=full; [[ "$leaks_on_purpose" == *" $t "* ]] && leak=no
        CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-$g}" CUDA_HAL_FAULTS_NO_REFUSED_RELEASES=1 CUDA_HAL_REQUIRE_GPU=1 \
          timeout --kill-after=10 "${GPU_BIN_TIMEOUT:-540}" \
          compute-sanitizer --tool memcheck --leak-check "$leak" --print-limit 50 \
          .gpu-faults/faults --test-threads=1 --nocapture --exact "$t" > "$log" 2>&1
        trc=$?
        summary="$(grep -aE "ERROR SUMMARY" "$log" | tail -n 1)"
        if [ "$trc" -eq 0 ] && grep -aq "test result: ok\. 1 passed" "$log" \
           && [[ "$summary" == *"ERROR SUMMARY: 0 errors"* ]]; then
          echo "ok $t GPU $g $((SECONDS - start)) s$([ "$leak" = no ] && echo " (leak check off: leaks on purpose)")"
        else
          [ "$trc" -eq 124 ] && summary="ran past ${GPU_BIN_TIMEOUT:-540} s (GPU_BIN_TIMEOUT)"
          echo "FAILED $t GPU $g $((SECONDS - start)) s (exit $trc; ${summary:-no summary})"
        fi >> "$mc/gpu$g.txt"
      done
    }
    pids=()
    for ((g = 0; g < gpus; g++)); do
      : > "$mc/gpu$g.txt"
      memcheck_worker "$g" &
      pids+=("$!")
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    for t in "${tests[@]}"; do
      grep -aE "driver calls|panicked|test result|ERROR SUMMARY" "$mc/$t.log" 2>/dev/null | sed "s/^/$t: /"
    done
    cat "$mc"/gpu*.txt
    rc=0
    passed="$(cat "$mc"/gpu*.txt | grep -c '^ok ' || true)"
    if [ "$passed" -ne "${#tests[@]}" ]; then
      echo "gpu-run: memcheck passed $passed of ${#tests[@]} tests"
      rc=1
    fi
    if [ "$rc" -eq 0 ]; then
      echo "RESULT: PASS (fault injection under memcheck, ${#tests[@]} tests on $gpus GPU(s))"
    else
      echo "RESULT: FAIL (fault injection under memcheck)"
    fi
    exit "$rc"
    ;;
esac
builds=("$@")
if [ "${#builds[@]}" -eq 0 ]; then builds=("${ALL_BUILDS[@]}"); fi
for b in "${builds[@]}"; do
  case " ${ALL_BUILDS[*]} " in
    *" $b "*) ;;
    *) echo "usage: $0 [tests|bench|all] [${ALL_BUILDS[*]}...]; unknown '$b'" >&2; exit 2 ;;
  esac
done

bundle="${GPU_BUNDLE:-.gpu-bundle}"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
timeout_s="${GPU_BIN_TIMEOUT:-240}"
read -r -a test_args <<< "${GPU_TEST_ARGS:-}"
last="$(mktemp)"            # output of the latest binary, for parsing
trap 'rm -f "$last"' EXIT

export CUDA_HAL_REQUIRE_GPU=1
export RUST_BACKTRACE=1

failures=()                 # one line per failure, for the summary
declare -A T_PASS T_FAIL T_IGN T_BAD BENCH_STATUS

# run_bin LOG LABEL BIN ARGS...: runs BIN with a time limit, appends a banner and its
# output to LOG and to $last (for parsing); returns its exit status.
run_bin() {
  local log="$1" label="$2"; shift 2
  local start=$SECONDS rc
  {
    echo
    echo "################################################################"
    echo "## $label"
    echo "## cmd: $*"
    echo "## start: $(date -u +%H:%M:%S)"
    echo "################################################################"
  } >> "$log"
  # Stream into the log, so that it survives even if this whole run is killed.
  timeout --kill-after=10 "$timeout_s" "$@" 2>&1 | tee -a "$log" > "$last"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "## TIMEOUT after ${timeout_s}s (exit $rc)" >> "$log"
  fi
  echo "## exit: $rc after $((SECONDS - start))s" >> "$log"
  return "$rc"
}

if [ ! -d "$bundle" ]; then
  echo "gpu-run: $bundle/ not found: run scripts/gpu-pack.sh and carry .gpu-bundle" >&2
  exit 2
fi
scripts/gpu-unpack.sh "$bundle" || exit 2

# --- environment ------------------------------------------------------------------
{
  echo "== date -u";            date -u
  echo "== uname -a";           uname -a
  echo "== host CPU";           lscpu 2>/dev/null | grep -E "^(Model name|Vendor ID|CPU family|Model):" || true
  echo "== nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "== nvidia-smi";         nvidia-smi 2>&1
  echo "== $bundle/manifest.txt"
  cat "$bundle/manifest.txt" 2>&1
  # The fatbin embedded in a test executable: its header (magic 0xba55ed50, version,
  # header size, then the size of what follows) gives its length.
  python3 - "$bundle/all/gpu" "$bundle/kernels.fatbin" <<'PY' 2>&1
import struct, sys
data = open(sys.argv[1], "rb").read()
at = data.find(struct.pack("<I", 0xBA55ED50))
if at < 0:
    sys.exit("no fatbin in " + sys.argv[1])
_, _, header, size = struct.unpack_from("<IHHQ", data, at)
open(sys.argv[2], "wb").write(data[at:at + header + size])
PY
  echo "== cuobjdump --list-elf --list-ptx (the fatbin embedded in $bundle/all/gpu)"
  cuobjdump --list-elf --list-ptx "$bundle/kernels.fatbin" 2>&1
  echo "== ldd of a test binary (must not mention libcuda)"
  ldd "$bundle/all/gpu" 2>&1
  echo "== run: mode=$mode builds=${builds[*]} GPU_TEST_ARGS=${GPU_TEST_ARGS:-} timeout=${timeout_s}s"
} > "$OUT/env.txt"
echo "gpu-run: $(date -u '+%F %T UTC') on $(uname -n), mode=$mode, builds: ${builds[*]}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "(nvidia-smi failed)"; } 2>&1 | head -n 4

# --- tests ----------------------------------------------------------------------------
# Tests named two_devices_* skip themselves on one device, which would count as passing:
# with fewer than two devices they are left out here instead, and reported as not run.
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
# nvidia-smi lists every GPU whatever CUDA_VISIBLE_DEVICES hides from the tests.
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  visible="$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)"
  [ "$visible" -lt "${ngpus:-0}" ] && ngpus="$visible"
fi
two_device_args=()
if [ "${ngpus:-0}" -lt 2 ] && [ "${CUDA_HAL_REQUIRE_GPUS:-0}" -lt 2 ]; then
  two_device_args=(--skip two_devices_)
fi
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  : > "$OUT/tests.log"
  for b in "${builds[@]}"; do
    T_PASS[$b]=0; T_FAIL[$b]=0; T_IGN[$b]=0; T_BAD[$b]=""
    # Every file in the build's folder except the bench is a test binary.
    mapfile -t bins < <(find "$bundle/$b" -maxdepth 1 -type f ! -name 'bench-*' 2>/dev/null | sort)
    if [ "${#bins[@]}" -eq 0 ]; then
      failures+=("[$b] no test binaries in $bundle/$b")
      T_BAD[$b]="missing"
      continue
    fi
    for bin in "${bins[@]}"; do
      name="$(basename "$bin")"
      not_run="" left_out=0
      if [ "${#two_device_args[@]}" -gt 0 ]; then
        left_out="$("$bin" --list 2>/dev/null | grep -c '^two_devices_' || true)"
      fi
      if [ "${left_out:-0}" -gt 0 ]; then
        not_run=", $left_out two-device tests not run: ${ngpus:-0} device(s)"
      fi
      # (--show-output: what passing tests print, such as the driver behaviour a probe saw.)
      run_bin "$OUT/tests.log" "tests: build=$b binary=$name" "$bin" --show-output "${test_args[@]}" \
        ${not_run:+"${two_device_args[@]}"}
      rc=$?
      # The harness's line, the binary's last: "test result: ok. 5 passed; 0 failed; 1
      # ignored; ..." (a test run in a child process prints the child's own with its output).
      read -r p f i < <(grep -aoE 'test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed; [0-9]+ ignored' "$last" \
        | tail -n 1 | awk '{ p += $4; f += $6; i += $8 } END { print p + 0, f + 0, i + 0 }')
      T_PASS[$b]=$((T_PASS[$b] + p)); T_FAIL[$b]=$((T_FAIL[$b] + f)); T_IGN[$b]=$((T_IGN[$b] + i))
      status="ok"
      if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then
        status="FAILED (exit $rc)"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="TIMEOUT (exit $rc)"; fi
        failures+=("[$b] tests $name: $status, $f failed")
        T_BAD[$b]+=" $name"
      elif [ "$p" -eq 0 ]; then
        status="ok, but 0 tests passed"
      fi
      echo "[$b] $name: $status ($p passed, $f failed, $i ignored$not_run)"
    done
  done

  # --- the kernel lookup in a build without kernels (packed with the all build) --------
  if [[ " ${builds[*]} " == *" all "* ]]; then
    nk_test=the_crates_operations_launch_only_embedded_kernels
    if [ -x "$bundle/nokernels/gpu" ]; then
      CUDA_HAL_EXPECT_NO_KERNELS=1 run_bin "$OUT/tests.log" "tests: build=nokernels binary=gpu" \
        "$bundle/nokernels/gpu" --exact "$nk_test"
      rc=$?
      if [ "$rc" -eq 0 ] && grep -aq 'test result: ok. 1 passed' "$last"; then
        NOKERNELS_STATUS="ok ($nk_test passed)"
      else
        NOKERNELS_STATUS="FAILED (exit $rc)"; failures+=("[nokernels] gpu $nk_test: exit $rc")
      fi
    else
      NOKERNELS_STATUS="missing"; failures+=("[nokernels] $bundle/nokernels/gpu missing")
    fi
    echo "[nokernels] gpu: $NOKERNELS_STATUS"
  fi

  # --- doc examples (default features) ---------------------------------------------
  # Each prints "no CUDA device here" where it finds no device and returns: here that is a
  # failure, like a skipped test.
  : > "$OUT/doctests.log"
  D_PASS=0; D_FAIL=0
  mapfile -t dbins < <(find "$bundle/doctests" -name rust_out -type f 2>/dev/null | sort)
  if [ "${#dbins[@]}" -eq 0 ]; then
    failures+=("doc examples: none in $bundle/doctests")
  fi
  for bin in "${dbins[@]}"; do
    name="$(basename "$(dirname "$bin")")"
    run_bin "$OUT/doctests.log" "doc example $name" "$bin"
    rc=$?
    if [ "$rc" -ne 0 ]; then
      D_FAIL=$((D_FAIL + 1)); failures+=("doc example $name: exit $rc")
    elif grep -aq "no CUDA device here" "$last"; then
      D_FAIL=$((D_FAIL + 1)); failures+=("doc example $name: skipped (no CUDA device)")
    else
      D_PASS=$((D_PASS + 1))
    fi
  done
  DOC_STATUS="$D_PASS passed, $D_FAIL failed"
  echo "doc examples: $DOC_STATUS"

  # --- demo (default features) -------------------------------------------------------
  : > "$OUT/demo.log"
  if [ -x "$bundle/prover_demo" ]; then
    run_bin "$OUT/demo.log" "prover_demo" "$bundle/prover_demo"
    rc=$?
    DEMO_STATUS="ok"
    if [ "$rc" -ne 0 ]; then DEMO_STATUS="FAILED (exit $rc)"; failures+=("prover_demo: exit $rc"); fi
  else
    DEMO_STATUS="missing"
    failures+=("prover_demo: $bundle/prover_demo missing")
  fi
  echo "prover_demo: $DEMO_STATUS"

  # --- alloc_free_loop (the host path of alloc+free, tracking on and off) -------------
  LOOP_STATUS="ok"
  if [ -x "$bundle/alloc_free_loop" ]; then
    for tracking in on off; do
      run_bin "$OUT/demo.log" "alloc_free_loop $tracking" "$bundle/alloc_free_loop" "$tracking" 100000
      rc=$?
      if [ "$rc" -ne 0 ]; then
        LOOP_STATUS="FAILED (exit $rc)"; failures+=("alloc_free_loop $tracking: exit $rc")
      fi
    done
  else
    LOOP_STATUS="missing"
    failures+=("alloc_free_loop: $bundle/alloc_free_loop missing")
  fi
  echo "alloc_free_loop: $LOOP_STATUS"

  # --- NVTX ranges, through ncu --nvtx (Nsight Systems does not run on the GPU machines) --
  if ! command -v ncu > /dev/null; then
    NVTX_STATUS="not checked: no ncu on this machine"
  elif [ ! -x "$bundle/prover_demo_nvtx" ] || [ ! -f "$bundle/libnvtx3interop.so.1" ]; then
    NVTX_STATUS="missing"
    failures+=("nvtx: $bundle/prover_demo_nvtx or $bundle/libnvtx3interop.so.1 missing")
  elif python3 scripts/nvtx-check.py "$bundle/prover_demo_nvtx" \
         "$(cd "$bundle" && pwd)/libnvtx3interop.so.1" "$OUT/nvtx.log" > "$OUT/nvtx-check.txt" 2>&1; then
    NVTX_STATUS="ok"
  else
    NVTX_STATUS="FAILED"
    failures+=("nvtx: $(tail -n 1 "$OUT/nvtx-check.txt")")
  fi
  [ -f "$OUT/nvtx-check.txt" ] && cat "$OUT/nvtx-check.txt"
  echo "nvtx: $NVTX_STATUS"
fi

# --- benches --------------------------------------------------------------------------
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  : > "$OUT/bench.log"
  for b in "${builds[@]}"; do
    BENCH_STATUS[$b]=""
    mapfile -t bbins < <(find "$bundle/$b" -maxdepth 1 -type f -name 'bench-*' 2>/dev/null | sort)
    if [ "${#bbins[@]}" -eq 0 ]; then
      BENCH_STATUS[$b]="missing"
      failures+=("[$b] bench: no bench-* binaries")
      echo "[$b] bench: missing"
      continue
    fi
    for bin in "${bbins[@]}"; do
      name="$(basename "$bin")"
      run_bin "$OUT/bench.log" "bench: build=$b binary=$name" "$bin" --bench
      rc=$?
      rows="$(grep -ac '^ROW|' "$last")"
      if [ "$rc" -ne 0 ]; then
        st="FAILED (exit $rc), $rows rows"
        failures+=("[$b] $name: exit $rc")
      elif [ "$rows" -eq 0 ] && grep -aq '^SKIPPED:' "$last"; then
        # A bench skips only where it finds no device (bench-multi_gpu times copies
        # between two HALs of one device when there is one): here, a failure.
        st="FAILED: skipped ($(grep -a '^SKIPPED:' "$last" | head -n 1 | cut -c10-))"
        failures+=("[$b] $name: $st")
      elif [ "$rows" -eq 0 ]; then
        st="FAILED: no ROW lines"
        failures+=("[$b] $name: printed no ROW lines")
      else
        st="ok, $rows rows"
      fi
      BENCH_STATUS[$b]+=" $name: $st;"
      echo "[$b] $name: $st"
    done
  done
  if ! python3 scripts/bench-table.py "$OUT/bench.log" "$OUT/results.md" > /dev/null; then
    failures+=("bench-table.py failed")
  fi
fi

# --- results, then the summary last ------------------------------------------------
if [ -f "$OUT/results.md" ]; then
  echo
  cat "$OUT/results.md"
fi

{
  echo
  echo "==================== gpu-run summary ===================="
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  echo "bundle: $(grep -E '^(git_head|packed_at)' "$bundle/manifest.txt" 2>/dev/null | tr '\n' ' ')"
  # `gpu-pack.sh <builds>` leaves the other builds as an earlier pack made them.
  packed_now=" $(sed -n 's/^builds_packed_this_time: //p' "$bundle/manifest.txt" 2>/dev/null) "
  for b in "${builds[@]}"; do
    [[ "$packed_now" == *" $b "* ]] || echo "NOTE: [$b] was built by an earlier pack than git_head's"
  done
  echo "mode: $mode   builds: ${builds[*]}"
  for b in "${builds[@]}"; do
    line="[$b]"
    if [ -n "${T_PASS[$b]+set}" ]; then
      line+=" tests: ${T_PASS[$b]} passed, ${T_FAIL[$b]} failed, ${T_IGN[$b]} ignored"
      [ -n "${T_BAD[$b]}" ] && line+=" (bad:${T_BAD[$b]})"
    fi
    [ -n "${BENCH_STATUS[$b]+set}" ] && line+="  | bench: ${BENCH_STATUS[$b]}"
    echo "$line"
  done
  [ -n "${NOKERNELS_STATUS+set}" ] && echo "[nokernels] gpu (built without kernels): $NOKERNELS_STATUS"
  [ -n "${DOC_STATUS+set}" ] && echo "doc examples: $DOC_STATUS"
  [ -n "${DEMO_STATUS+set}" ] && echo "prover_demo: $DEMO_STATUS"
  [ -n "${LOOP_STATUS+set}" ] && echo "alloc_free_loop: $LOOP_STATUS"
  [ -n "${NVTX_STATUS+set}" ] && echo "nvtx (ncu --nvtx over prover_demo_nvtx): $NVTX_STATUS"
  if [ "${#failures[@]}" -eq 0 ]; then
    echo "RESULT: PASS"
  else
    echo "failures (${#failures[@]}):"
    printf '  %s\n' "${failures[@]}"
    echo "RESULT: FAIL"
  fi
} | tee "$OUT/summary.txt"

[ "${#failures[@]}" -eq 0 ]
