// platform.cuh: what differs between the three compilers of this source.
//
//   NVRTC (CuPy, tests/test_nvrtc.py)   __CUDACC__ and __CUDACC_RTC__ defined, no system headers
//   nvcc                                __CUDACC__ defined
//   host C++ (native backend, harness)  neither defined
//
// Everything else in kernels/ is written once against the names below: the
// UMLOS_HD function qualifier, the fixed-width integer types, and the
// bit operations that have intrinsics on the device (two high-half multiplies,
// count trailing zeros) (__CUDA_ARCH__ is
// defined only while compiling device code).
#pragma once

#if defined(__CUDACC__)
#define UMLOS_HD __host__ __device__ __forceinline__
#else
#define UMLOS_HD static inline
#endif

#if !defined(__CUDACC_RTC__)
#include <stdint.h>
#endif

namespace umlos {

#if defined(__CUDACC_RTC__)
// NVRTC has no <stdint.h>; these widths hold on every CUDA target.
typedef unsigned int u32;
typedef int i32;
#else
typedef uint32_t u32;
typedef int32_t i32;
#endif
// unsigned long long on every compiler (not uint64_t, which is unsigned long
// on LP64 hosts), so that the extern "C" signatures read the same everywhere.
typedef unsigned long long u64;
typedef long long i64;

static_assert(sizeof(u32) == 4, "u32 must be 32 bits");
static_assert(sizeof(i32) == 4, "i32 must be 32 bits");
static_assert(sizeof(u64) == 8, "u64 must be 64 bits");
static_assert(sizeof(i64) == 8, "i64 must be 64 bits");

// High 32 bits of the 64-bit product a * b.
UMLOS_HD u32 mulhi32(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return (u32)(((u64)a * (u64)b) >> 32);
#endif
}

// High 64 bits of the exact 128-bit product a * b (reference.mulhi64).
UMLOS_HD u64 mulhi64(u64 a, u64 b) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
    return (u64)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
#else
    // Four 32x32 partial products, exactly as reference.mulhi64.
    u64 a_lo = a & 0xFFFFFFFFull, a_hi = a >> 32;
    u64 b_lo = b & 0xFFFFFFFFull, b_hi = b >> 32;
    u64 lo_lo = a_lo * b_lo, lo_hi = a_lo * b_hi, hi_lo = a_hi * b_lo;
    u64 middle = (lo_lo >> 32) + (lo_hi & 0xFFFFFFFFull) + (hi_lo & 0xFFFFFFFFull);
    return a_hi * b_hi + (lo_hi >> 32) + (hi_lo >> 32) + (middle >> 32);
#endif
}

// Number of trailing zero bits of x, for x != 0.
UMLOS_HD int ctz64(u64 x) {
#if defined(__CUDA_ARCH__)
    return __ffsll((long long)x) - 1;
#elif defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int n = 0;
    while ((x & 1u) == 0) {
        x >>= 1;
        ++n;
    }
    return n;
#endif
}

}  // namespace umlos
