#version 450
// `n` rows of activations times a weight part: Y[r, out_offset + o] = X[r] . W[o] + bias[o]
// (-DGATED: up * silu(gate) of two layers). An invocation owns one quad of 4 output channels
// and a tile of 8 activation rows (the workgroup's y): each dequantized weight group serves 32
// outputs. No shared memory, no barriers.
#include "common.glsl"
#define TILE_ROWS 8u
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows; uint ic; uint block_size; uint n_blocks;
    uint out_offset; uint out_stride; uint has_bias; uint n;
} pc;
#include "linear_weights.glsl"

void tile_times(uint layer, uint q, uint quads, uint row0, uint tile, out vec4 acc[TILE_ROWS]) {
    uint ic4 = pc.ic / 4u;
    for (uint r = 0u; r < TILE_ROWS; r++) acc[r] = layer_bias(layer, q);
    vec4 lo[4];
    vec4 hi[4];
    for (uint g = 0u; g < pc.ic / 8u; g++) {
        load_group(layer, g, q, quads, g * 8u / pc.block_size, lo, hi);
        for (uint r = 0u; r < tile; r++) {
            uint at = (row0 + r) * ic4 + 2u * g;
            acc[r] += quad_dot(lo, hi, x[at], x[at + 1u]);
        }
    }
}

void main() {
    uint q = gl_GlobalInvocationID.x;
    uint quads = (pc.rows + 3u) / 4u;
    if (q >= quads) return;
    uint row0 = gl_WorkGroupID.y * TILE_ROWS;
    uint tile = min(TILE_ROWS, pc.n - row0);
    vec4 acc[TILE_ROWS];
    tile_times(0u, q, quads, row0, tile, acc);
#ifdef GATED
    vec4 up[TILE_ROWS];
    tile_times(1u, q, quads, row0, tile, up);
    for (uint r = 0u; r < tile; r++) acc[r] = up[r] * silu(acc[r]);
#endif
    for (uint r = 0u; r < tile; r++) {
        for (uint c = 0u; c < 4u; c++) {
            if (4u * q + c < pc.rows) y[(row0 + r) * pc.out_stride + pc.out_offset + 4u * q + c] = acc[r][c];
        }
    }
}
