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


@intrinsic
def dot_u4_s16(typingctx, codes, code_offset, xq, x_index):
    """sum_j hi(c_j)*xe_j + lo(c_j)*xo_j over the 32 code bytes at `codes` + code_offset (bytes), with
    the 64 int16 values from xq[x_index] laid out as [xe (32) | xo (32)]. int32 result.

    With VNNI: four vpdpwssd and a reduction; without it the same sum as plain vector IR
    (which LLVM turns into pmaddwd)."""
    if not (isinstance(codes, types.Array) and isinstance(xq, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        code_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        x_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        code_ptr = builder.gep(builder.bitcast(code_data, _BYTE_PTR), [args[1]])
        x_ptr = builder.gep(builder.bitcast(x_data, _BYTE_PTR), [builder.mul(args[3], ir.Constant(args[3].type, 2))])
        four, fifteen = ir.Constant(_V16I16, [4] * 16), ir.Constant(_V16I16, [15] * 16)
        pairs = []
        for half in range(2):
            words = builder.zext(_load(builder, code_ptr, 16 * half, _V16I8), _V16I16)
            pairs.append((builder.lshr(words, four), _load(builder, x_ptr, 32 * half, _V16I16)))
            pairs.append((builder.and_(words, fifteen), _load(builder, x_ptr, 64 + 32 * half, _V16I16)))
        if VNNI:
            dot_type = ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32])
            dot = cgutils.get_or_insert_function(builder.module, dot_type, "llvm.x86.avx512.vpdpwssd.256")
            acc = ir.Constant(_V8I32, [0] * 8)
            for codes16, x16 in pairs:
                acc = builder.call(dot, [acc, builder.bitcast(codes16, _V8I32), builder.bitcast(x16, _V8I32)])
            width = _V8I32
        else:
            acc = None
            for codes16, x16 in pairs:
                product = builder.mul(builder.zext(codes16, _V16I32), builder.sext(x16, _V16I32))
                acc = product if acc is None else builder.add(acc, product)
            width = _V16I32
        reduce_type = ir.FunctionType(_I32, [width])
        name = f"llvm.vector.reduce.add.v{width.count}i32"
        return builder.call(cgutils.get_or_insert_function(builder.module, reduce_type, name), [acc])

    return types.int32(codes, types.intp, xq, types.intp), codegen
