"""The routing family on the CPU: SPARSE_MOE, where only the experts the router chose run, on their
weights as packed at load, and the router's own ops (CPURouterOp).

Each expert is gate_up -> up * silu(gate) -> down (runtime/moe.py checks that form at load). Its
two Convolutions are packed by CPULinear.pack like any linear layer (views of the
memory-mapped codes, or lane groups at precision low); gate and up are row views of gate_up's
packing, so the fused gated kernel runs them in one launch. Nothing is copied per token.

* Decode (one row): for each of the top_k chosen experts, the gated GEMV and the down GEMV of
  ops/linear.py on the row, the down output scaled by its routing weight and added to the sum.
* Several rows (a prefill chunk, a verify block): the rows are grouped by expert; each chosen
  expert runs once over its own rows (gathered into a work array) with the same linear
  executions, which take the GEMV, lane or dequantize-and-BLAS path by that row count, and its
  weighted output is added back into those rows.

The router's Softmax, TopKV2 and Reduction (SUM) along the last axis of float32 rows run in small
numba kernels (CPURouterOp): through numpy's host rules they took 30 us a layer, a tenth of a
MoE decode step. Any other form (another axis or reduction, int inputs) stays CPUHostOp's.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backend import Node, Tensor
from mnngpu.backends.cpu.kernels import linear_kernels
from mnngpu.backends.cpu.kernels.intrinsics import LANES
from mnngpu.backends.cpu.ops.base import CPUExecution, CPUHostOp
from mnngpu.backends.cpu.ops.linear import CPUGatedLinear, CPULinear, PackedLinear
from mnngpu.ops import routing as routing_rules
from mnngpu.ops.linear import GATED_LINEAR, FusedLinearParam
from mnngpu.ops.routing import SPARSE_MOE, SparseExpert


def half_rows(packed: PackedLinear, first: bool) -> PackedLinear | None:
    """Rows [0, oc/2) or [oc/2, oc) of a packed matrix as views; None where the layout cannot be
    cut there (lane groups of LANES rows that straddle the middle)."""
    half = packed.oc // 2
    start, stop = (0, half) if first else (half, packed.oc)
    bias = packed.bias[start:stop] if packed.bias.size else packed.bias
    if packed.dense is not None:
        return dataclasses.replace(packed, oc=half, dense=packed.dense[start:stop], bias=bias)
    if packed.lanes:
        if half % LANES:
            return None
        start, stop = start // LANES, stop // LANES
    return dataclasses.replace(packed, oc=half, codes=packed.codes[start:stop], alpha=packed.alpha[start:stop],
                               bias=bias)


def expert_gate_and_up(expert: SparseExpert) -> tuple[Node, Node] | None:
    """The expert's gate and up as Convolution nodes over views of gate_up's packing, made once and
    kept with gate_up's weights; None where the packing cannot be cut in two."""
    weights = expert.gate_up.weights
    if "gate_and_up" not in weights:
        halves = [half_rows(weights["packed"], first) for first in (True, False)]
        if not expert.gate_first:
            halves.reverse()
        weights["gate_and_up"] = None if None in halves else tuple(
            Node("Convolution", f"{expert.gate_up.name}/{part}", expert.gate_up.param, {"packed": packed})
            for part, packed in zip(("gate", "up"), halves))
    return weights["gate_and_up"]


class ExpertRun:
    """One expert over `x` (rows, H) into `y` (rows, H): the linear executions of ops/linear.py,
    bound to these arrays and to `act` (rows, width)."""

    def __init__(self, backend, expert: SparseExpert, x: np.ndarray, act: np.ndarray, y: np.ndarray):
        self.gated_nodes = expert_gate_and_up(expert)
        if self.gated_nodes is not None:
            param = FusedLinearParam(list(self.gated_nodes))
            self.steps = [_bound(CPUGatedLinear, backend, Node(GATED_LINEAR, expert.gate_up.name, param), x, act)]
        else:   # gate_up whole, then up * silu(gate) on its two halves
            both = np.empty((x.shape[0], 2 * act.shape[1]), dtype=np.float32)
            width = act.shape[1]
            gate, up = (both[:, :width], both[:, width:]) if expert.gate_first else (both[:, width:], both[:, :width])
            silu = jit.runnable(linear_kernels.mul_silu, (up, gate, act))
            self.steps = [_bound(CPULinear, backend, expert.gate_up, x, both), _Call(silu, (up, gate, act))]
        self.steps.append(_bound(CPULinear, backend, expert.down, act, y))

    def run(self) -> None:
        for step in self.steps:
            step.onExecute(None, None)


class _Call:
    def __init__(self, kernel, args: tuple):
        self.kernel, self.args = kernel, args

    def onExecute(self, inputs, outputs):  # noqa: N802
        self.kernel(*self.args)


def _bound(cls, backend, node: Node, x: np.ndarray, out: np.ndarray):
    """An execution of `cls` for `node`, planned and bound to the arrays x and out."""
    execution = cls(backend, node)
    inputs = [Tensor(x.shape, np.dtype(np.float32), device=x)]
    outputs = [Tensor(out.shape, np.dtype(np.float32), device=out)]
    execution.inputs, execution.outputs = inputs, outputs
    execution.plan(inputs, outputs)
    execution.bind()
    return execution


class CPUSparseMoE(CPUExecution):
    """out[t] = sum over the top_k experts chosen for row t of w[t, j] * expert(hidden[t])."""

    def plan(self, inputs, outputs):
        self.rows, self.hidden = inputs[0].shape
        self.top_k = self.node.param.top_k
        self.width = int(self.node.param.experts[0].down.param.common.inputCount)

    def bind(self):
        self.x = self.value(self.inputs[0]).reshape(self.rows, self.hidden)
        self.w = self.value(self.inputs[1]).reshape(self.rows, self.top_k)
        self.ids = self.value(self.inputs[2]).reshape(self.rows, self.top_k)
        self.out = self.outputs[0].device.reshape(self.rows, self.hidden)
        self.act = np.empty((1, self.width), dtype=np.float32)
        self.y = np.empty((1, self.hidden), dtype=np.float32)
        self.decode_runs: dict[int, ExpertRun] = {}

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.rows == 1:
            self._decode()
        else:
            self._grouped()

    def _expert(self, index: int) -> SparseExpert:
        experts = self.node.param.experts
        if not 0 <= index < len(experts):
            raise IndexError(f"{self.node.name}: the router chose expert {index} of {len(experts)}")
        return experts[index]

    def _decode(self) -> None:
        self.out[:] = 0
        for expert, weight in zip(self.ids[0].tolist(), self.w[0].tolist()):
            run = self.decode_runs.get(expert)
            if run is None:
                run = self.decode_runs[expert] = ExpertRun(self.backend, self._expert(expert), self.x,
                                                           self.act, self.y)
            run.run()
            self.out += np.float32(weight) * self.y

    def _grouped(self) -> None:
        """Rows grouped by expert: each chosen expert once over all its rows."""
        self.out[:] = 0
        chosen = self.ids.reshape(-1)
        order = np.argsort(chosen, kind="stable")
        experts, starts = np.unique(chosen[order], return_index=True)
        ends = np.append(starts[1:], order.size)
        for expert, start, end in zip(experts.tolist(), starts.tolist(), ends.tolist()):
            entries = order[start:end]
            tokens = entries // self.top_k
            count = tokens.size
            x = self.backend._scratch("moe_x", (count, self.hidden))
            act = self.backend._scratch("moe_act", (count, self.width))
            y = self.backend._scratch("moe_y", (count, self.hidden))
            np.take(self.x, tokens, axis=0, out=x)
            ExpertRun(self.backend, self._expert(expert), x, act, y).run()
            y *= self.w.reshape(-1)[entries, None]
            self.out[tokens] += y   # a row chooses an expert at most once: no index repeats


@numba.njit(cache=True, nogil=True)
def softmax_rows(x, out):
    """out[r] = softmax(x[r]), with the row's maximum subtracted first."""
    for r in range(x.shape[0]):
        best = x[r, 0]
        for j in range(1, x.shape[1]):
            best = max(best, x[r, j])
        total = np.float32(0.0)
        for j in range(x.shape[1]):
            e = np.exp(x[r, j] - best)
            out[r, j] = e
            total += e
        for j in range(x.shape[1]):
            out[r, j] = out[r, j] / total


@numba.njit(cache=True, nogil=True)
def top_k_rows(x, largest, values, indices):
    """The k = values.shape[1] largest (smallest) entries of each row of x, best first; of equal
    values the lower index first (the host rule's stable order)."""
    k = values.shape[1]
    for r in range(x.shape[0]):
        taken = np.zeros(x.shape[1], dtype=np.bool_)
        for i in range(k):
            best = -1
            for j in range(x.shape[1]):
                if taken[j]:
                    continue
                if best < 0 or (x[r, j] > x[r, best] if largest else x[r, j] < x[r, best]):
                    best = j
            taken[best] = True
            values[r, i] = x[r, best]
            indices[r, i] = best


@numba.njit(cache=True, nogil=True)
def sum_rows(x, out):
    """out[r] = the sum of x[r], added in order (numpy's order for rows of under 8)."""
    for r in range(x.shape[0]):
        total = np.float32(0.0)
        for j in range(x.shape[1]):
            total += x[r, j]
        out[r] = total


@jit.twin_of(softmax_rows)
def softmax_rows_numpy(x, out):
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    out[:] = shifted / shifted.sum(axis=1, keepdims=True)


@jit.twin_of(top_k_rows)
def top_k_rows_numpy(x, largest, values, indices):
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :values.shape[1]]
    values[:] = np.take_along_axis(x, order, axis=1)
    indices[:] = order


@jit.twin_of(sum_rows)
def sum_rows_numpy(x, out):
    for r in range(x.shape[0]):
        total = np.float32(0.0)
        for value in x[r]:
            total += value
        out[r] = total


SUM_ROWS_MAX = 7   # numpy adds a row of up to 7 in order; a longer one pairwise, which sum_rows does not
ROUTER_WIDTH_MAX = 1024   # a router's rows (one score per expert); a longer softmax keeps numpy's pairwise sums


class CPURouterOp(CPUHostOp):
    """Softmax, TopKV2 or a SUM Reduction along the last axis of a float32 tensor, in one kernel."""

    @classmethod
    def variant_for(cls, inputs, node):
        x = inputs[0]
        if np.dtype(x.dtype) != np.float32 or not x.shape or any(t.host is None for t in inputs[1:]):
            return CPUHostOp
        if routing_rules.axes_of(node, inputs) != (len(x.shape) - 1,) or x.shape[-1] > ROUTER_WIDTH_MAX:
            return CPUHostOp
        if node.type == "Reduction" and (node.param.operation != "SUM" or x.shape[-1] > SUM_ROWS_MAX):
            return CPUHostOp
        return cls

    def bind(self):
        super().bind()
        width = self.inputs[0].shape[-1]
        x = self.value(self.inputs[0]).reshape(-1, width)
        if self.node.type == "Softmax":
            self.args = (x, self.out.reshape(-1, width))
            kernel = softmax_rows
        elif self.node.type == "TopKV2":
            largest = getattr(self.node.param, "largest", True) if self.node.param is not None else True
            k = self.outs[0].shape[-1]
            self.args = (x, bool(largest), self.outs[0].reshape(-1, k), self.outs[1].reshape(-1, k))
            kernel = top_k_rows
        else:
            self.args = (x, self.out.reshape(-1))
            kernel = sum_rows
        self.kernel = jit.runnable(kernel, self.args)

    def onExecute(self, inputs, outputs):  # noqa: N802
        self.kernel(*self.args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {SPARSE_MOE: CPUSparseMoE, "Softmax": CPURouterOp, "TopKV2": CPURouterOp, "Reduction": CPURouterOp}
