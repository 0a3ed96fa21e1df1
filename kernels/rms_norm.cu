// RMSNorm: each row divided by its root mean square, then scaled by a learned weight.
//
//     out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]
//
// Launch: one block per row (gridDim.x = rows), blockDim.x a multiple of 32, at most 1024.
// The sum of squares is accumulated in fp32 even though x is bf16: summing 2,048 squares
// in bf16 (8 bits of mantissa) would lose most of the small ones. `block_sum` comes from
// block_reduce.cuh, which the engine puts in front of this file.

#include <cuda_bf16.h>

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
