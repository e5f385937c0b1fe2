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


@intrinsic
def rint(typingctx, value):
    """value rounded to the nearest integer, ties to even: np.rint's result through llvm.rint,
    which a loop vectorizes (numba's np.rint calls libm once per element, 1 ns each)."""
    if not isinstance(value, types.Float):
        return None

    def codegen(context, builder, signature, args):
        float_type = args[0].type
        name = "llvm.rint.f32" if signature.args[0] == types.float32 else "llvm.rint.f64"
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(float_type, [float_type]), name)
        return builder.call(function, args)

    return value(value), codegen


_V32I8 = ir.VectorType(ir.IntType(8), 32)
_V32I16 = ir.VectorType(ir.IntType(16), 32)
_V32I32 = ir.VectorType(_I32, 32)
_V8I32 = ir.VectorType(_I32, 8)
_V16I32 = ir.VectorType(_I32, 16)
_F32 = ir.FloatType()
_I64 = ir.IntType(64)
_V16F32 = ir.VectorType(_F32, 16)
_V16F16 = ir.VectorType(ir.HalfType(), 16)

LANES = 16                  # output rows of a lane group: one int32 / float lane each
QUANT_CHUNK = 64            # inputs per int16 step of x, and per group chunk of codes
STEP_BYTES = 32             # codes of one dot step: 16 lanes x 2 bytes (4 inputs a lane)
GROUP_CHUNK_BYTES = 512     # a group's codes for one chunk: 16 steps
GROUP_BLOCK_BYTES = 4 * LANES   # a group's alpha for one block: 16 mins, then 16 scales, float16
PREFETCH_BYTES = 2048       # how far ahead of the chunk being read the codes are prefetched
ALPHA_PREFETCH_BYTES = 256  # ... and the group's alpha (an eighth of the codes' bytes)
CACHE_LINE = 64


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


def _load(builder, base, offset, vector_type, align: int = 1):
    address = builder.gep(base, [offset if isinstance(offset, ir.Value) else ir.Constant(_I64, offset)])
    return builder.load(builder.bitcast(address, vector_type.as_pointer()), align=align)


def _splat(builder, value, vector_type):
    single = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(single, single, ir.Constant(ir.VectorType(_I32, vector_type.count),
                                                              [0] * vector_type.count))


def _vector_fma(builder, a, b, c):
    fma_type = ir.FunctionType(a.type, [a.type] * 3)
    name = f"llvm.fma.v{a.type.count}f32"
    return builder.call(cgutils.get_or_insert_function(builder.module, fma_type, name), [a, b, c])


def _halves(builder, vector):
    """The low and high 8 lanes of a 16-lane vector."""
    mask = ir.VectorType(_I32, 8)
    return [builder.shuffle_vector(vector, vector, ir.Constant(mask, list(range(8 * h, 8 * h + 8)))) for h in (0, 1)]


def _lane_dot(builder, acc, words, pair):
    """acc (16 x int32) plus, in each lane l, words[2l] * x0 + words[2l+1] * x1: `words` the 32 int16
    codes (as 16 x i32), `pair` the two int16 inputs (x0, x1) as one i32."""
    pairs = _splat(builder, pair, _V16I32)
    if VNNI_WIDTH == 512:
        dot_type = ir.FunctionType(_V16I32, [_V16I32] * 3)
        dot = cgutils.get_or_insert_function(builder.module, dot_type, "llvm.x86.avx512.vpdpwssd.512")
        return builder.call(dot, [acc, words, pairs])
    if VNNI_WIDTH == 256:
        dot_type = ir.FunctionType(_V8I32, [_V8I32] * 3)
        dot = cgutils.get_or_insert_function(builder.module, dot_type, "llvm.x86.avx512.vpdpwssd.256")
        low, high = (builder.call(dot, [a, w, p]) for a, w, p in zip(
            _halves(builder, acc), _halves(builder, words), _halves(builder, pairs)))
        return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    product = builder.mul(builder.sext(builder.bitcast(words, _V32I16), _V32I32),
                          builder.sext(builder.bitcast(pairs, _V32I16), _V32I32))
    even, odd = (builder.shuffle_vector(product, product, ir.Constant(ir.VectorType(_I32, 16),
                                                                      list(range(start, 32, 2))))
                 for start in (0, 1))
    return builder.add(acc, builder.add(even, odd))


# numba's fastmath pass gives every float add and multiply that has no flag the "fast" flags, which
# let LLVM reassociate them, and it may do so differently where a kernel handles one row or four.
# A flag of our own ("no signed zeros", which changes no finite result) keeps these exact, so a
# verify row computes the bits its decode step computes.
_EXACT = ("nsz",)


class _XRow:
    """One input row: byte pointers to its int16 values, chunk steps and block sums, and its two
    float accumulators (allocas, which LLVM keeps in registers): `dots`, the scaled chunk dots,
    and `low`, the block sums times (k * scale + min)."""

    def __init__(self, builder, pointers):
        self.xq, self.xscale, self.xsum = pointers
        self.dots = cgutils.alloca_once_value(builder, ir.Constant(_V16F32, [0.0] * LANES))
        self.low = cgutils.alloca_once_value(builder, ir.Constant(_V16F32, [0.0] * LANES))


def _prefetch_lines(builder, base, first: int, count: int) -> None:
    for line in range(count):
        _prefetch_address(builder, builder.gep(base, [ir.Constant(_I64, first + line * CACHE_LINE)]))


DOT_CHAINS = 8   # independent int32 accumulators over all the rows: a dot's latency is ~4 issues


def _chunk_dots(builder, chunk_ptr, chunk, rows) -> list:
    """Each row's 16 int32 lane sums over one chunk: the group's 512 code bytes at chunk_ptr,
    step s holding in bytes 2l, 2l+1 of its 32 the codes of lane l's inputs 4s, 4s+1 (low
    nibbles) and 4s+2, 4s+3 (high nibbles), so one load serves two dot steps of every row. A row's
    dots go round-robin into several accumulators, added at the end: integer sums, so the result
    is the same whatever the number of rows, and the dot instructions need not wait for each other."""
    ways = max(2, DOT_CHAINS // len(rows))
    sums = [[ir.Constant(_V16I32, [0] * LANES)] * ways for _ in rows]
    x_chunk = builder.mul(chunk, ir.Constant(_I64, 2 * QUANT_CHUNK))
    for step in range(GROUP_CHUNK_BYTES // STEP_BYTES):
        codes = builder.zext(_load(builder, chunk_ptr, STEP_BYTES * step, _V32I8), _V32I16)
        low = builder.bitcast(builder.and_(codes, ir.Constant(_V32I16, [15] * 32)), _V16I32)
        high = builder.bitcast(builder.lshr(codes, ir.Constant(_V32I16, [4] * 32)), _V16I32)
        for r, row in enumerate(rows):
            for half, words in enumerate((low, high)):
                way = (2 * step + half) % ways
                x_pair = _load(builder, row.xq, builder.add(x_chunk, ir.Constant(_I64, 8 * step + 4 * half)), _I32)
                sums[r][way] = _lane_dot(builder, sums[r][way], words, x_pair)
    totals = []
    for partial in sums:
        while len(partial) > 1:
            partial = [builder.add(a, b) for a, b in zip(partial[::2], partial[1::2])] + partial[len(partial) // 2 * 2:]
        totals.append(partial[0])
    return totals


def _scalar(builder, base, index):
    return _load(builder, base, builder.mul(index, ir.Constant(_I64, 4)), _F32, align=4)


def _group_sums(builder, code_ptr, alpha_ptr, k, chunks_per_block, blocks, x_pointers) -> list:
    """A lane group of an int4 matrix times each input row at precision low, 16 output rows at once:
        out[l] = sum_c scale_b(c)[l] * xscale_c * dot_c[l]  +  sum_b (k * scale_b[l] + min_b[l]) * xsum_b
    where chunk c is 64 inputs, x is int16 with one step per chunk, and dot_c[l] lane l's integer
    dot product. The codes are unpacked once for all the rows. Every step of a row is the same
    whatever the number of rows, so its float result is too."""
    rows = [_XRow(builder, pointers) for pointers in x_pointers]
    with cgutils.for_range(builder, blocks) as block_loop:
        b = block_loop.index
        block_alpha = builder.gep(alpha_ptr, [builder.mul(b, ir.Constant(_I64, GROUP_BLOCK_BYTES))])
        _prefetch_lines(builder, block_alpha, ALPHA_PREFETCH_BYTES, 1)
        mins = builder.fpext(_load(builder, block_alpha, 0, _V16F16, align=2), _V16F32)
        scales = builder.fpext(_load(builder, block_alpha, 2 * LANES, _V16F16, align=2), _V16F32)
        low = _vector_fma(builder, _splat(builder, k, _V16F32), scales, mins)
        for row in rows:
            xsum = _splat(builder, _scalar(builder, row.xsum, b), _V16F32)
            builder.store(_vector_fma(builder, low, xsum, builder.load(row.low)), row.low)
        with cgutils.for_range(builder, chunks_per_block) as chunk_loop:
            c = builder.add(builder.mul(b, chunks_per_block), chunk_loop.index)
            chunk_ptr = builder.gep(code_ptr, [builder.mul(c, ir.Constant(_I64, GROUP_CHUNK_BYTES))])
            _prefetch_lines(builder, chunk_ptr, PREFETCH_BYTES, GROUP_CHUNK_BYTES // CACHE_LINE)
            for row, dot in zip(rows, _chunk_dots(builder, chunk_ptr, c, rows)):
                factor = builder.fmul(scales, _splat(builder, _scalar(builder, row.xscale, c), _V16F32),
                                      flags=_EXACT)
                builder.store(_vector_fma(builder, builder.sitofp(dot, _V16F32), factor, builder.load(row.dots)),
                              row.dots)
    return [builder.fadd(builder.load(row.dots), builder.load(row.low), flags=_EXACT) for row in rows]


def _data_pointer(context, builder, array_type, array, row=None):
    """Byte pointer to `array`'s first element, or to the first element of its row `row`."""
    ary = context.make_array(array_type)(context, builder, array)
    base = builder.bitcast(ary.data, _BYTE_PTR)
    if row is None:
        return base
    stride = cgutils.unpack_tuple(builder, ary.strides, array_type.ndim)[0]
    return builder.gep(base, [builder.mul(row, stride)])


def _store_lanes(builder, values, row_ptr, column, valid) -> None:
    """values' first `valid` lanes into the float32 row at row_ptr, from element `column` on."""
    target = builder.gep(row_ptr, [builder.mul(column, ir.Constant(_I64, 4))])
    full = builder.icmp_signed("==", valid, ir.Constant(_I64, LANES))
    with builder.if_else(full, likely=True) as (whole, part):
        with whole:
            builder.store(values, builder.bitcast(target, _V16F32.as_pointer()), align=4)
        with part:
            pointer = builder.bitcast(target, _F32.as_pointer())
            with cgutils.for_range(builder, valid) as lane:
                builder.store(builder.extract_element(values, lane.index), builder.gep(pointer, [lane.index]))


def _group_intrinsic(count: int):
    """group{count}_u4_s16(codes, alpha, group, k, chunks_per_block, xq, xscale, xsum, first, out,
    column, valid): rows first..first+count-1 of x (xq int16 [rows, ic], xscale [rows, chunks],
    xsum [rows, blocks]) times lane group `group` of the matrix (codes uint8 [groups, chunks, 512],
    alpha float16 bits [groups, blocks, 32]), its `valid` outputs stored at out[row, column:]."""

    def group_u4_s16(typingctx, codes, alpha, group, k, chunks_per_block, xq, xscale, xsum, first, out, column,
                     valid):
        if not all(isinstance(a, types.Array) for a in (codes, alpha, xq, xscale, xsum, out)):
            return None

        def codegen(context, builder, signature, args):
            code_ptr = _data_pointer(context, builder, signature.args[0], args[0], args[2])
            alpha_ptr = _data_pointer(context, builder, signature.args[1], args[1], args[2])
            k_value = context.cast(builder, args[3], signature.args[3], types.float32)
            x_pointers, out_rows = [], []
            for r in range(count):
                row = builder.add(args[8], ir.Constant(_I64, r))
                x_pointers.append(tuple(_data_pointer(context, builder, t, a, row)
                                        for t, a in zip(signature.args[5:8], args[5:8])))
                out_rows.append(_data_pointer(context, builder, signature.args[9], args[9], row))
            xsum_shape = cgutils.unpack_tuple(builder, context.make_array(signature.args[7])(
                context, builder, args[7]).shape, 2)
            sums = _group_sums(builder, code_ptr, alpha_ptr, k_value, args[4], xsum_shape[1], x_pointers)
            for values, out_row in zip(sums, out_rows):
                _store_lanes(builder, values, out_row, args[10], args[11])
            return context.get_dummy_value()

        return types.void(codes, alpha, types.intp, types.float32, types.intp, xq, xscale, xsum, types.intp, out,
                          types.intp, types.intp), codegen

    group_u4_s16.__name__ = group_u4_s16.__qualname__ = f"group{count}_u4_s16"
    return intrinsic(group_u4_s16)


GROUP_ROWS = 4   # rows of x that share one unpacking of a group's codes (group4_u4_s16)
group1_u4_s16, group2_u4_s16, group3_u4_s16, group4_u4_s16 = (_group_intrinsic(count) for count in range(1, 5))
