#version 450
// kv_store for a quantized cache (kv_int8.glsl): one invocation per (token, kv head) row finds
// the row's scale max|x| / 127 and writes its codes; with KEY_INT8 only, the values are stored
// as STORE, as kv_store does. New k, v: [seq, kv_heads, head_dim], head_dim a multiple of 4; each
// row at its place (kv_place.glsl).
#include "common.glsl"
#include "kv_int8.glsl"
#define STEP_BINDING 2
#define ROWS_BINDING 3
#include "kv_place.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { vec4 k_new[]; };
layout(std430, binding = 1) readonly buffer V { vec4 v_new[]; };
layout(std430, binding = 4) writeonly buffer KC { uint k_cache[]; };
#ifdef VALUE_INT8
layout(std430, binding = 5) writeonly buffer VC { uint v_cache[]; };
#else
layout(std430, binding = 5) writeonly buffer VC { STORE4 v_cache[]; };
#endif
layout(std430, binding = 6) writeonly buffer KS { float k_scale[]; };
#ifdef VALUE_INT8
layout(std430, binding = 7) writeonly buffer VS { float v_scale[]; };
#endif
layout(push_constant) uniform Push { uint seq; uint kv_heads; uint head_dim; uint capacity; uint batched; } pc;

float row_scale(bool keys, uint first, uint words) {
    vec4 largest = vec4(0.0);
    for (uint w = 0u; w < words; w++) largest = max(largest, abs(keys ? k_new[first + w] : v_new[first + w]));
    return max(max(largest.x, largest.y), max(largest.z, largest.w)) / 127.0;
}

void main() {
    uint r = global_index();
    if (r >= pc.seq * pc.kv_heads) return;
    uint h = r % pc.kv_heads;
    uint s = r / pc.kv_heads;
    uvec2 place = row_place(s, pc.batched);
    if (place.x == IDLE_ROW || place.y >= pc.capacity) return;
    uint words = pc.head_dim / 4u;
    uint row = place.x + h * pc.capacity + place.y;
    uint first = r * words;
    float scale = row_scale(true, first, words);
    float inverse = scale > 0.0 ? 1.0 / scale : 0.0;
    for (uint w = 0u; w < words; w++) k_cache[row * words + w] = pack_codes(k_new[first + w], inverse);
    k_scale[row] = scale;
#ifdef VALUE_INT8
    scale = row_scale(false, first, words);
    inverse = scale > 0.0 ? 1.0 / scale : 0.0;
    for (uint w = 0u; w < words; w++) v_cache[row * words + w] = pack_codes(v_new[first + w], inverse);
    v_scale[row] = scale;
#else
    for (uint w = 0u; w < words; w++) v_cache[row * words + w] = STORE4(v_new[first + w]);
#endif
}
