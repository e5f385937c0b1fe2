"""StaticModule: a graph bound to one backend, its weights decoded and packed once.

It turns the Net's ops into Nodes, decodes each op's external weights (quantized linear
blocks, norm gammas) from the weight file, lets the backend rearrange them into its own
layout (dropping the raw arrays), and builds the Session that resizes and runs the graph.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from mnngpu.backend import Node
from mnngpu.errors import ModelFormatError
from mnngpu.format import Net
from mnngpu.format.weights import WeightFile
from mnngpu.ops import op_table
from mnngpu.ops.common import DTYPES
from mnngpu.runtime.fusion import fuse
from mnngpu.runtime.graph import GraphOp
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.runtime.session import GraphInput, Session

# Graph inputs whose values decide shapes (the logits row slice) or each Attention op's key
# window (runtime.attention_mask), so they stay on the host.
HOST_INPUTS = frozenset({"logits_index", "attention_mask"})


def decode_weights(op, weights: WeightFile) -> dict:
    """The op's weights, decoded by its family's rule (mnngpu/ops/op_table.py); {} for an op without."""
    return op_table.decode_weights(op.type, op.param, op.name, weights)


def weights_location(op) -> tuple | None:
    """Where an op's weights sit in the weight file (its `external` entry); None for none or inline."""
    external = getattr(op.param, "external", None) if op_table.has_weights(op.type) else None
    return (op.type, tuple(external)) if external else None


class StaticModule:
    def __init__(self, net: Net, weights: WeightFile, runtime: RuntimeManager,
                 constants: dict[int, np.ndarray], rearrange: bool = True, base: StaticModule | None = None):
        self.net = net
        self.runtime = runtime
        self.constants = constants
        self.inputs: list[GraphInput] = []
        self.ops: list[GraphOp] = []
        # name -> (where its weights sit, the node with them decoded and packed): a base for another module
        self.weight_nodes: dict[str, tuple[tuple, Node]] = {}
        self.shared: list[str] = []   # ops whose packed weights came from `base`
        backend = runtime.backend()
        for op in net.ops:
            if op.type == "Input":
                self.inputs.append(self._graph_input(op))
            elif op.type != "Const":
                node = self._shared_node(op, base) or self._new_node(op, weights, backend, rearrange)
                if weights_location(op) is not None:
                    self.weight_nodes[op.name] = (weights_location(op), node)
                self.ops.append(GraphOp(node, list(op.inputs), list(op.outputs)))
        self.outputs = {name: net.tensor_names.index(name) for name in net.output_names}
        # Fused node types are used only where this backend's executions table has them.
        self.ops = fuse(self.ops, set(backend.executions), set(self.outputs.values()), constants)

    @staticmethod
    def _new_node(op, weights: WeightFile, backend, rearrange: bool) -> Node:
        node = Node(op.type, op.name, op.param, decode_weights(op, weights))
        if node.weights:
            node.source = partial(decode_weights, op, weights)
        if rearrange:
            backend.rearrange(node)
            node.packed_for.add(backend.type)
        return node

    def _shared_node(self, op, base: StaticModule | None) -> Node | None:
        """MNN's base module: an op whose name and weight location match the base's reuses the
        base's packed weights instead of decoding them again."""
        if base is None or op.name not in base.weight_nodes:
            return None
        location, base_node = base.weight_nodes[op.name]
        if location != weights_location(op):
            return None
        self.shared.append(op.name)
        return Node(op.type, op.name, op.param, base_node.weights, base_node.source, set(base_node.packed_for))

    @staticmethod
    def _graph_input(op) -> GraphInput:
        name = op.name
        param = op.param
        if param is None:
            raise ModelFormatError("Input op has no Input parameter", field=name)
        dtype = np.dtype(DTYPES.get(param.dtype, np.float32))
        return GraphInput(name, op.outputs[0], tuple(param.dims or ()), dtype, on_host=name in HOST_INPUTS)

    def session(self) -> Session:
        """A new Session over the shared, already-packed nodes (one per pool module)."""
        return Session(self.ops, len(self.net.tensor_names), self.inputs, self.constants, self.outputs,
                       self.runtime.backend(), self.runtime.cpu_backup(), self.runtime.placements)
