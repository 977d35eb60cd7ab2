// Prover kernels over BabyBear: element-wise arithmetic (base field "bb" and quartic
// extension "bb4"), batched bit reversal, batched NTT (radix-2 stage kernels and a fused
// shared-memory pass kernel, and its first pass for a coset LDE), coset-LDE expansion, and Poseidon2 (row hashing, Merkle
// layers, plain permutations). Buffers hold canonical values; see babybear.cuh.
//
// Every kernel is extern "C" and loops over its work with a grid stride (or over tiles with
// a block stride), so any grid size covers any length. Counts are 64-bit.
#include "babybear.cuh"
#include "ntt.cuh"

#include <type_traits>

#define BB_GRID_STRIDE(i, n) \
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (n); \
         i += (uint64_t)gridDim.x * blockDim.x)

namespace {

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

struct OpAdd {
    __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const {
        return bb::add(a, b);
    }
};
struct OpSub {
    __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const {
        return bb::sub(a, b);
    }
};
struct OpMul {
    __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const {
        return bb::mul(a, b);
    }
};

// out[i] = op(a[i], b[i]) over n u32s; 16-byte vector accesses when all three pointers
// allow them (the usual case: pool allocations are 256-byte aligned), scalar otherwise.
template <class Op>
__device__ __forceinline__ void eltwise_bb(uint32_t* out, const uint32_t* a, const uint32_t* b,
                                           uint64_t n, Op op) {
    if (aligned16(out) && aligned16(a) && aligned16(b)) {
        uint64_t n4 = n / 4;
        uint4* o4 = reinterpret_cast<uint4*>(out);
        const uint4* a4 = reinterpret_cast<const uint4*>(a);
        const uint4* b4 = reinterpret_cast<const uint4*>(b);
        BB_GRID_STRIDE(i, n4) {
            uint4 x = a4[i];
            uint4 y = b4[i];
            o4[i] = make_uint4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
        }
        uint64_t tail = n - n4 * 4;
        BB_GRID_STRIDE(j, tail) {
            uint64_t i = n4 * 4 + j;
            out[i] = op(a[i], b[i]);
        }
    } else {
        BB_GRID_STRIDE(i, n) { out[i] = op(a[i], b[i]); }
    }
}

}  // namespace

extern "C" __global__ void eltwise_add_bb(uint32_t* out, const uint32_t* a, const uint32_t* b,
                                          uint64_t n) {
    eltwise_bb(out, a, b, n, OpAdd{});
}

extern "C" __global__ void eltwise_sub_bb(uint32_t* out, const uint32_t* a, const uint32_t* b,
                                          uint64_t n) {
    eltwise_bb(out, a, b, n, OpSub{});
}

extern "C" __global__ void eltwise_mul_bb(uint32_t* out, const uint32_t* a, const uint32_t* b,
                                          uint64_t n) {
    eltwise_bb(out, a, b, n, OpMul{});
}

// out[i] = a[i] * s (s canonical).
extern "C" __global__ void eltwise_mul_scalar_bb(uint32_t* out, const uint32_t* a, uint32_t s,
                                                 uint64_t n) {
    const uint32_t sm = bb::to_mont(s);
    if (aligned16(out) && aligned16(a)) {
        uint64_t n4 = n / 4;
        uint4* o4 = reinterpret_cast<uint4*>(out);
        const uint4* a4 = reinterpret_cast<const uint4*>(a);
        BB_GRID_STRIDE(i, n4) {
            uint4 x = a4[i];
            o4[i] = make_uint4(bb::mont_mul(x.x, sm), bb::mont_mul(x.y, sm),
                               bb::mont_mul(x.z, sm), bb::mont_mul(x.w, sm));
        }
        uint64_t tail = n - n4 * 4;
        BB_GRID_STRIDE(j, tail) {
            uint64_t i = n4 * 4 + j;
            out[i] = bb::mont_mul(a[i], sm);
        }
    } else {
        BB_GRID_STRIDE(i, n) { out[i] = bb::mont_mul(a[i], sm); }
    }
}

namespace {

__device__ __forceinline__ bb::Ext load_ext(const bb::Ext* p, uint64_t i, bool vec) {
    if (vec) {
        uint4 v = reinterpret_cast<const uint4*>(p)[i];
        return bb::Ext{{v.x, v.y, v.z, v.w}};
    }
    return p[i];
}

__device__ __forceinline__ void store_ext(bb::Ext* p, uint64_t i, const bb::Ext& e, bool vec) {
    if (vec) {
        reinterpret_cast<uint4*>(p)[i] = make_uint4(e.c[0], e.c[1], e.c[2], e.c[3]);
    } else {
        p[i] = e;
    }
}

}  // namespace

#define BB4_ELTWISE(name, fn)                                                              \
    extern "C" __global__ void name(bb::Ext* out, const bb::Ext* a, const bb::Ext* b,      \
                                    uint64_t n) {                                          \
        const bool vec = aligned16(out) && aligned16(a) && aligned16(b);                   \
        BB_GRID_STRIDE(i, n) {                                                             \
            store_ext(out, i, fn(load_ext(a, i, vec), load_ext(b, i, vec)), vec);          \
        }                                                                                  \
    }

BB4_ELTWISE(eltwise_add_bb4, bb::ext_add)
BB4_ELTWISE(eltwise_sub_bb4, bb::ext_sub)
BB4_ELTWISE(eltwise_mul_bb4, bb::ext_mul)

// out[i] = a[i] * s for an extension scalar s (by value, 16 bytes).
extern "C" __global__ void eltwise_mul_scalar_bb4(bb::Ext* out, const bb::Ext* a, bb::Ext s,
                                                  uint64_t n) {
    const bool vec = aligned16(out) && aligned16(a);
    BB_GRID_STRIDE(i, n) { store_ext(out, i, bb::ext_mul(load_ext(a, i, vec), s), vec); }
}

// ---------------------------------------------------------------------------------------
// Bit reversal and NTT.

// Swaps elements j and rev(j) of every column of 2^log_n (log_n >= 1); total = all elements.
extern "C" __global__ void batch_bit_reverse_bb(uint32_t* io, uint32_t log_n, uint64_t total) {
    const uint64_t mask = (1ull << log_n) - 1;
    BB_GRID_STRIDE(i, total) {
        uint32_t j = (uint32_t)(i & mask);
        uint32_t r = bb::bit_rev(j, log_n);
        if (j < r) {
            uint64_t base = i - j;
            uint32_t x = io[base + j];
            io[base + j] = io[base + r];
            io[base + r] = x;
        }
    }
}

// out[k] = base^k in Montgomery form, k < count (NTT twiddles, coset shift powers).
extern "C" __global__ void powers_mont_bb(uint32_t* out, uint32_t base, uint64_t count) {
    BB_GRID_STRIDE(k, count) { out[k] = bb::to_mont(bb::pow(base, k)); }
}

// One radix-2 decimation-in-time stage (half-size h = 2^stage) over every column of
// 2^log_n elements already in bit-reversed order; total = butterflies = columns * n / 2.
// tw[k] = w_n^k in Montgomery form, k < n/2. With do_scale, both outputs are multiplied by
// scale_mont (Montgomery form: the inverse NTT's 1/n on its last stage).
extern "C" __global__ void ntt_stage_bb(uint32_t* io, const uint32_t* tw, uint32_t log_n,
                                        uint32_t stage, uint64_t total, uint32_t scale_mont,
                                        uint32_t do_scale) {
    const uint64_t half_mask = (1ull << stage) - 1;
    const uint64_t bfly_per_col_mask = (1ull << (log_n - 1)) - 1;
    BB_GRID_STRIDE(t, total) {
        uint64_t col = t >> (log_n - 1);
        uint64_t b = t & bfly_per_col_mask;
        uint64_t j = b & half_mask;
        uint64_t blk = b >> stage;
        uint64_t i0 = (col << log_n) + (blk << (stage + 1)) + j;
        uint64_t i1 = i0 + (1ull << stage);
        uint32_t u = io[i0];
        uint32_t v = bb::mont_mul(io[i1], __ldg(&tw[j << (log_n - 1 - stage)]));
        uint32_t x = bb::add(u, v);
        uint32_t y = bb::sub(u, v);
        if (do_scale) {
            x = bb::mont_mul(x, scale_mont);
            y = bb::mont_mul(y, scale_mont);
        }
        io[i0] = x;
        io[i1] = y;
    }
}

template <int K, int R, class Src>
__device__ __forceinline__ void ntt_rounds(const ntt::Tile<K>& tile, uint32_t (&x)[16],
                                           const uint32_t (&c16)[8], const Src& src,
                                           uint32_t* dst, const uint32_t* tw, uint32_t* sm) {
    tile.template phase<R>(threadIdx.x, x, c16, src, dst, tw, sm);
    if constexpr (R + 1 < ntt::Tile<K>::NR) {
        __syncthreads();
        ntt_rounds<K, R + 1>(tile, x, c16, src, dst, tw, sm);
    }
}

// Fused NTT passes (kernels/ntt.cuh): one block per tile of 2^(K + c) elements,
// 2^(K + c - 4) <= 256 threads, 4 << (K + c) bytes of dynamic shared memory. src == null:
// in place. Five 256-thread blocks per SM (48 registers): on an H100 this measured 10%
// faster for 2^24 than two 512-thread blocks, and those 25% faster than letting the
// compiler pick (the same 64 registers with a worse schedule). A per-block table of round
// 0's twiddles (made once per block instead of once per thread) measured 15% slower.
// Src: the input (`const uint32_t*`, null for in place) or an LDE's `ntt::LdeSource<SKIP>`.
template <int K, class Src>
__device__ __forceinline__ void ntt_pass(uint32_t* dst, Src src, const uint32_t* tw,
                                         const ntt::Pass& ps, uint64_t num_tiles) {
    extern __shared__ uint32_t sm[];
    if (blockIdx.x >= num_tiles) return;
    if constexpr (std::is_pointer_v<Src>) {
        if (src == nullptr) src = dst;
    }
    const ntt::Tile<K> tile(ps, blockIdx.x);
    uint32_t x[16], c16[8];
    tile.roots16(tw, c16);
    ntt_rounds<K, 0>(tile, x, c16, src, dst, tw, sm);
    if (tile.relayout()) {
        __syncthreads();
        tile.final_phase(threadIdx.x, x, dst, sm);
    }
}

#define NTT_PASS_KERNEL(K)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 5) ntt_pass_k##K##_bb(                     \
        uint32_t* dst, const uint32_t* src, const uint32_t* tw, uint32_t log_n, uint32_t s0,  \
        uint32_t c, uint32_t cpos, uint32_t bitrev, uint32_t p_load, uint32_t p_store,        \
        uint32_t do_scale, uint32_t scale_mont, uint64_t num_tiles) {                         \
        const ntt::Pass ps{log_n, s0, c, cpos, bitrev, p_load, p_store, do_scale, scale_mont}; \
        ntt_pass<K>(dst, src, tw, ps, num_tiles);                                             \
    }
NTT_PASS_KERNEL(4)
NTT_PASS_KERNEL(5)
NTT_PASS_KERNEL(6)
NTT_PASS_KERNEL(7)
NTT_PASS_KERNEL(8)
NTT_PASS_KERNEL(9)
NTT_PASS_KERNEL(10)
NTT_PASS_KERNEL(11)
NTT_PASS_KERNEL(12)
#undef NTT_PASS_KERNEL

// Pass `I` of a 2^LOG_N-point NTT compiled for it: ntt_pass<K> with every parameter of
// its plan a constant, so the compiler folds the strides, layouts and twiddle indices that
// ntt_pass_k*_bb computes from its arguments (its code for sm_90 is about half as long). A
// 2^24 NTT's three passes took 152 us against 184 us in a probe on an H200. The arguments
// are those of ntt_pass_k*_bb; only the pointers, the inverse's scale and the tile count
// are read. build.rs instantiates one for each pass of every plan (a single-pass one planned
// for 32 columns, which serves any multiple of min(32, 2^(12 - log_n))), from the plan in
// src/ntt_plan.rs, by which the crate launches them. With the one pass of 2^12 points,
// 2^10 -> 2^12 LDEs over 4096 columns took 67-68 us against 78 us with
// ntt_lde_pass_k12_bb (H100, 2026-11-27).
#define NTT_FIXED_PASS(LOG_N, I, K, S0, C, CPOS, BITREV, P_LOAD, P_STORE)                        \
    extern "C" __global__ void __launch_bounds__(256, 5) ntt_pass_n##LOG_N##_##I##_bb(            \
        uint32_t* dst, const uint32_t* src, const uint32_t* tw, uint32_t, uint32_t, uint32_t,   \
        uint32_t, uint32_t, uint32_t, uint32_t, uint32_t do_scale, uint32_t scale_mont,         \
        uint64_t num_tiles) {                                                                   \
        const ntt::Pass ps{LOG_N, S0, C, CPOS, BITREV, P_LOAD, P_STORE, do_scale, scale_mont};  \
        ntt_pass<K>(dst, src, tw, ps, num_tiles);                                               \
    }

// A coset LDE's first pass (kernels/ntt.cuh, `LdeSource`): ntt_pass_k*_bb's arguments with
// the coefficients as src (never null), then the shift powers (Montgomery form) and
// log_small. The expanded column is never written: this pass reads only the coefficients.
// with_lde_source picks one of three copies of the pass by the blowup (ntt.cuh,
// LDE_MAX_SKIP): with all three, the 9-stage first passes compiled per size
// (ntt_lde_pass_n17_0_bb, n18_0, n25_0 to n27_0) spill 8 bytes for sm_90 since the Shoup
// twiddles (eb7c219), and still ran faster; 2^10 -> 2^12 over 4096 columns ran 18% faster
// than with no stage skipped (H100, 2026-11-27). Compiled with __launch_bounds__(256, 4)
// (63 registers, no spill), they and ntt_pass_n11_0/n12_0 ran no faster (H200 A/B,
// 2026-11-28: every NTT and LDE row within 2%).
#define NTT_LDE_PASS_KERNEL(K)                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 5) ntt_lde_pass_k##K##_bb(                 \
        uint32_t* dst, const uint32_t* coeffs, const uint32_t* tw, uint32_t log_n, uint32_t s0, \
        uint32_t c, uint32_t cpos, uint32_t bitrev, uint32_t p_load, uint32_t p_store,          \
        uint32_t do_scale, uint32_t scale_mont, uint64_t num_tiles, const uint32_t* shift,      \
        uint32_t log_small) {                                                                   \
        const ntt::Pass ps{log_n, s0, c, cpos, bitrev, p_load, p_store, do_scale, scale_mont};  \
        ntt::with_lde_source(coeffs, shift, log_small, log_n,                                  \
                             [&](auto src) { ntt_pass<K>(dst, src, tw, ps, num_tiles); });     \
    }
NTT_LDE_PASS_KERNEL(4)
NTT_LDE_PASS_KERNEL(5)
NTT_LDE_PASS_KERNEL(6)
NTT_LDE_PASS_KERNEL(7)
NTT_LDE_PASS_KERNEL(8)
NTT_LDE_PASS_KERNEL(9)
NTT_LDE_PASS_KERNEL(10)
NTT_LDE_PASS_KERNEL(11)
NTT_LDE_PASS_KERNEL(12)
#undef NTT_LDE_PASS_KERNEL

// The first pass of a 2^LOG_N-point NTT compiled for it (as NTT_FIXED_PASS), reading an
// LDE's source: the arguments of ntt_lde_pass_k*_bb. build.rs instantiates one for the
// first pass of every plan.
#define NTT_FIXED_LDE_PASS(LOG_N, K, S0, C, CPOS, BITREV, P_LOAD, P_STORE)                       \
    extern "C" __global__ void __launch_bounds__(256, 5) ntt_lde_pass_n##LOG_N##_0_bb(            \
        uint32_t* dst, const uint32_t* coeffs, const uint32_t* tw, uint32_t, uint32_t, uint32_t, \
        uint32_t, uint32_t, uint32_t, uint32_t, uint32_t do_scale, uint32_t scale_mont,          \
        uint64_t num_tiles, const uint32_t* shift, uint32_t log_small) {                         \
        const ntt::Pass ps{LOG_N, S0, C, CPOS, BITREV, P_LOAD, P_STORE, do_scale, scale_mont};   \
        ntt::with_lde_source(coeffs, shift, log_small, LOG_N,                                    \
                             [&](auto src) { ntt_pass<K>(dst, src, tw, ps, num_tiles); });       \
    }

// Coset LDE, step 1 where the NTT does not read the coefficients itself (the radix-2
// path, or `HalConfig::lde_fused_expand` off): out column c (2^(log_n + log_blowup) elements) = column c of coeffs
// times shift^j (shift_pows[j] = shift^j in Montgomery form), zero-padded.
extern "C" __global__ void lde_expand_bb(uint32_t* out, const uint32_t* coeffs,
                                         const uint32_t* shift_pows, uint32_t log_n,
                                         uint32_t log_blowup, uint64_t total_out) {
    const uint32_t log_big = log_n + log_blowup;
    const uint64_t big_mask = (1ull << log_big) - 1;
    const uint64_t n = 1ull << log_n;
    BB_GRID_STRIDE(o, total_out) {
        uint64_t j = o & big_mask;
        uint32_t v = 0;
        if (j < n) {
            uint64_t col = o >> log_big;
            v = bb::mont_mul(coeffs[(col << log_n) + j], shift_pows[j]);
        }
        out[o] = v;
    }
}

// ---------------------------------------------------------------------------------------
// Poseidon2. `consts` is the constant table described in babybear.cuh; each block
// copies it into shared memory first (every thread reads every constant).

typedef const volatile uint32_t* P2Tbl;

template <int W>
__device__ __forceinline__ P2Tbl p2_stage_consts(uint32_t* shared, const uint32_t* consts) {
    for (int i = threadIdx.x; i < bb::P2Params<W>::TABLE_LEN; i += blockDim.x) shared[i] = consts[i];
    __syncthreads();
    return shared;
}

// Digest of each row of a column-major rows x cols matrix: width-16 overwrite sponge,
// rate 8 (see src/poseidon2/mod.rs, hash_iter). out holds 8 u32 per row.
extern "C" __global__ void poseidon2_hash_rows_bb(uint32_t* out, const uint32_t* matrix,
                                                  const uint32_t* consts, uint64_t rows,
                                                  uint64_t cols) {
    __shared__ uint32_t t_sh[bb::P2Params<16>::TABLE_LEN];
    P2Tbl t = p2_stage_consts<16>(t_sh, consts);
    BB_GRID_STRIDE(r, rows) {
        uint32_t s[16];
#pragma unroll
        for (int i = 0; i < 16; i++) s[i] = 0;
        for (uint64_t c0 = 0; c0 < cols; c0 += 8) {
            uint64_t left = cols - c0;
            if (left >= 8) {
#pragma unroll
                for (int i = 0; i < 8; i++) s[i] = bb::to_mont(matrix[(c0 + i) * rows + r]);
            } else {
                // The last, partial chunk overwrites only its own slots.
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if ((uint64_t)i < left) s[i] = bb::to_mont(matrix[(c0 + i) * rows + r]);
                }
            }
            bb::p2_permute_mont<16, P2Tbl>(s, t);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) out[r * 8 + i] = bb::from_mont(s[i]);
    }
}

// One Merkle layer: out[i] = permute(in[2i] || in[2i+1])[0..8], digests of 8 u32.
extern "C" __global__ void poseidon2_merkle_layer_bb(uint32_t* out, const uint32_t* in,
                                                     const uint32_t* consts, uint64_t n_out) {
    __shared__ uint32_t t_sh[bb::P2Params<16>::TABLE_LEN];
    P2Tbl t = p2_stage_consts<16>(t_sh, consts);
    BB_GRID_STRIDE(i, n_out) {
        uint32_t s[16];
#pragma unroll
        for (int j = 0; j < 16; j++) s[j] = bb::to_mont(in[i * 16 + j]);
        bb::p2_permute_mont<16, P2Tbl>(s, t);
#pragma unroll
        for (int j = 0; j < 8; j++) out[i * 8 + j] = bb::from_mont(s[j]);
    }
}

// Permutes n independent states of W canonical elements in place (state i is
// states[i*W .. (i+1)*W]).
template <int W>
__device__ __forceinline__ void p2_permute_states(uint32_t* states, const uint32_t* consts,
                                                  uint64_t n) {
    __shared__ uint32_t t_sh[bb::P2Params<W>::TABLE_LEN];
    P2Tbl t = p2_stage_consts<W>(t_sh, consts);
    BB_GRID_STRIDE(i, n) {
        uint32_t s[W];
#pragma unroll
        for (int j = 0; j < W; j++) s[j] = states[i * W + j];
        bb::p2_permute_canonical<W, P2Tbl>(s, t);
#pragma unroll
        for (int j = 0; j < W; j++) states[i * W + j] = s[j];
    }
}

extern "C" __global__ void poseidon2_permute_bb16(uint32_t* states, const uint32_t* consts,
                                                  uint64_t n) {
    p2_permute_states<16>(states, consts, n);
}

extern "C" __global__ void poseidon2_permute_bb24(uint32_t* states, const uint32_t* consts,
                                                  uint64_t n) {
    p2_permute_states<24>(states, consts, n);
}
