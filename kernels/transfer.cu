// Kernels for coalesced transfers: scatter many segments of one staged upload to their
// destinations, gather many segments into one contiguous download, and gather many single
// elements into one.
#include <stdint.h>

struct Segment {
    uint64_t src_offset;  // byte offset in the staged data
    uint64_t dst;         // device address (the source, for gather_segments)
    uint64_t len;         // bytes
};

// Copies the `n` words of type W from `src` to `dst` with the block's threads, four loads
// in flight per thread before their stores: where one side is host memory read over the bus
// (a mapped batch), a block's throughput is what it has in flight per round trip.
template <typename W>
__device__ __forceinline__ void copy_words(W* dst, const W* src, uint64_t n) {
    const uint64_t step = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + 3 * step < n; i += 4 * step) {
        const W a = src[i], b = src[i + step], c = src[i + 2 * step], d = src[i + 3 * step];
        dst[i] = a;
        dst[i + step] = b;
        dst[i + 2 * step] = c;
        dst[i + 3 * step] = d;
    }
    for (; i < n; i += step) dst[i] = src[i];
}

// Copies `len` bytes from `src` to `dst` with the block's threads: 16-byte words where both
// addresses are 16-byte aligned, else 4-byte words where both are 4-byte aligned, else
// bytes; the tail past the last whole word in bytes.
__device__ __forceinline__ void copy_segment(uint8_t* dst, const uint8_t* src, uint64_t len) {
    const uint64_t align = (uint64_t)src | (uint64_t)dst;
    uint64_t done = 0;
    if ((align & 15) == 0) {
        copy_words(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), len / 16);
        done = len & ~(uint64_t)15;
    } else if ((align & 3) == 0) {
        copy_words(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src),
                   len / 4);
        done = len & ~(uint64_t)3;
    }
    for (uint64_t i = done + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
}

// One block per segment (grid-stride over segments): data + src_offset -> dst.
extern "C" __global__ void scatter_segments(const Segment* segs, const uint8_t* data, uint32_t count) {
    for (uint32_t s = blockIdx.x; s < count; s += gridDim.x) {
        const Segment g = segs[s];
        copy_segment(reinterpret_cast<uint8_t*>(g.dst), data + g.src_offset, g.len);
    }
}

// The reverse, for a coalesced download: dst (the segment's device address) -> data +
// src_offset, one block per segment.
extern "C" __global__ void gather_segments(const Segment* segs, uint8_t* data, uint32_t count) {
    for (uint32_t s = blockIdx.x; s < count; s += gridDim.x) {
        const Segment g = segs[s];
        copy_segment(data + g.src_offset, reinterpret_cast<const uint8_t*>(g.dst), g.len);
    }
}

// out[i] = *addrs[i], elem_bytes each.
extern "C" __global__ void gather_elements(const uint64_t* addrs, uint8_t* out, uint64_t count,
                                           uint32_t elem_bytes) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint8_t* src = reinterpret_cast<const uint8_t*>(addrs[i]);
        uint8_t* dst = out + i * elem_bytes;
        if (((addrs[i] | elem_bytes) & 3) == 0) {
            for (uint32_t w = 0; w < elem_bytes / 4; ++w)
                reinterpret_cast<uint32_t*>(dst)[w] = reinterpret_cast<const uint32_t*>(src)[w];
        } else {
            for (uint32_t b = 0; b < elem_bytes; ++b) dst[b] = src[b];
        }
    }
}

// A test helper: each block waits until the host sets *gate (mapped host memory), then the
// grid copies in[0..n) to out. It holds a read of `in` queued for as long as a test needs.
extern "C" __global__ void copy_after_gate_u32(uint32_t* out, const uint32_t* in, uint64_t n,
                                               const volatile uint32_t* gate) {
    if (threadIdx.x == 0) {
        while (*gate == 0) __nanosleep(1000);
    }
    __syncthreads();
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        out[i] = in[i];
    }
}

// A compute-bound map used by the pipeline benchmark and tests: `rounds` LCG steps per element.
extern "C" __global__ void lcg_rounds_u32(uint32_t* out, const uint32_t* in, uint64_t n, uint32_t rounds) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t x = in[i];
        for (uint32_t r = 0; r < rounds; ++r) x = x * 1664525u + 1013904223u;
        out[i] = x;
    }
}
