// host_shim.h: just enough of CUDA for the host compiler to build the real
// __global__ bodies of kernels/nextbatch_kernels.cu (Random123's KAT_KERNEL trick).
//
// __global__ and __device__ become plain functions; threadIdx, blockIdx,
// blockDim and gridDim are globals that UMLOS_LAUNCH sets before calling a
// kernel once per (block, thread) of the emulated grid, in order. This is
// faithful for these kernels: they use no shared memory, no synchronisation,
// and each thread's grid-stride loop writes only its own items.
#pragma once

#define UMLOS_HOST_KERNEL_SHIM 1
#define __global__
#define __device__
#define __forceinline__ inline

struct umlos_shim_dim3 {
    unsigned int x, y, z;
};

static umlos_shim_dim3 threadIdx, blockIdx, blockDim, gridDim;

// Run `call` (a kernel invocation) over a grid of `grid` blocks of `block` threads.
#define UMLOS_LAUNCH(grid, block, call)                                   \
    do {                                                                  \
        gridDim = {(unsigned int)(grid), 1u, 1u};                         \
        blockDim = {(unsigned int)(block), 1u, 1u};                       \
        for (unsigned int bx_ = 0; bx_ < gridDim.x; ++bx_) {              \
            for (unsigned int tx_ = 0; tx_ < blockDim.x; ++tx_) {        \
                blockIdx = {bx_, 0u, 0u};                                 \
                threadIdx = {tx_, 0u, 0u};                                \
                call;                                                     \
            }                                                             \
        }                                                                 \
    } while (0)
