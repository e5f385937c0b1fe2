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
_V16I16 = ir.VectorType(ir.IntType(16), 16)
_V64I8 = ir.VectorType(ir.IntType(8), 64)
_V64I32 = ir.VectorType(_I32, 64)
_V16F16 = ir.VectorType(ir.HalfType(), 16)
_ZEROS16 = ir.Constant(_V16F32, [0.0] * 16)

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


def _vnni_dot(builder, instruction: str, acc, a, b):
    """acc (16 x int32) plus VNNI's `instruction` (vpdpwssd, vpdpbusd) of a and b: one 512-bit
    instruction, or two 256-bit ones on their halves; None where the CPU has neither."""
    if VNNI_WIDTH == 512:
        dot_type = ir.FunctionType(_V16I32, [_V16I32] * 3)
        dot = cgutils.get_or_insert_function(builder.module, dot_type, f"llvm.x86.avx512.{instruction}.512")
        return builder.call(dot, [acc, a, b])
    if VNNI_WIDTH == 256:
        dot_type = ir.FunctionType(_V8I32, [_V8I32] * 3)
        dot = cgutils.get_or_insert_function(builder.module, dot_type, f"llvm.x86.avx512.{instruction}.256")
        low, high = (builder.call(dot, [c, x, y]) for c, x, y in zip(
            _halves(builder, acc), _halves(builder, a), _halves(builder, b)))
        return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    return None


def _lane_dot(builder, acc, words, pair):
    """acc (16 x int32) plus, in each lane l, words[2l] * x0 + words[2l+1] * x1: `words` the 32 int16
    codes (as 16 x i32), `pair` the two int16 inputs (x0, x1) as one i32."""
    pairs = _splat(builder, pair, _V16I32)
    vnni = _vnni_dot(builder, "vpdpwssd", acc, words, pairs)
    if vnni is not None:
        return vnni
    product = builder.mul(builder.sext(builder.bitcast(words, _V32I16), _V32I32),
                          builder.sext(builder.bitcast(pairs, _V32I16), _V32I32))
    even, odd = (builder.shuffle_vector(product, product, ir.Constant(ir.VectorType(_I32, 16),
                                                                      list(range(start, 32, 2))))
                 for start in (0, 1))
    return builder.add(acc, builder.add(even, odd))


def _lane_dot_bytes(builder, acc, codes, quad):
    """acc (16 x int32) plus, in each lane l, the dot of its 4 unsigned code bytes with the 4 signed
    int8 inputs of `quad` (one i32): VNNI's unsigned-by-signed byte dot (vpdpbusd)."""
    quads = _splat(builder, quad, _V16I32)
    vnni = _vnni_dot(builder, "vpdpbusd", acc, codes, quads)
    if vnni is not None:
        return vnni
    product = builder.mul(builder.zext(builder.bitcast(codes, _V64I8), _V64I32),
                          builder.sext(builder.bitcast(quads, _V64I8), _V64I32))
    parts = [builder.shuffle_vector(product, product, ir.Constant(_V16I32, list(range(start, 64, 4))))
             for start in range(4)]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))


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
        self.dots = cgutils.alloca_once_value(builder, _ZEROS16)
        self.low = cgutils.alloca_once_value(builder, _ZEROS16)


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
    return [_added(builder, partial) for partial in sums]


_LOW_NIBBLES = ir.Constant(_V16I32, [0x0F0F] * LANES)
_HIGH_NIBBLES = ir.Constant(_V16I32, [0x0F0F0000] * LANES)


def _chunk_dots_bytes(builder, chunk_ptr, chunk, rows) -> list:
    """_chunk_dots for int8 x: a step's two code bytes of lane l (b0 = codes of inputs 4s and 4s+2,
    b1 = of 4s+1 and 4s+3, low nibble first) become the lane's 4 code bytes in input order,
    (b0 & 15, b1 & 15, b0 >> 4, b1 >> 4), with two masks and a shift of the zero-extended word;
    one byte dot then takes all four inputs of the step, half the int16 path's dot instructions."""
    ways = max(2, DOT_CHAINS // len(rows))
    sums = [[ir.Constant(_V16I32, [0] * LANES)] * ways for _ in rows]
    x_chunk = builder.mul(chunk, ir.Constant(_I64, QUANT_CHUNK))
    for step in range(GROUP_CHUNK_BYTES // STEP_BYTES):
        words = builder.zext(_load(builder, chunk_ptr, STEP_BYTES * step, _V16I16), _V16I32)
        codes = builder.or_(builder.and_(words, _LOW_NIBBLES),
                            builder.and_(builder.shl(words, ir.Constant(_V16I32, [12] * LANES)), _HIGH_NIBBLES))
        for r, row in enumerate(rows):
            quad = _load(builder, row.xq, builder.add(x_chunk, ir.Constant(_I64, 4 * step)), _I32)
            sums[r][step % ways] = _lane_dot_bytes(builder, sums[r][step % ways], codes, quad)
    return [_added(builder, partial) for partial in sums]


def _added(builder, vectors: list):
    """The integer vectors added pairwise."""
    while len(vectors) > 1:
        vectors = [builder.add(a, b) for a, b in zip(vectors[::2], vectors[1::2])] + vectors[len(vectors) // 2 * 2:]
    return vectors[0]


def _scalar(builder, base, index):
    return _load(builder, base, builder.mul(index, ir.Constant(_I64, 4)), _F32, align=4)


def _group_sums(builder, code_ptr, alpha_ptr, k, chunks_per_block, blocks, x_pointers, chunk_dots) -> list:
    """A lane group of an int4 matrix times each input row at precision low, 16 output rows at once:
        out[l] = sum_c scale_b(c)[l] * xscale_c * dot_c[l]  +  sum_b (k * scale_b[l] + min_b[l]) * xsum_b
    where chunk c is 64 inputs, x is int16 (or int8) with one step per chunk, and dot_c[l] lane l's integer
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
            for row, dot in zip(rows, chunk_dots(builder, chunk_ptr, c, rows)):
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
    """group{count}_u4(codes, alpha, group, k, chunks_per_block, xq, xscale, xsum, first, out,
    column, valid): rows first..first+count-1 of x (xq int16 or int8 [rows, ic], xscale [rows, chunks],
    xsum [rows, blocks]) times lane group `group` of the matrix (codes uint8 [groups, chunks, 512],
    alpha float16 bits [groups, blocks, 32]), its `valid` outputs stored at out[row, column:]."""

    def group_u4(typingctx, codes, alpha, group, k, chunks_per_block, xq, xscale, xsum, first, out, column,
                     valid):
        if not all(isinstance(a, types.Array) for a in (codes, alpha, xq, xscale, xsum, out)):
            return None
        if xq.dtype not in (types.int16, types.int8):
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
            chunk_dots = _chunk_dots_bytes if signature.args[5].dtype == types.int8 else _chunk_dots
            sums = _group_sums(builder, code_ptr, alpha_ptr, k_value, args[4], xsum_shape[1], x_pointers, chunk_dots)
            for values, out_row in zip(sums, out_rows):
                _store_lanes(builder, values, out_row, args[10], args[11])
            return context.get_dummy_value()

        return types.void(codes, alpha, types.intp, types.float32, types.intp, xq, xscale, xsum, types.intp, out,
                          types.intp, types.intp), codegen

    group_u4.__name__ = group_u4.__qualname__ = f"group{count}_u4"
    return intrinsic(group_u4)


GROUP_ROWS = 4   # rows of x that share one unpacking of a group's codes (group4_u4)
group1_u4, group2_u4, group3_u4, group4_u4 = (_group_intrinsic(count) for count in range(1, 5))


# ---- float32 rows for attention: a query's dot with each key, the weighted sum of value rows ------

ROW_CHUNK = _V16F32.count   # floats per vector: a head's width must be a multiple of it


def _halving(builder, vector, combine):
    """A vector's lanes folded into one: its low and high halves combined lane by lane, then the
    halves of that, in a fixed order (the same bits every call)."""
    while vector.type.count > 1:
        half = vector.type.count // 2
        mask = ir.VectorType(_I32, half)
        low = builder.shuffle_vector(vector, vector, ir.Constant(mask, list(range(half))))
        high = builder.shuffle_vector(vector, vector, ir.Constant(mask, list(range(half, 2 * half))))
        vector = combine(builder, low, high)
    return builder.extract_element(vector, ir.Constant(_I32, 0))


def _lane_sum(builder, vector):
    return _halving(builder, vector, lambda b, low, high: b.fadd(low, high, flags=_EXACT))


def _float_rows(arrays) -> bool:
    return all(isinstance(a, types.Array) and a.dtype == types.float32 for a in arrays)


KEY_BLOCK = ROW_CHUNK   # keys scored together: their lane sums come out as one vector


def _row(builder, base, stride, index):
    return builder.gep(base, [builder.mul(index, stride)])


def _blocks_and_rest(builder, first, stop, size: int):
    count = builder.sub(stop, first)
    blocks = builder.udiv(count, ir.Constant(_I64, size))
    return blocks, builder.add(first, builder.mul(blocks, ir.Constant(_I64, size)))


def _interleave_sums(builder, vectors):
    """The lane sums of 16 vectors, lane j of the result vector j's: pairs of vectors are merged
    halving each one's lanes (the halves added lane by lane), four times. Each vector's lanes are
    added in _lane_sum's order, so a key scored in a block gets the bits it gets alone."""
    width = ROW_CHUNK
    while len(vectors) > 1:
        half = width // 2
        # in each vector, runs of `width` lanes belong to one key: add their halves, two vectors at a time
        low = [i for start in range(0, 2 * ROW_CHUNK, width) for i in range(start, start + half)]
        high = [i + half for i in low]
        mask = ir.VectorType(_I32, ROW_CHUNK)
        vectors = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(mask, low)),
                                builder.shuffle_vector(a, b, ir.Constant(mask, high)), flags=_EXACT)
                   for a, b in zip(vectors[::2], vectors[1::2])]
        width = half
    return vectors[0]


def _array_parts(context, builder, array_type, array):
    """(byte pointer to the data, the first dimension's stride in bytes, the last dimension's size)."""
    ary = context.make_array(array_type)(context, builder, array)
    strides = cgutils.unpack_tuple(builder, ary.strides, array_type.ndim)
    shape = cgutils.unpack_tuple(builder, ary.shape, array_type.ndim)
    return builder.bitcast(ary.data, _BYTE_PTR), strides[0], shape[-1]


def _zero_vectors(builder, count):
    return [cgutils.alloca_once_value(builder, _ZEROS16) for _ in range(count)]


def _vector_max(builder, a, b):
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


@intrinsic
def key_scores(typingctx, query, keys, first, stop, scale, out):
    """out[t] = (query . keys[t]) * scale for first <= t < stop; returns their maximum. float32,
    query [width], keys [rows, width], width a multiple of ROW_CHUNK. Each key's products go into
    a vector accumulator, KEY_BLOCK keys at a time sharing each load of the query; the block's lane
    sums then come out as one vector (_interleave_sums), cheaper than a sum per key. The keys past
    the last whole block are summed one by one in the same order, so a key's score does not depend
    on where `first` falls (a verify row computes its decode step's bits)."""
    if not _float_rows((query, keys, out)) or not all(isinstance(a, types.Integer) for a in (first, stop)):
        return None

    def codegen(context, builder, signature, args):
        query_ptr, _, width = _array_parts(context, builder, signature.args[0], args[0])
        key_ptr, key_stride, _ = _array_parts(context, builder, signature.args[1], args[1])
        out_ptr = _data_pointer(context, builder, signature.args[5], args[5])
        first_key, stop_key = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (2, 3))
        scale_value = context.cast(builder, args[4], signature.args[4], types.float32)
        chunks = builder.udiv(width, ir.Constant(_I64, ROW_CHUNK))
        best = cgutils.alloca_once_value(builder, ir.Constant(_V16F32, [float("-inf")] * ROW_CHUNK))
        accs = _zero_vectors(builder, KEY_BLOCK)

        def products(t, count):
            """accs[:count] = the products of keys t.. with the query, lane by lane."""
            rows = [_row(builder, key_ptr, key_stride, builder.add(t, ir.Constant(_I64, j))) for j in range(count)]
            for acc in accs[:count]:
                builder.store(_ZEROS16, acc)
            with cgutils.for_range(builder, chunks) as chunk_loop:
                offset = builder.mul(chunk_loop.index, ir.Constant(_I64, 4 * ROW_CHUNK))
                q = _load(builder, query_ptr, offset, _V16F32, align=4)
                for row, acc in zip(rows, accs):
                    builder.store(_vector_fma(builder, q, _load(builder, row, offset, _V16F32, align=4),
                                              builder.load(acc)), acc)

        def out_at(t):
            return builder.gep(out_ptr, [builder.mul(t, ir.Constant(_I64, 4))])

        blocks, rest = _blocks_and_rest(builder, first_key, stop_key, KEY_BLOCK)
        with cgutils.for_range(builder, blocks) as block_loop:
            t = builder.add(first_key, builder.mul(block_loop.index, ir.Constant(_I64, KEY_BLOCK)))
            products(t, KEY_BLOCK)
            sums = _interleave_sums(builder, [builder.load(acc) for acc in accs])
            scores = builder.fmul(sums, _splat(builder, scale_value, _V16F32), flags=_EXACT)
            builder.store(scores, builder.bitcast(out_at(t), _V16F32.as_pointer()), align=4)
            builder.store(_vector_max(builder, scores, builder.load(best)), best)
        single = cgutils.alloca_once_value(builder, ir.Constant(_F32, float("-inf")))
        with cgutils.for_range(builder, builder.sub(stop_key, rest)) as tail_loop:
            t = builder.add(rest, tail_loop.index)
            products(t, 1)
            score = builder.fmul(_lane_sum(builder, builder.load(accs[0])), scale_value, flags=_EXACT)
            builder.store(score, builder.bitcast(out_at(t), _F32.as_pointer()))
            builder.store(_vector_max(builder, score, builder.load(single)), single)
        return _vector_max(builder, _halving(builder, builder.load(best), _vector_max), builder.load(single))

    return types.float32(query, keys, first, stop, scale, out), codegen


VALUE_GROUP = 4   # chunks of a value row summed together: 64 floats, one row read at a time


@intrinsic
def weighted_rows(typingctx, weights, values, first, stop, out):
    """out[:] = sum over first <= t < stop of weights[t] * values[t]: float32, values [rows, width]
    and out [width], width a multiple of ROW_CHUNK. VALUE_GROUP chunks of the width at a time, each
    row's chunks go into their own vector accumulators, the rows alternating between two sets
    (row t into set (t - first) mod 2, so the sums do not depend on the other rows); the chunks
    left over past whole groups go one at a time."""
    if not _float_rows((weights, values, out)) or not all(isinstance(a, types.Integer) for a in (first, stop)):
        return None

    def codegen(context, builder, signature, args):
        weight_ptr = _data_pointer(context, builder, signature.args[0], args[0])
        values_ptr, row_stride, _ = _array_parts(context, builder, signature.args[1], args[1])
        out_ptr, _, width = _array_parts(context, builder, signature.args[4], args[4])
        first_row, stop_row = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (2, 3))
        pairs, odd_row = _blocks_and_rest(builder, first_row, stop_row, 2)
        chunks = builder.udiv(width, ir.Constant(_I64, ROW_CHUNK))
        groups = builder.udiv(chunks, ir.Constant(_I64, VALUE_GROUP))

        def sum_rows(first_chunk, count):
            sets = [_zero_vectors(builder, count), _zero_vectors(builder, count)]
            offsets = [builder.mul(builder.add(first_chunk, ir.Constant(_I64, j)), ir.Constant(_I64, 4 * ROW_CHUNK))
                       for j in range(count)]

            def add_row(t, accs):
                weight = _splat(builder, _scalar(builder, weight_ptr, t), _V16F32)
                row = _row(builder, values_ptr, row_stride, t)
                for acc, offset in zip(accs, offsets):
                    value = _load(builder, row, offset, _V16F32, align=4)
                    builder.store(_vector_fma(builder, weight, value, builder.load(acc)), acc)

            with cgutils.for_range(builder, pairs) as pair_loop:
                t = builder.add(first_row, builder.mul(pair_loop.index, ir.Constant(_I64, 2)))
                add_row(t, sets[0])
                add_row(builder.add(t, ir.Constant(_I64, 1)), sets[1])
            with cgutils.for_range(builder, builder.sub(stop_row, odd_row)) as last:
                add_row(builder.add(odd_row, last.index), sets[0])
            for even, odd, offset in zip(*sets, offsets):
                total = builder.fadd(builder.load(even), builder.load(odd), flags=_EXACT)
                builder.store(total, builder.bitcast(builder.gep(out_ptr, [offset]), _V16F32.as_pointer()), align=4)

        with cgutils.for_range(builder, groups) as group_loop:
            sum_rows(builder.mul(group_loop.index, ir.Constant(_I64, VALUE_GROUP)), VALUE_GROUP)
        done = builder.mul(groups, ir.Constant(_I64, VALUE_GROUP))
        with cgutils.for_range(builder, builder.sub(chunks, done)) as chunk_loop:
            sum_rows(builder.add(done, chunk_loop.index), 1)
        return context.get_dummy_value()

    return types.void(weights, values, first, stop, out), codegen
