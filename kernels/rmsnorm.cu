// RMSNorm: each row divided by its root mean square, then scaled by a learned weight.
//
//     out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]
//
// Launch: one block per row (gridDim.x = rows), blockDim.x a multiple of 32, at most 1024.
// The sum of squares is accumulated in fp32 even though x is bf16: summing 2,048 squares
// in bf16 (8 bits of mantissa) would lose most of the small ones.

#include <cuda_bf16.h>

// ANCHOR: block_sum
// Sum of `value` over all threads of the block, returned to every thread.
// Step 1: within each warp of 32 threads, shuffles add values from lane to lane without
// touching memory (after 5 rounds, every lane holds the warp's sum).
// Step 2: one sum per warp goes through shared memory; the first warp adds those up.
__device__ float block_sum(float value) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        value += __shfl_xor_sync(0xffffffff, value, offset);
    }
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    // Only warp 0 reads the partial sums: any other warp's read of slot 0 would race with
    // warp 0's store of the total there.
    if (warp == 0) {
        const int warps = blockDim.x / 32;
        value = lane < warps ? warp_sums[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) {
            value += __shfl_xor_sync(0xffffffff, value, offset);
        }
        if (lane == 0) warp_sums[0] = value;
    }
    __syncthreads();
    const float total = warp_sums[0];
    __syncthreads();  // everyone has read the total: warp_sums may be reused
    return total;
}
// ANCHOR_END: block_sum

// ANCHOR: rms_norm
extern "C" __global__ void rms_norm(
    const __nv_bfloat16* x,       // [rows, hidden]
    const __nv_bfloat16* weight,  // [hidden]
    __nv_bfloat16* out,           // [rows, hidden]
    int hidden,
    float eps)
{
    const __nv_bfloat16* row = x + (size_t)blockIdx.x * hidden;
    __nv_bfloat16* out_row = out + (size_t)blockIdx.x * hidden;

    float sum_of_squares = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = __bfloat162float(row[i]);
        sum_of_squares += v * v;
    }
    const float scale = rsqrtf(block_sum(sum_of_squares) / hidden + eps);

    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float normalized = __bfloat162float(row[i]) * scale;
        out_row[i] = __float2bfloat16(normalized * __bfloat162float(weight[i]));
    }
}
// ANCHOR_END: rms_norm
