#!/usr/bin/env bash
# Compares the tracking overhead of several builds of bench-memory, taking turns, ON THE
# GPU MACHINE: each round runs every build's tracking measurement once, in a fresh
# process, so that host drift hits every build alike.
#
#   scripts/ab-tracking.sh ROUNDS DIR NAME...
#
# DIR holds the binaries as bm-NAME (or bm-NAME.gz, unpacked on first use), each built
# here with `cargo bench --no-run --bench memory` from the code to compare. Prints one line
# per process: `NAME cached% on_us off_us pool% on_us off_us` (block cache on, then off;
# tracked and untracked alloc+free in microseconds). `scripts/ab-stats.py` summarises
# them.
set -euo pipefail
rounds=$1 dir=$2
shift 2
for b in "$@"; do
  if [ ! -x "$dir/bm-$b" ]; then
    gunzip -c "$dir/bm-$b.gz" > "$dir/bm-$b" && chmod +x "$dir/bm-$b"
  fi
done
for _ in $(seq 1 "$rounds"); do
  for b in "$@"; do
    out="$(CUDA_HAL_BENCH_TRACKING_RUN=1 "$dir/bm-$b" --bench 2>&1)"
    pct() { echo "$out" | awk -F'|' -v l="$1" '$1=="RUN" && $2==l {printf "%+.3f %.5f %.5f", ($3/$4-1)*100, $3, $4}'; }
    echo "$b $(pct "block cache on") $(pct "block cache off")"
  done
done
