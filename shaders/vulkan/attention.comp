#version 450
// Causal attention of one query row and head against the cache, one workgroup each:
// row s, at position p of its sequence's region (kv_place.glsl), sees entries 0 .. p of it; an
// idle row (no sequence's) writes zeros. Heads share kv head
// h / (heads / kv_heads). Scores go through `scores` (float, [seq * heads, capacity]) in
// three passes: dot products and their max, exp and their sum, then the weighted sum of values.
// With KEY_INT8 / VALUE_INT8 (kv_int8.glsl) the cache holds codes and bindings 7 / 8 the scales.
#include "common.glsl"
#include "kv_int8.glsl"
#define STEP_BINDING 3
#define ROWS_BINDING 4
#include "kv_place.glsl"
#define MAX_HEAD_DIM 256u
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
#ifdef KEY_INT8
layout(std430, binding = 1) readonly buffer KC { uint k_cache[]; };
layout(std430, binding = 7) readonly buffer KS { float k_scale[]; };
#define KEY(at) code_at(k_cache[(at) / 4u], (at) % 4u)
#define KEY_SCALE(row) k_scale[row]
#else
layout(std430, binding = 1) readonly buffer KC { STORE k_cache[]; };
#define KEY(at) float(k_cache[at])
#define KEY_SCALE(row) 1.0
#endif
#ifdef VALUE_INT8
layout(std430, binding = 2) readonly buffer VC { uint v_cache[]; };
layout(std430, binding = 8) readonly buffer VS { float v_scale[]; };
#define VALUE(at) code_at(v_cache[(at) / 4u], (at) % 4u)
#define VALUE_SCALE(row) v_scale[row]
#else
layout(std430, binding = 2) readonly buffer VC { STORE v_cache[]; };
#define VALUE(at) float(v_cache[at])
#define VALUE_SCALE(row) 1.0
#endif
layout(std430, binding = 5) coherent buffer Scores { float scores[]; };
layout(std430, binding = 6) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint seq; uint heads; uint kv_heads; uint head_dim; uint capacity; float scale;
    uint window;   // a sliding layer's key window: only the last `window` visible entries; 0: all
    uint batched;  // rows of several sequences: each row's place from the rows table (kv_place.glsl)
} pc;

shared float q_row[MAX_HEAD_DIM];
shared float partial[64];

float workgroup_reduce(float v, bool take_max) {
    uint l = gl_LocalInvocationID.x;
    partial[l] = v;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1u) {
        if (l < s) partial[l] = take_max ? max(partial[l], partial[l + s]) : partial[l] + partial[l + s];
        barrier();
    }
    float total = partial[0];
    barrier();
    return total;
}

void main() {
    uint item = group_index();
    if (item >= pc.seq * pc.heads) return;
    uint l = gl_LocalInvocationID.x;
    uint s = item / pc.heads;
    uint h = item % pc.heads;
    uint g = h / (pc.heads / pc.kv_heads);
    uint D = pc.head_dim;
    uint q_base = item * D;
    uvec2 place = row_place(s, pc.batched);
    if (place.x == IDLE_ROW) {   // the same for the whole workgroup: no barrier is left waiting
        for (uint d = l; d < D; d += 64u) o[q_base + d] = 0.0;
        return;
    }
    uint visible = min(place.y + 1u, pc.capacity);
    uint first = (pc.window > 0u && visible > pc.window) ? visible - pc.window : 0u;
    for (uint d = l; d < D; d += 64u) q_row[d] = q[q_base + d];
    barrier();

    uint kv_base = place.x + g * pc.capacity;
    uint score_base = item * pc.capacity;
    float local_max = -3.0e38;
    for (uint t = first + l; t < visible; t += 64u) {
        uint k_base = (kv_base + t) * D;
        float dot_qk = 0.0;
        for (uint d = 0u; d < D; d++) dot_qk += q_row[d] * KEY(k_base + d);
        dot_qk *= pc.scale * KEY_SCALE(kv_base + t);
        scores[score_base + t] = dot_qk;
        local_max = max(local_max, dot_qk);
    }
    float m = workgroup_reduce(local_max, true);
    float local_sum = 0.0;
    for (uint t = first + l; t < visible; t += 64u) {
        float p = exp(scores[score_base + t] - m);
        scores[score_base + t] = p;
        local_sum += p;
    }
    float inv_sum = 1.0 / workgroup_reduce(local_sum, false);
    memoryBarrierBuffer();
    barrier();
    for (uint d = l; d < D; d += 64u) {
        float acc = 0.0;
        for (uint t = first; t < visible; t++) {
            acc += scores[score_base + t] * VALUE_SCALE(kv_base + t) * VALUE((kv_base + t) * D + d);
        }
        o[q_base + d] = acc * inv_sum;
    }
}
