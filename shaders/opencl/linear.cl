// 1x1 Convolution as a linear layer: y[t, o] = sum_k x[t, k] * w[o, k] + bias[o], with the
// weight kept quantized on the device and dequantized on the fly:
//     w[o, k] = code[o, k] * scales[o, b] + zeros[o, b],   b = k / block.
// The build defines one weight layout:
//   WEIGHT_Q4     uchar [oc][ic/2]; per 32 inputs, byte j holds input j (low nibble) and j+16 (high)
//   WEIGHT_Q8     uchar [oc][ic], one code a byte (int8, and other bit widths unpacked)
//   WEIGHT_DENSE  real_t [oc][ic], float weights (scales/zeros unused)

#if defined(WEIGHT_Q4)
#define WEIGHT_T uchar
inline float weight_code(__global const uchar* w, int ic, int o, int k) {
    const uchar c = w[(size_t)o * (ic / 2) + (k >> 5) * 16 + (k & 15)];
    return (k & 16) ? (float)(c >> 4) : (float)(c & 15);
}
#define LOAD_GROUP(w, ic, o, k, lo, hi) {                                       \
    const uchar16 c_ = vload16(0, (w) + (size_t)(o) * ((ic) / 2) + (k) / 2);    \
    lo = convert_float16(c_ & (uchar)15); hi = convert_float16(c_ >> (uchar)4); }
#elif defined(WEIGHT_Q8)
#define WEIGHT_T uchar
inline float weight_code(__global const uchar* w, int ic, int o, int k) { return (float)w[(size_t)o * ic + k]; }
#define LOAD_GROUP(w, ic, o, k, lo, hi) {                                       \
    const __global uchar* p_ = (w) + (size_t)(o) * (ic) + (k);                  \
    lo = convert_float16(vload16(0, p_)); hi = convert_float16(vload16(1, p_)); }
#elif defined(WEIGHT_DENSE)
#define WEIGHT_T real_t
inline float weight_code(__global const real_t* w, int ic, int o, int k) { return LOAD(w, (size_t)o * ic + k); }
#define LOAD_GROUP(w, ic, o, k, lo, hi) {                                       \
    const size_t at_ = (size_t)(o) * (ic) + (k);                                \
    lo = LOAD16(w, at_); hi = LOAD16(w, at_ + 16); }
#else
#error "build with one of WEIGHT_Q4, WEIGHT_Q8, WEIGHT_DENSE"
#endif

inline float weight_at(__global const WEIGHT_T* w, __global const float* scales, __global const float* zeros,
                       int ic, int nb, int block, int o, int k) {
    const float c = weight_code(w, ic, o, k);
#ifdef WEIGHT_DENSE
    return c;
#else
    const int b = o * nb + k / block;
    return fma(c, scales[b], zeros[b]);
#endif
}

#define LINEAR_ARGS __global real_t* y, __global const real_t* x, __global const WEIGHT_T* w,              \
                    __global const float* scales, __global const float* zeros, __global const float* bias, \
                    const int n, const int ic, const int oc, const int block, const int has_bias

// CPU devices: registers only, no local memory, no barriers; 32 inputs at a time as float16
// vectors. Needs ic % 32 == 0 and block % 32 == 0 (the host checks). Written out by hand
// (macros, not private arrays), because PoCL keeps private arrays in memory.
// Rows past oc (tokens past n) are read clamped and never written.
#define ROW(r) min(o0 + r, oc - 1)
#define TOKEN_ROW(t) (x + (size_t)min(t0 + t, n - 1) * ic)
#define STORE_OUT(r, t, v) if (o0 + r < oc && t0 + t < n) \
    STORE(y, (size_t)(t0 + t) * oc + o0 + r, (v) + (has_bias ? bias[o0 + r] : 0.0f));

#ifdef WEIGHT_DENSE
#define SCALE(r, b) 1.0f
#define ZERO(r, b) 0.0f
#else
#define SCALE(r, b) scales[ROW(r) * nb + (b)]
#define ZERO(r, b) zeros[ROW(r) * nb + (b)]
#endif

// One row of x, 4 outputs (o0 .. o0 + 3 of a matrix of oc rows) per work-item: code . x summed
// per block, then scaled once per block:
//     y[o] = sum_b scale[o, b] * (code[o, b] . x[b]) + zero[o, b] * sum(x[b]).
inline float4 rows_gemv4(__global const WEIGHT_T* w, __global const float* scales, __global const float* zeros,
                         __global const real_t* x, const int ic, const int oc, const int block, const int o0) {
    const int nb = ic / block;
    float4 acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        float16 d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f, xs = 0.0f;
        for (int k = b * block; k < (b + 1) * block; k += 32) {
            const float16 xl = LOAD16(x, k), xh = LOAD16(x, k + 16);
            xs += xl + xh;
            float16 lo, hi;
            LOAD_GROUP(w, ic, ROW(0), k, lo, hi) d0 = fma(lo, xl, fma(hi, xh, d0));
            LOAD_GROUP(w, ic, ROW(1), k, lo, hi) d1 = fma(lo, xl, fma(hi, xh, d1));
            LOAD_GROUP(w, ic, ROW(2), k, lo, hi) d2 = fma(lo, xl, fma(hi, xh, d2));
            LOAD_GROUP(w, ic, ROW(3), k, lo, hi) d3 = fma(lo, xl, fma(hi, xh, d3));
        }
        const float4 dots = (float4)(HSUM16(d0), HSUM16(d1), HSUM16(d2), HSUM16(d3));
        const float4 scale = (float4)(SCALE(0, b), SCALE(1, b), SCALE(2, b), SCALE(3, b));
        const float4 zero = (float4)(ZERO(0, b), ZERO(1, b), ZERO(2, b), ZERO(3, b));
        acc = fma(scale, dots, fma(zero, (float4)HSUM16(xs), acc));
    }
    return acc;
}

__kernel void linear_rows_gemv(LINEAR_ARGS) {
    const int o0 = get_global_id(0) * 4, t0 = 0;
    if (o0 >= oc) return;
    const float4 acc = rows_gemv4(w, scales, zeros, x, ic, oc, block, o0);
    STORE_OUT(0, 0, acc.s0) STORE_OUT(1, 0, acc.s1) STORE_OUT(2, 0, acc.s2) STORE_OUT(3, 0, acc.s3)
}

// The experts a MoE router chose (fused.SparseMoE), with rows_gemv4: the weights, scales, zeros
// and bias stack every expert's layer (expert e's rows start at e * rows per expert), and the
// router wrote k expert ids and weights per row. An id outside [0, n_experts) gives NaN.
#if defined(WEIGHT_Q4)
#define ROW_CODES(ic) ((ic) / 2)
#else
#define ROW_CODES(ic) (ic)
#endif
#define EXPERT_ROWS(first, ic, nb) w + (size_t)(first) * ROW_CODES(ic), scales + (size_t)(first) * (nb), \
                                   zeros + (size_t)(first) * (nb)
#define BIAS4(first, o0, oc) (has_bias ? (float4)(bias[(first) + min((o0), (oc) - 1)],                  \
    bias[(first) + min((o0) + 1, (oc) - 1)], bias[(first) + min((o0) + 2, (oc) - 1)],                      \
    bias[(first) + min((o0) + 3, (oc) - 1)]) : (float4)0.0f)
#define STORE4_ROW(p, base, o0, oc, v) { STORE(p, (base) + (o0), (v).s0);                   \
    if ((o0) + 1 < (oc)) STORE(p, (base) + (o0) + 1, (v).s1);                                           \
    if ((o0) + 2 < (oc)) STORE(p, (base) + (o0) + 2, (v).s2);                                           \
    if ((o0) + 3 < (oc)) STORE(p, (base) + (o0) + 3, (v).s3); }
#define EXPERT_ARGS __global const WEIGHT_T* w, __global const float* scales, __global const float* zeros, \
                    __global const float* bias, __global const int* ids, const int ic, const int oc,      \
                    const int block, const int k, const int n_experts, const int has_bias

// Entry (row, slot) = global id 1, row * k + slot: act[entry] = up * silu(gate) of expert
// ids[entry] on x[row], gate_up stacked [expert][2 * oc rows] (gate_first: the gate half first).
__kernel void expert_gated_gemv(__global real_t* act, __global const real_t* x, EXPERT_ARGS, const int gate_first) {
    const int o0 = get_global_id(0) * 4, entry = get_global_id(1);
    if (o0 >= oc) return;
    const int e = ids[entry], nb = ic / block;
    float4 v = (float4)NAN;
    if (e >= 0 && e < n_experts) {
        const int gate = (2 * e + (gate_first ? 0 : 1)) * oc, up = (2 * e + (gate_first ? 1 : 0)) * oc;
        const __global real_t* row = x + (size_t)(entry / k) * ic;
        const float4 g = rows_gemv4(EXPERT_ROWS(gate, ic, nb), row, ic, oc, block, o0) + BIAS4(gate, o0, oc);
        const float4 u = rows_gemv4(EXPERT_ROWS(up, ic, nb), row, ic, oc, block, o0) + BIAS4(up, o0, oc);
        v = u * g / (1.0f + exp(-g));
    }
    STORE4_ROW(act, (size_t)entry * oc, o0, oc, v)
}

// Row = global id 1: y[row] = sum over its k slots of weight * down_{ids}(act[row * k + slot]),
// down stacked [expert][oc rows].
__kernel void expert_down_gemv(__global real_t* y, __global const real_t* act, __global const real_t* weights,
                               EXPERT_ARGS) {
    const int o0 = get_global_id(0) * 4, row = get_global_id(1);
    if (o0 >= oc) return;
    const int nb = ic / block;
    float4 acc = 0.0f;
    for (int slot = 0; slot < k; slot++) {
        const int entry = row * k + slot, e = ids[entry];
        if (e < 0 || e >= n_experts) { acc += (float4)NAN; continue; }
        const float4 out = rows_gemv4(EXPERT_ROWS(e * oc, ic, nb), act + (size_t)entry * ic, ic, oc, block, o0)
                           + BIAS4(e * oc, o0, oc);
        acc = fma((float4)LOAD(weights, entry), out, acc);
    }
    STORE4_ROW(y, (size_t)row * oc, o0, oc, acc)
}

// Many rows of x: 4 outputs x 4 tokens per work-item. Each 32-input group of the 4 weight rows
// is dequantized once and used for the 4 tokens.
#define DEQUANT_GROUP(r) {                                                        \
    LOAD_GROUP(w, ic, ROW(r), k, lo##r, hi##r)                                    \
    const float16 s_ = SCALE(r, k / block), z_ = ZERO(r, k / block);              \
    lo##r = fma(lo##r, s_, z_); hi##r = fma(hi##r, s_, z_); }
#define TOKEN_DOTS(t) {                                                           \
    const float16 xl = LOAD16(xrow##t, k), xh = LOAD16(xrow##t, k + 16);          \
    a0##t = fma(lo0, xl, fma(hi0, xh, a0##t)); a1##t = fma(lo1, xl, fma(hi1, xh, a1##t)); \
    a2##t = fma(lo2, xl, fma(hi2, xh, a2##t)); a3##t = fma(lo3, xl, fma(hi3, xh, a3##t)); }
#define STORE_TOKEN(t) STORE_OUT(0, t, HSUM16(a0##t)) STORE_OUT(1, t, HSUM16(a1##t)) \
                       STORE_OUT(2, t, HSUM16(a2##t)) STORE_OUT(3, t, HSUM16(a3##t))

__kernel void linear_rows_gemm(LINEAR_ARGS) {
    const int o0 = get_global_id(0) * 4, t0 = get_global_id(1) * 4;
    if (o0 >= oc || t0 >= n) return;
    const int nb = ic / block;
    const __global real_t *xrow0 = TOKEN_ROW(0), *xrow1 = TOKEN_ROW(1), *xrow2 = TOKEN_ROW(2), *xrow3 = TOKEN_ROW(3);
    float16 a00 = 0.0f, a01 = 0.0f, a02 = 0.0f, a03 = 0.0f, a10 = 0.0f, a11 = 0.0f, a12 = 0.0f, a13 = 0.0f;
    float16 a20 = 0.0f, a21 = 0.0f, a22 = 0.0f, a23 = 0.0f, a30 = 0.0f, a31 = 0.0f, a32 = 0.0f, a33 = 0.0f;
    for (int k = 0; k < ic; k += 32) {
        float16 lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3;
        DEQUANT_GROUP(0) DEQUANT_GROUP(1) DEQUANT_GROUP(2) DEQUANT_GROUP(3)
        TOKEN_DOTS(0) TOKEN_DOTS(1) TOKEN_DOTS(2) TOKEN_DOTS(3)
    }
    STORE_TOKEN(0) STORE_TOKEN(1) STORE_TOKEN(2) STORE_TOKEN(3)
}

// Any shape: one work-item per output, scalar loop.
__kernel void linear_generic(LINEAR_ARGS) {
    const int o = get_global_id(0), t = get_global_id(1);
    if (o >= oc || t >= n) return;
    const int nb = ic / block;
    const __global real_t* row = x + (size_t)t * ic;
    float acc = 0.0f;
    for (int k = 0; k < ic; k++) acc = fma(weight_at(w, scales, zeros, ic, nb, block, o, k), LOAD(row, k), acc);
    STORE(y, (size_t)t * oc + o, acc + (has_bias ? bias[o] : 0.0f));
}

// GPU devices, one row of x: a work-group of GEMV_WG lanes per output, lanes reading
// consecutive inputs, then a tree reduction in local memory.
#define GEMV_WG 64
__kernel __attribute__((reqd_work_group_size(GEMV_WG, 1, 1)))
void linear_gemv_group(LINEAR_ARGS) {
    __local float scratch[GEMV_WG];
    const int o = get_group_id(0), l = get_local_id(0);
    const int nb = ic / block;
    float acc = 0.0f;
    for (int k = l; k < ic; k += GEMV_WG) acc = fma(weight_at(w, scales, zeros, ic, nb, block, o, k), LOAD(x, k), acc);
    scratch[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        if (l < s) scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) STORE(y, o, scratch[0] + (has_bias ? bias[o] : 0.0f));
}

// GPU devices, many rows of x: TILE x TILE outputs per work-group, x and dequantized w tiles
// staged in local memory.
#define TILE 16
__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))
void linear_gemm_tiled(LINEAR_ARGS) {
    __local float xs[TILE][TILE + 1];
    __local float ws[TILE][TILE + 1];
    const int lo = get_local_id(0), lt = get_local_id(1);
    const int o_base = get_group_id(0) * TILE, t_base = get_group_id(1) * TILE;
    const int nb = ic / block;
    float acc = 0.0f;
    for (int k0 = 0; k0 < ic; k0 += TILE) {
        const int k = k0 + lo;
        const int xt = t_base + lt, wo = o_base + lt;
        xs[lt][lo] = (xt < n && k < ic) ? LOAD(x, (size_t)xt * ic + k) : 0.0f;
        ws[lt][lo] = (wo < oc && k < ic) ? weight_at(w, scales, zeros, ic, nb, block, wo, k) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j = 0; j < TILE; j++) acc = fma(xs[lt][j], ws[lo][j], acc);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int o = o_base + lo, t = t_base + lt;
    if (o < oc && t < n) STORE(y, (size_t)t * oc + o, acc + (has_bias ? bias[o] : 0.0f));
}
