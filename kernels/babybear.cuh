// BabyBear field arithmetic (p = 15 * 2^27 + 1), its quartic extension F_p[x]/(x^4 - 11)
// and the Poseidon2 permutation, for the prover kernels in babybear.cu.
//
// Buffers hold CANONICAL values in [0, p). Internally some code uses Montgomery form
// (x~ = x * 2^32 mod p): mont_mul(a~, b) = a * b for canonical b, so a product of two
// canonical values is one conversion plus one Montgomery multiplication, and a table kept in
// Montgomery form (NTT twiddles, Poseidon2 constants) costs one multiplication per use.
//
// Every function is __host__ __device__ so that the same code can be checked on the CPU
// (kernels/host_check/host_check.cpp compiles this header for the host and compares it with
// known answers).
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define BB_HD __host__ __device__ __forceinline__
#else
#define BB_HD inline
#endif

namespace bb {

constexpr uint32_t P = 0x78000001u;          // 2013265921
constexpr uint32_t P_NEG_INV = 0x77ffffffu;  // -p^-1 mod 2^32
constexpr uint32_t R_MOD_P = 0x0ffffffeu;    // 2^32 mod p (1 in Montgomery form)
constexpr uint32_t R2_MOD_P = 0x45dddde3u;   // 2^64 mod p
constexpr uint32_t W_MONT = 0x37ffffe9u;     // 11 * 2^32 mod p (x^4 = 11, Montgomery form)

BB_HD uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

// x mod p for x < 2p: when x < p, x - p wraps to above 2^31 and the min picks x.
BB_HD uint32_t reduce_once(uint32_t x) { return umin(x, x - P); }

// a + b for a, b < p. 2p < 2^32, so the sum cannot wrap.
BB_HD uint32_t add(uint32_t a, uint32_t b) { return reduce_once(a + b); }

// a - b for a, b < p: d = a - b wraps when a < b, and then d + p (which wraps back to
// p - (b - a) < p) is the smaller; when a >= b, d < p <= d + p.
BB_HD uint32_t sub(uint32_t a, uint32_t b) {
    uint32_t d = a - b;
    return umin(d, d + P);
}

// x * 2^-32 mod p, canonical, for x < p * 2^32.
// m = x * (-p^-1) mod 2^32 makes x + m*p divisible by 2^32; x + m*p < 2p * 2^32 < 2^64, so
// the 64-bit sum does not wrap, and the quotient is < 2p.
BB_HD uint32_t mont_reduce(uint64_t x) {
    uint32_t m = (uint32_t)x * P_NEG_INV;
    uint32_t t = (uint32_t)((x + (uint64_t)m * P) >> 32);
    return reduce_once(t);
}

// x * w mod p for a constant w < p, with w_q = floor(w * 2^32 / p) (Shoup): q = hi(x * w_q)
// is floor(x * w / p) or one less, so x * w - q * p lies in [0, 2p) and its low 32 bits
// are the whole of it. Any x < 2^32; a Montgomery-form x gives a Montgomery-form product.
// One high multiply and two low ones, against the wide, low and high ones of mont_mul.
BB_HD uint32_t mul_shoup(uint32_t x, uint32_t w, uint32_t w_q) {
#ifdef __CUDA_ARCH__
    const uint32_t q = __umulhi(x, w_q);
#else
    const uint32_t q = (uint32_t)(((uint64_t)x * w_q) >> 32);
#endif
    return reduce_once(x * w - q * P);
}

// A constant as Shoup's operand: w < p and w_q = floor(w * 2^32 / p) (mul_shoup).
struct Shoup {
    uint32_t w, q;
};

BB_HD uint32_t mul_shoup(uint32_t x, Shoup s) { return mul_shoup(x, s.w, s.q); }

// The Shoup operand of a value w given in Montgomery form, wm = w * 2^32 mod p with
// 0 < wm < p (a root of unity, never zero). w * 2^32 = w_q * p + wm with w_q < 2^32, so
// w_q = -wm * p^-1 mod 2^32 = wm * P_NEG_INV, one low multiply. And w = (w_q * p + wm) /
// 2^32 = hi(w_q * p) + 1: the low half of w_q * p is 2^32 - wm, so adding wm carries one.
// It costs one low and one high multiply; each product then taken as mul_shoup(x, ...)
// instead of mont_mul(x, wm) saves a wide multiply (the NTT's butterflies, kernels/ntt.cuh).
BB_HD Shoup shoup_of_mont(uint32_t wm) {
    const uint32_t q = wm * P_NEG_INV;
#ifdef __CUDA_ARCH__
    return {__umulhi(q, P) + 1, q};
#else
    return {(uint32_t)(((uint64_t)q * P) >> 32) + 1, q};
#endif
}

// a * b * 2^-32 mod p; needs a < p (b any u32) so that a*b < p * 2^32.
BB_HD uint32_t mont_mul(uint32_t a, uint32_t b) {
    return mont_reduce((uint64_t)a * b);
}

BB_HD uint32_t to_mont(uint32_t a) { return mont_mul(a, R2_MOD_P); }
BB_HD uint32_t from_mont(uint32_t a) { return mont_reduce(a); }

// Canonical a * b.
BB_HD uint32_t mul(uint32_t a, uint32_t b) { return mont_mul(to_mont(a), b); }

// Canonical a^e.
BB_HD uint32_t pow(uint32_t a, uint64_t e) {
    uint32_t base = to_mont(a);
    uint32_t acc = R_MOD_P;  // 1, Montgomery form
    while (e != 0) {
        if (e & 1) acc = mont_mul(acc, base);
        base = mont_mul(base, base);
        e >>= 1;
    }
    return from_mont(acc);
}

// Quartic extension element, low coefficient first (same layout as the Rust ExtElem).
struct Ext {
    uint32_t c[4];
};

BB_HD Ext ext_add(const Ext& a, const Ext& b) {
    Ext r;
    for (int i = 0; i < 4; i++) r.c[i] = add(a.c[i], b.c[i]);
    return r;
}

BB_HD Ext ext_sub(const Ext& a, const Ext& b) {
    Ext r;
    for (int i = 0; i < 4; i++) r.c[i] = sub(a.c[i], b.c[i]);
    return r;
}

// (a0 + a1 x + a2 x^2 + a3 x^3)(b0 + ...) with x^4 = 11.
BB_HD Ext ext_mul(const Ext& a, const Ext& b) {
    uint32_t am[4];
    for (int i = 0; i < 4; i++) am[i] = to_mont(a.c[i]);
    // p_ij = a_i * b_j, canonical.
#define BB_P(i, j) mont_mul(am[i], b.c[j])
    uint32_t c0 = BB_P(0, 0);
    uint32_t c1 = add(BB_P(0, 1), BB_P(1, 0));
    uint32_t c2 = add(add(BB_P(0, 2), BB_P(1, 1)), BB_P(2, 0));
    uint32_t c3 = add(add(BB_P(0, 3), BB_P(1, 2)), add(BB_P(2, 1), BB_P(3, 0)));
    uint32_t h4 = add(add(BB_P(1, 3), BB_P(2, 2)), BB_P(3, 1));  // x^4 terms
    uint32_t h5 = add(BB_P(2, 3), BB_P(3, 2));                   // x^5 terms
    uint32_t h6 = BB_P(3, 3);                                    // x^6 terms
#undef BB_P
    Ext r;
    // mont_mul(h, 11 * 2^32) = 11 * h.
    r.c[0] = add(c0, mont_mul(h4, W_MONT));
    r.c[1] = add(c1, mont_mul(h5, W_MONT));
    r.c[2] = add(c2, mont_mul(h6, W_MONT));
    r.c[3] = c3;
    return r;
}

// a * s for a base-field scalar s given in Montgomery form.
BB_HD Ext ext_mul_base_mont(const Ext& a, uint32_t s_mont) {
    Ext r;
    for (int i = 0; i < 4; i++) r.c[i] = mont_mul(a.c[i], s_mont);
    return r;
}

// ---------------------------------------------------------------------------------------
// Poseidon2 over Montgomery-form states.
//
// Constant table layout (u32), width W, R_F = 8, R_P partial rounds:
//   [0, 4W)              round constants of the 4 initial full rounds (round-major)
//   [4W, 4W + R_P)       partial-round constants
//   [4W + R_P, 8W + R_P) round constants of the 4 final full rounds
//   [8W + R_P, 9W + R_P) internal diagonal mu_i (y_i = mu_i x_i + sum_j x_j), canonical
//   [9W + R_P, 10W + R_P) floor(mu_i * 2^32 / p), for mul_shoup
// The round constants are in Montgomery form.
// The Rust side (Poseidon2::device_table in src/poseidon2/mod.rs) builds it from grain.rs's
// parameters.

template <int W>
struct P2Params;
template <>
struct P2Params<16> {
    static constexpr int RP = 13;
    static constexpr int TABLE_LEN = 10 * 16 + RP;
};
template <>
struct P2Params<24> {
    static constexpr int RP = 21;
    static constexpr int TABLE_LEN = 10 * 24 + RP;
};

BB_HD uint32_t p2_sbox(uint32_t x) {
    uint32_t x2 = mont_mul(x, x);
    uint32_t x4 = mont_mul(x2, x2);
    uint32_t x6 = mont_mul(x4, x2);
    return mont_mul(x6, x);
}

// M4 = [[5,7,1,3],[4,6,1,1],[1,3,5,7],[1,1,4,6]] on one block (additions only; linear, so
// it is the same in Montgomery form).
BB_HD void p2_m4(uint32_t* x) {
    uint32_t t0 = add(x[0], x[1]);
    uint32_t t1 = add(x[2], x[3]);
    uint32_t t2 = add(add(x[1], x[1]), t1);  // 2x1 + x2 + x3
    uint32_t t3 = add(add(x[3], x[3]), t0);  // x0 + x1 + 2x3
    uint32_t t1_2 = add(t1, t1);
    uint32_t t4 = add(add(t1_2, t1_2), t3);  // x0 + x1 + 4x2 + 6x3
    uint32_t t0_2 = add(t0, t0);
    uint32_t t5 = add(add(t0_2, t0_2), t2);  // 4x0 + 6x1 + x2 + x3
    uint32_t t6 = add(t3, t5);               // 5x0 + 7x1 + x2 + 3x3
    uint32_t t7 = add(t2, t4);               // x0 + 3x1 + 5x2 + 7x3
    x[0] = t6;
    x[1] = t5;
    x[2] = t7;
    x[3] = t4;
}

// circ(2*M4, M4, ..., M4): M4 on each block, then each element gets the sum over blocks of
// the elements in its position.
template <int W>
BB_HD void p2_external(uint32_t* s) {
#pragma unroll
    for (int b = 0; b < W / 4; b++) p2_m4(s + 4 * b);
    uint32_t sums[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sums[i] = s[i];
#pragma unroll
        for (int b = 1; b < W / 4; b++) sums[i] = add(sums[i], s[4 * b + i]);
    }
#pragma unroll
    for (int i = 0; i < W; i++) s[i] = add(s[i], sums[i % 4]);
}

// Tables are read through `Tbl` (`const uint32_t*`, or `const volatile uint32_t*` in the
// kernels: that keeps the compiler from hoisting the ~160 constants of a block-stride loop
// into registers, which costs occupancy; shared-memory broadcast loads are cheap).
template <int W, class Tbl>
BB_HD void p2_full_round(uint32_t* s, Tbl rc) {
#pragma unroll
    for (int i = 0; i < W; i++) s[i] = p2_sbox(add(s[i], rc[i]));
    p2_external<W>(s);
}

// Permutes a Montgomery-form state with a Montgomery-form constant table `t`.
template <int W, class Tbl>
BB_HD void p2_permute_mont(uint32_t* s, Tbl t) {
    constexpr int RP = P2Params<W>::RP;
    Tbl ext_init = t;
    Tbl internal = t + 4 * W;
    Tbl ext_final = t + 4 * W + RP;
    Tbl diag = t + 8 * W + RP;
    Tbl diag_q = t + 9 * W + RP;
    p2_external<W>(s);
    // No round loop is unrolled. Unrolled, the full rounds made the width-16 permutation
    // 78 KB of SASS, and warps spent 37% of their cycles between issues waiting on
    // instruction fetch (ncu, H100); as loops (27 KB) it runs 17% faster. Unrolling the
    // partial rounds also crashes cicc (CUDA 13, compute_90) when the permutation sits in
    // a loop (the row-hash sponge).
#pragma unroll 1
    for (int r = 0; r < 4; r++) p2_full_round<W, Tbl>(s, ext_init + r * W);
#pragma unroll 1
    for (int r = 0; r < RP; r++) {
        s[0] = p2_sbox(add(s[0], internal[r]));
        uint32_t sum = s[0];
#pragma unroll
        for (int i = 1; i < W; i++) sum = add(sum, s[i]);
#pragma unroll
        for (int i = 0; i < W; i++) s[i] = add(mul_shoup(s[i], diag[i], diag_q[i]), sum);
    }
#pragma unroll 1
    for (int r = 0; r < 4; r++) p2_full_round<W, Tbl>(s, ext_final + r * W);
}

// Permutes a canonical state (converts in and out).
template <int W, class Tbl>
BB_HD void p2_permute_canonical(uint32_t* s, Tbl t) {
#pragma unroll
    for (int i = 0; i < W; i++) s[i] = to_mont(s[i]);
    p2_permute_mont<W, Tbl>(s, t);
#pragma unroll
    for (int i = 0; i < W; i++) s[i] = from_mont(s[i]);
}

// Bits 0..bits-1 of x reversed (bits <= 32; 0 gives 0).
BB_HD uint32_t bit_rev(uint32_t x, uint32_t bits) {
    if (bits == 0) return 0;
#ifdef __CUDA_ARCH__
    return __brev(x) >> (32 - bits);
#else
    uint32_t r = 0;
    for (uint32_t i = 0; i < bits; i++) r |= ((x >> i) & 1u) << (bits - 1 - i);
    return r;
#endif
}

}  // namespace bb
