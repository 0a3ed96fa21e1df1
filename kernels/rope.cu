// Rotary position embedding (RoPE), in Hugging Face's "half-split" layout.
//
// Within each head of head_dim values, element i is paired with element i + head_dim/2,
// and the pair is turned by the angle position * inv_freq[i]:
//
//     a' = a cos θ - b sin θ
//     b' = b cos θ + a sin θ
//
// The frequencies (with Llama 3's scaling already applied) come from the host, and the
// positions are absolute token positions, so the same kernel serves a whole prompt and,
// later, one new token at a time.
//
// Launch: one block per row (gridDim.x = rows), any block size; x is rotated in place.

#include <cuda_bf16.h>

// ANCHOR: rope
extern "C" __global__ void rope(
    __nv_bfloat16* x,                 // [rows, heads * head_dim], rotated in place
    const unsigned int* positions,    // [rows]
    const float* inv_freq,            // [head_dim / 2], radians per position
    int heads,
    int head_dim)
{
    const int row = blockIdx.x;
    const int half = head_dim / 2;
    const float position = (float)positions[row];
    __nv_bfloat16* row_start = x + (size_t)row * heads * head_dim;

    for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
        const int head = p / half;
        const int i = p % half;
        // fp32 angle, as Hugging Face computes it; sincosf is the accurate version.
        float sin_angle, cos_angle;
        sincosf(position * inv_freq[i], &sin_angle, &cos_angle);
        __nv_bfloat16* pair = row_start + head * head_dim;
        const float a = __bfloat162float(pair[i]);
        const float b = __bfloat162float(pair[i + half]);
        pair[i] = __float2bfloat16(a * cos_angle - b * sin_angle);
        pair[i + half] = __float2bfloat16(b * cos_angle + a * sin_angle);
    }
}
// ANCHOR_END: rope
