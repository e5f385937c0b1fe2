// Data movement (StridedSlice, Gather, Concat): dst[dst_base + layout(i)] = src[src_base + layout(i)]
// over the elements i of a copy shape. Copies move raw 16- or 32-bit elements, so one kernel
// serves fp32, fp16 and int32 tensors.

#define STRIDED_COPY(NAME, T)                                                                     \
__kernel void strided_copy_##NAME(__global T* dst, __global const T* src, const int n,           \
                                  const int8 shape, const int8 src_stride, const int8 dst_stride, \
                                  const int src_base, const int dst_base) {                       \
    const int i = get_global_id(0);                                                               \
    if (i >= n) return;                                                                           \
    dst[dst_base + strided_offset(i, shape, dst_stride)] = src[src_base + strided_offset(i, shape, src_stride)]; \
}                                                                                                 \
/* The rare layouts no strides describe (Gather with arbitrary indices): explicit offsets. */    \
__kernel void mapped_copy_##NAME(__global T* dst, __global const T* src, const int n,            \
                                 __global const int* src_offsets, __global const int* dst_offsets) { \
    const int i = get_global_id(0);                                                               \
    if (i < n) dst[dst_offsets[i]] = src[src_offsets[i]];                                         \
}

STRIDED_COPY(u16, ushort)
STRIDED_COPY(u32, uint)
