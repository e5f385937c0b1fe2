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


def _prefetch_address(builder, address) -> None:
    """Read-prefetch into all cache levels (llvm.prefetch: read, locality 3, data cache)."""
    function = cgutils.get_or_insert_function(builder.module, _PREFETCH_TYPE, "llvm.prefetch.p0i8")
    builder.call(function, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


@intrinsic
def prefetch(typingctx, array, byte_offset):
    """_prefetch_address of `array`'s data pointer + byte_offset."""
    if not isinstance(array, types.Array) or not isinstance(byte_offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        offset = context.cast(builder, args[1], signature.args[1], types.intp)
        _prefetch_address(builder, builder.gep(builder.bitcast(data, _BYTE_PTR), [offset]))
        return context.get_dummy_value()

    return types.void(array, byte_offset), codegen


_V16I8 = ir.VectorType(ir.IntType(8), 16)
_V32I8 = ir.VectorType(ir.IntType(8), 32)
_V16I16 = ir.VectorType(ir.IntType(16), 16)
_V32I16 = ir.VectorType(ir.IntType(16), 32)
_V8I32 = ir.VectorType(_I32, 8)
_V16I32 = ir.VectorType(_I32, 16)
CHUNK_CODE_BYTES = 32   # one chunk: 64 int4 weights ...
CHUNK_X_BYTES = 128     # ... and 64 int16 activations


def vnni_width() -> int:
    """The widest int16 dot-product instruction of numba's target CPU, in bits: 512 (AVX512-VNNI
    with AVX512-BW), 256 (AVX-VNNI, or AVX512-VNNI + VL), or 0 (none: plain vector IR)."""
    import llvmlite.binding as llvm
    import numba

    features = set((numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()).split(","))
    if {"+avx512vnni", "+avx512bw", "+avx512f"} <= features:
        return 512
    if "+avxvnni" in features or {"+avx512vnni", "+avx512vl"} <= features:
        return 256
    return 0


VNNI_WIDTH = vnni_width()
DOT_LANES = 8 if VNNI_WIDTH == 256 else 16   # int32 partial sums per chunk dot (_dot_words)


def _load(builder, base, offset: int, vector_type):
    address = builder.gep(base, [ir.Constant(ir.IntType(64), offset)]) if offset else base
    return builder.load(builder.bitcast(address, vector_type.as_pointer()), align=1)


def _nibble_words(builder, code_ptr) -> list:
    """The 64 nibbles of the 32 code bytes at code_ptr as int16 vectors, each with its byte offset
    into the int16 x layout [xe (32) | xo (32)]: (high nibbles 0-31, 0) and (low 0-31, 64) in one
    v32i16 each at 512 bits, else split in halves of v16i16."""
    if VNNI_WIDTH == 512:
        codes = builder.zext(_load(builder, code_ptr, 0, _V32I8), _V32I16)
        return [(builder.lshr(codes, ir.Constant(_V32I16, [4] * 32)), 0),
                (builder.and_(codes, ir.Constant(_V32I16, [15] * 32)), 64)]
    four, fifteen = ir.Constant(_V16I16, [4] * 16), ir.Constant(_V16I16, [15] * 16)
    words = []
    for half in range(2):
        codes = builder.zext(_load(builder, code_ptr, 16 * half, _V16I8), _V16I16)
        words.append((builder.lshr(codes, four), 32 * half))
        words.append((builder.and_(codes, fifteen), 64 + 32 * half))
    return words


def _dot_words(builder, words, x_ptr):
    """sum over the (nibbles, offset) pairs of nibbles * the int16 x at x_ptr + offset, as a vector
    of DOT_LANES int32 partial sums."""
    if VNNI_WIDTH:
        acc_type = _V16I32 if VNNI_WIDTH == 512 else _V8I32
        dot_type = ir.FunctionType(acc_type, [acc_type] * 3)
        dot = cgutils.get_or_insert_function(builder.module, dot_type, f"llvm.x86.avx512.vpdpwssd.{VNNI_WIDTH}")
        acc = ir.Constant(acc_type, [0] * acc_type.count)
        for codes16, offset in words:
            x16 = _load(builder, x_ptr, offset, codes16.type)
            acc = builder.call(dot, [acc, builder.bitcast(codes16, acc_type), builder.bitcast(x16, acc_type)])
        return acc
    acc = None
    for codes16, offset in words:
        x16 = _load(builder, x_ptr, offset, _V16I16)
        product = builder.mul(builder.zext(codes16, _V16I32), builder.sext(x16, _V16I32))
        acc = product if acc is None else builder.add(acc, product)
    return acc


_F32 = ir.FloatType()
_I64 = ir.IntType(64)
PREFETCH_BYTES = 2048   # how far ahead of the chunk being read the codes are prefetched


def _vector_fma(builder, a, b, c):
    fma_type = ir.FunctionType(a.type, [a.type] * 3)
    name = f"llvm.fma.v{a.type.count}f32"
    return builder.call(cgutils.get_or_insert_function(builder.module, fma_type, name), [a, b, c])


def _splat(builder, value, vector_type):
    single = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(single, single, ir.Constant(ir.VectorType(_I32, vector_type.count),
                                                              [0] * vector_type.count))


def _element_pointer(builder, base, index, element_bytes: int):
    return builder.gep(base, [builder.mul(index, ir.Constant(_I64, element_bytes))])


CACHE_LINE = 64


def _prefetch_line_ahead(builder, element_ptr, index, element_bytes: int, distance: int) -> None:
    """Prefetch `distance` bytes past element `index` (at element_ptr) of a stream of
    element_bytes-sized elements, at one element in CACHE_LINE // element_bytes: the prefetches are a line apart, so they still
    cover every line, with no more prefetch instructions than lines (on a Zen 4, with the weights
    in cache, a prefetch per 32-byte chunk took 22% of the one-row GEMV's time)."""
    every = CACHE_LINE // element_bytes
    first = builder.icmp_unsigned("==", builder.and_(index, ir.Constant(_I64, every - 1)), ir.Constant(_I64, 0))
    with builder.if_then(first, likely=False):
        _prefetch_address(builder, builder.gep(element_ptr, [ir.Constant(_I64, distance)]))


# numba's fastmath pass gives every float add and multiply that has no flag the "fast" flags, which
# let LLVM reassociate them, and it may do so differently where a kernel handles one row or four.
# A flag of our own ("no signed zeros", which changes no finite result) keeps these exact, so a
# verify row computes the bits its decode step computes.
_EXACT = ("nsz",)
_DOT_FLOATS = ir.VectorType(_F32, DOT_LANES)


class _XRow:
    """The byte pointers of one input row's int16 values, chunk steps and block sums, and its two
    float accumulators (allocas, which LLVM keeps in registers): `dots`, DOT_LANES lanes of the
    scaled chunk dots, and `pair`, the block-sum terms."""

    def __init__(self, builder, pointers):
        self.xq, self.xscale, self.xsum = pointers
        self.pair = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(_F32, 2), [0.0, 0.0]))
        self.dots = cgutils.alloca_once_value(builder, ir.Constant(_DOT_FLOATS, [0.0] * DOT_LANES))


def _lanes_sum(builder, vector):
    """The sum of a float vector's lanes, its halves added until one lane is left: a fixed order."""
    while vector.type.count > 1:
        half = vector.type.count // 2
        mask = ir.VectorType(_I32, half)
        low = builder.shuffle_vector(vector, vector, ir.Constant(mask, list(range(half))))
        high = builder.shuffle_vector(vector, vector, ir.Constant(mask, list(range(half, 2 * half))))
        vector = builder.fadd(low, high, flags=_EXACT)
    return builder.extract_element(vector, ir.Constant(_I32, 0))


def _row_sums(builder, code_ptr, alpha_ptr, k, chunks_per_block, blocks, x_pointers) -> list:
    """The int4 weight row times each input row at precision low:
        sum_b scale_b * sum_{c in b} xscale_c * dot_c  +  sum_b (k * scale_b + min_b) * xsum_b
    where chunk c is 32 code bytes (64 nibbles, high first) and 64 int16 x values laid out as
    [even elements (32) | odd elements (32)], dot_c their integer dot product. The nibbles are
    unpacked once for all the input rows. Each row keeps dot_c's DOT_LANES int32 lanes as they come
    from the dot instructions: a chunk costs the row one int-to-float conversion and one multiply-add
    of vectors, with no reduction; one reduction in a fixed order ends the row. Every step of a row
    is the same whatever the number of rows, so its float result is too."""
    rows = [_XRow(builder, pointers) for pointers in x_pointers]
    pair_type = ir.VectorType(_F32, 2)
    with cgutils.for_range(builder, blocks) as block_loop:
        b = block_loop.index
        block_alpha = _element_pointer(builder, alpha_ptr, b, 8)
        pair = builder.load(builder.bitcast(block_alpha, pair_type.as_pointer()), align=4)
        scale = builder.extract_element(pair, ir.Constant(_I32, 1))
        _prefetch_line_ahead(builder, block_alpha, b, 8, PREFETCH_BYTES // 4)   # alpha: 8 bytes per 32 code bytes
        for row in rows:
            xsum = builder.load(builder.bitcast(_element_pointer(builder, row.xsum, b, 4), _F32.as_pointer()))
            builder.store(_vector_fma(builder, pair, _splat(builder, xsum, pair_type), builder.load(row.pair)),
                          row.pair)
        with cgutils.for_range(builder, chunks_per_block) as chunk_loop:
            c = builder.add(builder.mul(b, chunks_per_block), chunk_loop.index)
            chunk_ptr = _element_pointer(builder, code_ptr, c, CHUNK_CODE_BYTES)
            _prefetch_line_ahead(builder, chunk_ptr, c, CHUNK_CODE_BYTES, PREFETCH_BYTES)
            words = _nibble_words(builder, chunk_ptr)
            for row in rows:
                dot = _dot_words(builder, words, _element_pointer(builder, row.xq, c, CHUNK_X_BYTES))
                xscale = builder.load(builder.bitcast(_element_pointer(builder, row.xscale, c, 4), _F32.as_pointer()))
                factor = _splat(builder, builder.fmul(scale, xscale, flags=_EXACT), _DOT_FLOATS)
                builder.store(_vector_fma(builder, builder.sitofp(dot, _DOT_FLOATS), factor, builder.load(row.dots)),
                              row.dots)
    sums = []
    for row in rows:
        pair = builder.load(row.pair)
        low = builder.fadd(builder.extract_element(pair, ir.Constant(_I32, 0)),
                           builder.fmul(k, builder.extract_element(pair, ir.Constant(_I32, 1)), flags=_EXACT),
                           flags=_EXACT)
        sums.append(builder.fadd(_lanes_sum(builder, builder.load(row.dots)), low, flags=_EXACT))
    return sums


def _data_pointer(context, builder, array_type, array, row=None):
    """Byte pointer to `array`'s first element, or to the first element of its row `row` (2-D)."""
    ary = context.make_array(array_type)(context, builder, array)
    base = builder.bitcast(ary.data, _BYTE_PTR)
    if row is None:
        return base
    stride = cgutils.unpack_tuple(builder, ary.strides, array_type.ndim)[0]
    return builder.gep(base, [builder.mul(row, stride)])


def _row_arguments(context, builder, signature, args):
    """(code pointer, alpha pointer, k, chunks per block, blocks) from (codes, code_offset (bytes),
    alpha, alpha_offset (floats), k, chunks_per_block, blocks, ...)."""
    code_ptr = builder.gep(_data_pointer(context, builder, signature.args[0], args[0]), [args[1]])
    alpha_base = _data_pointer(context, builder, signature.args[2], args[2])
    alpha_ptr = builder.gep(alpha_base, [builder.mul(args[3], ir.Constant(_I64, 4))])
    k = context.cast(builder, args[4], signature.args[4], types.float32)
    return code_ptr, alpha_ptr, k, args[5], args[6]


@intrinsic
def row_u4_s16(typingctx, codes, code_offset, alpha, alpha_offset, k, chunks_per_block, blocks, xq, xscale, xsum):
    """One int4 weight row times one input row at precision low (float32): see _row_sums. codes
    uint8 with the row at byte code_offset; alpha float32 [oc, blocks, 2] (min, scale) with the row
    at float alpha_offset; xq int16 [ic] in _row_sums's chunk layout, xscale [ic/64], xsum [blocks]."""
    if not all(isinstance(a, types.Array) for a in (codes, alpha, xq, xscale, xsum)):
        return None

    def codegen(context, builder, signature, args):
        head = _row_arguments(context, builder, signature, args)
        x = [tuple(_data_pointer(context, builder, t, a) for t, a in zip(signature.args[7:], args[7:]))]
        return _row_sums(builder, *head, x)[0]

    return types.float32(codes, types.intp, alpha, types.intp, types.float32, types.intp, types.intp,
                         xq, xscale, xsum), codegen


def _rows_intrinsic(count: int):
    """row_u4_s16 for rows first..first+count-1 of the 2-D xqs, xscales and xsums (a tuple of
    `count`): the weight row's nibbles are unpacked once for all of them."""

    def rows_u4_s16(typingctx, codes, code_offset, alpha, alpha_offset, k, chunks_per_block, blocks, xqs, xscales,
                    xsums, first):
        if not all(isinstance(a, types.Array) for a in (codes, alpha, xqs, xscales, xsums)):
            return None

        def codegen(context, builder, signature, args):
            head = _row_arguments(context, builder, signature, args)
            x = []
            for r in range(count):
                row = builder.add(args[10], ir.Constant(_I64, r))
                x.append(tuple(_data_pointer(context, builder, t, a, row)
                               for t, a in zip(signature.args[7:10], args[7:10])))
            return context.make_tuple(builder, signature.return_type, _row_sums(builder, *head, x))

        return types.UniTuple(types.float32, count)(codes, types.intp, alpha, types.intp, types.float32, types.intp,
                                                    types.intp, xqs, xscales, xsums, types.intp), codegen

    rows_u4_s16.__name__ = rows_u4_s16.__qualname__ = f"row{count}_u4_s16"
    return intrinsic(rows_u4_s16)


row2_u4_s16, row3_u4_s16, row4_u4_s16 = (_rows_intrinsic(count) for count in (2, 3, 4))
