#version 450
// Elementwise type conversion between int32 and float tensors. Built with -DTO_FLOAT
// (int32 -> float) or without it (float -> int32, truncating like numpy).
#include "common.glsl"
layout(local_size_x = 64) in;
#ifdef TO_FLOAT
layout(std430, binding = 0) readonly buffer X { int x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { int y[]; };
#endif
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) return;
#ifdef TO_FLOAT
    y[i] = float(x[i]);
#else
    y[i] = int(x[i]);
#endif
}
