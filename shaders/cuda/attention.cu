// MNN's fused Attention with the KV cache on the device.
//
// Each layer's cache: one buffer per side holding every sequence's region, real_t
// [slot][kv_heads][capacity][head_dim]; a sequence owns one slot. Where each row of a forward goes
// (its slot, and its position there) is read from device memory the backend writes before each
// step, so one prepared launch (or CUDA graph) serves every step and every sequence:
//   a forward of one sequence (batched 0): step = {past, slot}, row s at position past + s;
//   a batched forward (rows of several sequences): rows_table[2 s], [2 s + 1] = row s's slot and
//   position; a row no sequence holds has slot IDLE_SLOT: it stores nothing and its output is zero.
// q: [seq, heads, head_dim]; k, v (this step's): [seq, kv_heads, head_dim]; out: [seq, heads * head_dim].
#include "common.cuh"

#define ATT_TILE 128                 // keys per tile; also the threads per block
#define MAX_HEAD_DIM (2 * ATT_TILE)  // each thread owns output dims t and t + ATT_TILE
#define IDLE_SLOT (-1)

struct Place {
    int slot;
    int position;
};

__device__ __forceinline__ Place row_place(int s, int batched, const int* step, const int* rows_table) {
    Place place;
    if (batched) {
        place.slot = rows_table[2 * s];
        place.position = rows_table[2 * s + 1];
    } else {
        place.slot = step[1];
        place.position = step[0] + s;
    }
    return place;
}

// The first element of (slot, kv head)'s keys or values.
__device__ __forceinline__ size_t head_start(int slot, int kv_heads, int kv_head, int capacity, int head_dim) {
    return ((size_t)slot * kv_heads + kv_head) * capacity * head_dim;
}

extern "C" __global__ void kv_append(int seq, int kv_heads, int head_dim, int capacity, int batched,
                                     const int* step, const int* rows_table, const real_t* k_new,
                                     const real_t* v_new, real_t* k_cache, real_t* v_cache) {
    FOR_EACH_ELEMENT(i, seq * kv_heads * head_dim) {
        const int d = i % head_dim;
        const int h = (i / head_dim) % kv_heads;
        const int s = i / (head_dim * kv_heads);
        const Place place = row_place(s, batched, step, rows_table);
        if (place.slot == IDLE_SLOT || place.position >= capacity) continue;
        const size_t dst =
            head_start(place.slot, kv_heads, h, capacity, head_dim) + (size_t)place.position * head_dim + d;
        k_cache[dst] = k_new[i];
        v_cache[dst] = v_new[i];
    }
}

// One block per (head, query row), causal: row i, at position p of its slot, sees keys [0, p], with
// a key window > 0 (a sliding layer) only the last `window` of them. Softmax is computed
// online over tiles of ATT_TILE keys (running max and sum), so no buffer grows with the length.
extern "C" __global__ void attention(int seq, int heads, int kv_heads, int head_dim, int capacity, float scale,
                                     int window, int batched, const int* step, const int* rows_table,
                                     const real_t* q, const real_t* k_cache, const real_t* v_cache, real_t* out) {
    __shared__ float q_row[MAX_HEAD_DIM];
    __shared__ float p[ATT_TILE];
    const int h = blockIdx.x, i = blockIdx.y, t = threadIdx.x;
    const int kv_head = h / (heads / kv_heads);
    real_t* dst = out + ((size_t)i * heads + h) * head_dim;
    const Place place = row_place(i, batched, step, rows_table);
    if (place.slot == IDLE_SLOT) {  // the same for the whole block: no __syncthreads is left waiting
        for (int d = t; d < head_dim; d += ATT_TILE) dst[d] = from_float(0.0f);
        return;
    }
    const int visible = min(place.position + 1, capacity);
    const int first = window > 0 ? max(0, visible - window) : 0;
    const real_t* q_src = q + ((size_t)i * heads + h) * head_dim;
    for (int d = t; d < head_dim; d += ATT_TILE) q_row[d] = to_float(q_src[d]);
    const real_t* keys = k_cache + head_start(place.slot, kv_heads, kv_head, capacity, head_dim);
    const real_t* values = v_cache + head_start(place.slot, kv_heads, kv_head, capacity, head_dim);
    float running_max = NEG_INFINITY, running_sum = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    __syncthreads();
    for (int start = first; start < visible; start += ATT_TILE) {
        const int j = start + t;
        float score = NEG_INFINITY;
        if (j < visible) {
            const real_t* key = keys + (size_t)j * head_dim;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) dot += q_row[d] * to_float(key[d]);
            score = dot * scale;
        }
        p[t] = score;
        __syncthreads();
        float tile_max = NEG_INFINITY;
        for (int k = 0; k < ATT_TILE; ++k) tile_max = fmaxf(tile_max, p[k]);
        const float new_max = fmaxf(running_max, tile_max);  // finite: every tile has a visible key
        const float correction = expf(running_max - new_max);  // 0 on the first tile
        __syncthreads();                                       // all have read the scores
        p[t] = expf(score - new_max);                          // 0 for the masked keys
        __syncthreads();
        const int count = min(ATT_TILE, visible - start);
        float tile_sum = 0.0f;
        for (int k = 0; k < count; ++k) tile_sum += p[k];
        running_sum = running_sum * correction + tile_sum;
        acc0 *= correction;
        acc1 *= correction;
        for (int k = 0; k < count; ++k) {
            const real_t* value = values + (size_t)(start + k) * head_dim;
            if (t < head_dim) acc0 += p[k] * to_float(value[t]);
            if (t + ATT_TILE < head_dim) acc1 += p[k] * to_float(value[t + ATT_TILE]);
        }
        running_max = new_max;
        __syncthreads();  // p is rewritten by the next tile
    }
    if (t < head_dim) dst[t] = from_float(acc0 / running_sum);
    if (t + ATT_TILE < head_dim) dst[t + ATT_TILE] = from_float(acc1 / running_sum);
}
