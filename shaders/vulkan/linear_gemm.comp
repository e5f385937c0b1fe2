#version 450
// `n` rows of activations times a weight part: Y[r, out_offset + o] = X[r] . W[o] + bias[o].
// An invocation owns one quad of 4 output channels and a tile of 8 activation rows (the
// workgroup's y): each dequantized weight group serves 32 outputs. No shared memory, no barriers.
#include "common.glsl"
#include "linear_weights.glsl"
#define TILE_ROWS 8u
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows; uint ic; uint block_size; uint n_blocks;
    uint out_offset; uint out_stride; uint has_bias; uint n;
} pc;

void main() {
    uint q = gl_GlobalInvocationID.x;
    uint quads = (pc.rows + 3u) / 4u;
    if (q >= quads) return;
    uint row0 = gl_WorkGroupID.y * TILE_ROWS;
    uint tile = min(TILE_ROWS, pc.n - row0);
    uint ic4 = pc.ic / 4u;
    vec4 acc[TILE_ROWS];
    for (uint r = 0u; r < TILE_ROWS; r++) acc[r] = vec4(0.0);
    vec4 lo[4];
    vec4 hi[4];
    for (uint g = 0u; g < pc.ic / 8u; g++) {
        load_group(g, q, quads, g * 8u / pc.block_size, lo, hi);
        for (uint r = 0u; r < tile; r++) {
            uint at = (row0 + r) * ic4 + 2u * g;
            vec4 xa = x[at];
            vec4 xb = x[at + 1u];
            acc[r] += vec4(dot(lo[0], xa) + dot(hi[0], xb), dot(lo[1], xa) + dot(hi[1], xb),
                           dot(lo[2], xa) + dot(hi[2], xb), dot(lo[3], xa) + dot(hi[3], xb));
        }
    }
    vec4 b = pc.has_bias != 0u ? bias[q] : vec4(0.0);
    for (uint r = 0u; r < tile; r++) {
        for (uint c = 0u; c < 4u; c++) {
            if (4u * q + c < pc.rows) y[(row0 + r) * pc.out_stride + pc.out_offset + 4u * q + c] = acc[r][c] + b[c];
        }
    }
}
