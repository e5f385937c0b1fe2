#version 450
// Appends this step's keys and values to one layer's cache, each row at its place (kv_place.glsl:
// read from the step buffer or the rows table that the host writes before each submit, the
// commands being recorded once). New k, v: [seq, kv_heads, head_dim]; caches: one region of
// [kv_heads, capacity, head_dim] of STORE per sequence.
#include "common.glsl"
#define STEP_BINDING 2
#define ROWS_BINDING 3
#include "kv_place.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k_new[]; };
layout(std430, binding = 1) readonly buffer V { float v_new[]; };
layout(std430, binding = 4) writeonly buffer KC { STORE k_cache[]; };
layout(std430, binding = 5) writeonly buffer VC { STORE v_cache[]; };
layout(push_constant) uniform Push { uint seq; uint kv_heads; uint head_dim; uint capacity; uint batched; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.seq * pc.kv_heads * pc.head_dim) return;
    uint d = i % pc.head_dim;
    uint h = (i / pc.head_dim) % pc.kv_heads;
    uint s = i / (pc.head_dim * pc.kv_heads);
    uvec2 place = row_place(s, pc.batched);
    if (place.x == IDLE_ROW || place.y >= pc.capacity) return;
    uint at = (place.x + h * pc.capacity + place.y) * pc.head_dim + d;
    k_cache[at] = STORE(k_new[i]);
    v_cache[at] = STORE(v_new[i]);
}
