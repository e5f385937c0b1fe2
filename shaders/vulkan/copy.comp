#version 450
// A strided copy: element `i` of an n-element, up-to-6-D iteration space reads
// src[src_offset + sum(coord * src_stride)] and writes dst[dst_offset + sum(coord * dst_stride)].
// The host plans slices, concatenation and gathers as such copies. Elements (float or
// int32) move as raw 32-bit words.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Src { uint src[]; };
layout(std430, binding = 1) buffer Dst { uint dst[]; };
layout(push_constant) uniform Push {
    uint n; uint rank; int src_offset; int dst_offset;
    uint shape[6]; int src_stride[6]; int dst_stride[6];
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) return;
    uint rest = i;
    int s = pc.src_offset;
    int d = pc.dst_offset;
    for (int k = int(pc.rank) - 1; k >= 0; k--) {
        uint size = pc.shape[k];
        int coord = int(rest % size);
        rest /= size;
        s += coord * pc.src_stride[k];
        d += coord * pc.dst_stride[k];
    }
    dst[d] = src[s];
}
