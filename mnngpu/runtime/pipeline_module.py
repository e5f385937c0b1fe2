"""PipelineModule: the graph's interface (inputs, outputs, constants) over its StaticModules.

MNN splits a graph into sub-modules at control flow and at MoE ops (a MoEModule over the
expert subgraphs); here the experts are inlined instead (runtime/moe.py), so there is one
StaticModule, whose fusion folds each MoE op back into one sparse node where the backend has it. Constants are read here, including those whose data
sits in the external weight file.
"""

from __future__ import annotations

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.format import Net
from mnngpu.format.weights import WeightFile
from mnngpu.runtime.c4_ops import rewrite_exported_fusions
from mnngpu.runtime.moe import inline_experts
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.runtime.static_module import StaticModule


class PipelineModule:
    def __init__(self, net: Net, weights: WeightFile, runtime: RuntimeManager, rearrange: bool = True,
                 base: StaticModule | None = None):
        net = inline_experts(rewrite_exported_fusions(net))
        self.input_names = [op.name for op in net.ops if op.type == "Input"]
        self.output_names = list(net.output_names)
        unknown = [n for n in self.output_names if n not in net.tensor_names]
        if unknown:
            raise ModelFormatError(f"graph outputs {unknown} name no tensor", field="outputName")
        constants: dict[int, np.ndarray] = {op.outputs[0]: op.param.array(weights)
                                            for op in net.ops if op.type == "Const"}
        self.static_module = StaticModule(net, weights, runtime, constants, rearrange, base)
