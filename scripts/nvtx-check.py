#!/usr/bin/env python3
"""Checks the crate's NVTX ranges ON THE GPU MACHINE through `ncu --nvtx` (Nsight Systems
does not run there), over `prover_demo` built with the `nvtx` feature.

    scripts/nvtx-check.py DEMO NVTX_LIB LOG

First DEMO alone, with no tool attached: it must say `NVTX ranges: off` (the crate formats
no range names unless a tool collects them). Then three ncu runs of DEMO (with
CUDA_HAL_NVTX_LIB=NVTX_LIB), their output appended to LOG:
1. every kernel, no NVTX filter: how many kernels the demo launches, by name;
2. only kernels inside a `launch ...` range: there must be as many, by name, and the
   innermost range around each must be `launch <that kernel> out=<buffers> in=<buffers>`;
   kernels a HAL operation launches itself (the gather's and the batches', the NTT's, the
   LDE's, the hashes') must sit inside that operation's range too (`gather ... from
   <buffers>`, `batch_ntt <buffer> ...`), and the demo must launch the gather's and the
   batches' kernels (so that this is checked);
3. only kernels inside a range no operation opens: there must be none (the filter works,
   so step 2's count means something).
Prints one line per step and `NVTX: ok` or `NVTX: FAILED (...)`; exits 1 on failure.
"""

import collections
import os
import re
import subprocess
import sys

# A result's header: `  kernel_name (4224, 1, 1)x(256, 1, 1), Context 1, Stream 13, ...`
RESULT = re.compile(r"^  (\w+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context")
# A range of a push/pop stack: `        <0,launch eltwise_add_u32 out=tmp in=acc,column-0>`
RANGE = re.compile(r"^\s+<(\d+),(.*)>$")
LAUNCH = re.compile(r"^launch (\w+) out=(.*) in=(.*)$")


# Kernels HAL operations launch themselves, by name prefix: the ranges of the operations
# one of which must enclose each (outside its own `launch` range).
OPERATIONS = {
    "gather_elements": ("gather ",),
    "scatter_segments": ("upload_batch ", "arena upload "),
    "gather_segments": ("download_batch ",),
    "ntt_": ("batch_ntt ", "coset_lde "),
    "lde_expand_bb": ("coset_lde ",),
    "poseidon2_hash_rows_bb": ("poseidon2_hash_rows ",),
    "poseidon2_merkle_layer_bb": ("merkle_layer ",),
}
# Kernels the demo must launch, so that their ranges are checked.
REQUIRED = ("gather_elements", "scatter_segments", "gather_segments")


def operation_ranges(name):
    """The operation ranges one of which must enclose kernel `name` (none: no rule)."""
    for prefix, ops in OPERATIONS.items():
        if name.startswith(prefix):
            return ops
    return ()


def profile(demo, lib, log, include):
    """The profiled kernels as (name, [ranges of its NVTX stack, outermost first])."""
    cmd = ["ncu", "--nvtx", "--section", "LaunchStats"]
    if include:
        cmd += ["--nvtx-include", include]
    cmd.append(demo)
    env = dict(os.environ, CUDA_HAL_NVTX_LIB=lib)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n{run.stdout}{run.stderr}\n")
    if run.returncode != 0:
        raise RuntimeError(f"ncu exited {run.returncode} ({' '.join(cmd)})")
    results = []
    for line in run.stdout.splitlines():
        m = RESULT.match(line)
        if m:
            results.append((m.group(1), []))
            continue
        m = RANGE.match(line)
        if m and results:
            results[-1][1].append(m.group(2))
    return results


def main():
    demo, lib, log = sys.argv[1:4]
    open(log, "w").close()
    problems = []
    env = dict(os.environ, CUDA_HAL_NVTX_LIB=lib)
    env.pop("NVTX_INJECTION64_PATH", None)
    env.pop("CUDA_HAL_NVTX", None)
    alone = subprocess.run([demo], env=env, capture_output=True, text=True, timeout=600)
    with open(log, "a") as f:
        f.write(f"$ {demo} (no tool)\n{alone.stdout}{alone.stderr}\n")
    said = re.search(r"NVTX ranges: (\w+)", alone.stdout)
    print(f"NVTX: with no tool attached the demo says ranges are {said.group(1) if said else '?'}")
    if alone.returncode != 0 or not said or said.group(1) != "off":
        problems.append("with no tool attached the demo did not run with ranges off")
    every = profile(demo, lib, log, None)
    launched = collections.Counter(name for name, _ in every)
    print(f"NVTX: the demo launches {len(every)} kernels: {dict(launched)}")
    if not every:
        problems.append("ncu profiled no kernel of the demo")

    ranged = profile(demo, lib, log, "regex:launch .*/")
    in_ranges = collections.Counter(name for name, _ in ranged)
    named = 0
    in_ops = 0
    for name, stack in ranged:
        m = LAUNCH.match(stack[-1]) if stack else None
        if not m:
            problems.append(f"{name}: innermost range {stack[-1:]} is no launch range")
        elif m.group(1) != name:
            problems.append(f"{name}: inside the range of {m.group(1)}")
        elif not (m.group(2) or m.group(3)):
            problems.append(f"{name}: its range names no buffer ({stack[-1]})")
        else:
            named += 1
        ops = operation_ranges(name)
        if ops:
            if any(r.startswith(ops) for r in stack[:-1]):
                in_ops += 1
            else:
                problems.append(f"{name}: in no range of {ops} ({stack})")
    print(
        f"NVTX: {len(ranged)} kernels inside `launch` ranges, {named} of them inside their "
        f"own, naming their buffers (e.g. {ranged[0][1][-1] if ranged else '-'})"
    )
    print(
        f"NVTX: {in_ops} kernels that HAL operations launch inside the operation's range "
        f"(e.g. {next((st[-2] for n, st in ranged if operation_ranges(n) and len(st) > 1), '-')})"
    )
    for name in REQUIRED:
        if not launched[name]:
            problems.append(f"the demo launched no {name}: its ranges went unchecked")
    if in_ranges != launched:
        problems.append(f"kernels inside launch ranges {dict(in_ranges)} != launched {dict(launched)}")

    none = profile(demo, lib, log, "regex:no operation opens this range/")
    print(f"NVTX: {len(none)} kernels inside a range no operation opens (the filter works)")
    if none:
        problems.append(f"{len(none)} kernels matched a range no operation opens")

    if problems:
        print(f"NVTX: FAILED ({'; '.join(problems)})")
        sys.exit(1)
    print("NVTX: ok")


if __name__ == "__main__":
    main()
