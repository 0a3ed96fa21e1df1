// Greedy decoding's choice: the index of the largest logit of each row.
//
// Launch: one block per row (gridDim.x = rows), blockDim.x a multiple of 32, at most 1024.
// Each thread scans a strided share of the row; the block then reduces (value, index)
// pairs with warp shuffles. On a tie the lower index wins, as torch.argmax does, so the
// result does not depend on which thread saw which value. A row holding any NaN has no
// answer: its result is 0xffffffff, which is no token id, and the host reports it.

#include <math_constants.h>  // CUDART_INF_F

// ANCHOR: argmax
// Is (value a, index ia) a better choice than (b, ib)?
__device__ bool better(float a, unsigned int ia, float b, unsigned int ib) {
    return a > b || (a == b && ia < ib);
}

extern "C" __global__ void argmax_rows(
    const float* logits,   // [rows, vocab]
    int vocab,
    unsigned int* out)     // [rows]
{
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float best = -CUDART_INF_F;
    unsigned int best_index = 0xffffffff;
    int saw_nan = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        saw_nan |= isnan(row[i]);
        if (better(row[i], i, best, best_index)) {
            best = row[i];
            best_index = i;
        }
    }
    // Every thread of the block learns whether any thread saw a NaN.
    const int row_has_nan = __syncthreads_or(saw_nan);
    // Within each warp, then across warps through shared memory.
    __shared__ float warp_best[32];
    __shared__ unsigned int warp_index[32];
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffff, best, offset);
        const unsigned int other_index = __shfl_xor_sync(0xffffffff, best_index, offset);
        if (better(other, other_index, best, best_index)) {
            best = other;
            best_index = other_index;
        }
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        warp_best[warp] = best;
        warp_index[warp] = best_index;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < blockDim.x / 32 ? warp_best[lane] : -CUDART_INF_F;
        best_index = lane < blockDim.x / 32 ? warp_index[lane] : 0xffffffff;
        for (int offset = 16; offset > 0; offset /= 2) {
            const float other = __shfl_xor_sync(0xffffffff, best, offset);
            const unsigned int other_index = __shfl_xor_sync(0xffffffff, best_index, offset);
            if (better(other, other_index, best, best_index)) {
                best = other;
                best_index = other_index;
            }
        }
        if (lane == 0) out[blockIdx.x] = row_has_nan ? 0xffffffff : best_index;
    }
}
// ANCHOR_END: argmax
