#version 450
// LayerNorm / RMSNorm over rows of `n` elements, one workgroup per row:
//   rms:  y = x / sqrt(mean(x^2) + eps) * gamma (+ beta)
//   else: y = (x - mean) / sqrt(var + eps) * gamma + beta
// gamma and beta are bound to a placeholder and ignored when their flag is off.
// -DRESIDUAL: the row is x + residual (a decoder layer's residual add), summed in each pass and
// written to `total` in the last one, so the add and the norm are one dispatch.
#include "common.glsl"
layout(local_size_x = 64) in;
#ifdef RESIDUAL
layout(std430, binding = 0) readonly buffer X { float xa[]; };
layout(std430, binding = 4) readonly buffer Residual { float xb[]; };
layout(std430, binding = 5) writeonly buffer Total { float total[]; };
#define X_AT(i) (xa[i] + xb[i])
#else
layout(std430, binding = 0) readonly buffer X { float x[]; };
#define X_AT(i) x[i]
#endif
layout(std430, binding = 1) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 2) readonly buffer Beta { float beta[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint rows; uint n; float eps; uint rms; uint has_gamma; uint has_beta; } pc;

shared float partial[64];

float workgroup_sum(float v) {
    uint l = gl_LocalInvocationID.x;
    partial[l] = v;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1u) {
        if (l < s) partial[l] += partial[l + s];
        barrier();
    }
    float total = partial[0];
    barrier();
    return total;
}

void main() {
    uint row = group_index();
    if (row >= pc.rows) return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * pc.n;
    float mean = 0.0;
    if (pc.rms == 0u) {
        float s = 0.0;
        for (uint i = l; i < pc.n; i += 64u) s += X_AT(base + i);
        mean = workgroup_sum(s) / float(pc.n);
    }
    float sq = 0.0;
    for (uint i = l; i < pc.n; i += 64u) {
        float c = X_AT(base + i) - mean;
        sq += c * c;
    }
    float inv = inversesqrt(workgroup_sum(sq) / float(pc.n) + pc.eps);
    for (uint i = l; i < pc.n; i += 64u) {
        float sum = X_AT(base + i);
#ifdef RESIDUAL
        total[base + i] = sum;
#endif
        float v = (sum - mean) * inv;
        if (pc.has_gamma != 0u) v *= gamma[i];
        if (pc.has_beta != 0u) v += beta[i];
        y[base + i] = v;
    }
}
