// Attention for a batch of new tokens, each over its own sequence's KV cache: batched
// decode's attention. This is attention_decode.cu with a batch dimension added; diff the two.
//
// Row b of the batch is the new token of the sequence in cache slot cache_slots[b], at position
// lengths[b] - 1 (its key and value were written there just before). For that row and
// query head h, with key/value head g = h / group:
//
//     s_j = q_bh · k_j / sqrt(head_dim)    for every position j < lengths[b] of cache slot cache_slots[b]
//     out_bh = Σ_j softmax(s)_j v_j
//
// The sequences of one batch have different lengths and live in different slots; each
// block finds its own. (A cache slot is one sequence's region of the cache; the slots of lanes
// below are chapter 8's, groups of lanes inside a warp.) Everything else is chapter 8's kernel: one block per (key/value head,
// sequence) serves the `group` query heads that share the head, so each cached row is read
// once; slots of head_dim / 8 lanes load one row each with 128-bit loads; each slot keeps an
// online softmax per query head,
//
//     l   ← l · exp(m - m') + exp(s' - m')
//     acc ← acc · exp(m - m') + exp(s' - m') v'
//
// and the slots' states are merged by shuffles, then the warps' through shared memory.
//
// Launch: gridDim = (kv_heads, batch), blockDim.x a multiple of 32 up to THREADS; head_dim a
// multiple of 8 with head_dim / 8 a power of two up to 32; group <= MAX_GROUP; dynamic shared
// memory of warps · group · (head_dim + 2) floats (see ops::attention_decode_batch). The
// cache of one layer is [slots, capacity, kv_heads * head_dim]; every lengths[b] is at least 1
// and at most capacity.

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

// One softmax state's update with one more key: its score and its value row part.
__device__ inline void online_softmax_step(float score, const float value[LANE_VALUES], float& m, float& l,
                                           float acc[LANE_VALUES]) {
    const float new_max = fmaxf(m, score);
    const float rescale = __expf(m - new_max);  // 0 on the first key: m = -inf
    const float weight = __expf(score - new_max);
    l = l * rescale + weight;
    for (int i = 0; i < LANE_VALUES; i++) acc[i] = acc[i] * rescale + weight * value[i];
    m = new_max;
}

// Two softmax states merged into the first: both rescaled to the larger maximum.
__device__ inline void merge_states(float& m, float& l, float acc[LANE_VALUES], float m2, float l2,
                                    const float acc2[LANE_VALUES]) {
    const float top = fmaxf(m, m2);
    // A state that saw no key has m = -inf and weighs 0 (and two such states stay empty).
    const float a = (m == -CUDART_INF_F) ? 0.0f : __expf(m - top);
    const float b = (m2 == -CUDART_INF_F) ? 0.0f : __expf(m2 - top);
    l = l * a + l2 * b;
    for (int i = 0; i < LANE_VALUES; i++) acc[i] = acc[i] * a + acc2[i] * b;
    m = top;
}

// The full dot product of a slot's row with one query: each lane's 8 products, summed over
// the slot's lanes. They are consecutive and aligned, so XOR with offsets below
// lanes_per_slot stays inside the slot and every lane ends with the whole sum.
__device__ inline float slot_dot(const float query[LANE_VALUES], const float key[LANE_VALUES], int lanes_per_slot) {
    float score = 0.0f;
    for (int i = 0; i < LANE_VALUES; i++) score += query[i] * key[i];
    for (int offset = lanes_per_slot / 2; offset > 0; offset /= 2) score += __shfl_xor_sync(0xffffffff, score, offset);
    return score;
}

// ANCHOR: attention_decode_batch
// At most THREADS per block (ops::attention_decode_batch launches exactly that many): the
// bound lets the compiler budget registers so that a launch of that size always fits.
#define THREADS 256
extern "C" __global__ void __launch_bounds__(THREADS) attention_decode_batch(
    const __nv_bfloat16* q_batch,   // [batch, q_heads * head_dim], the new tokens' queries after RoPE
    const __nv_bfloat16* k_layer,   // [slots, capacity, kv_heads * head_dim], keys after RoPE
    const __nv_bfloat16* v_layer,   // [slots, capacity, kv_heads * head_dim]
    __nv_bfloat16* out_batch,       // [batch, q_heads * head_dim]
    const unsigned int* cache_slots, // [batch]: the cache slot of each row's sequence
    const unsigned int* lengths,    // [batch]: positions each row attends to, its own included
    int capacity,                   // positions per slot
    int kv_heads,
    int head_dim,
    int group,                      // query heads per key/value head
    float scale)                    // 1 / sqrt(head_dim)
{
    extern __shared__ float merge[];  // per warp: group maxima, group sums, group × head_dim accumulators
    const int kv_head = blockIdx.x;
    // The one change from chapter 8: this block's sequence, where its rows are, how many.
    const int row = blockIdx.y;
    const size_t q_width = (size_t)kv_heads * group * head_dim;
    const __nv_bfloat16* q = q_batch + row * q_width;
    __nv_bfloat16* out = out_batch + row * q_width;
    const int length = (int)lengths[row];
    const size_t slot_stride = (size_t)capacity * kv_heads * head_dim;
    const __nv_bfloat16* k_cache = k_layer + cache_slots[row] * slot_stride;
    const __nv_bfloat16* v_cache = v_layer + cache_slots[row] * slot_stride;
    const int lanes_per_slot = head_dim / LANE_VALUES;
    const int slots_per_warp = 32 / lanes_per_slot;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int slot = warp * slots_per_warp + lane / lanes_per_slot;
    const int slots = warps * slots_per_warp;
    const int part = (lane % lanes_per_slot) * LANE_VALUES;  // this lane's first element of a row
    const size_t row_stride = (size_t)kv_heads * head_dim;
    const __nv_bfloat16* k_rows = k_cache + kv_head * head_dim + part;
    const __nv_bfloat16* v_rows = v_cache + kv_head * head_dim + part;

    // This lane's 8 elements of each query of the group, with the 1/sqrt(head_dim) folded in.
    float query[MAX_GROUP][LANE_VALUES];
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][LANE_VALUES];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; h++) {
        m[h] = -CUDART_INF_F;
        l[h] = 0.0f;
        for (int i = 0; i < LANE_VALUES; i++) acc[h][i] = query[h][i] = 0.0f;
        if (h < group) {
            load_row_part(q + (size_t)(kv_head * group + h) * head_dim + part, query[h]);
            for (int i = 0; i < LANE_VALUES; i++) query[h][i] *= scale;
        }
    }

    // Each slot takes two rows per round (j and j + slots), both loaded before either is
    // used, so that twice as many loads are in flight. The loop runs the same number of
    // times in every lane of a warp, so the shuffles always have all 32 lanes; a row past
    // the end is loaded as zeros and changes nothing.
    for (int first = slot; first - lane / lanes_per_slot < length; first += 2 * slots) {
        const int rows[2] = {first, first + slots};
        float key[2][LANE_VALUES] = {}, value[2][LANE_VALUES] = {};
        for (int r = 0; r < 2; r++) {
            if (rows[r] < length) {
                load_row_part(k_rows + rows[r] * row_stride, key[r]);
                load_row_part(v_rows + rows[r] * row_stride, value[r]);
            }
        }
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int h = 0; h < MAX_GROUP; h++) {
                if (h >= group) break;
                const float score = slot_dot(query[h], key[r], lanes_per_slot);
                if (rows[r] < length) online_softmax_step(score, value[r], m[h], l[h], acc[h]);
            }
        }
    }

    // The warp's slots merged into its first slot, by shuffles: XOR with offsets from
    // lanes_per_slot up pairs lane i of one slot with lane i of another.
#pragma unroll
    for (int h = 0; h < MAX_GROUP; h++) {
        if (h >= group) break;
        for (int offset = lanes_per_slot; offset < 32; offset *= 2) {
            float other[LANE_VALUES];
            for (int i = 0; i < LANE_VALUES; i++) other[i] = __shfl_xor_sync(0xffffffff, acc[h][i], offset);
            const float m2 = __shfl_xor_sync(0xffffffff, m[h], offset);
            const float l2 = __shfl_xor_sync(0xffffffff, l[h], offset);
            merge_states(m[h], l[h], acc[h], m2, l2, other);
        }
    }

    // Every warp's state into shared memory, then one merge per (query head, element).
    float* maxima = merge;                    // [warps][group]
    float* sums = maxima + warps * group;     // [warps][group]
    float* partial = sums + warps * group;    // [warps][group][head_dim]
    if (lane < lanes_per_slot) {
#pragma unroll
        for (int h = 0; h < MAX_GROUP; h++) {
            if (h >= group) break;
            if (part == 0) {
                maxima[warp * group + h] = m[h];
                sums[warp * group + h] = l[h];
            }
            for (int i = 0; i < LANE_VALUES; i++) partial[(warp * group + h) * head_dim + part + i] = acc[h][i];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < group * head_dim; e += blockDim.x) {
        const int h = e / head_dim, d = e % head_dim;
        float top = -CUDART_INF_F;
        for (int w = 0; w < warps; w++) top = fmaxf(top, maxima[w * group + h]);
        float total = 0.0f, weighted = 0.0f;
        for (int w = 0; w < warps; w++) {
            const float rescale = __expf(maxima[w * group + h] - top);  // 0 for a warp that saw no key
            total += sums[w * group + h] * rescale;
            weighted += partial[(w * group + h) * head_dim + d] * rescale;
        }
        out[(size_t)(kv_head * group + h) * head_dim + d] = __float2bfloat16(weighted / total);
    }
}
// ANCHOR_END: attention_decode_batch
