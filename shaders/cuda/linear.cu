// The 1x1 Convolution as a linear layer, y = x W^T + bias, over weights kept quantized.
//
// Quantized weights: codes uint8 [oc, row_bytes]; scales and zeros fp32 [oc, n_blocks];
//   w[o, i] = code(o, i) * scales[o, i / block_size] + zeros[o, i / block_size]
// 4-bit codes: byte j of a row holds input 2j in its high nibble and 2j+1 in its low nibble.
// 8-bit (and 1..7-bit unpacked) codes: one code a byte.
// Decode (one row) runs the GEMV kernels: one warp per output row, fp32 accumulation; a batched
// decode (up to MAX_TOKENS rows) their *_tokens twins.
// Prefill dequantizes a tile of rows into gemm_t and multiplies with cuBLAS (cupy.matmul).
#include "common.cuh"

#define ROWS_PER_BLOCK 8  // warps per 256-thread block

// The warp's partial sums become out[row] (+ bias); every lane of the warp must call it.
__device__ __forceinline__ void store_row(float acc, int row, const float* bias, int has_bias, real_t* out) {
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) out[row] = from_float(acc + (has_bias ? bias[row] : 0.0f));
}

extern "C" __global__ void gemv_q4(int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                   const unsigned char* codes, const float* scales, const float* zeros,
                                   const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;  // the whole warp leaves together
    const unsigned char* w = codes + (size_t)row * row_bytes;
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    float acc = 0.0f;
    for (int j = lane; 2 * j < ic; j += 32) {
        const unsigned int byte = w[j];
        const int i = 2 * j;
        const int b = i / block_size;
        acc += ((float)(byte >> 4) * s[b] + z[b]) * to_float(x[i]);
        if (i + 1 < ic) {
            const int b1 = (i + 1) / block_size;
            acc += ((float)(byte & 15u) * s[b1] + z[b1]) * to_float(x[i + 1]);
        }
    }
    store_row(acc, row, bias, has_bias, out);
}

// Needs ic % 8 == 0 and block_size % 8 == 0: each lane reads 32-bit words of 8 codes that share
// one block (rows are 4-byte aligned since row_bytes = ic / 2).
extern "C" __global__ void gemv_q4_words(int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                         const unsigned char* codes, const float* scales, const float* zeros,
                                         const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned int* w = (const unsigned int*)(codes + (size_t)row * row_bytes);
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    float acc = 0.0f;
    for (int k = lane; k < (ic >> 3); k += 32) {
        const unsigned int word = w[k];
        const int i = k << 3;
        const int b = i / block_size;
        const float scale = s[b], zero = z[b];
#pragma unroll
        for (int t = 0; t < 4; ++t) {  // little-endian: byte t of the word is byte i/2 + t of the row
            const unsigned int byte = (word >> (8 * t)) & 0xffu;
            acc += ((float)(byte >> 4) * scale + zero) * to_float(x[i + 2 * t]);
            acc += ((float)(byte & 15u) * scale + zero) * to_float(x[i + 2 * t + 1]);
        }
    }
    store_row(acc, row, bias, has_bias, out);
}

extern "C" __global__ void gemv_q8(int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                   const unsigned char* codes, const float* scales, const float* zeros,
                                   const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned char* w = codes + (size_t)row * row_bytes;
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    float acc = 0.0f;
    for (int i = lane; i < ic; i += 32) {
        const int b = i / block_size;
        acc += ((float)w[i] * s[b] + z[b]) * to_float(x[i]);
    }
    store_row(acc, row, bias, has_bias, out);
}

// Needs ic % 4 == 0 and block_size % 4 == 0 (and so row_bytes % 4 == 0): words of 4 codes.
extern "C" __global__ void gemv_q8_words(int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                         const unsigned char* codes, const float* scales, const float* zeros,
                                         const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned int* w = (const unsigned int*)(codes + (size_t)row * row_bytes);
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    float acc = 0.0f;
    for (int k = lane; k < (ic >> 2); k += 32) {
        const unsigned int word = w[k];
        const int i = k << 2;
        const int b = i / block_size;
        const float scale = s[b], zero = z[b];
#pragma unroll
        for (int t = 0; t < 4; ++t) acc += ((float)((word >> (8 * t)) & 0xffu) * scale + zero) * to_float(x[i + t]);
    }
    store_row(acc, row, bias, has_bias, out);
}

// Unquantized weights, stored as real_t [oc, ic].
extern "C" __global__ void gemv_dense(int oc, int ic, const real_t* weight, const float* bias, int has_bias,
                                      const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const real_t* w = weight + (size_t)row * ic;
    float acc = 0.0f;
    for (int i = lane; i < ic; i += 32) acc += to_float(w[i]) * to_float(x[i]);
    store_row(acc, row, bias, has_bias, out);
}

// ---- a batched decode: x [tokens, ic] -> out [tokens, oc], each weight read once for every token ----
// The same loops and per-token arithmetic as the GEMV kernels above, so each token's row gets the
// values a lone decode step gets.

#define MAX_TOKENS 8  // rows of x a *_tokens kernel takes (backends/cuda/ops/linear.py MAX_GEMV_TOKENS)

// acc[t] += w * x[t, i] for each of the `tokens` rows of x.
__device__ __forceinline__ void add_tokens(float* acc, int tokens, float w, const real_t* x, int ic, int i) {
#pragma unroll
    for (int t = 0; t < MAX_TOKENS; ++t)
        if (t < tokens) acc[t] += w * to_float(x[(size_t)t * ic + i]);
}

// Each token's partial sums become out[t, row] (+ bias); every lane of the warp must call it.
__device__ __forceinline__ void store_tokens(const float* acc, int tokens, int row, int oc, const float* bias,
                                             int has_bias, real_t* out) {
#pragma unroll
    for (int t = 0; t < MAX_TOKENS; ++t)
        if (t < tokens) store_row(acc[t], row, bias, has_bias, out + (size_t)t * oc);
}

#define ZERO_TOKENS(acc)                 \
    float acc[MAX_TOKENS];               \
    _Pragma("unroll") for (int t = 0; t < MAX_TOKENS; ++t) acc[t] = 0.0f

extern "C" __global__ void gemv_q4_tokens(int tokens, int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                          const unsigned char* codes, const float* scales, const float* zeros,
                                          const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;  // the whole warp leaves together
    const unsigned char* w = codes + (size_t)row * row_bytes;
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    ZERO_TOKENS(acc);
    for (int j = lane; 2 * j < ic; j += 32) {
        const unsigned int byte = w[j];
        const int i = 2 * j;
        const int b = i / block_size;
        add_tokens(acc, tokens, (float)(byte >> 4) * s[b] + z[b], x, ic, i);
        if (i + 1 < ic) {
            const int b1 = (i + 1) / block_size;
            add_tokens(acc, tokens, (float)(byte & 15u) * s[b1] + z[b1], x, ic, i + 1);
        }
    }
    store_tokens(acc, tokens, row, oc, bias, has_bias, out);
}

extern "C" __global__ void gemv_q4_words_tokens(int tokens, int oc, int ic, int row_bytes, int block_size,
                                                int n_blocks, const unsigned char* codes, const float* scales,
                                                const float* zeros, const float* bias, int has_bias,
                                                const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned int* w = (const unsigned int*)(codes + (size_t)row * row_bytes);
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    ZERO_TOKENS(acc);
    for (int k = lane; k < (ic >> 3); k += 32) {
        const unsigned int word = w[k];
        const int i = k << 3;
        const int b = i / block_size;
        const float scale = s[b], zero = z[b];
#pragma unroll
        for (int t = 0; t < 4; ++t) {  // little-endian: byte t of the word is byte i/2 + t of the row
            const unsigned int byte = (word >> (8 * t)) & 0xffu;
            add_tokens(acc, tokens, (float)(byte >> 4) * scale + zero, x, ic, i + 2 * t);
            add_tokens(acc, tokens, (float)(byte & 15u) * scale + zero, x, ic, i + 2 * t + 1);
        }
    }
    store_tokens(acc, tokens, row, oc, bias, has_bias, out);
}

extern "C" __global__ void gemv_q8_tokens(int tokens, int oc, int ic, int row_bytes, int block_size, int n_blocks,
                                          const unsigned char* codes, const float* scales, const float* zeros,
                                          const float* bias, int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned char* w = codes + (size_t)row * row_bytes;
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    ZERO_TOKENS(acc);
    for (int i = lane; i < ic; i += 32) {
        const int b = i / block_size;
        add_tokens(acc, tokens, (float)w[i] * s[b] + z[b], x, ic, i);
    }
    store_tokens(acc, tokens, row, oc, bias, has_bias, out);
}

extern "C" __global__ void gemv_q8_words_tokens(int tokens, int oc, int ic, int row_bytes, int block_size,
                                                int n_blocks, const unsigned char* codes, const float* scales,
                                                const float* zeros, const float* bias, int has_bias,
                                                const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const unsigned int* w = (const unsigned int*)(codes + (size_t)row * row_bytes);
    const float* s = scales + (size_t)row * n_blocks;
    const float* z = zeros + (size_t)row * n_blocks;
    ZERO_TOKENS(acc);
    for (int k = lane; k < (ic >> 2); k += 32) {
        const unsigned int word = w[k];
        const int i = k << 2;
        const int b = i / block_size;
        const float scale = s[b], zero = z[b];
#pragma unroll
        for (int t = 0; t < 4; ++t)
            add_tokens(acc, tokens, (float)((word >> (8 * t)) & 0xffu) * scale + zero, x, ic, i + t);
    }
    store_tokens(acc, tokens, row, oc, bias, has_bias, out);
}

extern "C" __global__ void gemv_dense_tokens(int tokens, int oc, int ic, const real_t* weight, const float* bias,
                                             int has_bias, const real_t* x, real_t* out) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= oc) return;
    const real_t* w = weight + (size_t)row * ic;
    ZERO_TOKENS(acc);
    for (int i = lane; i < ic; i += 32) add_tokens(acc, tokens, to_float(w[i]), x, ic, i);
    store_tokens(acc, tokens, row, oc, bias, has_bias, out);
}

// ---- prefill: weights of rows [row0, row0 + rows) into gemm_t [rows, ic] ----------------------

extern "C" __global__ void dequant_q4(int row0, int rows, int ic, int row_bytes, int block_size, int n_blocks,
                                      const unsigned char* codes, const float* scales, const float* zeros,
                                      gemm_t* out) {
    FOR_EACH_ELEMENT(e, rows * ic) {
        const int o = row0 + e / ic, i = e % ic;
        const unsigned int byte = codes[(size_t)o * row_bytes + (i >> 1)];
        const unsigned int code = (i & 1) ? (byte & 15u) : (byte >> 4);
        const size_t b = (size_t)o * n_blocks + i / block_size;
        out[e] = float_to_gemm((float)code * scales[b] + zeros[b]);
    }
}

extern "C" __global__ void dequant_q8(int row0, int rows, int ic, int row_bytes, int block_size, int n_blocks,
                                      const unsigned char* codes, const float* scales, const float* zeros,
                                      gemm_t* out) {
    FOR_EACH_ELEMENT(e, rows * ic) {
        const int o = row0 + e / ic, i = e % ic;
        const size_t b = (size_t)o * n_blocks + i / block_size;
        out[e] = float_to_gemm((float)codes[(size_t)o * row_bytes + i] * scales[b] + zeros[b]);
    }
}

extern "C" __global__ void dense_to_gemm(int row0, int rows, int ic, const real_t* weight, gemm_t* out) {
    FOR_EACH_ELEMENT(e, rows * ic) out[e] = float_to_gemm(to_float(weight[(size_t)row0 * ic + e]));
}

extern "C" __global__ void real_to_gemm(int n, const real_t* x, gemm_t* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = float_to_gemm(to_float(x[i]));
}

// out[r, o] = y[r, o] + bias[o], back into real_t.
extern "C" __global__ void gemm_to_real(int rows, int oc, const gemm_t* y, const float* bias, int has_bias,
                                        real_t* out) {
    FOR_EACH_ELEMENT(e, rows * oc) out[e] = from_float(gemm_to_float(y[e]) + (has_bias ? bias[e % oc] : 0.0f));
}
