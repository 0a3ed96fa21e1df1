// Causal grouped-query attention over a whole prompt.
//
// For query position i and query head h, with key/value head g = h / (q_heads / kv_heads):
//
//     s_j = q_i · k_j / sqrt(head_dim)          for every key position j ≤ i
//     p_j = exp(s_j - max s) / Σ exp(s - max s)  (softmax)
//     out_i = Σ_j p_j v_j
//
// Keys after i are never looked at: that is the causal mask, applied by the loop bounds
// rather than by writing -∞ into a score matrix.
//
// Launch: one block per (query position, query head): gridDim = (tokens, q_heads);
// blockDim.x a multiple of 32; dynamic shared memory of at least tokens · 4 bytes for the
// scores (the engine rounds it up to whole 16-byte groups: see ops::attention_prefill).
// Scores, the softmax and the weighted sum are all fp32: rounding scores to bf16 before
// the softmax would change which keys the head attends to. `block_max` and `block_sum`
// come from block_reduce.cuh, which the engine puts in front of this file.

#include <cuda_bf16.h>
#include <math_constants.h>  // CUDART_INF_F

#define MAX_HEAD_DIM 256

// ANCHOR: attention_prefill
extern "C" __global__ void attention_prefill(
    const __nv_bfloat16* q,  // [tokens, q_heads * head_dim], after RoPE
    const __nv_bfloat16* k,  // [tokens, kv_heads * head_dim], after RoPE
    const __nv_bfloat16* v,  // [tokens, kv_heads * head_dim]
    __nv_bfloat16* out,      // [tokens, q_heads * head_dim]
    int q_heads,
    int kv_heads,
    int head_dim,
    float scale)             // 1 / sqrt(head_dim)
{
    extern __shared__ float scores[];  // [i + 1]
    __shared__ float query[MAX_HEAD_DIM];
    const int i = blockIdx.x;
    const int head = blockIdx.y;
    const int kv_head = head / (q_heads / kv_heads);
    const size_t q_stride = (size_t)q_heads * head_dim;
    const size_t kv_stride = (size_t)kv_heads * head_dim;

    // The query vector, once, in fp32.
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        query[d] = __bfloat162float(q[i * q_stride + head * head_dim + d]);
    }
    __syncthreads();

    // 1. Scores: each thread takes every blockDim.x-th key.
    float local_max = -CUDART_INF_F;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        const __nv_bfloat16* key = k + j * kv_stride + kv_head * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; d++) {
            dot += query[d] * __bfloat162float(key[d]);
        }
        scores[j] = dot * scale;
        local_max = fmaxf(local_max, scores[j]);
    }
    const float max_score = block_max(local_max);

    // 2. Softmax: subtracting the maximum keeps every exp() at most 1.
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        scores[j] = expf(scores[j] - max_score);
        local_sum += scores[j];
    }
    const float sum = block_sum(local_sum);  // also makes every score visible

    // 3. Weighted sum of values: each thread owns output dimensions d.
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) {
            acc += scores[j] * __bfloat162float(v[j * kv_stride + kv_head * head_dim + d]);
        }
        out[i * q_stride + head * head_dim + d] = __float2bfloat16(acc / sum);
    }
}
// ANCHOR_END: attention_prefill
