"""Module.load: the entry from a model file to something that runs (MNN's Express Module).

    module = Module.load(llm.mnn, llm.mnn.weight, ModuleConfig(shape_mutable, rearrange), runtime)
    logits, = module.forward({"input_ids": embeds, ...}, ["logits"])
    decode = module.clone()   # shares the packed weights; its own resized pipelines
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnngpu.format import Net, read_net
from mnngpu.format.weights import WeightFile
from mnngpu.runtime.pipeline_module import PipelineModule
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.runtime.session import Session


@dataclass
class ModuleConfig:
    shape_mutable: bool = True   # False for GPU/NPU: resize once per pool module
    rearrange: bool = True       # pack weights for the backend at load, drop the raw copy
    base: NetModule | None = None   # MNN's base module: reuse its packed weights where an op matches (LoRA)


class NetModule:
    def __init__(self, pipeline_module: PipelineModule, config: ModuleConfig):
        self.pipeline_module = pipeline_module
        self.config = config
        self.session: Session = pipeline_module.static_module.session()

    @property
    def input_names(self) -> list[str]:
        return self.pipeline_module.input_names

    def forward(self, feeds: dict[str, np.ndarray], wanted: list[str]) -> list[np.ndarray]:
        return self.session.run(feeds, wanted)

    def clone(self) -> "NetModule":
        return NetModule(self.pipeline_module, self.config)


class Module:
    @staticmethod
    def load(model_path: Path, weight_path: Path, config: ModuleConfig, runtime: RuntimeManager,
             net: Net | None = None) -> NetModule:
        """`net`: the already-parsed graph of model_path, when the caller has one."""
        net = net if net is not None else read_net(model_path)
        weights = WeightFile(weight_path)
        base = config.base.pipeline_module.static_module if config.base is not None else None
        return NetModule(PipelineModule(net, weights, runtime, config.rearrange, base), config)
