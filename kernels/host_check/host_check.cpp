// Host-side check of kernels/babybear.cuh: compiled with a plain C++ compiler (no CUDA) by
// tests/kernel_host_check.rs, which feeds it commands on stdin and compares every answer
// with the Rust field and Poseidon2 code. One command per line, one answer line each:
//   add a b | sub a b | mul a b | pow a e | ext a0 a1 a2 a3 b0 b1 b2 b3 | rev x bits
//   table16 <157 u32> | table24 <237 u32>       (Montgomery-form Poseidon2 tables; no answer)
//   p16 <16 u32> | p24 <24 u32>                 (canonical states; answer: the permutation)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../babybear.cuh"

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
        } else {
            std::fprintf(stderr, "unknown command %s\n", op);
            return 2;
        }
    }
    return 0;
}
