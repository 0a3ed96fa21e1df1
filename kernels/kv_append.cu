// A decode step's new keys and values into the cache: row b of the batch is written at
// position positions[b] of cache slot slots[b].
//
// In a prefill the projections write straight into the slot's rows, which are contiguous;
// a decode step's rows belong to different sequences, scattered over the cache, so the
// projections write them into a staging buffer and this kernel puts each where it belongs.
//
// Launch: one block per row (gridDim.x = batch), any number of threads. The cache of one
// layer is [slots, capacity, row_width]; every positions[b] is below capacity.

#include <cuda_bf16.h>

// ANCHOR: kv_append
extern "C" __global__ void kv_append(
    const __nv_bfloat16* k_new,    // [batch, row_width], keys after RoPE
    const __nv_bfloat16* v_new,    // [batch, row_width]
    __nv_bfloat16* k_layer,        // [slots, capacity, row_width]
    __nv_bfloat16* v_layer,
    const unsigned int* slots,     // [batch]
    const unsigned int* positions, // [batch]
    int capacity,
    int row_width)
{
    const int row = blockIdx.x;
    const size_t target = ((size_t)slots[row] * capacity + positions[row]) * row_width;
    for (int i = threadIdx.x; i < row_width; i += blockDim.x) {
        k_layer[target + i] = k_new[(size_t)row * row_width + i];
        v_layer[target + i] = v_new[(size_t)row * row_width + i];
    }
}
// ANCHOR_END: kv_append
