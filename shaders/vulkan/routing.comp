#version 450
// The MoE router's ops, one variant each: SOFTMAX, TOP_K, REDUCE (over (outer, n, inner) lines,
// one invocation per (outer, inner) line of n values: routers are narrow, n = the number of
// experts) and EXPERT_ADD (out = (acc +) w * y, w the weight the router gave `expert` per row).
#include "common.glsl"
layout(local_size_x = 64) in;

#if defined(EXPERT_ADD)
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { float weights[]; };
layout(std430, binding = 2) readonly buffer S { int selected[]; };
layout(std430, binding = 3) readonly buffer Acc { float acc[]; };
layout(std430, binding = 4) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { uint rows; uint width; uint k; int expert; uint has_acc; } pc;

void main() {
    uint at = global_index();
    if (at >= pc.rows * pc.width) return;
    uint row = at / pc.width;
    float w = 0.0;
    for (uint j = 0u; j < pc.k; j++)
        if (selected[row * pc.k + j] == pc.expert) w += weights[row * pc.k + j];
    float v = w * y[at];
    if (pc.has_acc != 0u) v += acc[at];
    out_[at] = v;
}
#else
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float out_[]; };
#ifdef TOP_K
layout(std430, binding = 2) writeonly buffer Indices { int indices[]; };
#endif
// op: REDUCE's operation (runtime/routing.py REDUCE_CODES); k: TOP_K's count
layout(push_constant) uniform Push { uint outer; uint n; uint inner; uint op; uint k; } pc;

void main() {
    uint line = global_index();
    if (line >= pc.outer * pc.inner) return;
    uint o = line / pc.inner;
    uint i = line - o * pc.inner;
    uint base = o * pc.n * pc.inner + i;
#if defined(SOFTMAX)
    float top = x[base];
    for (uint j = 1u; j < pc.n; j++) top = max(top, x[base + j * pc.inner]);
    float sum = 0.0;
    for (uint j = 0u; j < pc.n; j++) sum += exp(x[base + j * pc.inner] - top);
    for (uint j = 0u; j < pc.n; j++) out_[base + j * pc.inner] = exp(x[base + j * pc.inner] - top) / sum;
#elif defined(TOP_K)
    // each pick is the best value ranked after the previous pick (equal values: lower index first)
    uint out_base = o * pc.k * pc.inner + i;
    float last = 0.0;
    int last_index = -1;
    for (uint pick = 0u; pick < pc.k; pick++) {
        float best = 0.0;
        int best_index = -1;
        for (uint j = 0u; j < pc.n; j++) {
            float v = x[base + j * pc.inner];
            bool after = last_index < 0 || v < last || (v == last && int(j) > last_index);
            if (after && (best_index < 0 || v > best)) { best = v; best_index = int(j); }
        }
        out_[out_base + pick * pc.inner] = best;
        indices[out_base + pick * pc.inner] = best_index;
        last = best;
        last_index = best_index;
    }
#else
    float acc = x[base];
    for (uint j = 1u; j < pc.n; j++) {
        float v = x[base + j * pc.inner];
        acc = pc.op == 2u ? max(acc, v) : pc.op == 3u ? min(acc, v) : pc.op == 4u ? acc * v : acc + v;
    }
    out_[line] = pc.op == 1u ? acc / float(pc.n) : acc;
#endif
}
#endif
