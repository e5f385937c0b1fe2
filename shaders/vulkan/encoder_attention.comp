#version 450
// An encoder's attention (kv_cache false: a vision tower's): every query row over every key row
// of this step's own k and v (float activations, seq-major [seq][kv_heads][head_dim]; no cache,
// no causal mask), with the mask input added to the scaled scores: mask_planes planes of
// [seq][seq], head h reading plane min(h, mask_planes - 1); mask_planes 0: no mask (binding 3 is
// then a placeholder). One invocation per (query row, head), an online softmax in registers.
// A masked score (float's lowest) is clamped to HIDDEN_SCORE, whose weight vanishes at the first
// visible key.
#include "common.glsl"
#define MAX_HEAD_DIM 256u
#define HIDDEN_SCORE -1.0e30
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Mask { float mask[]; };
layout(std430, binding = 4) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint seq; uint heads; uint kv_heads; uint head_dim; float scale; uint mask_planes;
} pc;

void main() {
    uint item = global_index();
    if (item >= pc.seq * pc.heads) return;
    uint s = item / pc.heads;
    uint h = item % pc.heads;
    uint g = h / (pc.heads / pc.kv_heads);
    uint plane = min(h, max(pc.mask_planes, 1u) - 1u);
    float acc[MAX_HEAD_DIM];
    for (uint d = 0u; d < pc.head_dim; d++) acc[d] = 0.0;
    float running_max = HIDDEN_SCORE;
    float running_sum = 0.0;
    for (uint t = 0u; t < pc.seq; t++) {
        uint key = (t * pc.kv_heads + g) * pc.head_dim;
        float score = 0.0;
        for (uint d = 0u; d < pc.head_dim; d++) score += q[item * pc.head_dim + d] * k[key + d];
        score *= pc.scale;
        if (pc.mask_planes > 0u) score = max(score + mask[(plane * pc.seq + s) * pc.seq + t], HIDDEN_SCORE);
        float next_max = max(running_max, score);
        float rescale = exp(running_max - next_max);
        float p = exp(score - next_max);
        running_sum = running_sum * rescale + p;
        for (uint d = 0u; d < pc.head_dim; d++) acc[d] = acc[d] * rescale + p * v[key + d];
        running_max = next_max;
    }
    for (uint d = 0u; d < pc.head_dim; d++) o[item * pc.head_dim + d] = acc[d] / running_sum;
}
