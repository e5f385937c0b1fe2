#version 450
// The gated delta rule's q and k (backends/vulkan/ops/linear_attention.py): one invocation per
// (token, k head, q or k) makes the head's head_k_dim values of mixed (seq, channels) unit length
// (where l2norm is set, 1e-6 under the root), then scales q's by 1 / sqrt(head_k_dim).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Mixed { float mixed[]; };
layout(push_constant) uniform Push { uint channels; uint k_heads; uint seq; uint head_k_dim; uint l2norm; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.seq * 2 * pc.k_heads) return;
    uint t = i / (2 * pc.k_heads);
    uint head = i % (2 * pc.k_heads);   // heads 0 .. k_heads - 1 are q's
    uint base = t * pc.channels + head * pc.head_k_dim;
    float scale = head < pc.k_heads ? inversesqrt(float(pc.head_k_dim)) : 1.0;
    if (pc.l2norm != 0) {
        float sum = 0.0;
        for (uint d = 0; d < pc.head_k_dim; d++) sum += mixed[base + d] * mixed[base + d];
        float norm = 1.0 / sqrt(sum + 1e-6);
        for (uint d = 0; d < pc.head_k_dim; d++) mixed[base + d] *= norm;
    }
    for (uint d = 0; d < pc.head_k_dim; d++) mixed[base + d] *= scale;
}
