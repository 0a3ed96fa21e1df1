// A pass's new keys and values into the page pool: row r of the pass is written to row
// cache_rows[r] of the pool, page · page_size + offset (vLLM calls cache_rows the slot mapping).
//
// Chapter 9's kv_append found a row's place from its slot and position, in a contiguous
// region per sequence. In a pool of pages a sequence's positions are wherever its block table
// says; the host turns (sequence, position) into a pool row once per pass, for a prefill's
// prompt and a decode step's batch alike, and this kernel only copies.
//
// Launch: one block per row (gridDim.x = rows), any number of threads. One layer of the pool
// is [pages · page_size, row_width]; every cache_rows[r] is inside it.

#include <cuda_bf16.h>

// ANCHOR: kv_write
extern "C" __global__ void kv_write(
    const __nv_bfloat16* k_new,     // [rows, row_width], keys after RoPE
    const __nv_bfloat16* v_new,     // [rows, row_width]
    __nv_bfloat16* k_layer,         // [pages * page_size, row_width]: one layer of the pool
    __nv_bfloat16* v_layer,
    const unsigned int* cache_rows, // [rows]: the pool row of each new key and value
    int row_width)
{
    const int row = blockIdx.x;
    const size_t target = (size_t)cache_rows[row] * row_width;
    for (int i = threadIdx.x; i < row_width; i += blockDim.x) {
        k_layer[target + i] = k_new[(size_t)row * row_width + i];
        v_layer[target + i] = v_new[(size_t)row * row_width + i];
    }
}
// ANCHOR_END: kv_write
