// Attention for one new token over the KV cache: decode's attention.
//
// The token has one query per query head; the cache holds the keys and values of every
// position so far, its own included (written just before). For query head h, with
// key/value head g = h / group:
//
//     s_j = q_h · k_j / sqrt(head_dim)    for every cached position j < length
//     out_h = Σ_j softmax(s)_j v_j
//
// There is no mask: every cached position is in the past, or the token itself.
//
// One block serves one key/value head and the `group` query heads that share it, so each
// cached key and value row is read from memory once, not once per query head. Inside the
// block, a *slot* of head_dim / 8 lanes holds one row: each lane loads 8 consecutive bf16
// values (16 bytes, one 128-bit load). A warp holds 32 / (head_dim / 8) slots (4 for
// head_dim 64, 2 for 128), and the slots walk the positions in turn: slot s takes
// positions s, s + slots, s + 2·slots, …
//
// Each slot keeps an *online softmax* per query head: the running maximum m of the scores
// it has seen, the running sum l = Σ exp(s - m), and the running weighted sum
// acc = Σ exp(s - m) v. A new score s' with m' = max(m, s') updates them as
//
//     l   ← l · exp(m - m') + exp(s' - m')
//     acc ← acc · exp(m - m') + exp(s' - m') v'
//
// so no score is ever stored. At the end the slots' states are merged the same way (each
// rescaled to the largest maximum), and out = acc / l.
//
// Launch: gridDim.x = kv_heads, blockDim.x a multiple of 32; head_dim a multiple of 8 with
// head_dim / 8 a power of two up to 32; group <= MAX_GROUP; dynamic shared memory of
// slots · group · (head_dim + 2) floats (see ops::attention_decode).

#include <cuda_bf16.h>
#include <math_constants.h>  // CUDART_INF_F

#define MAX_GROUP 8
#define LANE_VALUES 8  // bf16 values per 128-bit load

// Eight bf16 values from one 16-byte load, as floats.
__device__ inline void load_row_part(const __nv_bfloat16* source, float out[LANE_VALUES]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(source);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (int i = 0; i < LANE_VALUES / 2; i++) {
        const float2 pair = __bfloat1622float2(pairs[i]);
        out[2 * i] = pair.x;
        out[2 * i + 1] = pair.y;
    }
}

// ANCHOR: attention_decode
extern "C" __global__ void attention_decode(
    const __nv_bfloat16* q,        // [q_heads * head_dim], the new token's queries after RoPE
    const __nv_bfloat16* k_cache,  // [positions, kv_heads * head_dim], keys after RoPE
    const __nv_bfloat16* v_cache,  // [positions, kv_heads * head_dim]
    __nv_bfloat16* out,            // [q_heads * head_dim]
    int length,                    // positions to attend to: 0 .. length - 1
    int kv_heads,
    int head_dim,
    int group,                     // query heads per key/value head
    float scale)                   // 1 / sqrt(head_dim)
{
    extern __shared__ float merge[];  // per slot: group maxima, group sums, group × head_dim accumulators
    const int kv_head = blockIdx.x;
    const int lanes_per_slot = head_dim / LANE_VALUES;
    const int slots_per_warp = 32 / lanes_per_slot;
    const int lane = threadIdx.x % 32;
    const int slot = (threadIdx.x / 32) * slots_per_warp + lane / lanes_per_slot;
    const int slots = (blockDim.x / 32) * slots_per_warp;
    const int part = (lane % lanes_per_slot) * LANE_VALUES;  // this lane's first element of a row
    const size_t row_stride = (size_t)kv_heads * head_dim;

    // This lane's 8 elements of each query of the group, with the 1/sqrt(head_dim) folded in.
    float query[MAX_GROUP][LANE_VALUES];
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][LANE_VALUES];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; h++) {
        m[h] = -CUDART_INF_F;
        l[h] = 0.0f;
        for (int i = 0; i < LANE_VALUES; i++) {
            acc[h][i] = 0.0f;
            query[h][i] = 0.0f;
        }
        if (h < group) {
            load_row_part(q + (size_t)(kv_head * group + h) * head_dim + part, query[h]);
            for (int i = 0; i < LANE_VALUES; i++) query[h][i] *= scale;
        }
    }

    // The loop runs the same number of times in every lane of a warp, so that the shuffles
    // below always have all 32 lanes: a slot past the end loads nothing and updates nothing.
    for (int first = slot - lane / lanes_per_slot; first < length; first += slots) {
        const int j = first + lane / lanes_per_slot;
        const bool inside = j < length;
        float key[LANE_VALUES] = {}, value[LANE_VALUES] = {};
        if (inside) {
            load_row_part(k_cache + j * row_stride + kv_head * head_dim + part, key);
            load_row_part(v_cache + j * row_stride + kv_head * head_dim + part, value);
        }
#pragma unroll
        for (int h = 0; h < MAX_GROUP; h++) {
            if (h >= group) break;
            float score = 0.0f;
            for (int i = 0; i < LANE_VALUES; i++) score += query[h][i] * key[i];
            // The slot's lanes are consecutive and aligned: XOR with offsets below
            // lanes_per_slot stays inside the slot, so every lane ends with the full dot.
            for (int offset = lanes_per_slot / 2; offset > 0; offset /= 2) {
                score += __shfl_xor_sync(0xffffffff, score, offset);
            }
            if (!inside) continue;
            const float new_max = fmaxf(m[h], score);
            const float rescale = __expf(m[h] - new_max);  // 0 on the first key: m = -inf
            const float weight = __expf(score - new_max);
            l[h] = l[h] * rescale + weight;
            for (int i = 0; i < LANE_VALUES; i++) acc[h][i] = acc[h][i] * rescale + weight * value[i];
            m[h] = new_max;
        }
    }

    // Every slot's state into shared memory, then one merge per (query head, element).
    float* maxima = merge;                    // [slots][group]
    float* sums = maxima + slots * group;     // [slots][group]
    float* partial = sums + slots * group;    // [slots][group][head_dim]
#pragma unroll
    for (int h = 0; h < MAX_GROUP; h++) {
        if (h >= group) break;
        if (part == 0) {
            maxima[slot * group + h] = m[h];
            sums[slot * group + h] = l[h];
        }
        for (int i = 0; i < LANE_VALUES; i++) partial[(slot * group + h) * head_dim + part + i] = acc[h][i];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < group * head_dim; e += blockDim.x) {
        const int h = e / head_dim, d = e % head_dim;
        float top = -CUDART_INF_F;
        for (int s = 0; s < slots; s++) top = fmaxf(top, maxima[s * group + h]);
        float total = 0.0f, weighted = 0.0f;
        for (int s = 0; s < slots; s++) {
            const float rescale = __expf(maxima[s * group + h] - top);  // 0 for a slot that saw no key
            total += sums[s * group + h] * rescale;
            weighted += partial[(s * group + h) * head_dim + d] * rescale;
        }
        out[(size_t)(kv_head * group + h) * head_dim + d] = __float2bfloat16(weighted / total);
    }
}
// ANCHOR_END: attention_decode
