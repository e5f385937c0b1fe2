// Shared by every CUDA kernel file: the float storage type and the block reductions.
//
// The loader compiles each file once per storage type, setting STORAGE:
//   0: fp32 tensors (precision high)   1: fp16 tensors   2: bf16 tensors
// Tensors hold real_t; all arithmetic is fp32. gemm_t is the element type of the prefill GEMM
// (cuBLAS through cupy.matmul): fp16 for fp16 storage, else fp32 (cuBLAS has no bf16 path here).
// Half types are kept as raw 16-bit patterns, so no CUDA header is needed under NVRTC.

#ifndef STORAGE
#define STORAGE 0
#endif

#if STORAGE == 0
typedef float real_t;
typedef float gemm_t;
__device__ __forceinline__ float to_float(real_t v) { return v; }
__device__ __forceinline__ real_t from_float(float v) { return v; }
#elif STORAGE == 1
typedef unsigned short real_t;  // IEEE binary16 bits
typedef unsigned short gemm_t;
__device__ __forceinline__ float to_float(real_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ real_t from_float(float v) {
    real_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
#elif STORAGE == 2
typedef unsigned short real_t;  // bfloat16 bits: the high half of an fp32
typedef float gemm_t;
__device__ __forceinline__ float to_float(real_t v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ real_t from_float(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (real_t)0x7fc0;  // NaN stays a quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                             // round to nearest, ties to even
    return (real_t)(u >> 16);
}
#else
#error "STORAGE must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif

#if STORAGE == 1
__device__ __forceinline__ float gemm_to_float(gemm_t v) { return to_float(v); }
__device__ __forceinline__ gemm_t float_to_gemm(float v) { return from_float(v); }
#else
__device__ __forceinline__ float gemm_to_float(gemm_t v) { return v; }
__device__ __forceinline__ gemm_t float_to_gemm(float v) { return v; }
#endif

// NVRTC has no <cmath>, so no INFINITY macro.
#define NEG_INFINITY __uint_as_float(0xff800000u)

// Grid-stride loop over n elements, for the 1-D launches of the elementwise kernels.
#define FOR_EACH_ELEMENT(i, n) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The sum of v over the block, returned to every thread. blockDim.x is a multiple of 32
// (at most 1024); scratch is a __shared__ float[32]. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
    const int warps = blockDim.x >> 5;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}
