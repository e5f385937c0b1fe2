// MNN's fused Attention with the KV cache on the device.
// Cache per layer: k_cache, v_cache real_t [kv_heads][capacity][HEAD_DIM] (int8 codes: see below).
// kv_length[0] is the number of tokens already kept in front of this step's `seq` new ones;
// the host writes it before the step, so one prepared kernel serves every step and length.
// Query row s sees cache positions 0 .. kv_length + s (causal); with a key window > 0 (a sliding
// layer) only the last `window` of them. HEAD_DIM is a build define.

// Appends this step's keys and values (seq-major: [seq][kv_heads][HEAD_DIM]) at kv_length.
__kernel void kv_append(__global real_t* k_cache, __global real_t* v_cache, __global const real_t* k,
                        __global const real_t* v, __global const int* kv_length, const int kv_heads,
                        const int capacity, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int d = i % HEAD_DIM, h = (i / HEAD_DIM) % kv_heads, s = i / (HEAD_DIM * kv_heads);
    const size_t at = ((size_t)h * capacity + kv_length[0] + s) * HEAD_DIM + d;
    STORE(k_cache, at, LOAD(k, i));
    STORE(v_cache, at, LOAD(v, i));
}

// With KEY_INT8 (VALUE_INT8) the cache holds int8 codes and k_scale (v_scale) one float per
// [kv_heads][capacity] row: value = code * scale (attention_mode 1 and 2). Otherwise the scale
// buffers are placeholders and every scale reads as 1.
#ifdef KEY_INT8
typedef char key_t;
#define KEY(p, i) ((float)(p)[i])
#define KEY4(p, i) convert_float4(vload4(0, (p) + (i)))
#define KEY_SCALE(j) key_scale[j]
#else
typedef real_t key_t;
#define KEY(p, i) LOAD(p, i)
#define KEY4(p, i) LOAD4(p, i)
#define KEY_SCALE(j) 1.0f
#endif
#ifdef VALUE_INT8
typedef char value_t;
#define VALUE(p, i) ((float)(p)[i])
#define VALUE4(p, i) convert_float4(vload4(0, (p) + (i)))
#define VALUE_SCALE(j) value_scale[j]
#else
typedef real_t value_t;
#define VALUE(p, i) LOAD(p, i)
#define VALUE4(p, i) LOAD4(p, i)
#define VALUE_SCALE(j) 1.0f
#endif

// Codes one row of HEAD_DIM values as int8 with one symmetric scale max|x| / 127.
inline void quantize_row(__global char* codes, __global float* scale, __global const real_t* x) {
    float largest = 0.0f;
    for (int d = 0; d < HEAD_DIM; d++) largest = fmax(largest, fabs(LOAD(x, d)));
    const float step = largest / 127.0f;
    const float inverse = step > 0.0f ? 1.0f / step : 0.0f;
    for (int d = 0; d < HEAD_DIM; d++) codes[d] = (char)clamp(rint(LOAD(x, d) * inverse), -127.0f, 127.0f);
    *scale = step;
}

// kv_append for a quantized cache: one work-item per (token, kv head) row.
__kernel void kv_append_int8(__global key_t* k_cache, __global value_t* v_cache, __global const real_t* k,
                             __global const real_t* v, __global const int* kv_length, const int kv_heads,
                             const int capacity, const int rows, __global float* k_scale,
                             __global float* v_scale) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int h = r % kv_heads, s = r / kv_heads;
    const size_t row = (size_t)h * capacity + kv_length[0] + s;
#ifdef KEY_INT8
    quantize_row(k_cache + row * HEAD_DIM, k_scale + row, k + (size_t)r * HEAD_DIM);
#else
    for (int d = 0; d < HEAD_DIM; d++) STORE(k_cache, row * HEAD_DIM + d, LOAD(k, (size_t)r * HEAD_DIM + d));
#endif
#ifdef VALUE_INT8
    quantize_row(v_cache + row * HEAD_DIM, v_scale + row, v + (size_t)r * HEAD_DIM);
#else
    for (int d = 0; d < HEAD_DIM; d++) STORE(v_cache, row * HEAD_DIM + d, LOAD(v, (size_t)r * HEAD_DIM + d));
#endif
}

#define ATTENTION_ARGS __global real_t* out, __global const real_t* q, __global const key_t* k_cache, \
                       __global const value_t* v_cache, __global const int* kv_length, const int seq,  \
                       const int heads, const int kv_heads, const int capacity, const float scale,     \
                       __global const float* k_scales, __global const float* v_scales, const int window

// CPU devices: one work-item per (head, query row); one pass over the keys with a running
// max and sum (online softmax), the output accumulated in registers. HEAD_DIM % 4 == 0.
#define D4 (HEAD_DIM / 4)
__kernel void attention_rows(ATTENTION_ARGS) {
    const int h = get_global_id(0), s = get_global_id(1);
    if (h >= heads || s >= seq) return;
    const int g = h / (heads / kv_heads);
    const int visible = kv_length[0] + s + 1;
    const int first = window > 0 ? max(0, visible - window) : 0;
    const __global real_t* qrow = q + ((size_t)s * heads + h) * HEAD_DIM;
    const __global key_t* keys = k_cache + (size_t)g * capacity * HEAD_DIM;
    const __global value_t* values = v_cache + (size_t)g * capacity * HEAD_DIM;
    const __global float* key_scale = k_scales + (size_t)g * capacity;
    const __global float* value_scale = v_scales + (size_t)g * capacity;
    float4 qv[D4], acc[D4];
    for (int i = 0; i < D4; i++) { qv[i] = LOAD4(qrow, 4 * i) * scale; acc[i] = 0.0f; }
    float running_max = -INFINITY, total = 0.0f;
    for (int j = first; j < visible; j++) {
        float4 dot4 = 0.0f;
        for (int i = 0; i < D4; i++) dot4 = fma(qv[i], KEY4(keys, j * HEAD_DIM + 4 * i), dot4);
        const float score = HSUM4(dot4) * KEY_SCALE(j);
        if (score > running_max) {
            const float rescale = exp(running_max - score);
            total *= rescale;
            for (int i = 0; i < D4; i++) acc[i] *= rescale;
            running_max = score;
        }
        const float p = exp(score - running_max);
        total += p;
        const float weight = p * VALUE_SCALE(j);
        for (int i = 0; i < D4; i++) acc[i] = fma(weight, VALUE4(values, j * HEAD_DIM + 4 * i), acc[i]);
    }
    __global real_t* dst = out + ((size_t)s * heads + h) * HEAD_DIM;
    for (int i = 0; i < D4; i++) {
        const float4 o = acc[i] / total;
        STORE(dst, 4 * i, o.s0); STORE(dst, 4 * i + 1, o.s1); STORE(dst, 4 * i + 2, o.s2); STORE(dst, 4 * i + 3, o.s3);
    }
}

// GPU devices: one work-group per (head, query row). Lanes score ATT_WG keys at a time into
// local memory; every lane then folds that chunk into the running softmax and accumulates the
// output dims it owns (d = lane, lane + ATT_WG, ...).
#define ATT_WG 64
#define DIMS_PER_LANE ((HEAD_DIM + ATT_WG - 1) / ATT_WG)
__kernel __attribute__((reqd_work_group_size(ATT_WG, 1, 1)))
void attention_group(ATTENTION_ARGS) {
    __local float scores[ATT_WG];
    // the row from the global id: a batched forward launches one sequence's rows at a global offset
    const int h = get_group_id(0), s = get_global_id(1), lane = get_local_id(0);
    const int g = h / (heads / kv_heads);
    const int visible = kv_length[0] + s + 1;
    const int first = window > 0 ? max(0, visible - window) : 0;
    const __global real_t* qrow = q + ((size_t)s * heads + h) * HEAD_DIM;
    const __global key_t* keys = k_cache + (size_t)g * capacity * HEAD_DIM;
    const __global value_t* values = v_cache + (size_t)g * capacity * HEAD_DIM;
    const __global float* key_scale = k_scales + (size_t)g * capacity;
    const __global float* value_scale = v_scales + (size_t)g * capacity;
    float acc[DIMS_PER_LANE];
    for (int i = 0; i < DIMS_PER_LANE; i++) acc[i] = 0.0f;
    float running_max = -INFINITY, total = 0.0f;
    for (int base = first; base < visible; base += ATT_WG) {
        const int j = base + lane;
        float score = -INFINITY;
        if (j < visible) {
            score = 0.0f;
            for (int d = 0; d < HEAD_DIM; d++) score = fma(LOAD(qrow, d), KEY(keys, j * HEAD_DIM + d), score);
            score *= scale * KEY_SCALE(j);
        }
        scores[lane] = score;
        barrier(CLK_LOCAL_MEM_FENCE);
        const int count = min(ATT_WG, visible - base);
        float chunk_max = running_max;
        for (int i = 0; i < count; i++) chunk_max = fmax(chunk_max, scores[i]);
        const float rescale = exp(running_max - chunk_max);
        total *= rescale;
        for (int i = 0; i < DIMS_PER_LANE; i++) acc[i] *= rescale;
        for (int i = 0; i < count; i++) {
            const float p = exp(scores[i] - chunk_max);
            total += p;
            const float weight = p * VALUE_SCALE(base + i);
            for (int a = 0; a < DIMS_PER_LANE; a++) {
                const int d = lane + a * ATT_WG;
                if (d < HEAD_DIM) acc[a] = fma(weight, VALUE(values, (base + i) * HEAD_DIM + d), acc[a]);
            }
        }
        running_max = chunk_max;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    __global real_t* dst = out + ((size_t)s * heads + h) * HEAD_DIM;
    for (int a = 0; a < DIMS_PER_LANE; a++) {
        const int d = lane + a * ATT_WG;
        if (d < HEAD_DIM) STORE(dst, d, acc[a] / total);
    }
}

// An encoder's attention (kv_cache false: a vision tower's): every query row over every key row
// of this step's own k and v (seq-major [seq][kv_heads][HEAD_DIM], no cache, no causal mask),
// with the mask input added to the scaled scores: mask_planes planes of [seq][seq], head h
// reading plane min(h, mask_planes - 1); mask_planes 0: no mask. One work-item per (head, query
// row), one pass over the keys with a running max and sum. A masked score (float's lowest, -inf
// under fp16 storage) is clamped to HIDDEN_SCORE, whose weight vanishes at the first visible key.
#define HIDDEN_SCORE -1.0e30f
__kernel void encoder_attention(__global real_t* out, __global const real_t* q, __global const real_t* k,
                                __global const real_t* v, __global const real_t* mask, const int seq,
                                const int heads, const int kv_heads, const float scale, const int mask_planes) {
    const int h = get_global_id(0), s = get_global_id(1);
    if (h >= heads || s >= seq) return;
    const int g = h / (heads / kv_heads);
    const __global real_t* qrow = q + ((size_t)s * heads + h) * HEAD_DIM;
    const __global real_t* mask_row = mask + ((size_t)min(h, max(mask_planes - 1, 0)) * seq + s) * seq;
    float acc[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; d++) acc[d] = 0.0f;
    float running_max = HIDDEN_SCORE, total = 0.0f;   // finite: fast math may assume no infinities
    for (int j = 0; j < seq; j++) {
        const __global real_t* key = k + ((size_t)j * kv_heads + g) * HEAD_DIM;
        float score = 0.0f;
        for (int d = 0; d < HEAD_DIM; d++) score = fma(LOAD(qrow, d), LOAD(key, d), score);
        score *= scale;
        if (mask_planes > 0) score = fmax(score + LOAD(mask_row, j), HIDDEN_SCORE);
        if (score > running_max) {
            const float rescale = exp(running_max - score);
            total *= rescale;
            for (int d = 0; d < HEAD_DIM; d++) acc[d] *= rescale;
            running_max = score;
        }
        const float p = exp(score - running_max);
        total += p;
        const __global real_t* value = v + ((size_t)j * kv_heads + g) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM; d++) acc[d] = fma(p, LOAD(value, d), acc[d]);
    }
    __global real_t* dst = out + ((size_t)s * heads + h) * HEAD_DIM;
    for (int d = 0; d < HEAD_DIM; d++) STORE(dst, d, acc[d] / total);
}
