// Paged decode attention: a batch of new tokens, each over its own sequence's keys and values,
// read from the page pool through the sequence's block table. This is
// attention_decode_batch.cu with two changes; diff the two.
//
// Row b of the batch attends to positions j < lengths[b]. Position j is at offset
// j % page_size of page block_tables[b][j / page_size], wherever the pool put that page; the
// kernel looks each one up as it streams the keys, and never gathers the sequence into one
// place or stores its scores: the online softmax of chapter 8,
//
//     l   <- l · exp(m - m') + exp(s' - m')
//     acc <- acc · exp(m - m') + exp(s' - m') v'
//
// keeps a running maximum m, sum l and weighted values acc per query head.
//
// The second change is the split (flash-decoding). One block per (key/value head, sequence)
// is 8 blocks for one sequence of Llama 3.2 1B: a long context with few sequences would leave
// most of the GPU's 132 multiprocessors idle. So gridDim.z splits the positions: block z
// takes pages [z · pages_per_split, (z + 1) · pages_per_split) and, when there is more than
// one split, writes its unnormalized state (acc, m, l) for each query head to `partials`;
// attention_merge then combines the splits' states the way the warps' are combined below:
//
//     m = max_z m_z,   l = sum_z l_z exp(m_z - m),   out = sum_z acc_z exp(m_z - m) / l
//
// A split past a sequence's end saw no key (m = -inf) and weighs nothing.
//
// Launch: gridDim = (kv_heads, batch, splits), blockDim.x a multiple of 32 up to THREADS;
// head_dim a multiple of 8 with head_dim / 8 a power of two up to 32; group <= MAX_GROUP;
// dynamic shared memory of warps · group · (head_dim + 2) floats (see
// ops::attention_decode_paged). One layer of the pool is [pages · page_size, kv_heads *
// head_dim]; every lengths[b] is at least 1 and its pages are in the first entries of its
// block table row; partials is [batch, q_heads, splits, head_dim + 2] floats.

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

// ANCHOR: attention_decode_paged
// At most THREADS per block (ops::attention_decode_paged launches exactly that many): the
// bound lets the compiler budget registers so that a launch of that size always fits.
#define THREADS 256
extern "C" __global__ void __launch_bounds__(THREADS) attention_decode_paged(
    const __nv_bfloat16* q_batch,       // [batch, q_heads * head_dim], the new tokens' queries after RoPE
    const __nv_bfloat16* k_layer,       // [pages * page_size, kv_heads * head_dim]: one layer of the pool
    const __nv_bfloat16* v_layer,       // [pages * page_size, kv_heads * head_dim]
    __nv_bfloat16* out_batch,           // [batch, q_heads * head_dim], written when there is one split
    float* partials,                    // [batch, q_heads, splits, head_dim + 2], when there are more
    const unsigned int* block_tables,   // [batch, table_width]: each row's pages, in order
    const unsigned int* lengths,        // [batch]: positions each row attends to, its own included
    int table_width,
    int page_size,                      // positions per page
    int pages_per_split,
    int kv_heads,
    int head_dim,
    int group,                          // query heads per key/value head
    float scale)                        // 1 / sqrt(head_dim)
{
    extern __shared__ float merge[];  // per warp: group maxima, group sums, group × head_dim accumulators
    const int kv_head = blockIdx.x;
    const int row = blockIdx.y;
    const size_t q_width = (size_t)kv_heads * group * head_dim;
    const __nv_bfloat16* q = q_batch + row * q_width;
    __nv_bfloat16* out = out_batch + row * q_width;
    // This block's positions: its split's pages of the sequence, up to the sequence's end.
    const int split = blockIdx.z, splits = gridDim.z;
    const int begin = split * pages_per_split * page_size;
    const int end = min((int)lengths[row], begin + pages_per_split * page_size);
    const unsigned int* block_table = block_tables + (size_t)row * table_width;
    const int lanes_per_slot = head_dim / LANE_VALUES;
    const int slots_per_warp = 32 / lanes_per_slot;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int slot = warp * slots_per_warp + lane / lanes_per_slot;
    const int slots = warps * slots_per_warp;
    const int part = (lane % lanes_per_slot) * LANE_VALUES;  // this lane's first element of a row
    const size_t row_stride = (size_t)kv_heads * head_dim;
    const __nv_bfloat16* k_rows = k_layer + kv_head * head_dim + part;
    const __nv_bfloat16* v_rows = v_layer + kv_head * head_dim + part;

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
    for (int first = begin + slot; first - lane / lanes_per_slot < end; first += 2 * slots) {
        const int rows[2] = {first, first + slots};
        float key[2][LANE_VALUES] = {}, value[2][LANE_VALUES] = {};
        for (int r = 0; r < 2; r++) {
            if (rows[r] < end) {
                // The first change: position -> its page, through the block table -> a pool row.
                const size_t pool_row = (size_t)block_table[rows[r] / page_size] * page_size + rows[r] % page_size;
                load_row_part(k_rows + pool_row * row_stride, key[r]);
                load_row_part(v_rows + pool_row * row_stride, value[r]);
            }
        }
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int h = 0; h < MAX_GROUP; h++) {
                if (h >= group) break;
                const float score = slot_dot(query[h], key[r], lanes_per_slot);
                if (rows[r] < end) online_softmax_step(score, value[r], m[h], l[h], acc[h]);
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
            // 0 for a warp that saw no key (and nothing at all in a split past the end).
            const float rescale = (maxima[w * group + h] == -CUDART_INF_F) ? 0.0f : __expf(maxima[w * group + h] - top);
            total += sums[w * group + h] * rescale;
            weighted += partial[(w * group + h) * head_dim + d] * rescale;
        }
        const int q_head = kv_head * group + h;
        if (splits == 1) {
            out[(size_t)q_head * head_dim + d] = __float2bfloat16(weighted / total);
        } else {
            // This split's state, unnormalized, for attention_merge.
            const int q_heads = kv_heads * group;
            float* state = partials + (((size_t)row * q_heads + q_head) * splits + split) * (head_dim + 2);
            state[d] = weighted;
            if (d == 0) {
                state[head_dim] = top;
                state[head_dim + 1] = total;
            }
        }
    }
}
// ANCHOR_END: attention_decode_paged

// ANCHOR: attention_merge
// The splits' softmax states of each (sequence, query head) merged into its output.
// Launch: gridDim = (q_heads, batch), any number of threads; partials as written above.
extern "C" __global__ void attention_merge(
    const float* partials,       // [batch, q_heads, splits, head_dim + 2]: acc, then m, then l
    __nv_bfloat16* out_batch,    // [batch, q_heads * head_dim]
    int splits,
    int head_dim)
{
    const int q_head = blockIdx.x, q_heads = gridDim.x, row = blockIdx.y;
    const size_t stride = head_dim + 2;
    const float* states = partials + ((size_t)row * q_heads + q_head) * splits * stride;
    float top = -CUDART_INF_F;
    for (int z = 0; z < splits; z++) top = fmaxf(top, states[z * stride + head_dim]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float total = 0.0f, weighted = 0.0f;
        for (int z = 0; z < splits; z++) {
            const float m = states[z * stride + head_dim];
            if (m == -CUDART_INF_F) continue;  // a split past the sequence's end
            const float rescale = __expf(m - top);
            total += states[z * stride + head_dim + 1] * rescale;
            weighted += states[z * stride + d] * rescale;
        }
        out_batch[((size_t)row * q_heads + q_head) * head_dim + d] = __float2bfloat16(weighted / total);
    }
}
// ANCHOR_END: attention_merge
