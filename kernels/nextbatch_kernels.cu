// nextbatch_kernels.cu: the extern "C" __global__ launchers (ABI: kernels/README.md).
//
// Each kernel is a thin grid-stride loop over a function of nextbatch.cuh, so
// any grid shape computes the same result. Inputs are checked on the host
// before a launch; nothing here validates. Compiled by NVRTC (CuPy), by nvcc,
// and by the host compiler with tests/kernel_harness/host_shim.h, which defines
// __global__ and the grid variables so the same bodies run on the CPU.
#include "nextbatch.cuh"

#if !defined(__CUDACC__) && !defined(UMLOS_HOST_KERNEL_SHIM)
#error "nextbatch_kernels.cu needs a CUDA compiler, or the host shim of tests/kernel_harness"
#endif

namespace umlos {

// This thread's first item and the grid's stride, in 64 bits.
__device__ __forceinline__ u64 grid_first() {
    return (u64)blockIdx.x * (u64)blockDim.x + (u64)threadIdx.x;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * (u64)blockDim.x;
}

// The next item of a grid-stride loop, or `count` when done (never overflows).
__device__ __forceinline__ u64 grid_next(u64 i, u64 stride, u64 count) {
    return count - i <= stride ? count : i + stride;
}

__device__ __forceinline__ EpochKey epoch_key(u32 k0, u32 k1, u32 w2, u32 w3) {
    EpochKey ek;
    ek.k0 = k0;
    ek.k1 = k1;
    ek.w2 = w2;
    ek.w3 = w3;
    return ek;
}

template <typename T>
__device__ __forceinline__ void map_positions_kernel(const u64* base, const u64* m, const u64* a, const u64* c,
                                                     u64 block_size, u64 block_magic, u32 block_info, u64 start,
                                                     u64 count, T* out) {
    PlanView plan;
    plan.base = base;
    plan.m = m;
    plan.a = a;
    plan.c = c;
    plan.block.d = block_size;
    plan.block.magic = block_magic;
    plan.block.info = block_info;
    map_positions_strided(plan, start, count, out, grid_first(), grid_stride());
}

}  // namespace umlos

extern "C" __global__ void umlos_block_permute_j(umlos::u64 num_full_blocks, umlos::u32 k0, umlos::u32 k1,
                                                 umlos::u32 w2, umlos::u32 w3, umlos::u64* j) {
    const umlos::EpochKey ek = umlos::epoch_key(k0, k1, w2, w3);
    const umlos::u64 stride = umlos::grid_stride();
    for (umlos::u64 i = umlos::grid_first(); i < num_full_blocks; i = umlos::grid_next(i, stride, num_full_blocks)) {
        j[i] = umlos::block_permute_j(i, ek);
    }
}

extern "C" __global__ void umlos_block_affine_params(const umlos::u64* perm_block_ids, umlos::u64 count,
                                                     umlos::u64 n, umlos::u64 block_size, umlos::u32 k0,
                                                     umlos::u32 k1, umlos::u32 w2, umlos::u32 w3,
                                                     umlos::u64* base, umlos::u64* m, umlos::u64* a,
                                                     umlos::u64* c) {
    const umlos::EpochKey ek = umlos::epoch_key(k0, k1, w2, w3);
    const umlos::u64 stride = umlos::grid_stride();
    for (umlos::u64 i = umlos::grid_first(); i < count; i = umlos::grid_next(i, stride, count)) {
        const umlos::BlockParams p = umlos::block_affine_params(perm_block_ids[i], n, block_size, ek);
        base[i] = p.base;
        m[i] = p.m;
        a[i] = p.a;
        c[i] = p.c;
    }
}

extern "C" __global__ void umlos_map_positions_u64(const umlos::u64* base, const umlos::u64* m,
                                                   const umlos::u64* a, const umlos::u64* c,
                                                   umlos::u64 block_size, umlos::u64 block_magic,
                                                   umlos::u32 block_info, umlos::u64 start, umlos::u64 count,
                                                   unsigned long long* out) {
    umlos::map_positions_kernel(base, m, a, c, block_size, block_magic, block_info, start, count, out);
}

extern "C" __global__ void umlos_map_positions_i64(const umlos::u64* base, const umlos::u64* m,
                                                   const umlos::u64* a, const umlos::u64* c,
                                                   umlos::u64 block_size, umlos::u64 block_magic,
                                                   umlos::u32 block_info, umlos::u64 start, umlos::u64 count,
                                                   long long* out) {
    umlos::map_positions_kernel(base, m, a, c, block_size, block_magic, block_info, start, count, out);
}

extern "C" __global__ void umlos_map_positions_i32(const umlos::u64* base, const umlos::u64* m,
                                                   const umlos::u64* a, const umlos::u64* c,
                                                   umlos::u64 block_size, umlos::u64 block_magic,
                                                   umlos::u32 block_info, umlos::u64 start, umlos::u64 count,
                                                   int* out) {
    umlos::map_positions_kernel(base, m, a, c, block_size, block_magic, block_info, start, count, out);
}

extern "C" __global__ void umlos_sequential_u64(umlos::u64 start, umlos::u64 count, unsigned long long* out) {
    const umlos::u64 stride = umlos::grid_stride();
    for (umlos::u64 i = umlos::grid_first(); i < count; i = umlos::grid_next(i, stride, count)) {
        out[i] = start + i;
    }
}

extern "C" __global__ void umlos_philox4x32_10_batch(const umlos::u32* in, umlos::u64 count, umlos::u32* out) {
    const umlos::u64 stride = umlos::grid_stride();
    for (umlos::u64 i = umlos::grid_first(); i < count; i = umlos::grid_next(i, stride, count)) {
        umlos::PhiloxCtr ctr;
        umlos::PhiloxKey key;
        for (int w = 0; w < 4; ++w) {
            ctr.v[w] = in[6 * i + w];
        }
        key.v[0] = in[6 * i + 4];
        key.v[1] = in[6 * i + 5];
        const umlos::PhiloxCtr x = umlos::philox4x32_10(ctr, key);
        for (int w = 0; w < 4; ++w) {
            out[4 * i + w] = x.v[w];
        }
    }
}
