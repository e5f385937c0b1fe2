#version 450
// y = f(x) elementwise; `op` numbers follow UNARY_CODES in mnngpu/runtime/elementwise.py.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; uint op; } pc;

// tanh is clamped where it is already +-1 in float32: some drivers overflow exp inside it.
// asin and acos go through the two-argument atan, which drivers compute far more precisely.
// Abramowitz-Stegun 7.1.26 has only 1.5e-7 absolute error, but GLSL has no erf of its own.
float erf_approx(float v) {
    float t = 1.0 / (1.0 + 0.3275911 * abs(v));
    float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - poly * exp(-v * v));
}

float apply(uint op, float v) {
    switch (op) {
        case 0u: return abs(v);
        case 1u: return -v;
        case 2u: return floor(v);
        case 3u: return ceil(v);
        case 4u: return v * v;
        case 5u: return sqrt(v);
        case 6u: return inversesqrt(v);
        case 7u: return exp(v);
        case 8u: return log(v);
        case 9u: return sin(v);
        case 10u: return cos(v);
        case 11u: return tan(v);
        case 12u: return atan(v, sqrt((1.0 - v) * (1.0 + v)));
        case 13u: return atan(sqrt((1.0 - v) * (1.0 + v)), v);
        case 14u: return atan(v);
        case 15u: return 1.0 / v;
        case 16u: return tanh(clamp(v, -15.0, 15.0));
        case 17u: return 1.0 / (1.0 + exp(-v));
        case 18u: return v / (1.0 + exp(-v));
        case 19u: return sign(v);
        case 20u: return roundEven(v);
        case 21u: return erf_approx(v);
        case 22u: return 0.5 * v * (1.0 + tanh(clamp(0.7978845608028654 * (v + 0.044715 * v * v * v), -15.0, 15.0)));
        case 23u: return 0.5 * v * (1.0 + erf_approx(v * 0.7071067811865476));
    }
    return v;
}

void main() {
    uint i = global_index();
    if (i >= pc.n) return;
    y[i] = apply(pc.op, x[i]);
}
