#version 450
// `n` rows of activations times a weight part: Y[r, out_offset + o] = X[r] . W[o] + bias[o]
// (-DGATED: up * silu(gate) of two layers). An invocation owns one quad of 4 output channels
// and a tile of 8 activation rows (the workgroup's y): each unpacked weight group serves 32
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

#if !defined(DENSE)
// Each row as linear_gemv's row_times computes it (a block's codes times x, scaled once a block),
// each group's codes unpacked once for the tile.
void tile_times(uint layer, uint q, uint quads, uint row0, uint tile, out vec4 acc[TILE_ROWS]) {
    uint ic4 = pc.ic / 4u;
    uint groups = pc.block_size / 8u;
    vec4 lo[4];
    vec4 hi[4];
    vec4 dots[TILE_ROWS];
    vec4 xs[TILE_ROWS];
    for (uint r = 0u; r < TILE_ROWS; r++) acc[r] = vec4(0.0);
    for (uint b = 0u; b < pc.n_blocks; b++) {
        for (uint r = 0u; r < TILE_ROWS; r++) {
            dots[r] = vec4(0.0);
            xs[r] = vec4(0.0);
        }
        for (uint g = b * groups; g < (b + 1u) * groups; g++) {
            load_codes(layer, g, q, quads, lo, hi);
            for (uint r = 0u; r < tile; r++) {
                uint at = (row0 + r) * ic4 + 2u * g;
                vec4 xa = x[at];
                vec4 xb = x[at + 1u];
                xs[r] += xa + xb;
                dots[r] += quad_dot(lo, hi, xa, xb);
            }
        }
        for (uint r = 0u; r < tile; r++) acc[r] += block_terms(layer, b, q, quads, dots[r], xs[r]);
    }
    for (uint r = 0u; r < tile; r++) acc[r] += layer_bias(layer, q);
}
#else
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
#endif

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
