#version 450
// The linear layer for GPUs, for one activation row or many: Y[r, out_offset + o] =
// X[r] . W[o] + bias[o] (-DGATED: up * silu(gate) of two layers), with each row's input width
// split across a workgroup. linear_gemv.comp's one invocation per quad over the whole row leaves
// a GPU with a few hundred threads for a layer of a thousand channels; here a workgroup takes
// QUADS quads of one row (the workgroup's y), SLICES invocations share each quad, every one
// summing every SLICES-th group of 8 inputs, and shared memory adds the slices up. Neighbouring
// invocations read neighbouring quads, so a slice's loads stay coalesced; a layer's weights are
// read once per row, mostly from the cache when there are many rows.
#include "common.glsl"
#define QUADS 8u
#define SLICES 32u
layout(local_size_x = 256) in;   // QUADS * SLICES
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows; uint ic; uint block_size; uint n_blocks;
    uint out_offset; uint out_stride; uint has_bias; uint n;
} pc;
#include "linear_weights.glsl"

#ifdef GATED
shared vec4 partial[2u * QUADS * SLICES];   // the gate's slices, then the up projection's
#else
shared vec4 partial[QUADS * SLICES];
#endif

vec4 slice_times(uint layer, uint q, uint quads, uint row, uint slice) {
    uint at = row * (pc.ic / 4u);
    vec4 acc = vec4(0.0);
    vec4 lo[4];
    vec4 hi[4];
    for (uint g = slice; g < pc.ic / 8u; g += SLICES) {
        load_group(layer, g, q, quads, g * 8u / pc.block_size, lo, hi);
        acc += quad_dot(lo, hi, x[at + 2u * g], x[at + 2u * g + 1u]);
    }
    return acc;
}

void main() {
    uint local_quad = gl_LocalInvocationID.x % QUADS;
    uint slice = gl_LocalInvocationID.x / QUADS;
    uint q = gl_WorkGroupID.x * QUADS + local_quad;
    uint row = gl_WorkGroupID.y;
    uint quads = (pc.rows + 3u) / 4u;
    bool in_range = q < quads;
    uint at = slice * QUADS + local_quad;
    partial[at] = in_range ? slice_times(0u, q, quads, row, slice) : vec4(0.0);
#ifdef GATED
    partial[QUADS * SLICES + at] = in_range ? slice_times(1u, q, quads, row, slice) : vec4(0.0);
#endif
    for (uint width = SLICES / 2u; width > 0u; width /= 2u) {
        barrier();
        if (slice < width) {
            partial[at] += partial[at + width * QUADS];
#ifdef GATED
            partial[QUADS * SLICES + at] += partial[QUADS * SLICES + at + width * QUADS];
#endif
        }
    }
    if (slice != 0u || !in_range) return;
#ifdef GATED
    vec4 acc = (partial[QUADS * SLICES + local_quad] + layer_bias(1u, q)) * silu(partial[local_quad] + layer_bias(0u, q));
#else
    vec4 acc = partial[local_quad] + layer_bias(0u, q);
#endif
    for (uint c = 0u; c < 4u; c++) {
        if (4u * q + c < pc.rows) y[row * pc.out_stride + pc.out_offset + 4u * q + c] = acc[c];
    }
}
