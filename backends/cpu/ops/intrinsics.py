"""Low-level helpers for the numba kernels that numba itself does not offer.

`prefetch(array, byte_offset)` asks the CPU to start loading the cache line at
`array`'s data pointer + `byte_offset`. The int4 GEMV does several instructions per weight
byte, so without a prefetch the hardware streamer falls behind and the kernel reads memory
at a third of the machine's bandwidth. A prefetch never faults, even past the array's end.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_BYTE_PTR = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_PREFETCH_TYPE = ir.FunctionType(ir.VoidType(), [_BYTE_PTR, _I32, _I32, _I32])


@intrinsic
def prefetch(typingctx, array, byte_offset):
    """Read-prefetch into all cache levels (llvm.prefetch: read, locality 3, data cache)."""
    if not isinstance(array, types.Array) or not isinstance(byte_offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        base = builder.bitcast(data, _BYTE_PTR)
        offset = context.cast(builder, args[1], signature.args[1], types.intp)
        address = builder.gep(base, [offset])
        function = cgutils.get_or_insert_function(builder.module, _PREFETCH_TYPE, "llvm.prefetch.p0i8")
        builder.call(function, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.void(array, byte_offset), codegen


_V16I8 = ir.VectorType(ir.IntType(8), 16)
_V16I16 = ir.VectorType(ir.IntType(16), 16)
_V8I32 = ir.VectorType(_I32, 8)
_V16I32 = ir.VectorType(_I32, 16)


def has_vnni() -> bool:
    """True when numba's target CPU has a 256-bit int16 dot product (AVX-VNNI, or AVX512-VNNI + VL)."""
    import llvmlite.binding as llvm
    import numba

    features = set((numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()).split(","))
    return "+avxvnni" in features or {"+avx512vnni", "+avx512vl"} <= features


VNNI = has_vnni()


def _load(builder, base, offset: int, vector_type):
    address = builder.gep(base, [ir.Constant(ir.IntType(64), offset)]) if offset else base
    return builder.load(builder.bitcast(address, vector_type.as_pointer()), align=1)


def _nibble_words(builder, code_ptr) -> list:
    """The 64 nibbles of the 32 code bytes at code_ptr as four v16i16, in the order of the int16
    x layout [xe (32) | xo (32)]: (high nibbles 0-15, low 0-15, high 16-31, low 16-31), each with
    its byte offset into that layout."""
    four, fifteen = ir.Constant(_V16I16, [4] * 16), ir.Constant(_V16I16, [15] * 16)
    words = []
    for half in range(2):
        codes = builder.zext(_load(builder, code_ptr, 16 * half, _V16I8), _V16I16)
        words.append((builder.lshr(codes, four), 32 * half))
        words.append((builder.and_(codes, fifteen), 64 + 32 * half))
    return words


def _dot_words(builder, words, x_ptr):
    """sum over the four (nibbles, offset) pairs of nibbles * the int16 x at x_ptr + offset, as a
    vector of int32 partial sums (v8i32 with VNNI, v16i32 without)."""
    if VNNI:
        dot_type = ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32])
        dot = cgutils.get_or_insert_function(builder.module, dot_type, "llvm.x86.avx512.vpdpwssd.256")
        acc = ir.Constant(_V8I32, [0] * 8)
        for codes16, offset in words:
            x16 = _load(builder, x_ptr, offset, _V16I16)
            acc = builder.call(dot, [acc, builder.bitcast(codes16, _V8I32), builder.bitcast(x16, _V8I32)])
        return acc
    acc = None
    for codes16, offset in words:
        x16 = _load(builder, x_ptr, offset, _V16I16)
        product = builder.mul(builder.zext(codes16, _V16I32), builder.sext(x16, _V16I32))
        acc = product if acc is None else builder.add(acc, product)
    return acc


def _pointers(context, builder, signature, args) -> tuple:
    """(code pointer, [x pointer per int16 array]) for (codes, code_offset, *xq arrays, x_index)."""
    code_data = context.make_array(signature.args[0])(context, builder, args[0]).data
    code_ptr = builder.gep(builder.bitcast(code_data, _BYTE_PTR), [args[1]])
    x_index = args[-1]
    x_ptrs = []
    for array_type, array in zip(signature.args[2:-1], args[2:-1]):
        x_data = context.make_array(array_type)(context, builder, array).data
        x_ptrs.append(builder.gep(builder.bitcast(x_data, _BYTE_PTR),
                                  [builder.mul(x_index, ir.Constant(x_index.type, 2))]))
    return code_ptr, x_ptrs


def _reduce_add(builder, vector):
    reduce_type = ir.FunctionType(_I32, [vector.type])
    name = f"llvm.vector.reduce.add.v{vector.type.count}i32"
    return builder.call(cgutils.get_or_insert_function(builder.module, reduce_type, name), [vector])


def _pair_sums(builder, x, y):
    """[x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, ...]: vphaddd's order, so it needs no lane crossing."""
    evens = [i + offset for lane in (0, 4) for offset in (0, 8) for i in (lane, lane + 2)]
    return builder.add(builder.shuffle_vector(x, y, ir.Constant(_V8I32, evens)),
                       builder.shuffle_vector(x, y, ir.Constant(_V8I32, [i + 1 for i in evens])))


def _reduce_add4(builder, vectors) -> list:
    """The element sums of four int32 vectors, sharing the shuffles of one reduction."""
    if vectors[0].type.count == 16:   # fold to v8i32 first
        low, high = ir.Constant(_V8I32, list(range(8))), ir.Constant(_V8I32, list(range(8, 16)))
        vectors = [builder.add(builder.shuffle_vector(v, v, low), builder.shuffle_vector(v, v, high))
                   for v in vectors]
    sums = _pair_sums(builder, _pair_sums(builder, vectors[0], vectors[1]),
                      _pair_sums(builder, vectors[2], vectors[3]))   # [a, b, c, d] in each 128-bit lane
    quarter = ir.VectorType(_I32, 4)
    low = builder.shuffle_vector(sums, sums, ir.Constant(quarter, [0, 1, 2, 3]))
    high = builder.shuffle_vector(sums, sums, ir.Constant(quarter, [4, 5, 6, 7]))
    total = builder.add(low, high)
    return [builder.extract_element(total, ir.Constant(_I32, i)) for i in range(4)]


@intrinsic
def dot_u4_s16(typingctx, codes, code_offset, xq, x_index):
    """sum_j hi(c_j)*xe_j + lo(c_j)*xo_j over the 32 code bytes at `codes` + code_offset (bytes), with
    the 64 int16 values from xq[x_index] laid out as [xe (32) | xo (32)]. int32 result.

    With VNNI: four vpdpwssd and a reduction; without it the same sum as plain vector IR
    (which LLVM turns into pmaddwd)."""
    if not (isinstance(codes, types.Array) and isinstance(xq, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        code_ptr, (x_ptr,) = _pointers(context, builder, signature, args)
        return _reduce_add(builder, _dot_words(builder, _nibble_words(builder, code_ptr), x_ptr))

    return types.int32(codes, types.intp, xq, types.intp), codegen


@intrinsic
def dot4_u4_s16(typingctx, codes, code_offset, xq0, xq1, xq2, xq3, x_index):
    """dot_u4_s16 of the same 32 code bytes with four int16 vectors at once (a tuple of four int32):
    the nibbles are unpacked once for all four."""
    xqs = (xq0, xq1, xq2, xq3)
    if not (isinstance(codes, types.Array) and all(isinstance(xq, types.Array) for xq in xqs)):
        return None

    def codegen(context, builder, signature, args):
        code_ptr, x_ptrs = _pointers(context, builder, signature, args)
        words = _nibble_words(builder, code_ptr)
        sums = _reduce_add4(builder, [_dot_words(builder, words, x_ptr) for x_ptr in x_ptrs])
        return context.make_tuple(builder, signature.return_type, sums)

    return types.UniTuple(types.int32, 4)(codes, types.intp, *xqs, types.intp), codegen
