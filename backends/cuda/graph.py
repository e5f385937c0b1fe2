"""CUDA graphs: a pipeline's kernel launches captured once and replayed every step.

Each resize (one pool module) makes a Recording of the executions created in it, in order.
Its first run launches them one by one. At the start of a later run, if every execution can
be captured (fixed launches only: no cuBLAS, no allocation — the decode pipeline) and no op
of the pipeline fell back to the CPU, the launches are captured into a cupy.cuda.Graph; from
then on the executions only do their host-side work (the KV places written to their device
buffers) and `finish()` launches the graph. Per-step values reach the graph through device
buffers written on the same stream before the launch: the graph inputs and the KV places (the
backend's step buffer or rows table). Before a run's first turn the backend makes room in its KV
pools (`prepare_run`), so that no buffer a graph or a prepared launch binds moves mid-run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mnngpu.backend import warn_once
from mnngpu.backends.cuda.device import CudaDevice, log
from mnngpu.errors import MnnGpuError

GRAPH_ENV = "MNNGPU_CUDA_GRAPH"  # "0" runs every pipeline launch by launch


@dataclass(eq=False)
class Recording:
    executions: list = field(default_factory=list)
    graph: Any = None
    runs: int = 0
    host_transfers: bool = False   # an op on the CPU backup copies through the host mid-run
    capture_failed: bool = False

    @property
    def capturable(self) -> bool:
        return (not self.host_transfers and not self.capture_failed
                and all(getattr(e, "capturable", False) for e in self.executions))


class GraphRecorder:
    def __init__(self, device: CudaDevice, enabled: bool | None = None):
        self.device = device
        self.enabled = os.environ.get(GRAPH_ENV, "1") != "0" if enabled is None else enabled
        self.recordings: list[Recording] = []
        self._resizing: Recording | None = None
        self._active: Recording | None = None    # the recording whose run is under way
        self.prepare_run = lambda recording: None  # set by the backend: KV capacity checks

    # ---- resize ----------------------------------------------------------------------------
    def begin_resize(self) -> None:
        self._resizing = Recording()

    def end_resize(self) -> None:
        if self._resizing is not None and self._resizing.executions:
            self.recordings.append(self._resizing)
        self._resizing = None

    def register(self, execution) -> Recording | None:
        if self._resizing is not None:
            self._resizing.executions.append(execution)
        return self._resizing

    # ---- run --------------------------------------------------------------------------------
    def begin(self, execution) -> None:
        """An execution's turn in a run, before its host-side work: the first turn of a run prepares
        it (prepare_run: the KV caches' room) and captures its graph where due."""
        recording = execution.recording
        if recording is not None and recording is not self._active:
            self._start(recording)

    def execute(self, execution) -> None:
        """An execution's turn in a run, after its host-side work: launch it now, unless its
        pipeline replays a graph."""
        recording = execution.recording
        if recording is None:
            execution.launch()
            return
        self.begin(execution)
        if recording.graph is None:
            execution.launch()

    def _start(self, recording: Recording) -> None:
        self.prepare_run(recording)   # first: a run it refuses never starts
        self._active = recording
        recording.runs += 1
        if self.enabled and recording.graph is None and recording.runs > 1:
            if recording.capturable:
                self._capture(recording)
            elif recording.host_transfers:
                warn_once("CUDA graphs are off for a pipeline with an op on the CPU backup: its launches "
                          "run one by one (mnngpu inspect --backend cuda lists the fallbacks)")

    def _capture(self, recording: Recording) -> None:
        stream = self.device.stream
        try:
            stream.begin_capture()
            try:
                for execution in recording.executions:
                    execution.launch()
            finally:
                graph = stream.end_capture()
        except Exception as exc:  # noqa: BLE001 (whatever cupy or the driver refuse, the launches still run)
            log.warning("CUDA graph capture failed (%s: %s); this pipeline runs launch by launch",
                        type(exc).__name__, exc)
            recording.capture_failed = True
            return
        recording.graph = graph

    def host_transfer(self) -> None:
        """An upload or download: mid-run, it means a CPU-backup op sits inside the pipeline,
        whose launches must then stay interleaved with the host copies."""
        if self._active is not None:
            self._active.host_transfers = True

    def flush(self) -> None:
        """End the run under way: launch its graph, if it has one."""
        active, self._active = self._active, None
        if active is not None and active.graph is not None:
            with self.device.stream:
                active.graph.launch(stream=self.device.stream)

    def invalidate(self) -> None:
        """Buffers a graph refers to were replaced (the KV cache grew): capture again later. Never
        mid-run of a graph that replays at flush: its executions have skipped their launches."""
        if self._active is not None and self._active.graph is not None:
            raise MnnGpuError("the CUDA KV pools grew during a run that replays a captured graph; they grow "
                              "before a run's first launch (CUDABackend._prepare_run)")
        for recording in self.recordings:
            recording.graph = None
