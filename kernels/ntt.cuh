// Fused NTT passes over BabyBear (canonical data, Montgomery-form twiddles; see babybear.cuh).
//
// A batched forward or inverse NTT of 2^log_n points per column runs as a few passes (see
// plan_ntt in src/ntt_plan.rs); each pass does K consecutive radix-2 decimation-in-time
// stages s0 .. s0+K-1 on data whose first pass reads the input in bit-reversed order.
//
// Positions are DIT positions (after bit reversal), column bits above log_n included. A
// block owns one tile of 2^(K+c) elements: the K butterfly bits at s0.. ("b", tile bits
// 0..K-1) and c coalescing bits at cpos.. ("l", tile bits K..K+c-1) vary inside the tile,
// the other position bits come from the block number.
//
// Each of the 2^(K+c-4) threads holds 16 values in registers and runs up to four stages on
// them at once (a round): round 0 does the first R0 = K - 4*(NR-1) stages on tile bits 0..3,
// round r >= 1 the four stages on tile bits q(r)..q(r)+3. Between rounds the values go
// through shared memory, one __syncthreads per exchange; the first round loads straight
// from global memory and the last stores straight to it, in layouts chosen so that a
// warp's lanes touch runs of 16 or 32 consecutive addresses (64 or 128 bytes), or at least
// whole 32-byte sectors.
//
// A layout {q, p} puts the 16 registers on tile bits q..q+3 and the thread-index bits on
// the other tile bits, in cyclic order starting at bit p (lane bits first). Shared memory
// is XOR-swizzled (`swizzle`) so that the lane patterns of the exchanges hit distinct banks.
//
// Twiddles: the stage-s butterfly at DIT position x multiplies by w_{2^(s+1)}^(x mod 2^s).
// In round r, with lo = s0 + q(r), x mod 2^s = U + v * 2^lo where U = x mod 2^lo is fixed
// per thread and v < 2^j comes from the register index (j = s - lo). Hence
//   w = w_{2^(lo+j+1)}^U * w_16^(v * 2^(3-j)),
// where the first factor is one table load for the round's last stage and squarings for the
// others, and the second is one of eight constants w_16^0..7. `tw` holds w_n^k for k < n/2
// in Montgomery form (w_n inverted for the inverse NTT), so every root above is a table entry.
// The squarings, the products by the constants and the butterflies of stages 0..2 are Shoup
// products (`butterflies`), each operand's quotient taken from its Montgomery form with
// one low multiply (bb::shoup_of_mont).
//
// A coset LDE's first pass reads its source another way (`LdeSource`): the column of
// 2^log_n points is the 2^log_small coefficients times the shift's powers, then zeros,
// and neither the zeros nor the expanded column are ever in memory. Its first log_n -
// log_small stages only pair values with zeros: it skips up to LDE_MAX_SKIP of them and
// copies the values instead.
//
// Everything here is __host__ __device__: kernels/host_check runs the same per-thread phases
// on the CPU, thread by thread, to check the index arithmetic against the Rust reference.
#pragma once
#include "babybear.cuh"

namespace ntt {

// The launch parameters of one pass.
struct Pass {
    uint32_t log_n;       // points per column: 2^log_n (>= 4)
    uint32_t s0;          // first stage
    uint32_t c;           // coalescing bits: a tile has 2^(K + c) elements, K + c <= 12
    uint32_t cpos;        // position bit of l's lowest bit
    uint32_t bitrev;      // read position x from src[rev(x)] (the first pass)
    uint32_t p_load;      // first lane bit of the layout of the global loads
    uint32_t p_store;     // first lane bit of the layout of the global stores
    uint32_t do_scale;    // multiply stored values by scale_mont (the inverse's 1/n)
    uint32_t scale_mont;
};

// The source of a coset LDE's first pass (bit-reversed, from stage 0): position j < 2^log_n
// of column col holds coeffs[col * 2^log_small + j] * shift[j] for j < 2^log_small (shift
// in Montgomery form, so the product is canonical), zero above. log_small <= log_n.
// SKIP: the stages the pass leaves out (Tile::stages_skipped), at most log_n - log_small;
// a constant, so that the compiler drops them from the code (with_lde_source picks it).
template <uint32_t SKIP>
struct LdeSource {
    static_assert(SKIP <= 4, "the skipped stages' copies are made in round 0's registers");
    const uint32_t* coeffs;
    const uint32_t* shift;
    uint32_t log_small;
};

// The most stages an LDE's first pass skips: a blowup of 4 (the common one) skips two.
// Each value up to it is a separate copy of the pass's code.
constexpr uint32_t LDE_MAX_SKIP = 2;

// f(LdeSource<S>{coeffs, shift, log_small}) with S = min(log_n - log_small, LDE_MAX_SKIP).
template <class F>
BB_HD void with_lde_source(const uint32_t* coeffs, const uint32_t* shift, uint32_t log_small,
                           uint32_t log_n, F&& f) {
    static_assert(LDE_MAX_SKIP == 2, "one branch per skip");
    const uint32_t b = log_n - log_small;
    if (b >= 2) {
        f(LdeSource<2>{coeffs, shift, log_small});
    } else if (b == 1) {
        f(LdeSource<1>{coeffs, shift, log_small});
    } else {
        f(LdeSource<0>{coeffs, shift, log_small});
    }
}

// Registers on tile bits q..q+3, thread bits on the others in cyclic order from bit p.
struct Layout {
    uint32_t q, p;
};

// Shared-memory slot of tile element e: e with its low five bits (the bank) XORed with a
// linear function of tile bits 5..11, so that every lane pattern the passes use (for every
// plan of plan_ntt) falls on distinct banks. The vectors were found by
// scripts/ntt-swizzle-search.py, which also checks them. Linear over XOR: swizzle(a ^ b) = swizzle(a) ^ swizzle(b), and a bijection,
// since only the low five bits change and they change by a function of the others.
BB_HD uint32_t swizzle(uint32_t e) {
    constexpr uint32_t bank_of_bit[7] = {21, 26, 29, 17, 9, 30, 19};  // tile bits 5..11
    uint32_t f = 0;
#pragma unroll
    for (uint32_t i = 0; i < 7; i++)
        if ((e >> (5 + i)) & 1u) f ^= bank_of_bit[i];
    return e ^ f;
}

// The tile bits of thread t in layout L (tile of 2^tile_log elements, tile_log >= 4).
BB_HD uint32_t thread_bits(uint32_t t, uint32_t tile_log, Layout L) {
    // The non-register bits in cyclic order from p form at most three runs.
    uint32_t s1, l1, s2, l2, s3, l3;
    if (L.p >= L.q + 4) {
        s1 = L.p, l1 = tile_log - L.p;
        s2 = 0, l2 = L.q;
        s3 = L.q + 4, l3 = L.p - (L.q + 4);
    } else {
        s1 = L.p, l1 = L.q - L.p;
        s2 = L.q + 4, l2 = tile_log - (L.q + 4);
        s3 = 0, l3 = L.p;
    }
    uint32_t e = (t & ((1u << l1) - 1)) << s1;
    t >>= l1;
    e |= (t & ((1u << l2) - 1)) << s2;
    t >>= l2;
    e |= (t & ((1u << l3) - 1)) << s3;
    return e;
}

BB_HD uint32_t rev4(uint32_t i) {
    return ((i & 1u) << 3) | ((i & 2u) << 1) | ((i & 4u) >> 1) | ((i & 8u) >> 3);
}

// One tile of a pass with K butterfly bits (4 <= K <= 12), as seen by one thread at a time.
template <int K>
struct Tile {
    static constexpr int NR = 1 + (K - 1) / 4;   // rounds
    static constexpr int R0 = K - 4 * (NR - 1);  // stages of round 0 (1..4)

    static BB_HD constexpr uint32_t q_of(int r) { return r == 0 ? 0u : uint32_t(R0 + 4 * (r - 1)); }
    static BB_HD constexpr uint32_t stages_of(int r) { return r == 0 ? uint32_t(R0) : 4u; }

    Pass ps;
    uint32_t tile_log;
    uint64_t base;  // the position of tile element 0

    BB_HD Tile(const Pass& p, uint64_t g) : ps(p), tile_log(K + p.c) {
        // Deposit the tile number g into the position bits outside [s0, s0+K) and
        // [cpos, cpos+c); the two ranges sorted are [r1s, r1s+r1w) below [r2s, r2s+r2w).
        uint32_t r1s, r1w, r2s, r2w;
        if (p.cpos < p.s0) {
            r1s = p.cpos, r1w = p.c, r2s = p.s0, r2w = K;
        } else {
            r1s = p.s0, r1w = K, r2s = p.cpos, r2w = p.c;
        }
        const uint32_t mid = r2s - (r1s + r1w);
        uint64_t rest = g;
        // A first pass with fewer than 16 points on the lanes reads 32-byte runs, and the
        // other half of each 64-byte access belongs to the tile whose position bit
        // r2s - 1 differs (the address bit just above the run, after reversal). Give that
        // bit the tile number's lowest bit, so the two halves go to neighbouring tiles,
        // which run together, instead of tiles 2^(mid-1) apart, which at 2^26 run 128 MiB
        // of reads apart and read every byte twice from DRAM. In a multi-pass plan only
        // passes of 9 stages have fewer than 4 coalescing bits (4096-element tiles); K > 8
        // keeps the test out of the generic kernels of fewer stages.
        const bool pair_halves = K > 8 && p.bitrev && p.c < 4 && p.cpos > p.s0 && mid > 0;
        const uint64_t low = pair_halves ? (rest & 1) : 0;
        if (pair_halves) rest >>= 1;
        const uint32_t spread = pair_halves ? mid - 1 : mid;
        const uint64_t part0 = rest & ((1ull << r1s) - 1);
        rest >>= r1s;
        const uint64_t part1 = rest & ((1ull << spread) - 1);
        rest >>= spread;
        base = part0 | (part1 << (r1s + r1w)) | (low << (r2s - 1)) | (rest << (r2s + r2w));
    }

    // The layout of round r: loads for round 0, stores for the last (when there are two or
    // more rounds), else the next five bits above the registers if they fit, else below.
    template <int r>
    BB_HD Layout layout() const {
        const uint32_t q = q_of(r);
        uint32_t p;
        if (r == NR - 1 && NR > 1) {
            p = ps.p_store;
        } else if (r == 0) {
            p = ps.p_load;
        } else if (q + 9 <= tile_log) {
            p = q + 4;
        } else if (q >= 5) {
            p = q - 5;
        } else {
            p = (q + 4) % tile_log;
        }
        return lanes_from(q, p);
    }

    // Layout {q, p}, with p moved just above the registers if it falls among them.
    BB_HD Layout lanes_from(uint32_t q, uint32_t p) const {
        return {q, p - q < 4u ? (q + 4) % tile_log : p};
    }

    // With one round, the stores may want another layout than the loads.
    BB_HD bool relayout() const { return NR == 1 && ps.p_store != ps.p_load; }
    // The stores' layout after a relayout (one round: registers on tile bits 0..3).
    BB_HD Layout store_layout() const { return lanes_from(0, ps.p_store); }

    // DIT position of tile element e.
    BB_HD uint64_t pos_of(uint32_t e) const {
        return base | ((uint64_t)(e & ((1u << K) - 1)) << ps.s0) | ((uint64_t)(e >> K) << ps.cpos);
    }

    // w_16^0..7 in Montgomery form.
    BB_HD void roots16(const uint32_t* tw, uint32_t (&c16)[8]) const {
#pragma unroll
        for (uint32_t v = 0; v < 8; v++) c16[v] = tw[v << (ps.log_n - 4)];
    }

    // Round 0's values from global memory; pos = pos_of(the thread's tile bits), registers
    // on tile bits 0..3. Register offsets stay below 2^log_n, so 32 bits hold them.
    BB_HD void load(uint32_t (&x)[16], uint64_t pos, const uint32_t* src) const {
        if (ps.bitrev) {
            const uint64_t nmask = (1ull << ps.log_n) - 1;
            const uint64_t a = (pos & ~nmask) | bb::bit_rev((uint32_t)(pos & nmask), ps.log_n);
            const uint32_t* p = src + a;
            const uint32_t sh = ps.log_n - 4 - ps.s0;
#pragma unroll
            for (uint32_t i = 0; i < 16; i++) x[i] = p[rev4(i) << sh];
        } else {
            const uint32_t* p = src + pos;
#pragma unroll
            for (uint32_t i = 0; i < 16; i++) x[i] = p[i << ps.s0];
        }
    }

    // Stages the pass leaves out: none, but see the LdeSource overload.
    BB_HD static constexpr uint32_t stages_skipped(const uint32_t*) { return 0; }

    // An LDE's first pass (ps.bitrev, ps.s0 == 0) with a blowup of 2^b: position x holds
    // a coefficient only where x's bits 0..b-1 (the source index's top b bits) are zero.
    // So each of stages 0..b-1 pairs a value with a zero, and only copies it: after the
    // first k <= b of them, x holds the value of position x with bits 0..k-1 cleared. The
    // pass skips those k = SKIP stages and loads that state instead (load() below).
    template <uint32_t SKIP>
    BB_HD static constexpr uint32_t stages_skipped(const LdeSource<SKIP>&) { return SKIP; }

    // Round 0's values of an LDE's first pass, as they stand after its skipped stages
    // 0..SKIP-1: position pos holds the source's value at pos with bits 0..SKIP-1 cleared.
    // The source at position y is coeffs[col * 2^log_small + j] * shift[j] for j = rev(y) <
    // 2^log_small, zero above (the positions with a bit in SKIP..b-1 set). Registers on
    // tile bits 0..3 (position bits 0..3): those with a bit below SKIP set are copies, made
    // by the same pairing as the stages; of the others, those whose j is past the
    // coefficients are zero and not read. Both are the same registers in every thread
    // (with a blowup of at most 16; past it the zeros differ between threads), so whole
    // warps skip those loads.
    template <uint32_t SKIP>
    BB_HD void load(uint32_t (&x)[16], uint64_t pos, const LdeSource<SKIP>& lde) const {
        const uint64_t nmask = (1ull << ps.log_n) - 1;
        const uint32_t j0 = bb::bit_rev((uint32_t)(pos & nmask), ps.log_n);
        const uint64_t col = pos >> ps.log_n;
        const uint32_t* p = lde.coeffs + (col << lde.log_small);
        const uint32_t small = 1u << lde.log_small;
        const uint32_t sh = ps.log_n - 4;
#pragma unroll
        for (uint32_t i = 0; i < 16; i++) {
            if (i & ((1u << SKIP) - 1)) continue;
            const uint32_t j = j0 + (rev4(i) << sh);
            x[i] = j < small ? bb::mont_mul(p[j], lde.shift[j]) : 0u;
        }
#pragma unroll
        for (int s = 0; s < (int)SKIP; s++)
#pragma unroll
            for (uint32_t i = 0; i < 16; i++)
                if ((i >> s) & 1u) x[i] = x[i ^ (1u << s)];
    }

    // The values to global memory; registers on tile bits q..q+3.
    BB_HD void store(const uint32_t (&x)[16], uint64_t pos, uint32_t q, uint32_t* dst) const {
        uint32_t* p = dst + pos;
        const uint32_t sh = q + ps.s0;
#pragma unroll
        for (uint32_t i = 0; i < 16; i++)
            p[i << sh] = ps.do_scale ? bb::mont_mul(x[i], ps.scale_mont) : x[i];
    }

    // e: the thread's tile bits; registers on tile bits q..q+3.
    BB_HD void to_shared(const uint32_t (&x)[16], uint32_t e, uint32_t q, uint32_t* sm) const {
        const uint32_t at = swizzle(e);
#pragma unroll
        for (uint32_t i = 0; i < 16; i++) sm[at ^ swizzle(i << q)] = x[i];
    }

    BB_HD void from_shared(uint32_t (&x)[16], uint32_t e, uint32_t q, const uint32_t* sm) const {
        const uint32_t at = swizzle(e);
#pragma unroll
        for (uint32_t i = 0; i < 16; i++) x[i] = sm[at ^ swizzle(i << q)];
    }

    // The stages of round r on this thread's 16 values (layout L), but for the pass's
    // stages below `skip` (tile bits, as stages_skipped).
    // pos: pos_of(the thread's tile bits) in round r's layout.
    //
    // Products by a twiddle are Shoup products (bb::mul_shoup) wherever the twiddle serves
    // more than one of them, so that its conversion (bb::shoup_of_mont) pays: one high
    // multiply and two low ones each, against mont_mul's wide, low and high ones. Stage 3's
    // twiddles serve one butterfly each and stay in Montgomery form.
    template <int r>
    BB_HD void butterflies(uint32_t (&x)[16], uint64_t pos, const uint32_t* tw,
                           const uint32_t (&c16)[8], uint32_t skip) const {
        constexpr uint32_t stages = stages_of(r);
        const uint32_t lo = ps.s0 + q_of(r);
        const uint32_t u = (uint32_t)(pos & ((1ull << lo) - 1));
        // W[j] = w_{2^(lo+j+1)}^u in Montgomery form, Ws[j] as a Shoup operand; the last
        // from the table, the others by squaring. lo == 0 (round 0 of a pass from stage
        // 0): u = 0, every W[j] is 1.
        const bool unit = r == 0 && lo == 0;
        uint32_t W[4];
        bb::Shoup Ws[4];
        if (!unit) {
            W[stages - 1] = tw[(uint64_t)u << (ps.log_n - lo - stages)];
            Ws[stages - 1] = bb::shoup_of_mont(W[stages - 1]);
#pragma unroll
            for (int j = 3; j > 0; j--) {
                if (j >= (int)stages) continue;
                W[j - 1] = bb::mul_shoup(W[j], Ws[j]);
                Ws[j - 1] = bb::shoup_of_mont(W[j - 1]);
            }
        }
#pragma unroll
        for (uint32_t j = 0; j < stages; j++) {
            if (q_of(r) + j < skip) continue;
            // w_v = W[j] * w_{2^(j+1)}^v for v < 2^j: wm[v] in Montgomery form (W[j]'s
            // Shoup product with the root), ws[v] as a Shoup operand in stages 0..2.
            // With unit, w_v is the root alone, and w_0 = 1 multiplies by nothing.
            const bool shoup = j < 3;
            uint32_t wm[8];
            bb::Shoup ws[8];
#pragma unroll
            for (uint32_t v = 0; v < 8; v++) {
                if (v >= (1u << j)) continue;
                if (unit) {
                    wm[v] = c16[v << (3 - j)];
                    if (shoup && v != 0) ws[v] = bb::shoup_of_mont(wm[v]);
                } else if (v == 0) {
                    wm[v] = W[j];
                    ws[v] = Ws[j];
                } else {
                    wm[v] = bb::mul_shoup(c16[v << (3 - j)], Ws[j]);
                    if (shoup) ws[v] = bb::shoup_of_mont(wm[v]);
                }
            }
#pragma unroll
            for (uint32_t i0 = 0; i0 < 16; i0++) {
                if ((i0 >> j) & 1u) continue;
                const uint32_t i1 = i0 | (1u << j);
                const uint32_t v = i0 & ((1u << j) - 1);
                const uint32_t a = x[i0];
                const uint32_t b = (unit && v == 0) ? x[i1]
                                   : shoup          ? bb::mul_shoup(x[i1], ws[v])
                                                    : bb::mont_mul(x[i1], wm[v]);
                x[i0] = bb::add(a, b);
                x[i1] = bb::sub(a, b);
            }
        }
    }

    // Phase r of a thread: get the values (global for round 0, else shared), run round r,
    // then put them to shared memory for the next phase or store them. The caller puts a
    // barrier between phases; within a phase a thread writes only the slots it read.
    // Src: a `const uint32_t*` (the pass's input) or an `LdeSource<SKIP>`.
    template <int r, class Src>
    BB_HD void phase(uint32_t t, uint32_t (&x)[16], const uint32_t (&c16)[8],
                     const Src& src, uint32_t* dst, const uint32_t* tw, uint32_t* sm) const {
        const Layout L = layout<r>();
        const uint32_t e = thread_bits(t, tile_log, L);
        const uint64_t pos = pos_of(e);
        if (r == 0) {
            load(x, pos, src);
        } else {
            from_shared(x, e, L.q, sm);
        }
        butterflies<r>(x, pos, tw, c16, stages_skipped(src));
        if (r < NR - 1 || relayout()) {
            to_shared(x, e, L.q, sm);
        } else {
            store(x, pos, L.q, dst);
        }
    }

    // After a relayout: the stores, from shared memory.
    BB_HD void final_phase(uint32_t t, uint32_t (&x)[16], uint32_t* dst, const uint32_t* sm) const {
        const Layout L = store_layout();
        const uint32_t e = thread_bits(t, tile_log, L);
        from_shared(x, e, L.q, sm);
        store(x, pos_of(e), L.q, dst);
    }
};

}  // namespace ntt
