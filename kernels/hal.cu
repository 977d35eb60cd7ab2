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
