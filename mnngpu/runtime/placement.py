"""Placement: where each op of a resize runs, decided before any Execution is made.

For every op in order: an op whose inputs are all known on the host (shape arithmetic,
constants) is folded with numpy; every other op is offered to the main backend (`decline`:
its op table, its capabilities, then its Execution's own shape and dtype limits) and goes to
the CPU backup when the main backend declines it, with the reason. Each runtime collects the
decisions of all its resizes in one PlacementTable (node -> backend, reason): `mnngpu inspect
--backend` prints it and the ready line counts its fallbacks. Under strict_device a fallback is a
BackendUnavailableError instead.

The CPU backup packs the weights of each node it takes with its own `rearrange`: the main
backend packed them into its own layout at load and dropped the raw copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.backend import Backend, Node, Tensor
from mnngpu.errors import BackendUnavailableError, ConfigError, ModelFormatError
from mnngpu.ops import linear_attention, op_table
from mnngpu.ops.common import shape_stand_in
from mnngpu.ops.linear import is_windowed
from mnngpu.runtime.graph import GraphOp, op_errors_named

HOST = "host"   # the placement of an op folded on the host at resize


@dataclass
class Assignment:
    op: GraphOp
    inputs: list[Tensor]
    outputs: list[Tensor]
    backend: Backend | None   # None: folded on the host (the outputs hold their values)
    reason: str = ""          # why the main backend declined the op ("" when it did not)


@dataclass
class Placement:
    node: str
    op_type: str
    backend: str              # a backend type, or HOST
    reason: str = ""


class PlacementTable:
    """Every node a runtime placed, in graph order; an op that fell back in any resize (prefill
    or decode shapes) stays reported as a fallback."""

    def __init__(self, backend_type: str):
        self.backend_type = backend_type
        self.entries: dict[int, Placement] = {}   # id(node) -> its placement

    def record(self, assignments: list[Assignment]) -> None:
        for assignment in assignments:
            node = assignment.op.node
            known = self.entries.get(id(node))
            if known is not None and known.reason and not assignment.reason:
                continue
            backend = HOST if assignment.backend is None else assignment.backend.type
            self.entries[id(node)] = Placement(node.name, node.type, backend, assignment.reason)

    @property
    def fallbacks(self) -> list[Placement]:
        return [p for p in self.entries.values() if p.reason]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for placement in self.entries.values():
            counts[placement.backend] = counts.get(placement.backend, 0) + 1
        return counts

    def format(self) -> str:
        """The table as text: a summary line, then one line per node."""
        summary = ", ".join(f"{n} on {b}" for b, n in self.counts().items())
        rows = [(p.node, p.op_type, p.backend, p.reason) for p in self.entries.values()]
        width = max((len(r[0]) for r in rows), default=4)
        kinds = max((len(r[1]) for r in rows), default=4)
        lines = [f"placement on {self.backend_type}: {summary}; {len(self.fallbacks)} fell back to the CPU"]
        for name, op_type, backend, reason in rows:
            line = f"  {name:<{width}}  {op_type:<{kinds}}  {backend}"
            lines.append(line + (f"  (declined: {reason})" if reason else ""))
        return "\n".join(lines)


def assign(ops: list[GraphOp], tensors: list[Tensor | None], backend: Backend,
           cpu_backup: Backend) -> list[Assignment]:
    """Decide where every op runs; fills `tensors` (inputs and constants given) with every op's
    outputs: shapes and dtypes, and values where folded. Makes no Execution and no buffer.
    Under the backend config's strict_device, a fallback raises instead."""
    strict = bool(getattr(backend.config, "strict_device", False))
    assignments = []
    for op in ops:
        inputs = [tensors[i] for i in op.inputs]
        with op_errors_named(op.node, "does not fit its inputs"):
            if op_table.foldable(op.node, inputs):
                assignment = Assignment(op, inputs, _fold(op.node, inputs), None)
            else:
                outputs = [Tensor(tuple(int(d) for d in shape), np.dtype(dtype), name=op.node.name)
                           for shape, dtype in op_table.infer(op.node, inputs)]
                chosen, reason = choose(op.node, inputs, outputs, backend, cpu_backup, strict)
                assignment = Assignment(op, inputs, outputs, chosen, reason)
        for index, tensor in zip(op.outputs, assignment.outputs):
            tensors[index] = tensor
        assignments.append(assignment)
    return assignments


def _fold(node: Node, inputs: list[Tensor]) -> list[Tensor]:
    values = op_table.evaluate(node, [t.host if t.host is not None else shape_stand_in(t) for t in inputs])
    return [Tensor(np.shape(v), np.asarray(v).dtype, name=node.name, host=np.asarray(v)) for v in values]


def decline(backend: Backend, inputs: list[Tensor], outputs: list[Tensor], node: Node) -> str | None:
    """Why `backend` cannot run `node` on these inputs, or None when it can."""
    execution = backend.executions.get(node.type)
    if execution is None:
        return backend.caps.declines.get(node.type, f"{node.type} is not in the {backend.type} op table")
    return _declined_by_caps(backend, node, inputs) or execution.variant_for(inputs, node).decline(inputs, outputs, node)


def _declined_by_caps(backend: Backend, node: Node, inputs: list[Tensor]) -> str | None:
    caps = backend.caps
    if node.type == "Attention" and not node.param.kv_cache and not caps.encoder_attention:
        return f"Attention without a KV cache (a vision encoder's) is not implemented on {backend.type}"
    if node.type == "Convolution" and not caps.windowed_convolution and inputs and \
            is_windowed(node.param.common, inputs[0].shape):
        return f"a sliding-window Convolution (an audio encoder's) is not implemented on {backend.type}"
    return None


def choose(node: Node, inputs: list[Tensor], outputs: list[Tensor], backend: Backend, cpu_backup: Backend,
           strict: bool = False) -> tuple[Backend, str]:
    """The backend that runs `node`, and why the main one declined it ("" when it did not)."""
    if node.type == "LinearAttention" and backend.batch is not None and not backend.caps.batched_state:
        raise ConfigError(f"{linear_attention.batching_declined(backend.type)}; use one slot", field="parallel")
    reason = decline(backend, inputs, outputs, node)
    if reason is None:
        return backend, ""
    if cpu_backup is backend:
        raise ModelFormatError(f"no backend can run op type {node.type}: {reason}", field=node.name)
    if strict:
        raise BackendUnavailableError(f"strict_device=true: op {node.name} ({node.type}) would fall back to the "
                                      f"CPU: {reason}", field="strict_device")
    backup_reason = decline(cpu_backup, inputs, outputs, node)
    if backup_reason is not None:
        raise ModelFormatError(f"no backend can run op type {node.type}: {reason}; {backup_reason}",
                               field=node.name)
    return cpu_backup, reason


def rearrange_for(backend: Backend, node: Node) -> None:
    """Pack the weights of `node` (of each member of a fused node) for `backend`, once."""
    members = getattr(node.param, "members", None) or [node]
    for member in members:
        if backend.type in member.packed_for:
            continue
        if member.source is not None:
            for key, value in member.source().items():
                member.weights.setdefault(key, value)
        backend.rearrange(member)
        member.packed_for.add(backend.type)
