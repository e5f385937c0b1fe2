#version 450
// One row of activations times a weight part: y[out_offset + o] = W[o] . x + bias[o]
// (-DGATED: up[o] * silu(gate[o]) of two layers). Each invocation computes one quad of 4
// output channels over the whole row: no shared memory, no barriers (CPU drivers such as
// lavapipe run those slowly).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows; uint ic; uint block_size; uint n_blocks;
    uint out_offset; uint out_stride; uint has_bias; uint n;
} pc;
#include "linear_weights.glsl"

vec4 row_times(uint layer, uint q, uint quads) {
    vec4 acc = vec4(0.0);
    vec4 lo[4];
    vec4 hi[4];
    for (uint g = 0u; g < pc.ic / 8u; g++) {
        load_group(layer, g, q, quads, g * 8u / pc.block_size, lo, hi);
        acc += quad_dot(lo, hi, x[2u * g], x[2u * g + 1u]);
    }
    return acc + layer_bias(layer, q);
}

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
