// Prepended to every OpenCL program by backends/opencl/device.py, after the -D defines.
// Float tensors are stored as `real_t`: fp32, or fp16 under HALF_STORAGE. Math is always fp32:
// kernels touch storage only through these macros. vload_half/vstore_half are core OpenCL, so
// HALF_STORAGE compiles even where cl_khr_fp16 (half arithmetic) is missing.
#ifdef HAS_FP16_EXTENSION
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

#ifdef HALF_STORAGE
typedef half real_t;
#define LOAD(p, i) vload_half((i), (p))
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#define LOAD16(p, i) vload_half16(0, (p) + (i))
#define STORE(p, i, v) vstore_half((v), (i), (p))
#else
typedef float real_t;
#define LOAD(p, i) ((p)[i])
#define LOAD4(p, i) vload4(0, (p) + (i))
#define LOAD16(p, i) vload16(0, (p) + (i))
#define STORE(p, i, v) ((p)[i] = (v))
#endif

#define HSUM4(v) ((v).s0 + (v).s1 + (v).s2 + (v).s3)
#define HSUM16(v) HSUM4((v).s0123 + (v).s4567 + (v).s89ab + (v).scdef)

// Offset of the element at flat index `i` of a row-major `shape` (outermost first, right-aligned
// in 8 dims) in a tensor laid out with `stride` (elements; 0 on broadcast dims). Programs that
// use it are built with RANK, the dims in use (default 8), to skip index arithmetic on the rest.
#define STRIDED_STEP(c) { const int q_ = i / shape.c; off += (i - q_ * shape.c) * stride.c; i = q_; }
#ifndef RANK
#define RANK 8
#endif
#if RANK == 1
#define OUTERMOST s7
#elif RANK == 2
#define OUTERMOST s6
#elif RANK == 3
#define OUTERMOST s5
#elif RANK == 4
#define OUTERMOST s4
#elif RANK == 5
#define OUTERMOST s3
#elif RANK == 6
#define OUTERMOST s2
#elif RANK == 7
#define OUTERMOST s1
#else
#define OUTERMOST s0
#endif
inline int strided_offset(int i, const int8 shape, const int8 stride) {
    int off = 0;
#if RANK > 1
    STRIDED_STEP(s7)
#endif
#if RANK > 2
    STRIDED_STEP(s6)
#endif
#if RANK > 3
    STRIDED_STEP(s5)
#endif
#if RANK > 4
    STRIDED_STEP(s4)
#endif
#if RANK > 5
    STRIDED_STEP(s3)
#endif
#if RANK > 6
    STRIDED_STEP(s2)
#endif
#if RANK > 7
    STRIDED_STEP(s1)
#endif
    return off + i * stride.OUTERMOST;  // what is left of i indexes the outermost dim
}
