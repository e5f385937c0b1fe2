#version 450
// Appends this step's keys and values to one layer's cache at the kept length `past`, read
// from the step buffer that the host writes before each submit (the commands are recorded
// once). New k, v: [seq, kv_heads, head_dim]; caches: [kv_heads, capacity, head_dim] of STORE.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k_new[]; };
layout(std430, binding = 1) readonly buffer V { float v_new[]; };
layout(std430, binding = 2) readonly buffer Step { uint past; } step;
layout(std430, binding = 3) writeonly buffer KC { STORE k_cache[]; };
layout(std430, binding = 4) writeonly buffer VC { STORE v_cache[]; };
layout(push_constant) uniform Push { uint seq; uint kv_heads; uint head_dim; uint capacity; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.seq * pc.kv_heads * pc.head_dim) return;
    uint d = i % pc.head_dim;
    uint h = (i / pc.head_dim) % pc.kv_heads;
    uint s = i / (pc.head_dim * pc.kv_heads);
    uint pos = step.past + s;
    if (pos >= pc.capacity) return;
    uint at = (h * pc.capacity + pos) * pc.head_dim + d;
    k_cache[at] = STORE(k_new[i]);
    v_cache[at] = STORE(v_new[i]);
}
