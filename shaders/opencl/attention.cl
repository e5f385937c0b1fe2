// MNN's fused Attention with the KV cache on the device.
// Cache per layer: k_cache, v_cache real_t [kv_heads][capacity][HEAD_DIM].
// kv_length[0] is the number of tokens already kept in front of this step's `seq` new ones;
// the host writes it before the step, so one prepared kernel serves every step and length.
// Query row s sees cache positions 0 .. kv_length + s (causal). HEAD_DIM is a build define.

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

#define ATTENTION_ARGS __global real_t* out, __global const real_t* q, __global const real_t* k_cache, \
                       __global const real_t* v_cache, __global const int* kv_length, const int seq,  \
                       const int heads, const int kv_heads, const int capacity, const float scale

// CPU devices: one work-item per (head, query row); one pass over the keys with a running
// max and sum (online softmax), the output accumulated in registers. HEAD_DIM % 4 == 0.
#define D4 (HEAD_DIM / 4)
__kernel void attention_rows(ATTENTION_ARGS) {
    const int h = get_global_id(0), s = get_global_id(1);
    if (h >= heads || s >= seq) return;
    const int g = h / (heads / kv_heads);
    const int visible = kv_length[0] + s + 1;
    const __global real_t* qrow = q + ((size_t)s * heads + h) * HEAD_DIM;
    const __global real_t* keys = k_cache + (size_t)g * capacity * HEAD_DIM;
    const __global real_t* values = v_cache + (size_t)g * capacity * HEAD_DIM;
    float4 qv[D4], acc[D4];
    for (int i = 0; i < D4; i++) { qv[i] = LOAD4(qrow, 4 * i) * scale; acc[i] = 0.0f; }
    float running_max = -INFINITY, total = 0.0f;
    for (int j = 0; j < visible; j++) {
        float4 dot4 = 0.0f;
        for (int i = 0; i < D4; i++) dot4 = fma(qv[i], LOAD4(keys, j * HEAD_DIM + 4 * i), dot4);
        const float score = HSUM4(dot4);
        if (score > running_max) {
            const float rescale = exp(running_max - score);
            total *= rescale;
            for (int i = 0; i < D4; i++) acc[i] *= rescale;
            running_max = score;
        }
        const float p = exp(score - running_max);
        total += p;
        for (int i = 0; i < D4; i++) acc[i] = fma(p, LOAD4(values, j * HEAD_DIM + 4 * i), acc[i]);
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
    const int h = get_group_id(0), s = get_group_id(1), lane = get_local_id(0);
    const int g = h / (heads / kv_heads);
    const int visible = kv_length[0] + s + 1;
    const __global real_t* qrow = q + ((size_t)s * heads + h) * HEAD_DIM;
    const __global real_t* keys = k_cache + (size_t)g * capacity * HEAD_DIM;
    const __global real_t* values = v_cache + (size_t)g * capacity * HEAD_DIM;
    float acc[DIMS_PER_LANE];
    for (int i = 0; i < DIMS_PER_LANE; i++) acc[i] = 0.0f;
    float running_max = -INFINITY, total = 0.0f;
    for (int base = 0; base < visible; base += ATT_WG) {
        const int j = base + lane;
        float score = -INFINITY;
        if (j < visible) {
            score = 0.0f;
            for (int d = 0; d < HEAD_DIM; d++) score = fma(LOAD(qrow, d), LOAD(keys, j * HEAD_DIM + d), score);
            score *= scale;
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
            for (int a = 0; a < DIMS_PER_LANE; a++) {
                const int d = lane + a * ATT_WG;
                if (d < HEAD_DIM) acc[a] = fma(p, LOAD(values, (base + i) * HEAD_DIM + d), acc[a]);
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
