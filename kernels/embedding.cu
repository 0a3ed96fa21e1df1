// Embedding lookup: row `ids[t]` of the table becomes row `t` of the output.
//
// Launch: one block per token (gridDim.x = number of tokens), any block size.
// The threads of a block walk the row together, each taking every blockDim.x-th
// value, so neighbouring threads read neighbouring addresses (coalesced access).

#include <cuda_bf16.h>

// ANCHOR: embedding
extern "C" __global__ void embedding(
    const __nv_bfloat16* table,  // [vocab, hidden]
    const unsigned int* ids,     // [tokens]
    __nv_bfloat16* out,          // [tokens, hidden]
    int hidden)
{
    const int token = blockIdx.x;
    const __nv_bfloat16* row = table + (size_t)ids[token] * hidden;
    __nv_bfloat16* out_row = out + (size_t)token * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out_row[i] = row[i];
    }
}
// ANCHOR_END: embedding
