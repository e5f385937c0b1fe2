// BinaryOp, UnaryOp and Cast on float tensors. One kernel per op, made by the macros below;
// the host picks binary_flat_<OP> when both inputs have the output's shape, else
// binary_strided_<OP> with per-input strides (0 on broadcast dims).

#define SILU(x) ((x) / (1.0f + exp(-(x))))

#define BINARY(NAME, EXPR)                                                                        \
__kernel void binary_flat_##NAME(__global real_t* out, __global const real_t* A,                 \
                                 __global const real_t* B, const int n) {                        \
    const int i = get_global_id(0);                                                               \
    if (i >= n) return;                                                                           \
    const float a = LOAD(A, i), b = LOAD(B, i);                                                   \
    STORE(out, i, (float)(EXPR));                                                                 \
}                                                                                                 \
__kernel void binary_strided_##NAME(__global real_t* out, __global const real_t* A,              \
                                    __global const real_t* B, const int n, const int8 shape,     \
                                    const int8 a_stride, const int8 b_stride) {                   \
    const int i = get_global_id(0);                                                               \
    if (i >= n) return;                                                                           \
    const float a = LOAD(A, strided_offset(i, shape, a_stride));                                  \
    const float b = LOAD(B, strided_offset(i, shape, b_stride));                                  \
    STORE(out, i, (float)(EXPR));                                                                 \
}

// numpy's float floor-mod: the result takes the divisor's sign.
inline float floor_mod(float a, float b) { return a - floor(a / b) * b; }

BINARY(ADD, a + b)
BINARY(SUB, a - b)
BINARY(MUL, a * b)
BINARY(REALDIV, a / b)
BINARY(DIV, a / b)
BINARY(FLOORDIV, floor(a / b))
BINARY(MOD, floor_mod(a, b))
BINARY(FLOORMOD, floor_mod(a, b))
BINARY(POW, pow(a, b))
BINARY(MAXIMUM, fmax(a, b))
BINARY(MINIMUM, fmin(a, b))
BINARY(MAX_TEMP, fmax(a, b))
BINARY(MIN_TEMP, fmin(a, b))
BINARY(SquaredDifference, (a - b) * (a - b))
BINARY(GREATER, a > b)
BINARY(GREATER_EQUAL, a >= b)
BINARY(LESS, a < b)
BINARY(LESS_EQUAL, a <= b)
BINARY(EQUAL, a == b)
BINARY(NOTEQUAL, a != b)
BINARY(ATAN2, atan2(a, b))
BINARY(MUL_SILU, a * SILU(b))

#define UNARY(NAME, EXPR)                                                                         \
__kernel void unary_##NAME(__global real_t* out, __global const real_t* X, const int n) {        \
    const int i = get_global_id(0);                                                               \
    if (i >= n) return;                                                                           \
    const float x = LOAD(X, i);                                                                   \
    STORE(out, i, (float)(EXPR));                                                                 \
}

inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

UNARY(ABS, fabs(x))
UNARY(NEG, -x)
UNARY(FLOOR, floor(x))
UNARY(CEIL, ceil(x))
UNARY(SQUARE, x * x)
UNARY(SQRT, sqrt(x))
UNARY(RSQRT, 1.0f / sqrt(x))
UNARY(EXP, exp(x))
UNARY(LOG, log(x))
UNARY(SIN, sin(x))
UNARY(COS, cos(x))
UNARY(TAN, tan(x))
UNARY(ASIN, asin(x))
UNARY(ACOS, acos(x))
UNARY(ATAN, atan(x))
UNARY(RECIPROCAL, 1.0f / x)
UNARY(TANH, tanh(x))
UNARY(SIGMOID, 1.0f / (1.0f + exp(-x)))
UNARY(SILU, SILU(x))
UNARY(SIGN, sign(x))
UNARY(ROUND, rint(x))
UNARY(ERF, erf(x))
UNARY(GELU, gelu_tanh(x))
UNARY(GELU_STANDARD, 0.5f * x * (1.0f + erf(x * 0.7071067811865476f)))

__kernel void cast_int_to_float(__global real_t* out, __global const int* x, const int n) {
    const int i = get_global_id(0);
    if (i < n) STORE(out, i, (float)x[i]);
}

// C's conversion truncates toward zero, as numpy's astype does.
__kernel void cast_float_to_int(__global int* out, __global const real_t* x, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = (int)LOAD(x, i);
}
