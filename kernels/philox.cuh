// philox.cuh: Philox4x32-10 (resolution R1), twin of umlos_cuda/philox.py.
//
// Random123's Philox4x32 with 10 rounds (Salmon et al., SC'11). Integer-only
// and stateless: a counter and a key in, four words out.
#pragma once

#include "platform.cuh"

namespace umlos {

constexpr u32 PHILOX_M0 = 0xD2511F53u;
constexpr u32 PHILOX_M1 = 0xCD9E8D57u;
constexpr u32 PHILOX_W0 = 0x9E3779B9u;
constexpr u32 PHILOX_W1 = 0xBB67AE85u;
constexpr int PHILOX_ROUNDS = 10;

struct PhiloxCtr {
    u32 v[4];
};

struct PhiloxKey {
    u32 v[2];
};

// One round: (hi0, lo0) = M0 * c0, (hi1, lo1) = M1 * c2,
// (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0).
UMLOS_HD PhiloxCtr philox_round(PhiloxCtr c, PhiloxKey k) {
    const u32 hi0 = mulhi32(PHILOX_M0, c.v[0]);
    const u32 lo0 = PHILOX_M0 * c.v[0];
    const u32 hi1 = mulhi32(PHILOX_M1, c.v[2]);
    const u32 lo1 = PHILOX_M1 * c.v[2];
    PhiloxCtr out;
    out.v[0] = hi1 ^ c.v[1] ^ k.v[0];
    out.v[1] = lo1;
    out.v[2] = hi0 ^ c.v[3] ^ k.v[1];
    out.v[3] = lo0;
    return out;
}

// Philox4x32-10: ten rounds; the key is bumped by (W0, W1) mod 2^32 between rounds.
UMLOS_HD PhiloxCtr philox4x32_10(PhiloxCtr c, PhiloxKey k) {
    c = philox_round(c, k);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int round = 1; round < PHILOX_ROUNDS; ++round) {
        k.v[0] += PHILOX_W0;
        k.v[1] += PHILOX_W1;
        c = philox_round(c, k);
    }
    return c;
}

}  // namespace umlos
