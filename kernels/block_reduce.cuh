// Reductions over a thread block, shared by every kernel that needs one: the chapters
// put this file in front of a kernel's source before NVRTC compiles it (see gpu.rs).
//
// Step 1: within each warp of 32 threads, shuffles combine values from lane to lane
// without touching memory (after 5 rounds, every lane holds the warp's result).
// Step 2: one result per warp goes through shared memory, and warp 0 combines those.
// Only warp 0 reads the per-warp results: another warp's read of slot 0 would race with
// warp 0's store of the block's result there.
//
// Every thread of the block must call it; blockDim.x a multiple of 32, at most 1024.

#include <math_constants.h>  // CUDART_INF_F

// ANCHOR: block_reduce
__device__ inline float shuffle_xor(float value, int offset) {
    return __shfl_xor_sync(0xffffffff, value, offset);
}

// `value` combined over the whole block, returned to every thread. `identity` is what
// combining with changes nothing (0 for a sum, -inf for a maximum). The last
// __syncthreads lets the block call it again right away.
template <typename T, typename Combine>
__device__ T block_reduce(T value, Combine combine, T identity) {
    __shared__ T per_warp[32];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        value = combine(value, shuffle_xor(value, offset));
    }
    if (lane == 0) per_warp[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < blockDim.x / 32 ? per_warp[lane] : identity;
        for (int offset = 16; offset > 0; offset /= 2) {
            value = combine(value, shuffle_xor(value, offset));
        }
        if (lane == 0) per_warp[0] = value;
    }
    __syncthreads();
    const T result = per_warp[0];
    __syncthreads();  // everyone has read the result: per_warp may be reused
    return result;
}

struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ inline float block_sum(float value) { return block_reduce(value, Sum(), 0.0f); }
__device__ inline float block_max(float value) { return block_reduce(value, Max(), -CUDART_INF_F); }
// ANCHOR_END: block_reduce
