// harness.cpp: the kernels of kernels/nextbatch_kernels.cu, compiled for the
// host through host_shim.h, behind a C ABI that tests/test_kernels_host.py
// drives with ctypes. Each harness_* function launches one kernel over an
// emulated grid of `grid` x `block` threads; the header functions the kernels
// do not cover (divider, mulmod) are exported directly.
#include "host_shim.h"

#include "nextbatch_kernels.cu"

using umlos::u32;
using umlos::u64;

extern "C" {

void harness_block_permute_j(u32 grid, u32 block, u64 num_full_blocks, u32 k0, u32 k1, u32 w2, u32 w3, u64* j) {
    UMLOS_LAUNCH(grid, block, umlos_block_permute_j(num_full_blocks, k0, k1, w2, w3, j));
}

void harness_block_affine_params(u32 grid, u32 block, const u64* ids, u64 count, u64 n, u64 block_size, u32 k0,
                                 u32 k1, u32 w2, u32 w3, u64* base, u64* m, u64* a, u64* c) {
    UMLOS_LAUNCH(grid, block, umlos_block_affine_params(ids, count, n, block_size, k0, k1, w2, w3, base, m, a, c));
}

// dtype: 0 = uint64, 1 = int64, 2 = int32.
void harness_map_positions(u32 grid, u32 block, int dtype, const u64* base, const u64* m, const u64* a, const u64* c,
                           u64 block_size, u64 block_magic, u32 block_info, u64 start, u64 count, void* out) {
    if (dtype == 0) {
        UMLOS_LAUNCH(grid, block, umlos_map_positions_u64(base, m, a, c, block_size, block_magic, block_info, start,
                                                          count, static_cast<unsigned long long*>(out)));
    } else if (dtype == 1) {
        UMLOS_LAUNCH(grid, block, umlos_map_positions_i64(base, m, a, c, block_size, block_magic, block_info, start,
                                                          count, static_cast<long long*>(out)));
    } else {
        UMLOS_LAUNCH(grid, block, umlos_map_positions_i32(base, m, a, c, block_size, block_magic, block_info, start,
                                                          count, static_cast<int*>(out)));
    }
}

void harness_sequential_u64(u32 grid, u32 block, u64 start, u64 count, unsigned long long* out) {
    UMLOS_LAUNCH(grid, block, umlos_sequential_u64(start, count, out));
}

void harness_philox4x32_10_batch(u32 grid, u32 block, const u32* in, u64 count, u32* out) {
    UMLOS_LAUNCH(grid, block, umlos_philox4x32_10_batch(in, count, out));
}

// Header functions, element-wise over arrays.
void harness_divider(u64 d, u64* magic, u32* info) {
    const umlos::Divider v = umlos::divider_make(d);
    *magic = v.magic;
    *info = v.info;
}

void harness_divide(u64 d, const u64* x, u64 count, u64* q) {
    const umlos::Divider v = umlos::divider_make(d);
    for (u64 i = 0; i < count; ++i) q[i] = umlos::divider_divide(x[i], v);
}

void harness_mulmod_add(const u64* a, const u64* x, const u64* c, const u64* m, u64 count, u64* out) {
    for (u64 i = 0; i < count; ++i) out[i] = umlos::mulmod_add(a[i], x[i], c[i], m[i]);
}

// The bit-by-bit 128-bit reduction that device code uses for m > 2^32 (the
// host build of mulmod_add takes unsigned __int128 instead): checked separately.
void harness_mulmod_add_u128(const u64* a, const u64* x, const u64* c, const u64* m, u64 count, u64* out) {
    for (u64 i = 0; i < count; ++i) out[i] = umlos::mulmod_add_u128(a[i], x[i], c[i], m[i]);
}

void harness_mulmod_add_divider(u64 d, const u64* a, const u64* x, const u64* c, u64 count, u64* out) {
    const umlos::Divider v = umlos::divider_make(d);
    for (u64 i = 0; i < count; ++i) out[i] = umlos::mulmod_add_divider(a[i], x[i], c[i], v);
}

void harness_gcd(const u64* a, const u64* b, u64 count, u64* out) {
    for (u64 i = 0; i < count; ++i) out[i] = umlos::gcd_u64(a[i], b[i]);
}

void harness_map_run(u64 base, u64 m, u64 a, u64 c, u64 l0, u64 count, u64* out) {
    umlos::map_run(base, m, a, c, l0, count, out);
}

}  // extern "C"
