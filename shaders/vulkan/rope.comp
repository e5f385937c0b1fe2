#version 450
// The fused rotary embedding (the engine's ROPE node), one pass over x, rotating the first `rot` dims:
//   y = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., split:rot], x[..., :split])
// and y = x beyond them (a partial rotary, MNN's rope_cut_head_dim). x and y are contiguous with rows
// of `dim`; cos and sin hold rows of `rot`, read through per-row strides over the host-merged outer
// dims (0 where a row is shared, e.g. by the heads).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Cos { float cos_rows[]; };
layout(std430, binding = 2) readonly buffer Sin { float sin_rows[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n; uint dim; uint split; uint rank;
    uint shape[6]; int stride_cos[6]; int stride_sin[6];
    uint rot;
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) return;
    uint d = i % pc.dim;
    if (d >= pc.rot) {
        y[i] = x[i];
        return;
    }
    uint rest = i / pc.dim;
    int at_cos = int(d);
    int at_sin = int(d);
    for (int k = int(pc.rank) - 1; k >= 0; k--) {
        int coord = int(rest % pc.shape[k]);
        rest /= pc.shape[k];
        at_cos += coord * pc.stride_cos[k];
        at_sin += coord * pc.stride_sin[k];
    }
    uint tail = pc.rot - pc.split;
    float rotated = d < tail ? -x[i + pc.split] : x[i - tail];
    y[i] = x[i] * cos_rows[at_cos] + rotated * sin_rows[at_sin];
}
