// Host-side check of kernels/babybear.cuh: compiled with a plain C++ compiler (no CUDA) by
// tests/kernel_host_check.rs, which feeds it commands on stdin and compares every answer
// with the Rust field and Poseidon2 code. One command per line, one answer line each:
//   add a b | sub a b | mul a b | pow a e | ext a0 a1 a2 a3 b0 b1 b2 b3 | rev x bits
//   table16 <173 u32> | table24 <261 u32>       (Poseidon2 tables, babybear.cuh's layout; no answer)
//   p16 <16 u32> | p24 <24 u32>                 (canonical states; answer: the permutation)
//   nttpass K log_n s0 c cpos bitrev p_load p_store do_scale scale_mont in_place len
//           <len u32 src> [<len u32 dst> unless in_place] <2^(log_n-1) u32 twiddles>
//                                               (answer: dst after one ntt_pass_k{K}_bb
//                                                launch, run thread by thread, phase by
//                                                phase, with the kernel's own code)
//   ldepass K log_n s0 c cpos bitrev p_load p_store do_scale scale_mont log_small len
//           <len >> (log_n - log_small) u32 coefficients> <2^log_small u32 shift powers>
//           <len u32 dst> <2^(log_n-1) u32 twiddles>
//                                               (answer: dst after one ntt_lde_pass_k{K}_bb
//                                                launch, run the same way)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../babybear.cuh"
#include "../ntt.cuh"

namespace {

struct Regs {
    uint32_t x[16];
    uint32_t c16[8];
};

template <int K, int R, class Src>
void host_rounds(const ntt::Tile<K>& tile, std::vector<Regs>& regs, const Src& src,
                 uint32_t* dst, const uint32_t* tw, uint32_t* sm) {
    // Each phase runs for every thread before the next starts: the kernel's barriers.
    // Inside a phase, one thread at a time: one of the interleavings the GPU may run.
    for (uint32_t t = 0; t < regs.size(); t++)
        tile.template phase<R>(t, regs[t].x, regs[t].c16, src, dst, tw, sm);
    if constexpr (R + 1 < ntt::Tile<K>::NR) host_rounds<K, R + 1>(tile, regs, src, dst, tw, sm);
}

// One launch of ntt_pass_k{K}_bb (src a pointer) or ntt_lde_pass_k{K}_bb (an LdeSource):
// every block (tile) in turn, as the kernels in babybear.cu.
template <int K, class Src>
void host_pass(const ntt::Pass& ps, const Src& src, uint32_t* dst, const uint32_t* tw,
               uint64_t len) {
    const uint32_t tile_log = K + ps.c;
    std::vector<uint32_t> sm(1u << tile_log);
    std::vector<Regs> regs(1u << (tile_log - 4));
    for (uint64_t g = 0; g < (len >> tile_log); g++) {
        const ntt::Tile<K> tile(ps, g);
        std::fill(sm.begin(), sm.end(), 0xffffffffu);
        for (auto& r : regs) tile.roots16(tw, r.c16);
        host_rounds<K, 0>(tile, regs, src, dst, tw, sm.data());
        if (tile.relayout())
            for (uint32_t t = 0; t < regs.size(); t++) tile.final_phase(t, regs[t].x, dst, sm.data());
    }
}

template <class Src>
bool dispatch_pass(uint32_t k, const ntt::Pass& ps, const Src& src, uint32_t* dst,
                   const uint32_t* tw, uint64_t len) {
    switch (k) {
        case 4: host_pass<4>(ps, src, dst, tw, len); return true;
        case 5: host_pass<5>(ps, src, dst, tw, len); return true;
        case 6: host_pass<6>(ps, src, dst, tw, len); return true;
        case 7: host_pass<7>(ps, src, dst, tw, len); return true;
        case 8: host_pass<8>(ps, src, dst, tw, len); return true;
        case 9: host_pass<9>(ps, src, dst, tw, len); return true;
        case 10: host_pass<10>(ps, src, dst, tw, len); return true;
        case 11: host_pass<11>(ps, src, dst, tw, len); return true;
        case 12: host_pass<12>(ps, src, dst, tw, len); return true;
        default: return false;
    }
}

}  // namespace

int main() {
    std::vector<uint32_t> t16(bb::P2Params<16>::TABLE_LEN), t24(bb::P2Params<24>::TABLE_LEN);
    char op[32];
    while (std::scanf("%31s", op) == 1) {
        auto rd = [] {
            unsigned long long v = 0;
            if (std::scanf("%llu", &v) != 1) std::abort();
            return v;
        };
        if (!std::strcmp(op, "add")) {
            uint32_t a = rd(), b = rd();
            std::printf("%u\n", bb::add(a, b));
        } else if (!std::strcmp(op, "sub")) {
            uint32_t a = rd(), b = rd();
            std::printf("%u\n", bb::sub(a, b));
        } else if (!std::strcmp(op, "mul")) {
            uint32_t a = rd(), b = rd();
            std::printf("%u\n", bb::mul(a, b));
        } else if (!std::strcmp(op, "pow")) {
            uint32_t a = rd();
            unsigned long long e = rd();
            std::printf("%u\n", bb::pow(a, e));
        } else if (!std::strcmp(op, "ext")) {
            bb::Ext a, b;
            for (auto& c : a.c) c = rd();
            for (auto& c : b.c) c = rd();
            bb::Ext r = bb::ext_mul(a, b);
            std::printf("%u %u %u %u\n", r.c[0], r.c[1], r.c[2], r.c[3]);
        } else if (!std::strcmp(op, "shoup")) {
            uint32_t wm = rd(), x = rd();
            const bb::Shoup s = bb::shoup_of_mont(wm);
            std::printf("%u %u %u\n", s.w, s.q, bb::mul_shoup(x, s));
        } else if (!std::strcmp(op, "rev")) {
            uint32_t x = rd(), bits = rd();
            std::printf("%u\n", bb::bit_rev(x, bits));
        } else if (!std::strcmp(op, "table16")) {
            for (auto& v : t16) v = rd();
        } else if (!std::strcmp(op, "table24")) {
            for (auto& v : t24) v = rd();
        } else if (!std::strcmp(op, "p16") || !std::strcmp(op, "p24")) {
            bool w16 = op[1] == '1';
            uint32_t s[24];
            int w = w16 ? 16 : 24;
            for (int i = 0; i < w; i++) s[i] = rd();
            if (w16) {
                bb::p2_permute_canonical<16, const uint32_t*>(s, t16.data());
            } else {
                bb::p2_permute_canonical<24, const uint32_t*>(s, t24.data());
            }
            for (int i = 0; i < w; i++) std::printf(i + 1 < w ? "%u " : "%u\n", s[i]);
        } else if (!std::strcmp(op, "nttpass") || !std::strcmp(op, "ldepass")) {
            const bool lde = op[0] == 'l';
            uint32_t k = rd();
            ntt::Pass ps;
            ps.log_n = rd(), ps.s0 = rd(), ps.c = rd(), ps.cpos = rd(), ps.bitrev = rd();
            ps.p_load = rd(), ps.p_store = rd(), ps.do_scale = rd(), ps.scale_mont = rd();
            if (lde) {
                const uint32_t log_small = rd();
                const uint64_t len = rd();
                std::vector<uint32_t> coeffs(len >> (ps.log_n - log_small));
                std::vector<uint32_t> shift(1ull << log_small), dst(len), tw(1ull << (ps.log_n - 1));
                for (auto* v : {&coeffs, &shift, &dst, &tw})
                    for (auto& x : *v) x = rd();
                bool known = false;
                ntt::with_lde_source(coeffs.data(), shift.data(), log_small, ps.log_n,
                                     [&](auto src) {
                                         known = dispatch_pass(k, ps, src, dst.data(), tw.data(), len);
                                     });
                if (!known) {
                    std::fprintf(stderr, "ldepass: K = %u\n", k);
                    return 2;
                }
                for (uint64_t i = 0; i < len; i++) std::printf(i + 1 < len ? "%u " : "%u\n", dst[i]);
                std::fflush(stdout);
                continue;
            }
            bool in_place = rd() != 0;
            uint64_t len = rd();
            std::vector<uint32_t> src(len), dst, tw(1ull << (ps.log_n - 1));
            for (auto& v : src) v = rd();
            if (!in_place) {
                dst.resize(len);
                for (auto& v : dst) v = rd();
            }
            for (auto& v : tw) v = rd();
            uint32_t* out = in_place ? src.data() : dst.data();
            if (!dispatch_pass(k, ps, src.data(), out, tw.data(), len)) {
                std::fprintf(stderr, "nttpass: K = %u\n", k);
                return 2;
            }
            for (uint64_t i = 0; i < len; i++) std::printf(i + 1 < len ? "%u " : "%u\n", out[i]);
            std::fflush(stdout);  // the test talks to this process one pass at a time
        } else {
            std::fprintf(stderr, "unknown command %s\n", op);
            return 2;
        }
    }
    return 0;
}
