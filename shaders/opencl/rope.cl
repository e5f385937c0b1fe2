// The fused rotary embedding (the engine's ROPE node), rotate-half form over the first `rot` dims:
//     out = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., split:rot], x[..., :split])
// and out = x beyond them (a partial rotary, MNN's rope_cut_head_dim).
// x, out [seq][heads][dim]; cos, sin [seq][rot], one row per position shared by the heads.
__kernel void rope_rotate_half(__global real_t* out, __global const real_t* x, __global const real_t* cos_rows,
                               __global const real_t* sin_rows, const int heads, const int dim, const int rot,
                               const int split, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int d = i % dim, s = i / (dim * heads);
    if (d >= rot) {
        STORE(out, i, LOAD(x, i));
        return;
    }
    const int tail = rot - split;
    const int row = i - d;
    const float rotated = d < tail ? -LOAD(x, row + d + split) : LOAD(x, row + d - tail);
    const int at = s * rot + d;
    STORE(out, i, LOAD(x, i) * LOAD(cos_rows, at) + rotated * LOAD(sin_rows, at));
}
