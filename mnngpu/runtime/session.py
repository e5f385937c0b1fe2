"""Session: the graph's tensors, resized into Pipelines per input-shape key, and run.

A shape-mutable backend (CPU) keeps a few recent Pipelines, one per input shapes; a
fixed-shape backend is resized once per pool module and replays that Pipeline every step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from mnngpu.backend import Backend, Tensor
from mnngpu.errors import InputError, ModelFormatError
from mnngpu.runtime import placement
from mnngpu.runtime.graph import GraphOp
from mnngpu.runtime.pipeline import Pipeline
from mnngpu.runtime.placement import Assignment, PlacementTable


@dataclass
class GraphInput:
    name: str
    index: int
    dims: tuple[int, ...]   # -1 where the size is given at run time
    dtype: np.dtype
    on_host: bool = False   # its value decides shapes (e.g. logits_index): part of the resize key


class Session:
    MAX_PIPELINES = 4

    def __init__(self, ops: list[GraphOp], n_tensors: int, inputs: list[GraphInput],
                 constants: dict[int, np.ndarray], outputs: dict[str, int],
                 backend: Backend, cpu_backup: Backend, placements: PlacementTable | None = None):
        self.ops, self.n_tensors, self.inputs = ops, n_tensors, inputs
        self.constants, self.outputs = constants, outputs
        self.backend, self.cpu_backup = backend, cpu_backup
        self.placements = placements
        self.pipelines: OrderedDict[tuple, tuple[Pipeline, list[Tensor | None]]] = OrderedDict()

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple:
        key = []
        for spec in self.inputs:
            value = feeds[spec.name]
            key.append(tuple(value.shape))
            if spec.on_host:
                key.append(tuple(np.asarray(value).reshape(-1).tolist()))
        return tuple(key)

    def resize(self, feeds: dict[str, np.ndarray]) -> tuple[Pipeline, list[Tensor | None]]:
        key = self._key(feeds)
        if key in self.pipelines:
            self.pipelines.move_to_end(key)
            return self.pipelines[key]
        tensors = self._graph_tensors(feeds)
        pipeline = Pipeline(self.ops, self.backend, self.cpu_backup, self.placements)
        for spec in self.inputs:
            if not spec.on_host:
                pipeline.bind_input(tensors[spec.index])
        pipeline.resize(tensors)
        self.pipelines[key] = (pipeline, tensors)
        while len(self.pipelines) > self.MAX_PIPELINES:
            self.pipelines.popitem(last=False)
        return pipeline, tensors

    def _graph_tensors(self, feeds: dict[str, np.ndarray]) -> list[Tensor | None]:
        """The constants and the graph inputs shaped as `feeds` (host values only where on_host)."""
        tensors: list[Tensor | None] = [None] * self.n_tensors
        for index, value in self.constants.items():
            tensors[index] = Tensor(value.shape, value.dtype, name=f"const{index}", host=value)
        for spec in self.inputs:
            value = np.asarray(feeds[spec.name], dtype=spec.dtype)
            tensors[spec.index] = Tensor(value.shape, np.dtype(spec.dtype), name=spec.name,
                                         host=value if spec.on_host else None)
        return tensors

    def place(self, feeds: dict[str, np.ndarray]) -> list[Assignment]:
        """Where each op would run for inputs shaped as `feeds`, without resizing (recorded in the
        placement table; under strict_device a fallback raises here)."""
        assignments = placement.assign(self.ops, self._graph_tensors(feeds), self.backend, self.cpu_backup)
        if self.placements is not None:
            self.placements.record(assignments)
        return assignments

    def run(self, feeds: dict[str, np.ndarray], wanted: list[str]) -> list[np.ndarray]:
        missing = [spec.name for spec in self.inputs if spec.name not in feeds]
        if missing:
            raise InputError(f"missing graph inputs {missing}", field="inputs")
        pipeline, tensors = self.resize(feeds)
        for spec in self.inputs:
            if not spec.on_host:
                self.backend.upload(tensors[spec.index], np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype))
        pipeline.run()
        results = []
        for name in wanted:
            if name not in self.outputs:
                raise ModelFormatError(f"the graph has no output {name!r} (its outputs: {list(self.outputs)})",
                                       field="outputName")
            tensor = tensors[self.outputs[name]]
            holder = pipeline.backend_of(tensor)
            results.append(tensor.host if holder is None else holder.download(tensor))
        return results
