// Elementwise ops on real_t tensors: BinaryOp, UnaryOp and Cast.
// The op codes are numbered in mnngpu/runtime/elementwise.py (BINARY_CODES, UNARY_CODES).
#include "common.cuh"

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ float binary_op(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return fmaxf(a, b);
        case 5: return fminf(a, b);
        case 6: return powf(a, b);
        case 7: { const float d = a - b; return d * d; }
        case 8: return a * silu(b);  // MNN's MUL_SILU: input0 * silu(input1)
        case 9: return atan2f(a, b);
        case 10: return floorf(a / b);
        case 11: {  // numpy's mod: the result takes the divisor's sign
            const float r = fmodf(a, b);
            return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
        }
        case 12: return a > b ? 1.0f : 0.0f;
        case 13: return a >= b ? 1.0f : 0.0f;
        case 14: return a < b ? 1.0f : 0.0f;
        case 15: return a <= b ? 1.0f : 0.0f;
        case 16: return a == b ? 1.0f : 0.0f;
        case 17: return a != b ? 1.0f : 0.0f;
    }
    return 0.0f;
}

__device__ float unary_op(int op, float x) {
    switch (op) {
        case 0: return fabsf(x);
        case 1: return -x;
        case 2: return floorf(x);
        case 3: return ceilf(x);
        case 4: return x * x;
        case 5: return sqrtf(x);
        case 6: return 1.0f / sqrtf(x);  // not rsqrtf: that one is approximate
        case 7: return expf(x);
        case 8: return logf(x);
        case 9: return sinf(x);
        case 10: return cosf(x);
        case 11: return tanf(x);
        case 12: return asinf(x);
        case 13: return acosf(x);
        case 14: return atanf(x);
        case 15: return 1.0f / x;
        case 16: return tanhf(x);
        case 17: return 1.0f / (1.0f + expf(-x));
        case 18: return silu(x);
        case 19: return (float)((x > 0.0f) - (x < 0.0f));
        case 20: return rintf(x);  // half to even, as numpy's round
        case 21: return erff(x);
        case 22: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        case 23: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    }
    return 0.0f;
}

// Both inputs have the output's shape.
extern "C" __global__ void binary_same(int op, int n, const real_t* a, const real_t* b, real_t* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = from_float(binary_op(op, to_float(a[i]), to_float(b[i])));
}

// Broadcasting: output element i reads a[a_index[i]] and b[b_index[i]] (planned on the host).
extern "C" __global__ void binary_indexed(int op, int n, const real_t* a, const real_t* b,
                                          const int* a_index, const int* b_index, real_t* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = from_float(binary_op(op, to_float(a[a_index[i]]), to_float(b[b_index[i]])));
}

extern "C" __global__ void unary(int op, int n, const real_t* x, real_t* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = from_float(unary_op(op, to_float(x[i])));
}

extern "C" __global__ void int_to_real(int n, const int* x, real_t* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = from_float((float)x[i]);
}

// numpy's astype(int32): truncation toward zero.
extern "C" __global__ void real_to_int(int n, const real_t* x, int* out) {
    FOR_EACH_ELEMENT(i, n) out[i] = (int)truncf(to_float(x[i]));
}
