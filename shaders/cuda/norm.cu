// LayerNorm and RMSNorm (MNN's LayerNorm with useRMSNorm) over the last `cols` values of each row.
#include "common.cuh"

// One block per row. gamma and beta are fp32 [cols], read only when has_gamma / has_beta.
//   rms:  y = x / sqrt(mean(x^2) + eps) * gamma (+ beta)
//   else: y = (x - mean) / sqrt(var + eps) * gamma + beta
extern "C" __global__ void layer_norm(int cols, int rms, float eps, const real_t* x, const float* gamma,
                                      int has_gamma, const float* beta, int has_beta, real_t* out) {
    __shared__ float scratch[32];
    const real_t* row = x + (size_t)blockIdx.x * cols;
    real_t* dst = out + (size_t)blockIdx.x * cols;
    float mean = 0.0f;
    if (!rms) {
        float sum = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += to_float(row[c]);
        mean = block_sum(sum, scratch) / (float)cols;
    }
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_float(row[c]) - mean;
        squares += d * d;
    }
    const float denominator = sqrtf(block_sum(squares, scratch) / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = (to_float(row[c]) - mean) / denominator;
        if (has_gamma) y *= gamma[c];
        if (has_beta) y += beta[c];
        dst[c] = from_float(y);
    }
}
