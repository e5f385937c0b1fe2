#version 450
// out = a (op) b with numpy broadcasting: the host folds shapes into at most 6 dims and gives
// each input's element strides (0 along a broadcast dim). `op` numbers follow BINARY_CODES in
// mnngpu/runtime/elementwise.py. Built with -DINT for int32 tensors.
#include "common.glsl"
layout(local_size_x = 64) in;
#ifdef INT
#define T int
#else
#define T float
#endif
layout(std430, binding = 0) readonly buffer A { T a[]; };
layout(std430, binding = 1) readonly buffer B { T b[]; };
layout(std430, binding = 2) writeonly buffer C { T c[]; };
layout(push_constant) uniform Push {
    uint n; uint op; uint rank; uint pad;
    uint shape[6]; int stride_a[6]; int stride_b[6];
} pc;

#ifdef INT
int apply(uint op, int x, int y) {
    int q = ((op == 3u || op == 10u || op == 11u) && y != 0) ? x / y : 0;   // truncates toward zero, like C
    int r = x - q * y;
    switch (op) {
        case 0u: return x + y;
        case 1u: return x - y;
        case 2u: return x * y;
        case 3u: return q;
        case 4u: return max(x, y);
        case 5u: return min(x, y);
        case 6u: return int(round(pow(float(x), float(y))));
        case 7u: return (x - y) * (x - y);
        case 8u: return int(float(x) * float(y) / (1.0 + exp(-float(y))));
        case 9u: return int(atan(float(x), float(y)));
        case 10u: return (r != 0 && ((r < 0) != (y < 0))) ? q - 1 : q;
        case 11u: return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
        case 12u: return int(x > y);
        case 13u: return int(x >= y);
        case 14u: return int(x < y);
        case 15u: return int(x <= y);
        case 16u: return int(x == y);
        case 17u: return int(x != y);
    }
    return x;
}
#else
// GLSL leaves pow undefined for a negative base; numpy defines it for whole exponents.
float power(float x, float y) {
    if (x >= 0.0 || y != floor(y)) return pow(x, y);
    float m = pow(-x, y);
    return mod(y, 2.0) == 1.0 ? -m : m;
}

float apply(uint op, float x, float y) {
    switch (op) {
        case 0u: return x + y;
        case 1u: return x - y;
        case 2u: return x * y;
        case 3u: return x / y;
        case 4u: return max(x, y);
        case 5u: return min(x, y);
        case 6u: return power(x, y);
        case 7u: return (x - y) * (x - y);
        case 8u: return x * (y / (1.0 + exp(-y)));
        case 9u: return atan(x, y);
        case 10u: return floor(x / y);
        case 11u: return x - y * floor(x / y);
        case 12u: return float(x > y);
        case 13u: return float(x >= y);
        case 14u: return float(x < y);
        case 15u: return float(x <= y);
        case 16u: return float(x == y);
        case 17u: return float(x != y);
    }
    return x;
}
#endif

void main() {
    uint i = global_index();
    if (i >= pc.n) return;
    uint rest = i;
    int ia = 0;
    int ib = 0;
    for (int d = int(pc.rank) - 1; d >= 0; d--) {
        uint size = pc.shape[d];
        int coord = int(rest % size);
        rest /= size;
        ia += coord * pc.stride_a[d];
        ib += coord * pc.stride_b[d];
    }
    c[i] = apply(pc.op, a[ia], b[ib]);
}
