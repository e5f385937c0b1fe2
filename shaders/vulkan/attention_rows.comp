#version 450
// Causal attention with one invocation per query row and head, for CPU devices (lavapipe),
// where barriers and shared memory are slow: an online softmax over the visible cache entries
// of the row's sequence (kv_place.glsl), keeping the running max, sum and weighted values in registers.
// Same bindings and push constants as attention.comp, without the scores buffer; head_dim a
// multiple of 4.
// With KEY_INT8 / VALUE_INT8 (kv_int8.glsl) the cache holds codes and bindings 6 / 7 the scales.
#include "common.glsl"
#include "kv_int8.glsl"
#define STEP_BINDING 3
#define ROWS_BINDING 4
#include "kv_place.glsl"
#define MAX_HEAD_DIM4 64u
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
#ifdef KEY_INT8
layout(std430, binding = 1) readonly buffer KC { uint k_cache[]; };
layout(std430, binding = 6) readonly buffer KS { float k_scale[]; };
#define KEY4(at) codes4(k_cache[at])
#define KEY_SCALE(row) k_scale[row]
#else
layout(std430, binding = 1) readonly buffer KC { STORE4 k_cache[]; };
#define KEY4(at) vec4(k_cache[at])
#define KEY_SCALE(row) 1.0
#endif
#ifdef VALUE_INT8
layout(std430, binding = 2) readonly buffer VC { uint v_cache[]; };
layout(std430, binding = 7) readonly buffer VS { float v_scale[]; };
#define VALUE4(at) codes4(v_cache[at])
#define VALUE_SCALE(row) v_scale[row]
#else
layout(std430, binding = 2) readonly buffer VC { STORE4 v_cache[]; };
#define VALUE4(at) vec4(v_cache[at])
#define VALUE_SCALE(row) 1.0
#endif
layout(std430, binding = 5) writeonly buffer Out { vec4 o[]; };
layout(push_constant) uniform Push {
    uint seq; uint heads; uint kv_heads; uint head_dim; uint capacity; float scale;
    uint window;   // a sliding layer's key window: only the last `window` visible entries; 0: all
    uint batched;  // rows of several sequences: each row's place from the rows table (kv_place.glsl)
} pc;

void main() {
    uint item = global_index();
    if (item >= pc.seq * pc.heads) return;
    uint s = item / pc.heads;
    uint h = item % pc.heads;
    uint g = h / (pc.heads / pc.kv_heads);
    uint D4 = pc.head_dim / 4u;
    uvec2 place = row_place(s, pc.batched);
    if (place.x == IDLE_ROW) {
        for (uint d = 0u; d < D4; d++) o[item * D4 + d] = vec4(0.0);
        return;
    }
    uint visible = min(place.y + 1u, pc.capacity);
    uint first = (pc.window > 0u && visible > pc.window) ? visible - pc.window : 0u;
    vec4 q_row[MAX_HEAD_DIM4];
    vec4 acc[MAX_HEAD_DIM4];
    for (uint d = 0u; d < D4; d++) {
        q_row[d] = q[item * D4 + d] * pc.scale;
        acc[d] = vec4(0.0);
    }
    float running_max = -3.0e38;
    float running_sum = 0.0;
    for (uint t = first; t < visible; t++) {
        uint row = place.x + g * pc.capacity + t;
        uint base = row * D4;
        float score = 0.0;
        for (uint d = 0u; d < D4; d++) score += dot(q_row[d], KEY4(base + d));
        score *= KEY_SCALE(row);
        float next_max = max(running_max, score);
        float rescale = exp(running_max - next_max);
        float p = exp(score - next_max);
        running_sum = running_sum * rescale + p;
        float weight = p * VALUE_SCALE(row);
        for (uint d = 0u; d < D4; d++) acc[d] = acc[d] * rescale + weight * VALUE4(base + d);
        running_max = next_max;
    }
    for (uint d = 0u; d < D4; d++) o[item * D4 + d] = acc[d] / running_sum;
}
