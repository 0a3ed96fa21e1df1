// SwiGLU's gate: out = silu(gate) * up, element by element, where silu(g) = g / (1 + e^-g).
//
// The MLP computes gate and up with two matrix products; this kernel joins them, so the
// two 8,192-wide intermediate rows are read once and one row is written. gate and up
// arrive in fp32 (the matrix products keep their fp32 sums), so the activation is
// rounded to bf16 once, here, rather than three times.
//
// Launch: any grid and block size; each thread takes every (gridDim.x · blockDim.x)-th element.

#include <cuda_bf16.h>

// ANCHOR: silu_mul
extern "C" __global__ void silu_mul(
    const float* gate,    // [n]
    const float* up,      // [n]
    __nv_bfloat16* out,   // [n]
    int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float silu = g / (1.0f + expf(-g));
        out[i] = __float2bfloat16(silu * up[i]);
    }
}
// ANCHOR_END: silu_mul
