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
