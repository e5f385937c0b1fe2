#version 450
// The gated delta rule (backends/vulkan/ops/linear_attention.py): one invocation per (v head h,
// state column j) keeps S[:, j] of h's (head_k_dim, head_v_dim) float32 state in registers over
// the forward's first ctl.rows tokens. Per token, with q and k of k head h / (heads / k_heads) in
// mixed (seq, channels): S <- exp(gate) S; delta = beta (v - S^T k); S <- S + k delta;
// out = S^T q. Later rows (a prefill chunk's padding) give 0 and leave S alone.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Mixed { float mixed[]; };
layout(std430, binding = 1) readonly buffer Gate { float gate[]; };
layout(std430, binding = 2) readonly buffer Beta { float beta[]; };
layout(std430, binding = 3) buffer State { float state[]; };
layout(std430, binding = 4) writeonly buffer Out { float out_rows[]; };
layout(std430, binding = 5) readonly buffer Control { uint rows; uint save; } ctl;
layout(push_constant) uniform Push {
    uint channels; uint heads; uint head_v_dim; uint k_heads; uint seq; uint head_k_dim;
} pc;

#define MAX_HEAD_K_DIM 256

void main() {
    uint i = global_index();
    if (i >= pc.heads * pc.head_v_dim) return;
    uint h = i / pc.head_v_dim;
    uint j = i % pc.head_v_dim;
    uint keys = pc.k_heads * pc.head_k_dim;
    uint q_at = (h / (pc.heads / pc.k_heads)) * pc.head_k_dim;
    uint column = h * pc.head_k_dim * pc.head_v_dim + j;
    float s[MAX_HEAD_K_DIM];
    for (uint d = 0; d < pc.head_k_dim; d++) s[d] = state[column + d * pc.head_v_dim];
    for (uint t = 0; t < ctl.rows; t++) {
        uint row = t * pc.channels;
        float v = mixed[row + 2 * keys + h * pc.head_v_dim + j];
        float decay = exp(gate[t * pc.heads + h]);
        float recalled = 0.0;
        for (uint d = 0; d < pc.head_k_dim; d++) {
            s[d] *= decay;
            recalled += s[d] * mixed[row + keys + q_at + d];
        }
        float delta = beta[t * pc.heads + h] * (v - recalled);
        float y = 0.0;
        for (uint d = 0; d < pc.head_k_dim; d++) {
            s[d] += mixed[row + keys + q_at + d] * delta;
            y += s[d] * mixed[row + q_at + d];
        }
        out_rows[t * pc.heads * pc.head_v_dim + i] = y;
    }
    for (uint t = ctl.rows; t < pc.seq; t++) out_rows[t * pc.heads * pc.head_v_dim + i] = 0.0;
    for (uint d = 0; d < pc.head_k_dim; d++) state[column + d * pc.head_v_dim] = s[d];
}
