// Kernels the HAL itself needs: fill and element-wise arithmetic.
// Every kernel is extern "C" (unmangled) and uses a grid-stride loop over a 64-bit count,
// so any launch shape covers any length.
#include <stdint.h>

#define GRID_STRIDE(i, n) \
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (n); \
         i += (uint64_t)gridDim.x * blockDim.x)

extern "C" __global__ void fill_u32(uint32_t* out, uint32_t value, uint64_t n) {
    GRID_STRIDE(i, n) { out[i] = value; }
}

extern "C" __global__ void fill_u64(uint64_t* out, uint64_t value, uint64_t n) {
    GRID_STRIDE(i, n) { out[i] = value; }
}

// Elements of `words` 32-bit words (1..8: any multiple of 4 bytes up to 32), each set to
// the pattern lo.x, lo.y, lo.z, lo.w, hi.x, ... (its first `words` words).
extern "C" __global__ void fill_words_u32(uint32_t* out, uint4 lo, uint4 hi, uint32_t words,
                                          uint64_t n) {
    const uint32_t p[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    GRID_STRIDE(i, n) {
        uint32_t* e = out + i * words;
#pragma unroll
        for (uint32_t w = 0; w < 8; w++)
            if (w < words) e[w] = p[w];
    }
}

#define ELTWISE(name, T, op)                                                          \
    extern "C" __global__ void name(T* out, const T* a, const T* b, uint64_t n) {     \
        GRID_STRIDE(i, n) { out[i] = a[i] op b[i]; }                                  \
    }

// u32 arithmetic wraps modulo 2^32; f32 follows IEEE-754 round-to-nearest.
ELTWISE(eltwise_add_u32, uint32_t, +)
ELTWISE(eltwise_mul_u32, uint32_t, *)
ELTWISE(eltwise_add_f32, float, +)
ELTWISE(eltwise_mul_f32, float, *)

// Writes through an arbitrary address: used only by the tests of context poisoning.
extern "C" __global__ void poke_address(uint64_t address, uint32_t value) {
    *reinterpret_cast<volatile uint32_t*>(address) = value;
}
