// Greedy decoding's choice: the index of the largest logit of each row.
//
// Launch: one block per row (gridDim.x = rows), blockDim.x a multiple of 32, at most 1024.
// Each thread scans a strided share of the row; the block then reduces (value, index)
// pairs with block_reduce.cuh's reduction, which the engine puts in front of this file.
// On a tie the lower index wins, as torch.argmax does, so the result does not depend on
// which thread saw which value. A row holding any NaN has no
// answer: its result is 0xffffffff, which is no token id, and the host reports it.

#include <math_constants.h>  // CUDART_INF_F

// ANCHOR: argmax
// A candidate answer: a logit and its index.
struct Choice {
    float value;
    unsigned int index;
};

// Is `a` a better choice than `b`? The larger value; on a tie, the lower index.
__device__ bool better(Choice a, Choice b) {
    return a.value > b.value || (a.value == b.value && a.index < b.index);
}

struct Best {
    __device__ Choice operator()(Choice a, Choice b) const { return better(b, a) ? b : a; }
};

// block_reduce.cuh's reduction moves values between lanes with shuffle_xor; a Choice
// moves as its two halves.
__device__ Choice shuffle_xor(Choice choice, int offset) {
    return {shuffle_xor(choice.value, offset), __shfl_xor_sync(0xffffffff, choice.index, offset)};
}

extern "C" __global__ void argmax(
    const float* logits,   // [rows, vocab]
    int vocab,
    unsigned int* out)     // [rows]
{
    const float* row = logits + (size_t)blockIdx.x * vocab;
    const Choice none = {-CUDART_INF_F, 0xffffffff};
    Choice best = none;
    int saw_nan = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        saw_nan |= isnan(row[i]);
        const Choice candidate = {row[i], (unsigned int)i};
        if (better(candidate, best)) best = candidate;
    }
    // Every thread of the block learns whether any thread saw a NaN.
    const int row_has_nan = __syncthreads_or(saw_nan);
    best = block_reduce(best, Best(), none);
    if (threadIdx.x == 0) out[blockIdx.x] = row_has_nan ? 0xffffffff : best.index;
}
// ANCHOR_END: argmax
