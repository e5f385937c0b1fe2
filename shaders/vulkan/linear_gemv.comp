#version 450
// One row of activations times a weight part: y[out_offset + o] = W[o] . x + bias[o]
// (-DGATED: up[o] * silu(gate[o]) of two layers). Each invocation computes one quad of 4
// output channels over the whole row: no shared memory, no barriers (CPU drivers such as
// lavapipe run those slowly).
//
// -DEXPERT: the experts a MoE router chose (fused.SparseMoE), the weight buffers stacking every
// expert, the router's expert ids and weights (k per row) in two more buffers. Workgroup row y:
//   with GATED, entry y = row * k + slot: y[entry] = up * silu(gate) of expert ids[entry] on x[row];
//   without, row y: y[row] = sum over its k slots of weight * (W_ids x[row * k + slot] + bias).
// Only the chosen experts' weights are read; an id outside [0, n_experts) gives NaN.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows; uint ic; uint block_size; uint n_blocks;
    uint out_offset; uint out_stride; uint has_bias; uint n;
#ifdef EXPERT
    uint k; uint n_experts;
#endif
} pc;
#include "linear_weights.glsl"

#ifdef EXPERT
#ifdef GATED
#define ROUTE_BINDING 10
#else
#define ROUTE_BINDING 6
#endif
layout(std430, binding = ROUTE_BINDING) readonly buffer Ids { int ids[]; };
layout(std430, binding = ROUTE_BINDING + 1) readonly buffer Route { float route_weight[]; };
uint x_base = 0u;   // the activation row's first vec4

// Point the weight loads at expert `id`'s slice of the stacked buffers; false for an id out of range.
bool choose_expert(int id, uint quads) {
    if (id < 0 || uint(id) >= pc.n_experts) return false;
    uint e = uint(id);
#if defined(Q4)
    expert_weights = e * (pc.ic / 8u) * quads;
#elif defined(Q8)
    expert_weights = e * (pc.ic / 4u) * quads;
#else
    expert_weights = e * (pc.ic / 8u) * quads * 32u;
#endif
    expert_blocks = e * pc.n_blocks * quads;
    expert_bias = e * quads;
    return true;
}
#else
const uint x_base = 0u;
#endif

#if !defined(DENSE)
// A block's codes times x, scaled once a block (linear_weights.glsl: load_codes, block_terms): on
// lavapipe, dequantizing each weight on its own was a fifth of the decode step. linear_gemm.comp
// gives each of its rows these very operations, so a batched row gets the bits it gets alone.
vec4 row_times(uint layer, uint q, uint quads) {
    vec4 acc = vec4(0.0);
    vec4 lo[4];
    vec4 hi[4];
    uint groups = pc.block_size / 8u;
    for (uint b = 0u; b < pc.n_blocks; b++) {
        vec4 dots = vec4(0.0);
        vec4 xs = vec4(0.0);
        for (uint g = b * groups; g < (b + 1u) * groups; g++) {
            vec4 xa = x[x_base + 2u * g];
            vec4 xb = x[x_base + 2u * g + 1u];
            load_codes(layer, g, q, quads, lo, hi);
            xs += xa + xb;
            dots += quad_dot(lo, hi, xa, xb);
        }
        acc += block_terms(layer, b, q, quads, dots, xs);
    }
    return acc + layer_bias(layer, q);
}
#else
vec4 row_times(uint layer, uint q, uint quads) {
    vec4 acc = vec4(0.0);
    vec4 lo[4];
    vec4 hi[4];
    for (uint g = 0u; g < pc.ic / 8u; g++) {
        load_group(layer, g, q, quads, g * 8u / pc.block_size, lo, hi);
        acc += quad_dot(lo, hi, x[x_base + 2u * g], x[x_base + 2u * g + 1u]);
    }
    return acc + layer_bias(layer, q);
}
#endif

#ifdef EXPERT
void main() {
    uint q = gl_WorkGroupID.x * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    uint quads = (pc.rows + 3u) / 4u;
    if (q >= quads) return;
    uint at = gl_WorkGroupID.y;
    vec4 acc = vec4(uintBitsToFloat(0x7fc00000u));
#ifdef GATED
    x_base = (at / pc.k) * (pc.ic / 4u);
    if (choose_expert(ids[at], quads)) acc = row_times(1u, q, quads) * silu(row_times(0u, q, quads));
#else
    acc = vec4(0.0);
    for (uint slot = 0u; slot < pc.k; slot++) {
        uint entry = at * pc.k + slot;
        x_base = entry * (pc.ic / 4u);
        if (choose_expert(ids[entry], quads)) acc += route_weight[entry] * row_times(0u, q, quads);
        else acc += vec4(uintBitsToFloat(0x7fc00000u));
    }
#endif
    for (uint c = 0u; c < 4u; c++) {
        if (4u * q + c < pc.rows) y[pc.out_offset + at * pc.out_stride + 4u * q + c] = acc[c];
    }
}
#else
void main() {
    uint q = global_index();
    uint quads = (pc.rows + 3u) / 4u;
    if (q >= quads) return;
#ifdef GATED
    vec4 acc = row_times(1u, q, quads) * silu(row_times(0u, q, quads));
#else
    vec4 acc = row_times(0u, q, quads);
#endif
    for (uint c = 0u; c < 4u; c++) {
        if (4u * q + c < pc.rows) y[pc.out_offset + 4u * q + c] = acc[c];
    }
}
#endif
