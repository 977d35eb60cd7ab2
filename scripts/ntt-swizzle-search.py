#!/usr/bin/env python3
"""Finds (or checks) the shared-memory swizzle of the fused NTT passes (kernels/ntt.cuh).

The kernel stores tile element e at e ^ f(e >> 5), f linear over GF(2): tile bit 5 + i
adds BANK_OF_BIT[i] to the bank. A warp's shared access hits 32 distinct banks when the
bank vectors of its five lane bits are linearly independent. This script mirrors plan_ntt
(src/ntt_plan.rs) and Tile::layout (kernels/ntt.cuh) to list every lane pattern of every
exchange, for column sizes 2^4 .. 2^27 and several column counts, and reports conflicts.

    scripts/ntt-swizzle-search.py            # check the kernel's vectors
    scripts/ntt-swizzle-search.py --search   # random search for conflict-free vectors

Keep TILE_LOG, SINGLE_C, MULTI_C, MAX_STAGES and BANK_OF_BIT in step with the sources
(src/ntt_plan.rs, kernels/ntt.cuh).
"""
import random
import sys

TILE_LOG, SINGLE_C, MULTI_C, MAX_STAGES, REG = 12, 5, 4, 9, 4
BANK_OF_BIT = [21, 26, 29, 17, 9, 30, 19]  # tile bits 5..11


def plan(log_n, cols):
    """plan_ntt: (k, c, p_load, p_store) per pass."""
    if log_n <= TILE_LOG:
        k = log_n
        c = min(TILE_LOG - k, SINGLE_C, (cols & -cols).bit_length() - 1)
        return [(k, c, max(k - 5, REG), 0 if k > REG else REG)]
    passes = -(-log_n // MAX_STAGES)
    out = []
    for i in range(passes):
        k = log_n // passes + (1 if i < log_n % passes else 0)
        c = TILE_LOG - MAX_STAGES if k == MAX_STAGES else MULTI_C
        out.append((k, c, k, 0 if i == 0 else k))
    return out


def shared_layouts(k, c, p_load, p_store):
    """Tile::layout: the (q, p) layouts of every shared-memory access of one pass."""
    tl = k + c
    nr = 1 + (k - 1) // 4
    r0 = k - 4 * (nr - 1)
    lays = []
    for r in range(nr):
        q = 0 if r == 0 else r0 + 4 * (r - 1)
        if r == nr - 1 and nr > 1:
            p = p_store
        elif r == 0:
            p = p_load
        elif q + 9 <= tl:
            p = q + 4
        elif q >= 5:
            p = q - 5
        else:
            p = (q + 4) % tl
        if 0 <= p - q < 4:
            p = (q + 4) % tl
        lays.append((q, p))
    relayout = nr == 1 and p_store != p_load
    used = []
    for r in range(nr):
        if r > 0:
            used.append(lays[r])  # read after an exchange
        if r < nr - 1 or relayout:
            used.append(lays[r])  # write for the next phase
    if relayout:
        used.append((0, p_store if not 0 <= p_store < 4 else 4 % tl))
    return tl, used


def lane_bits(tl, q, p):
    """thread_bits: the tile bits of thread-index bits 0..4 (the lanes)."""
    if p >= q + 4:
        runs = [(p, tl - p), (0, q), (q + 4, p - q - 4)]
    else:
        runs = [(p, q - p), (q + 4, tl - q - 4), (0, p)]
    bits = [b for s, n in runs for b in range(s, s + n)]
    return tuple(bits[:5])


def conflict_degree(vectors):
    basis = []
    for v in vectors:
        for b in basis:
            v = min(v, v ^ b)
        if v:
            basis.append(v)
    return 2 ** (len(vectors) - len(basis))


def patterns():
    pats = {}
    for log_n in range(REG, 28):
        for cols in [1, 2, 3, 4, 8, 16, 32, 64, 1024]:
            for p in plan(log_n, cols):
                tl, used = shared_layouts(*p)
                for q, pp in used:
                    pats.setdefault(lane_bits(tl, q, pp), []).append((log_n, cols))
    return pats


def conflicts(bank_of_bit, pats):
    bad = []
    for lanes, where in pats.items():
        vecs = [1 << b if b < 5 else bank_of_bit[b - 5] for b in lanes]
        d = conflict_degree(vecs)
        if d > 1:
            bad.append((lanes, d, where[0]))
    return bad


def main():
    pats = patterns()
    if "--search" in sys.argv:
        rng = random.Random(2)
        for _ in range(1_000_000):
            cand = [rng.randrange(1, 32) for _ in BANK_OF_BIT]
            if not conflicts(cand, pats):
                print("conflict-free:", cand)
                return 0
        print("none found")
        return 1
    bad = conflicts(BANK_OF_BIT, pats)
    for lanes, d, (log_n, cols) in bad:
        print(f"lanes on tile bits {lanes}: {d}-way conflict (e.g. 2^{log_n} x {cols})")
    print(f"{len(pats)} lane patterns, {len(bad)} with bank conflicts")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
