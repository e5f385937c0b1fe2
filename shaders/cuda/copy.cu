// Data movement by index maps planned on the host (StridedSlice, GatherV2, Concat):
// gather: dst[i] = src[index[i]];  scatter: dst[index[i]] = src[i].
// Elements are moved as raw 16- or 32-bit words, so one kernel serves every element type.
#include "common.cuh"

extern "C" __global__ void gather_u32(int n, const unsigned int* src, const int* index, unsigned int* dst) {
    FOR_EACH_ELEMENT(i, n) dst[i] = src[index[i]];
}

extern "C" __global__ void gather_u16(int n, const unsigned short* src, const int* index, unsigned short* dst) {
    FOR_EACH_ELEMENT(i, n) dst[i] = src[index[i]];
}

extern "C" __global__ void scatter_u32(int n, const unsigned int* src, const int* index, unsigned int* dst) {
    FOR_EACH_ELEMENT(i, n) dst[index[i]] = src[i];
}

extern "C" __global__ void scatter_u16(int n, const unsigned short* src, const int* index, unsigned short* dst) {
    FOR_EACH_ELEMENT(i, n) dst[index[i]] = src[i];
}
