"""1x1 Convolution as a linear layer over quantized weights kept packed in memory.

The packed form (`PackedLinear`) is the weight file's own bytes wherever it can be: the int4/int8
codes are views of the memory-mapped file, and so is alpha when the file stores it as fp32
(min, scale) pairs, which the exporter does. Otherwise alpha is rebuilt as (zero, scale) pairs
from the decoded scales and zeros (small models, symmetric or fp16-alpha exports).

* precision low, int4 (block a multiple of 64): the codes and alpha are repacked at load into
  lane groups of 16 output rows (kernels/lane_kernels.py) and every row count, decode, a verify block or
  a prefill chunk, runs lane_kernels.lanes_group / lanes_gated on int16 activations (int8 with
  int8_activations). The file's
  pages of the repacked arrays are released, so the weights are in memory once. A LayerNorm right
  before such a layer runs in its kernel (ops/norm.py: fold_norms).
* Otherwise, decode (one row): linear_kernels.gemv_group runs every member of a fused LinearGroup
  (q/k/v) in one parallel launch; GatedLinear fuses gate, up and MUL_SILU.
* A few rows (a short prompt chunk): the same GEMVs, every row of x passing over each span of
  weight rows while it is in cache (gemv_rows_group / gemv_rows_gated).
* Prefill (PREFILL_ROWS rows or more): tiles of output rows are dequantized into a per-thread
  float32 buffer and multiplied with numpy's BLAS (one BLAS thread per worker), so no float copy
  of a whole weight ever exists.
"""

from __future__ import annotations

import dataclasses
import mmap
from dataclasses import dataclass

import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.kernels import lane_kernels
from mnngpu.backends.cpu.kernels import linear_kernels as kernels
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.linear import GATED_LINEAR, LINEAR_GROUP, im2col, is_pointwise, is_windowed

TILE_BYTES = 1 << 21    # float32 bytes of one dequantized weight tile
MIN_TILE_ROWS = 224     # measured: a 512 x 4864 x 224 GEMM runs 40% faster than one 107 rows wide
PREFILL_ROWS = 9        # from this many input rows on, dequantize + BLAS beats GEMVs sharing each weight span
LANE_ROW_BLOCK = 128    # rows of x per lane kernel call: bounds the int16 x and a gated layer's gate and up
# Weights below this run their GEMV on the calling thread: a launch costs ~2 us on numba's OpenMP
# and TBB layers, ~140 us on its workqueue layer.
PARALLEL_BYTES = {True: 1 << 16, False: 1 << 20}   # by backend.cheap_launches
EMPTY = np.zeros(0, dtype=np.float32)


@dataclass
class PackedLinear:
    oc: int
    ic: int
    block: int                 # inputs per (row, block) scale
    nibbles: bool              # codes hold two 4-bit values a byte, high nibble first
    codes: np.ndarray | None   # uint8 [oc, ic//2] or [oc, ic]; lanes: [groups, chunks, 512]
    alpha: np.ndarray | None   # float32 [oc, n_blocks, 2]: (min, scale); lanes: [groups, n_blocks, 32]
    k: np.float32              # w = (code + k) * scale + min
    bias: np.ndarray           # float32 [oc], or empty
    dense: np.ndarray | None = None   # float32 [oc, ic] for unquantized weights
    in_place: bool = False     # codes and alpha are both views of the weight file
    lanes: bool = False        # codes and alpha in lane_kernels' lane groups (int4, precision low)


def pack_linear(weight, param=None, lanes: bool = False) -> PackedLinear:
    """The CPU layout of a decoded QuantizedLinear (mnngpu.format.quant); `param` is the op's
    Convolution2D, whose `external` offsets locate alpha in the file. `lanes`: int4 weights whose
    blocks allow it go into lane groups, for the int16 kernels of precision low."""
    packed = _file_layout(weight, param)
    if not (lanes and packed.nibbles and lane_kernels.packable(packed.oc, packed.ic, packed.block, packed.alpha)):
        return packed
    codes, alpha = lane_kernels.pack(packed.codes, packed.alpha, release=_release_file_pages)
    return dataclasses.replace(packed, codes=codes, alpha=alpha, in_place=False, lanes=True)


def _file_layout(weight, param) -> PackedLinear:
    bias = EMPTY if weight.bias is None else np.ascontiguousarray(weight.bias, dtype=np.float32)
    if not weight.is_quantized:
        return PackedLinear(weight.oc, weight.ic, weight.ic, False, None, None, np.float32(0), bias,
                            dense=np.ascontiguousarray(weight.float_weight, dtype=np.float32))
    nibbles = weight.bits == 4 and weight.block_size % 2 == 0 and weight.codes.shape[1] * 2 == weight.ic
    codes = weight.codes if nibbles or weight.bits == 8 else weight.unpacked_codes()
    codes = np.ascontiguousarray(codes)
    raw = _file_alpha(weight, param)
    k = _code_offset(weight, raw) if raw is not None else None
    if k is not None:
        return PackedLinear(weight.oc, weight.ic, weight.block_size, nibbles, codes, raw, k, bias, in_place=True)
    # codes centred as the file's fp32 pairs are (k = -2^(bits-1)): an activation quantized to int16
    # (precision low) then errs against weights around zero, not around half the code range
    k = np.float32(-(1 << (weight.bits - 1)))
    alpha = np.stack([weight.zeros - k * weight.scales, weight.scales], axis=-1).astype(np.float32)
    return PackedLinear(weight.oc, weight.ic, weight.block_size, nibbles, codes, alpha, k, bias)


def _file_alpha(weight, param) -> np.ndarray | None:
    """The file's fp32 (min, scale) pairs [oc, n_blocks, 2] as a view, when the codes come from it."""
    external = getattr(param, "external", None)
    if external is None or len(external) < 3 or external[2] != weight.oc * weight.n_blocks * 8:
        return None
    source = _buffer_under(weight.codes)
    if source is None:
        return None
    try:
        pairs = np.frombuffer(source, dtype="<f4", count=external[2] // 4, offset=external[0] + external[1])
    except (TypeError, ValueError):
        return None
    return pairs.reshape(weight.oc, weight.n_blocks, 2)


def _buffer_under(array: np.ndarray):
    """The buffer (an mmap of the weight file, bytes, ...) an array is a view of, or None."""
    source = array
    while isinstance(source, np.ndarray):
        source = source.base
    return source.obj if isinstance(source, memoryview) else source


def _release_file_pages(view: np.ndarray) -> None:
    """Drop the whole pages under a view of the memory-mapped weight file from this process's
    resident memory once it has been repacked (they are read back from the file if touched)."""
    mapping = _buffer_under(view)
    if not isinstance(mapping, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):   # not on every OS
        return
    start = view.ctypes.data - np.frombuffer(mapping, dtype=np.uint8, count=1).ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (start + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, last - first)


def _code_offset(weight, raw: np.ndarray) -> np.float32 | None:
    """k with scales == raw scale and zeros == raw min + k * scale (the decoder's own arithmetic)."""
    scale, low = raw[..., 1], raw[..., 0]
    if not np.array_equal(scale, weight.scales):
        return None
    nonzero = np.flatnonzero(scale)
    if nonzero.size == 0:
        return None
    first = nonzero[0]
    k = np.float32(np.rint((weight.zeros.reshape(-1)[first] - low.reshape(-1)[first]) / scale.reshape(-1)[first]))
    tolerance = 1e-6 * float(np.abs(scale).max()) * (1 << weight.bits) + 1e-30
    if np.abs(weight.zeros - (low + k * scale)).max() > tolerance:
        return None
    return k


class CPULinear(CPUExecution):
    """One Convolution, or a fused LinearGroup (several outputs) / GatedLinear (gate, up -> one)."""

    gated = False

    @classmethod
    def variant_for(cls, inputs, node):
        if node.type == "Convolution" and is_windowed(node.param.common, inputs[0].shape):
            return CPUConvolution
        return cls

    @classmethod
    def pack(cls, backend, node) -> None:
        """int4 layers that read one row at a time go into lane groups where activations are
        quantized (precision low); with use_mmap the packed arrays move to files under tmp_path."""
        lanes = backend.quantize_activations and is_pointwise(node.param.common)
        packed = pack_linear(node.weights.pop("weight"), node.param, lanes=lanes)
        if backend.weight_files is not None:
            packed = backend._mapped(packed)
        node.weights["packed"] = packed
        backend.lane_layers += packed.lanes

    @property
    def members(self) -> list[PackedLinear]:
        param = self.node.param
        nodes = param.members if hasattr(param, "members") else [self.node]
        return [node.weights["packed"] for node in nodes]

    def plan(self, inputs, outputs):
        self.weights = self.members
        first = self.weights[0]
        self.rows = inputs[0].size // first.ic
        self.fused_gemv = all(w.codes is not None and w.nibbles == first.nibbles and w.block == first.block
                              and w.ic == first.ic and w.lanes == first.lanes for w in self.weights)

    def bind(self):
        first = self.weights[0]
        self.x = self.value(self.inputs[0]).reshape(self.rows, first.ic)
        self.outs = [t.device.reshape(self.rows, -1) for t in self.outputs]
        self.gemv_calls = []
        self.kernel_name = ""
        if not self.fused_gemv or (self.rows >= PREFILL_ROWS and not first.lanes):
            return
        # big matrices are split over the threads; small ones run faster without the hand-off
        weight_bytes = sum(w.codes.nbytes + w.alpha.nbytes for w in self.weights)
        parallel = weight_bytes >= PARALLEL_BYTES[self.backend.cheap_launches] or self.rows >= PREFILL_ROWS
        if first.lanes:
            pair = self.lanes_kernels
            self.gemv_calls = [self._lanes_call(slice(start, min(self.rows, start + LANE_ROW_BLOCK)))
                               for start in range(0, self.rows, LANE_ROW_BLOCK)]
        elif self.rows == 1:
            pair = self.gemv_kernels
            self.gemv_calls = [(*self._matrices(), self._spans(), self.x[0], first.nibbles, first.block,
                                *(buffer[0] for buffer in kernels.row_buffers(1, first.ic, first.block)),
                                *self._outputs_args(0))]
        else:
            pair = self.rows_kernels
            self.gemv_calls = [(*self._matrices(), self._spans(), self.x, first.nibbles, first.block,
                                *kernels.row_buffers(self.rows, first.ic, first.block),
                                *self._outputs_args(slice(None)))]
        chosen = pair[0] if parallel else pair[1]
        self.kernel_name = chosen.py_func.__name__
        self.kernel = jit.runnable(chosen, self.gemv_calls[0])

    def fold_norm(self, norm_args: tuple, kernel) -> None:
        """Run the LayerNorm before this layer in its kernel (ops/norm.py: fold_norms): `kernel` is the
        folded twin of this layer's, taking the norm's arguments first."""
        self.gemv_calls = [(*norm_args, *self.gemv_calls[0])]
        self.kernel_name = kernel.py_func.__name__
        self.kernel = jit.runnable(kernel, self.gemv_calls[0])

    def _lanes_call(self, rows: slice) -> tuple:
        """The lane kernel's arguments for rows `rows` of x, its work arrays in the backend's
        scratch, which every linear layer uses in turn (a prefill chunk's are megabytes)."""
        first = self.weights[0]
        xq_type = np.int8 if self.backend.config.int8_activations else np.int16
        layouts = lane_kernels.x_layouts(rows.stop - rows.start, first.ic, first.block, xq_type)
        buffers = tuple(self.backend._scratch(f"lanes_{name}", shape, dtype)
                        for name, (shape, dtype) in zip(lane_kernels.X_BUFFERS, layouts))
        return (*self._matrices(), self._spans(), self.x[rows], first.block, *buffers, *self._outputs_args(rows))

    def _matrices(self) -> tuple:
        return (tuple(w.codes for w in self.weights), tuple(w.alpha for w in self.weights),
                tuple(w.k for w in self.weights), tuple(w.bias for w in self.weights))

    def _spans(self) -> np.ndarray:
        return kernels.row_spans([w.oc for w in self.weights])

    def _outputs_args(self, rows: int | slice) -> tuple:
        """The GEMV kernel's output arguments for rows `rows` of x (one row: an int)."""
        return (tuple(out[rows] for out in self.outs),)

    gemv_kernels = (kernels.gemv_group, kernels.gemv_group_serial)   # (parallel, serial)
    rows_kernels = (kernels.gemv_rows_group, kernels.gemv_rows_group_serial)
    lanes_kernels = (lane_kernels.lanes_group, lane_kernels.lanes_group_serial)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if not self.gemv_calls:
            self._prefill()
            return
        for call in self.gemv_calls:
            self.kernel(*call)

    def _prefill(self) -> None:
        threads = self.backend.workers.threads
        tiles = [(m, start, min(w.oc, start + tile_rows(w, threads)))
                 for m, w in enumerate(self.weights) for start in range(0, w.oc, tile_rows(w, threads))]
        tiles.sort(key=lambda tile: tile[1] - tile[2])   # the biggest first: the threads finish together

        def run(index: int) -> None:
            m, start, stop = tiles[index]
            w = self.weights[m]
            np.matmul(self.x, weight_tile(self.backend, w, start, stop).T, out=self.outs[m][:, start:stop])
            if w.bias.size:
                self.outs[m][:, start:stop] += w.bias[start:stop]

        self.backend._parallel(run, len(tiles))


class CPUConvolution(CPULinear):
    """A Convolution whose window slides: its input unfolded (mnngpu.ops.linear.im2col) into one row per
    output position, the linear layer over those rows, the result back to [n, oc, oh, ow]."""

    def plan(self, inputs, outputs):
        self.weights = self.members
        self.rows = int(np.prod(outputs[0].shape)) // outputs[0].shape[1]
        self.in_shape = (*inputs[0].shape, 1)[:4]    # a 3-D [n, c, h] input is [n, c, h, 1]
        self.out_shape = (*outputs[0].shape, 1)[:4]
        self.fused_gemv = False   # always the dequantize + BLAS path: rows are the output positions

    def bind(self):
        first = self.weights[0]
        self.x = np.empty((self.rows, first.ic), dtype=np.float32)
        self.outs = [np.empty((self.rows, first.oc), dtype=np.float32)]
        self.gemv_calls = []

    def onExecute(self, inputs, outputs):  # noqa: N802
        self.x[:] = im2col(self.node, [self.value(self.inputs[0]).reshape(self.in_shape)]).T
        self._prefill()
        n, oc, oh, ow = self.out_shape
        out = self.outputs[0].device.reshape(self.out_shape)
        out[...] = self.outs[0].reshape(n, oh, ow, oc).transpose(0, 3, 1, 2)


class CPUGatedLinear(CPULinear):
    """GatedLinear: out = up(x) * silu(gate(x)), members [gate, up]."""

    gemv_kernels = (kernels.gemv_gated, kernels.gemv_gated_serial)
    rows_kernels = (kernels.gemv_rows_gated, kernels.gemv_rows_gated_serial)
    lanes_kernels = (lane_kernels.lanes_gated, lane_kernels.lanes_gated_serial)

    def bind(self):
        self.out = self.outputs[0].device.reshape(self.rows, -1)
        super().bind()

    def _outputs_args(self, rows: int | slice) -> tuple:
        """gate and up for rows `rows` in the backend's scratch, which the gated layers share, and
        the output, which the kernel sets to up * silu(gate)."""
        count = 1 if isinstance(rows, int) else len(range(*rows.indices(self.rows)))
        gate, up = (self.backend._scratch(name, (count, self.weights[0].oc))
                    for name in ("gemv_gate", "gemv_up"))
        if isinstance(rows, int):
            gate, up = gate[0], up[0]
        return (gate, up), self.out[rows]

    def _prefill(self) -> None:
        gate, up = self.weights
        rows = tile_rows(gate, self.backend.workers.threads)
        starts = list(range(0, gate.oc, rows))

        def run(index: int) -> None:
            start = starts[index]
            stop = min(gate.oc, start + rows)
            g = self.backend._scratch("gate", (self.rows, stop - start))
            u = self.backend._scratch("up", (self.rows, stop - start))
            np.matmul(self.x, weight_tile(self.backend, gate, start, stop).T, out=g)
            np.matmul(self.x, weight_tile(self.backend, up, start, stop).T, out=u)
            if gate.bias.size:
                g += gate.bias[start:stop]
            if up.bias.size:
                u += up.bias[start:stop]
            act = self.backend._scratch("act", (self.rows, stop - start))   # contiguous: vectorizes
            jit.runnable(kernels.mul_silu, (u, g, act))(u, g, act)
            self.out[:, start:stop] = act

        self.backend._parallel(run, len(starts))


def tile_rows(w: PackedLinear, threads: int = 1) -> int:
    """Rows per dequantized tile: about TILE_BYTES, at least MIN_TILE_ROWS (a narrow GEMM is slow),
    the matrix split into equal tiles, as many as a multiple of the threads when there are enough."""
    target = max(MIN_TILE_ROWS, TILE_BYTES // (4 * w.ic))
    tiles = -(-w.oc // target)
    if tiles >= threads:
        tiles = -(-tiles // threads) * threads
    rows = -(-w.oc // tiles)
    return min(w.oc, -(-rows // 8) * 8)


def weight_tile(backend, w: PackedLinear, start: int, stop: int) -> np.ndarray:
    """float32 rows [start, stop) of w, in this thread's scratch tile (or a view of dense weights)."""
    if w.dense is not None:
        return w.dense[start:stop]
    if w.lanes:   # in a fused group with a member of another layout (mixed bits): rare, numpy unpacks it
        levels, low = lane_kernels.unpacked(w.codes, w.alpha, w.k, start, stop)
        return levels + low
    tile = backend._scratch("weight_tile", (stop - start, w.ic))
    args = (w.codes, w.alpha, w.k, w.nibbles, w.block, start, tile)
    jit.runnable(kernels.dequantize_rows, args)(*args)
    return tile


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Convolution": CPULinear, LINEAR_GROUP: CPULinear, GATED_LINEAR: CPUGatedLinear}
