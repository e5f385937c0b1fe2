// The fused rotary embedding (mnngpu/runtime/fusion.py's "RoPE" node), rotate-half form:
//     out = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., split:], x[..., :split])
// x, out [seq][heads][dim]; cos, sin [seq][dim], one row per position shared by the heads.
__kernel void rope_rotate_half(__global real_t* out, __global const real_t* x, __global const real_t* cos_rows,
                               __global const real_t* sin_rows, const int heads, const int dim,
                               const int split, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int d = i % dim, s = i / (dim * heads);
    const int tail = dim - split;
    const int row = i - d;
    const float rotated = d < tail ? -LOAD(x, row + d + split) : LOAD(x, row + d - tail);
    const int at = s * dim + d;
    STORE(out, i, LOAD(x, i) * LOAD(cos_rows, at) + rotated * LOAD(sin_rows, at));
}
