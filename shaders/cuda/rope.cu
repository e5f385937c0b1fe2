// The fused rotary embedding (the engine's ROPE node), rotate-half form over the first `rot` dims:
//     out = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., split:rot], x[..., :split])
// and out = x beyond them (a partial rotary, MNN's rope_cut_head_dim).
// x, out [seq][heads][dim]; cos, sin [seq][rot], one row per position shared by the heads.
#include "common.cuh"

extern "C" __global__ void rope_rotate_half(int heads, int dim, int rot, int split, int n, const real_t* x,
                                            const real_t* cos_rows, const real_t* sin_rows, real_t* out) {
    FOR_EACH_ELEMENT(i, n) {
        const int d = i % dim;
        if (d >= rot) {
            out[i] = x[i];
            continue;
        }
        const int s = i / (dim * heads);
        const int tail = rot - split;
        const int row = i - d;
        const float rotated = d < tail ? -to_float(x[row + d + split]) : to_float(x[row + d - tail]);
        const int at = s * rot + d;
        out[i] = from_float(to_float(x[i]) * to_float(cos_rows[at]) + rotated * to_float(sin_rows[at]));
    }
}
