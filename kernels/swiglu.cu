// SwiGLU's gate: gate = silu(gate) * up, element by element, where silu(g) = g / (1 + e^-g).
//
// The MLP computes gate and up with two matrix products; this kernel joins them, so the
// two 8,192-wide intermediate rows are read once and one row is written. It writes over
// `gate`, whose value is dead once read: no third buffer is needed.
//
// Launch: any grid and block size; each thread takes every (gridDim.x · blockDim.x)-th element.

#include <cuda_bf16.h>

// ANCHOR: swiglu
extern "C" __global__ void swiglu(
    __nv_bfloat16* gate,        // [n], in: the gate; out: silu(gate) * up
    const __nv_bfloat16* up,    // [n]
    int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float g = __bfloat162float(gate[i]);
        const float silu = g / (1.0f + expf(-g));
        gate[i] = __float2bfloat16(silu * __bfloat162float(up[i]));
    }
}
// ANCHOR_END: swiglu
