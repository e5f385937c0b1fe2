"""CUDAExecution: an op as a list of kernel launches prepared at resize.

onResize prepares `self.launches` (kernel, grid, block, fixed arguments); onExecute does the
per-step host work (`before_launch`) and hands the launches to the backend's GraphRecorder,
which runs them now or leaves them to the pipeline's CUDA graph.
"""

from __future__ import annotations

from mnngpu.backend import Execution, Node
from mnngpu.backends.cuda.device import Launch


class CUDAExecution(Execution):
    capturable = True  # launch() is fixed kernel launches only: it can go into a CUDA graph

    def __init__(self, backend, node: Node):
        super().__init__(backend, node)
        self.launches: list[Launch] = []
        self.recording = backend.graphs.register(self)

    def prepare(self, source: str, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple) -> None:
        self.launches.append(Launch(self.backend.device.kernel(source, name), grid, block, args))

    def before_launch(self) -> None:
        """Host-side work of a step, done even when a CUDA graph replays the launches."""

    def launch(self) -> None:
        for launch in self.launches:
            self.backend.device.run(launch)

    def onExecute(self, inputs, outputs):
        self.backend.graphs.begin(self)
        self.before_launch()
        self.backend.graphs.execute(self)
