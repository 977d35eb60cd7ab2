#!/usr/bin/env python3
"""Builds a stub libcuda for profiling the HAL's host-side paths on a machine without a GPU.

    scripts/stub-libcuda.py OUT.so
    CUDA_HAL_LIBCUDA=OUT.so valgrind --tool=callgrind target/release/examples/alloc_free_loop on

Every entry point of cuda-sys's table returns CUDA_SUCCESS and leaves its outputs alone,
except the few a HAL needs to open a device and allocate: one device with 80 GiB, a
context, a stream, a pool, and pool or cuMemAlloc allocations at increasing addresses.
Nothing runs: kernels, copies and synchronisation do nothing, so only the host code of the
crate is exercised (instruction counts, not timings of device work). Never a test double:
no test uses it.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

SPECIAL = {
    "cuInit": "int cuInit(unsigned f) { return 0; }",
    "cuDriverGetVersion": "int cuDriverGetVersion(int *v) { *v = 13000; return 0; }",
    "cuDeviceGetCount": "int cuDeviceGetCount(int *n) { *n = 1; return 0; }",
    "cuDeviceGet": "int cuDeviceGet(int *d, int o) { *d = o; return 0; }",
    "cuDeviceGetName": "int cuDeviceGetName(char *n, int len, int d) { strncpy(n, \"stub\", len); return 0; }",
    "cuDeviceTotalMem_v2": "int cuDeviceTotalMem_v2(size_t *b, int d) { *b = 80ULL << 30; return 0; }",
    # compute capability 9.0, 132 SMs, every other attribute 1
    "cuDeviceGetAttribute": "int cuDeviceGetAttribute(int *v, int a, int d) { *v = a == 75 ? 9 : a == 76 ? 0 : a == 16 ? 132 : 1; return 0; }",
    "cuDevicePrimaryCtxRetain": "int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0x1000; return 0; }",
    "cuCtxGetCurrent": "int cuCtxGetCurrent(void **c) { *c = current; return 0; }",
    "cuCtxSetCurrent": "int cuCtxSetCurrent(void *c) { current = c; return 0; }",
    "cuStreamCreate": "int cuStreamCreate(void **s, unsigned f) { *s = (void *)0x2000; return 0; }",
    "cuMemPoolCreate": "int cuMemPoolCreate(void **p, const void *props) { *p = (void *)0x3000; return 0; }",
    "cuMemAllocFromPoolAsync": "int cuMemAllocFromPoolAsync(unsigned long long *p, size_t b, void *pool, void *s) { return next(p, b); }",
    "cuMemAlloc_v2": "int cuMemAlloc_v2(unsigned long long *p, size_t b) { return next(p, b); }",
    "cuMemGetInfo_v2": "int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 70ULL << 30; *t = 80ULL << 30; return 0; }",
    # page-locked host memory is plain host memory here
    "cuMemHostAlloc": "int cuMemHostAlloc(void **p, size_t b, unsigned f) { *p = malloc(b ? b : 1); return 0; }",
    "cuMemAllocHost_v2": "int cuMemAllocHost_v2(void **p, size_t b) { *p = malloc(b ? b : 1); return 0; }",
    "cuMemFreeHost": "int cuMemFreeHost(void *p) { free(p); return 0; }",
    # unified addressing: mapped host memory has the host's address on the device
    "cuMemHostGetDevicePointer_v2": "int cuMemHostGetDevicePointer_v2(unsigned long long *d, void *p, unsigned f) { *d = (unsigned long long)p; return 0; }",
    "cuMemPoolGetAttribute": "int cuMemPoolGetAttribute(void *p, int a, void *v) { *(unsigned long long *)v = 0; return 0; }",
}

PRELUDE = """#include <stddef.h>
#include <stdlib.h>
#include <string.h>
static __thread void *current;
static unsigned long long next_address = 1ULL << 40;
static int next(unsigned long long *p, size_t bytes) {
    *p = __atomic_fetch_add(&next_address, (bytes + 4095) & ~4095ULL, __ATOMIC_RELAXED);
    return 0;
}
"""


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1]).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    table = (ROOT / "cuda-sys" / "src" / "driver_api.rs").read_text()
    names = sorted(set(re.findall(r'"(cu[A-Za-z0-9_]*)"', table)))
    body = [SPECIAL.get(n, f"int {n}() {{ return 0; }}") for n in names]
    src = out.with_suffix(".c")
    src.write_text(PRELUDE + "\n".join(body) + "\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-w", "-o", str(out), str(src)], check=True)
    print(f"{out}: {len(names)} entry points")


if __name__ == "__main__":
    main()
