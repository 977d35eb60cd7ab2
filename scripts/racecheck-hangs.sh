#!/usr/bin/env bash
# Looks for hangs of compute-sanitizer's racecheck over one test suite (the gpu tests, or
# RC_SUITE), ON THE GPU MACHINE: runs it in a loop with four test threads and, when a run
# outlives its limit, takes every thread's stack of the test process with cuda-gdb (the
# machine has no gdb). Writes $OUT/rc.N.log per run, and $OUT/bt.N.txt and
# $OUT/threads.N.txt per hang.
#
# Stacks name the crate's frames only with line tables. Build the binary here with
#   CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo test --release --no-run --test gpu
# (or --test transfers ...) and gzip it to .gpu-bundle/extra/<suite>-dbg.gz before
# carrying the bundle; without it the packed (stripped) .gpu-bundle/all/<suite> runs.
#
#   OUT=$OUT scripts/racecheck-hangs.sh     (RC_SUITE=gpu, RC_RUNS=14 runs, RC_LIMIT=25 s
#                                            each, stops at RC_HANGS=2 hangs, RC_THREADS=4
#                                            test threads)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
scripts/gpu-unpack.sh >/dev/null || exit 2
suite="${RC_SUITE:-gpu}"
bin=".gpu-bundle/extra/$suite-dbg"
[ -x "$bin" ] || bin=".gpu-bundle/all/$suite"
skip=(--skip device_fault --skip poison_child --skip filling_the_device --skip bad_input)
export CUDA_HAL_REQUIRE_GPU=1
limit="${RC_LIMIT:-25}"
hangs=0
for i in $(seq 1 "${RC_RUNS:-14}"); do
  log="$OUT/rc.$i.log"
  # Its own session, so that a hung run can be killed whole.
  setsid compute-sanitizer --tool racecheck --error-exitcode 99 "$bin" "${skip[@]}" \
    --test-threads="${RC_THREADS:-4}" > "$log" 2>&1 &
  cs=$!
  t0=$(date +%s)
  while kill -0 "$cs" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 0.5; done
  if kill -0 "$cs" 2>/dev/null; then
    hangs=$((hangs + 1))
    # The test process is a grandchild of compute-sanitizer; its name is the binary's.
    pid="$(pgrep -x "$(basename "$bin" | cut -c1-15)" | head -n 1)"
    echo "run $i: hung after ${limit} s (test process $pid)"
    ps -eLo pid,tid,stat,wchan:32,comm,pcpu | awk -v p="$pid" '$1 == p' > "$OUT/threads.$i.txt"
    timeout 150 cuda-gdb -batch -p "$pid" -ex "info threads" -ex "thread apply all bt 40" \
      > "$OUT/bt.$i.txt" 2>&1
    kill -9 -- "-$cs" 2>/dev/null
    kill -9 "$pid" "$cs" 2>/dev/null
    wait "$cs" 2>/dev/null
    [ "$hangs" -ge "${RC_HANGS:-2}" ] && break
  else
    wait "$cs"
    rc=$?
    echo "run $i: exit $rc in $(( $(date +%s) - t0 )) s; $(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazard|test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | tr '\n' ' ')"
  fi
done
echo "hangs: $hangs"
