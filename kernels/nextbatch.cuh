// nextbatch.cuh: the index arithmetic of NextBatch_v2 (resolutions R4-R7),
// twin of umlos_cuda/reference.py (same function names, same split of work).
//
//   philox_draws         R4: draw n of a domain -> (r0, r1)
//   block_permute_j      R5: the Fisher-Yates draw j of step i (parallel over i)
//   seeded_block_permute R5: the sequential swaps (host only: see docs/kernels.md)
//   block_affine_params  R6: (base, m, a, c) of one permuted block
//   mulmod_add           (a * x + c) mod m, exact for every m < 2^64
//   map_position         one train position -> index, through the plan tables
//   map_run              a contiguous run inside one block, incrementally (native)
//
// Everything is uint64 and exact; nothing wraps unless the result is taken
// modulo a power of two, where wrapping is exact. No function validates its
// inputs: the Python layer does that before anything runs.
#pragma once

#include "philox.cuh"

namespace umlos {

constexpr u32 DOMAIN_BLOCK_PERMUTE = 1u;  // R4 domain of SeededBlockPermute_v1
constexpr u32 DOMAIN_INTRA_BLOCK = 2u;    // R4 domain of SeededIntraBlockMap_v1

// The Philox material of one epoch (R4): key (w0, w1) and counter words w2, w3,
// all read little-endian from the 16-byte epoch seed.
struct EpochKey {
    u32 k0, k1, w2, w3;
};

struct Draw {
    u64 r0, r1;
};

// R4: draw number n of a domain uses counter (lo32(n), hi32(n), w2, w3 ^ domain)
// under key (k0, k1); r0 = x0 | x1 << 32, r1 = x2 | x3 << 32.
UMLOS_HD Draw philox_draws(u64 n, EpochKey ek, u32 domain) {
    PhiloxCtr ctr;
    ctr.v[0] = (u32)n;
    ctr.v[1] = (u32)(n >> 32);
    ctr.v[2] = ek.w2;
    ctr.v[3] = ek.w3 ^ domain;
    PhiloxKey key;
    key.v[0] = ek.k0;
    key.v[1] = ek.k1;
    const PhiloxCtr x = philox4x32_10(ctr, key);
    Draw d;
    d.r0 = (u64)x.v[0] | ((u64)x.v[1] << 32);
    d.r1 = (u64)x.v[2] | ((u64)x.v[3] << 32);
    return d;
}

// R5: the Fisher-Yates step i swaps order[i] with order[j], j = (r0 * (i+1)) >> 64
// for r0 of draw i (domain 1), so 0 <= j <= i. Step 0 does not exist; j = 0 there.
UMLOS_HD u64 block_permute_j(u64 i, EpochKey ek) {
    if (i == 0) {
        return 0;
    }
    return mulhi64(philox_draws(i, ek, DOMAIN_BLOCK_PERMUTE).r0, i + 1);
}

// R5: SeededBlockPermute_v1 from precomputed draws j[0..B): order = 0..B-1, then
// for i = B-1 down to 1 swap order[i] and order[j[i]]. Sequential by nature.
UMLOS_HD void seeded_block_permute(u64 num_full_blocks, const u64* j, u64* order) {
    for (u64 i = 0; i < num_full_blocks; ++i) {
        order[i] = i;
    }
    for (u64 i = num_full_blocks; i-- > 1;) {
        const u64 k = j[i];
        const u64 t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
}

// Greatest common divisor (binary GCD: shifts and subtractions, no 64-bit
// division; the value is the same as Euclid's and numpy.gcd).
UMLOS_HD u64 gcd_u64(u64 a, u64 b) {
    if (a == 0) {
        return b;
    }
    if (b == 0) {
        return a;
    }
    const int shift = ctz64(a | b);
    a >>= ctz64(a);
    do {
        b >>= ctz64(b);
        if (a > b) {
            const u64 t = a;
            a = b;
            b = t;
        }
        b -= a;
    } while (b != 0);
    return a << shift;
}

struct BlockParams {
    u64 base, m, a, c;
};

// R6: SeededIntraBlockMap_v1's parameters for permuted block id pb. The block
// covers [base, base + m); local position l maps to base + (a*l + c) mod m.
// a starts at 1 + k0 mod (m-1) and scans cand, cand+1, ..., m-1, 1, 2, ... for
// the first value coprime with m (1 always is, so the scan ends); c = k1 mod m.
// m = 1 gives a = c = 0, the constant map to base.
UMLOS_HD BlockParams block_affine_params(u64 pb, u64 n, u64 block_size, EpochKey ek) {
    BlockParams p;
    p.base = pb * block_size;
    const u64 rest = n - p.base;
    p.m = block_size < rest ? block_size : rest;
    p.a = 0;
    p.c = 0;
    if (p.m > 1) {
        const Draw d = philox_draws(pb, ek, DOMAIN_INTRA_BLOCK);
        const u64 span = p.m - 1;
        u64 cand = 1 + d.r0 % span;
        while (gcd_u64(cand, p.m) != 1) {
            cand = cand < span ? cand + 1 : 1;
        }
        p.a = cand;
        p.c = d.r1 % p.m;
    }
    return p;
}

// Quotient of the 128-bit value (hi, lo) by d, with hi < d (so the quotient
// fits in 64 bits); *rem receives the remainder. Bit by bit, exactly as
// reference.mulmod_add reduces: slow, but the same on every compiler.
UMLOS_HD u64 divmod_u128(u64 hi, u64 lo, u64 d, u64* rem) {
    u64 r = hi;
    u64 q = 0;
    for (int bit = 63; bit >= 0; --bit) {
        const u64 carry = r >> 63;
        r = (r << 1) | ((lo >> bit) & 1u);
        q <<= 1;
        if (carry != 0 || r >= d) {
            r -= d;  // wraps back into [0, d) when carry was set
            q |= 1;
        }
    }
    *rem = r;
    return q;
}

// (a * x + c) mod m for a, x, c < m through the bit-by-bit reduction of the
// 128-bit product: the path of device code for m > 2^32 (reference.mulmod_add).
UMLOS_HD u64 mulmod_add_u128(u64 a, u64 x, u64 c, u64 m) {
    u64 rem;
    divmod_u128(mulhi64(a, x) % m, a * x, m, &rem);
    return rem >= m - c ? rem - (m - c) : rem + c;
}

// (a * x + c) mod m for a, x, c < m, exactly. A power-of-two m takes the low
// bits of the wrapped 64-bit result (exact: 2^k divides 2^64); m <= 2^32 keeps
// a*x + c below 2^64; larger m reduce the 128-bit product.
UMLOS_HD u64 mulmod_add(u64 a, u64 x, u64 c, u64 m) {
    if ((m & (m - 1)) == 0) {
        return (a * x + c) & (m - 1);
    }
    if (m <= (((u64)1) << 32)) {
        return (a * x + c) % m;
    }
#if !defined(__CUDA_ARCH__) && defined(__SIZEOF_INT128__)
    return (u64)(((unsigned __int128)a * x + c) % m);
#else
    return mulmod_add_u128(a, x, c, m);
#endif
}

// Division by an invariant d without a 64-bit divide (libdivide's unsigned
// 64-bit algorithm, branchful variant): a power of two is a shift; otherwise
// q = mulhi64(magic, x) >> shift, with a fix-up add for the divisors whose
// magic needs 65 bits. Exact for every x and d in [1, 2^64).
constexpr u32 DIVIDER_SHIFT_MASK = 0x3Fu;
constexpr u32 DIVIDER_ADD = 0x40u;
constexpr u32 DIVIDER_POW2 = 0x80u;

struct Divider {
    u64 d;
    u64 magic;
    u32 info;  // shift | DIVIDER_ADD | DIVIDER_POW2
};

// Twin of umlos_cuda.kernel_source.divider_params (Python computes it for CuPy).
UMLOS_HD Divider divider_make(u64 d) {
    Divider v;
    v.d = d;
    u32 floor_log2 = 0;
    while ((d >> floor_log2) > 1) {
        ++floor_log2;
    }
    if ((d & (d - 1)) == 0) {
        v.magic = 0;
        v.info = floor_log2 | DIVIDER_POW2;
        return v;
    }
    u64 rem;
    u64 proposed = divmod_u128(((u64)1) << floor_log2, 0, d, &rem);
    const u64 e = d - rem;
    if (e < (((u64)1) << floor_log2)) {
        v.info = floor_log2;
    } else {
        proposed += proposed;
        const u64 twice_rem = rem + rem;
        if (twice_rem >= d || twice_rem < rem) {
            proposed += 1;
        }
        v.info = floor_log2 | DIVIDER_ADD;
    }
    v.magic = 1 + proposed;
    return v;
}

UMLOS_HD u64 divider_divide(u64 x, Divider v) {
    const u32 shift = v.info & DIVIDER_SHIFT_MASK;
    if (v.info & DIVIDER_POW2) {
        return x >> shift;
    }
    const u64 q = mulhi64(v.magic, x);
    if (v.info & DIVIDER_ADD) {
        return (((x - q) >> 1) + q) >> shift;
    }
    return q >> shift;
}

// (a * x + c) mod d for a, x, c < d, with d's divider: no 64-bit divide for
// powers of two and for d <= 2^32.
UMLOS_HD u64 mulmod_add_divider(u64 a, u64 x, u64 c, Divider v) {
    if (v.info & DIVIDER_POW2) {
        return (a * x + c) & (v.d - 1);
    }
    if (v.d <= (((u64)1) << 32)) {
        const u64 y = a * x + c;
        return y - divider_divide(y, v) * v.d;
    }
    return mulmod_add(a, x, c, v.d);
}

// The epoch plan's tables (EpochPlan), indexed by virtual block b = p / block_size.
struct PlanView {
    const u64* base;
    const u64* m;
    const u64* a;
    const u64* c;
    Divider block;  // divider_make(block_size)
};

// One train position p (< N) to its index: base[b] + (a[b]*l + c[b]) mod m[b].
// Full blocks have m = block_size and use its divider; the one short tail
// block (if any) takes the general path.
UMLOS_HD u64 map_position(const PlanView& plan, u64 p) {
    const u64 b = divider_divide(p, plan.block);
    const u64 l = p - b * plan.block.d;
    const u64 m = plan.m[b];
    const u64 r = m == plan.block.d ? mulmod_add_divider(plan.a[b], l, plan.c[b], plan.block)
                                    : mulmod_add(plan.a[b], l, plan.c[b], m);
    return plan.base[b] + r;
}

// Positions [start, start + count) visited by one thread of a grid-stride loop
// that starts at `first` and steps by `stride`; out[i] receives position start + i.
// The step never overflows, whatever count is.
template <typename T>
UMLOS_HD void map_positions_strided(const PlanView& plan, u64 start, u64 count, T* out, u64 first, u64 stride) {
    for (u64 i = first; i < count;) {
        out[i] = (T)map_position(plan, start + i);
        if (count - i <= stride) {
            break;
        }
        i += stride;
    }
}

// The indices of `count` consecutive positions inside one block, from local
// position l0: r = (a*l + c) mod m advances by a mod m per step, an add and a
// compare (written so that r + a never overflows, for m up to 2^64 - 1).
// Used by the native backend; the same bits as map_position.
template <typename T>
UMLOS_HD void map_run(u64 base, u64 m, u64 a, u64 c, u64 l0, u64 count, T* out) {
    if (count == 0) {
        return;
    }
    u64 r = mulmod_add(a, l0, c, m);
    const u64 back = m - a;  // r + a >= m  <=>  r >= m - a
    for (u64 i = 0; i < count; ++i) {
        out[i] = (T)(base + r);
        r = r >= back ? r - back : r + a;
    }
}

}  // namespace umlos
