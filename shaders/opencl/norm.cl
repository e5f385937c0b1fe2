// LayerNorm over rows of `width` values: RMS (x / sqrt(mean(x^2) + eps)) or standard
// ((x - mean) / sqrt(var + eps)), then * gamma + beta where given.

inline float norm_apply(float x, float mean, float inv, int j, __global const float* gamma,
                        __global const float* beta, int has_gamma, int has_beta) {
    float y = (x - mean) * inv;
    if (has_gamma) y *= gamma[j];
    if (has_beta) y += beta[j];
    return y;
}

// Both kernels take a residual: with has_residual, row r of x + residual goes to `total` first (a
// decoder layer's residual add, as binary_flat_ADD stores it) and the norm is of that row, so the
// add and the norm are one launch; without, residual and total are placeholders.
#define RESIDUAL_ARGS __global const real_t* residual, __global real_t* total, const int has_residual

// CPU devices: one work-item per row, no local memory.
__kernel void norm_rows(__global real_t* out, __global const real_t* x, __global const float* gamma,
                        __global const float* beta, const int rows, const int width, const float eps,
                        const int rms, const int has_gamma, const int has_beta, RESIDUAL_ARGS) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const __global real_t* row = x + (size_t)r * width;
    if (has_residual) {
        const size_t at = (size_t)r * width;
        for (int j = 0; j < width; j++) STORE(total, at + j, (float)(LOAD(x, at + j) + LOAD(residual, at + j)));
        row = total + at;
    }
    const int vec_end = width & ~3;
    float mean = 0.0f;
    if (!rms) {
        float4 s4 = 0.0f;
        for (int j = 0; j < vec_end; j += 4) s4 += LOAD4(row, j);
        float s = HSUM4(s4);
        for (int j = vec_end; j < width; j++) s += LOAD(row, j);
        mean = s / width;
    }
    float4 q4 = 0.0f;
    for (int j = 0; j < vec_end; j += 4) { const float4 d = LOAD4(row, j) - mean; q4 = fma(d, d, q4); }
    float q = HSUM4(q4);
    for (int j = vec_end; j < width; j++) { const float d = LOAD(row, j) - mean; q = fma(d, d, q); }
    const float inv = 1.0f / sqrt(q / width + eps);
    __global real_t* dst = out + (size_t)r * width;
    for (int j = 0; j < width; j++)
        STORE(dst, j, norm_apply(LOAD(row, j), mean, inv, j, gamma, beta, has_gamma, has_beta));
}

// GPU devices: one work-group of NORM_WG lanes per row, tree reductions in local memory.
#define NORM_WG 64
inline float group_sum(float v, __local float* scratch) {
    const int l = get_local_id(0);
    scratch[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = NORM_WG / 2; s > 0; s >>= 1) {
        if (l < s) scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

__kernel __attribute__((reqd_work_group_size(NORM_WG, 1, 1)))
void norm_group(__global real_t* out, __global const real_t* x, __global const float* gamma,
                __global const float* beta, const int rows, const int width, const float eps,
                const int rms, const int has_gamma, const int has_beta, RESIDUAL_ARGS) {
    __local float scratch[NORM_WG];
    const int r = get_group_id(0), l = get_local_id(0);
    const __global real_t* row = x + (size_t)r * width;
    if (has_residual) {
        const size_t at = (size_t)r * width;
        for (int j = l; j < width; j += NORM_WG)
            STORE(total, at + j, (float)(LOAD(x, at + j) + LOAD(residual, at + j)));
        barrier(CLK_GLOBAL_MEM_FENCE);   // the row's other lanes read what this one wrote
        row = total + at;
    }
    float mean = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (int j = l; j < width; j += NORM_WG) s += LOAD(row, j);
        mean = group_sum(s, scratch) / width;
    }
    float q = 0.0f;
    for (int j = l; j < width; j += NORM_WG) { const float d = LOAD(row, j) - mean; q = fma(d, d, q); }
    const float inv = 1.0f / sqrt(group_sum(q, scratch) / width + eps);
    __global real_t* dst = out + (size_t)r * width;
    for (int j = l; j < width; j += NORM_WG)
        STORE(dst, j, norm_apply(LOAD(row, j), mean, inv, j, gamma, beta, has_gamma, has_beta));
}
