"""The op-test harness every backend shares (as ggml's test-backend-ops): one op through the Backend
interface as the Pipeline drives it, on any backend kind this machine has.

    backend = make("opencl-gpu-fp16")          # skips (or, under MNNGPU_REQUIRE, fails) without a driver
    y = run(backend, node, [x, indices], host=(1,))
    close(backend, y, want)                    # the tolerance follows the backend's storage

An op a backend declines by design is named in the case (`declined_by`): the harness then checks
the backend gives its reason and runs the op on a CPU backend instead, as placement would.
Any other decline fails the case.
"""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import Backend, BackendConfig, Node, Tensor
from mnngpu.backend.kv import KVMeta
from mnngpu.backends.cuda.memory import BF16
from mnngpu.errors import BackendUnavailableError
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.ops import op_table
from mnngpu.ops.linear import FusedLinearParam
from mnngpu.runtime import placement
from mnngpu.runtime.pipeline import Pipeline
from tests import reference

FP32_RTOL = 2e-5
LOW_RTOL = {"float16": 1e-2, "bfloat16": 4e-2}   # relative to the result's largest value


def _cpu():
    from mnngpu.backends.cpu import CPUBackend

    return CPUBackend(BackendConfig(precision="high", thread_num=2), KVMeta())


def _opencl(variant: str, half: bool):
    from mnngpu.backends.opencl import OpenCLBackend

    return OpenCLBackend(BackendConfig(precision="high"), KVMeta(), variant=variant, half_storage=half)


def _vulkan(variant: str):
    from mnngpu.backends.vulkan import VulkanBackend

    backend = VulkanBackend(BackendConfig(precision="high"), KVMeta())
    backend.variant = variant
    return backend


def _cuda(storage: str):
    from mnngpu.backends.cuda import CUDABackend
    from mnngpu.backends.cuda.memory import BF16, FP16, FP32

    return CUDABackend(BackendConfig(precision="high"), KVMeta(), storage={"fp32": FP32, "fp16": FP16, "bf16": BF16}[storage])


# kind -> factory: every backend, with each kernel family and storage its tests must cover.
KINDS = {
    "cpu": _cpu,
    "opencl-cpu": lambda: _opencl("cpu", False), "opencl-gpu": lambda: _opencl("gpu", False),
    "opencl-cpu-fp16": lambda: _opencl("cpu", True), "opencl-gpu-fp16": lambda: _opencl("gpu", True),
    "vulkan-cpu": lambda: _vulkan("cpu"), "vulkan-gpu": lambda: _vulkan("gpu"),
    "cuda": lambda: _cuda("fp32"), "cuda-fp16": lambda: _cuda("fp16"), "cuda-bf16": lambda: _cuda("bf16"),
}


def make(kind: str) -> Backend:
    """A fresh backend of `kind`, or a skip naming why this machine has none."""
    backend_type = kind.split("-")[0]
    try:
        return KINDS[kind]()
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend_type} unavailable: {exc}")
    except ImportError as exc:
        pytest.skip(f"{backend_type} unavailable: {exc}")


def close(backend: Backend, got: np.ndarray, want: np.ndarray, fp32: float = FP32_RTOL) -> None:
    fmt = backend.caps.storage
    reference.assert_close(got, want, fp32 if fmt == "float32" else LOW_RTOL[fmt])


def stored(backend: Backend, array: np.ndarray) -> np.ndarray:
    """float32 values the backend's storage holds exactly, so rounding never flips a comparison."""
    array = np.asarray(array, dtype=np.float32)
    if backend.caps.storage == "bfloat16":   # no numpy dtype: the high half of each float32, rounded
        return BF16.from_storage(BF16.to_storage(array))
    return array.astype(backend.caps.storage).astype(np.float32)


def keep_raw_weights(node: Node) -> None:
    """Let a second backend pack the weights too, as the weight file lets a loaded node."""
    for member in getattr(node.param, "members", None) or [node]:
        if member.weights and member.source is None:
            member.source = lambda raw=dict(member.weights): dict(raw)


class OneOp:
    """One op resized once (commands recorded, buffers planned and bound), then run on fresh inputs."""

    def __init__(self, backend: Backend, node: Node, arrays: list[np.ndarray], host: tuple[int, ...] = (),
                 declined_by: tuple[str, ...] = ()):
        self.inputs = [Tensor(np.shape(a), np.asarray(a).dtype, f"in{i}", host=np.asarray(a) if i in host else None)
                       for i, a in enumerate(arrays)]
        self.outputs = [Tensor(tuple(s), np.dtype(d), "out") for s, d in op_table.infer(node, self.inputs)]
        keep_raw_weights(node)
        placement.rearrange_for(backend, node)   # at load, as static_module does
        reason = placement.decline(backend, self.inputs, self.outputs, node)
        if backend.type in declined_by:
            assert reason, f"{backend.type} was expected to decline {node.type}"
            backend = _cpu()
            placement.rearrange_for(backend, node)
        else:
            assert reason is None, f"{backend.type} declined {node.type}: {reason}"
        self.backend = backend
        backend.onResizeBegin()
        self.execution = backend.onCreate(self.inputs, self.outputs, node)
        for tensor, array in zip(self.inputs, arrays):
            backend.upload(tensor, np.asarray(array))
        for tensor in self.outputs:
            backend.alloc(tensor)
        self.execution.onResize(self.inputs, self.outputs)
        backend.onResizeEnd()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        for tensor, array in zip(self.inputs, arrays):
            if tensor.host is None:
                self.backend.upload(tensor, np.asarray(array))
        if self.execution.needs_run:
            self.execution.onExecute(self.inputs, self.outputs)
        self.backend.finish()
        return [self.backend.download(t) for t in self.outputs]


def run(backend: Backend, node: Node, arrays: list[np.ndarray], host: tuple[int, ...] = (),
        declined_by: tuple[str, ...] = ()) -> np.ndarray:
    """The op's first output for `arrays` (inputs at the `host` positions are known at resize)."""
    return OneOp(backend, node, arrays, host, declined_by)(*arrays)[0]


def run_graph(backend: Backend, ops: list, constants: dict[int, np.ndarray], arrays: list[np.ndarray],
              output: int) -> tuple[Pipeline, np.ndarray]:
    """`ops` resized and run in a Pipeline on `backend`, a CPU backup taking what it declines: tensors
    0.. are the graph inputs `arrays`, `constants` are known at resize. Returns the pipeline and
    tensor `output`'s value."""
    n_tensors = 1 + max(t for op in ops for t in (*op.inputs, *op.outputs))
    tensors: list[Tensor | None] = [None] * n_tensors
    pipeline = Pipeline(ops, backend, backend if backend.type == "cpu" else _cpu())
    for i, array in enumerate(arrays):
        tensors[i] = Tensor(array.shape, array.dtype, f"in{i}")
        pipeline.bind_input(tensors[i])
    for i, value in constants.items():
        tensors[i] = Tensor(value.shape, value.dtype, f"c{i}", host=value)
    pipeline.resize(tensors)
    for i, array in enumerate(arrays):
        backend.upload(tensors[i], array)
    pipeline.run()
    return pipeline, pipeline.backend_of(tensors[output]).download(tensors[output])


# ---- weights ---------------------------------------------------------------------------------------------

def quantized_linear(rng, oc: int, ic: int, bits: int, block: int, bias: bool) -> tuple[QuantizedLinear, np.ndarray]:
    """A QuantizedLinear laid out as format/quant.py decodes one, and its float64 weight."""
    levels, scales, zeros = reference.random_levels(rng, oc, ic, bits, block)
    codes = reference.pack_high_nibble_first(levels) if bits == 4 else levels
    weight = QuantizedLinear(oc, ic, bits, block, False, codes, scales, zeros,
                             rng.normal(0, 1, oc).astype(np.float32) if bias else None)
    dense = levels.astype(np.float64) * np.repeat(scales, block, 1) + np.repeat(zeros, block, 1)
    return weight, dense


def conv_node(weight: QuantizedLinear, name: str = "fc") -> Node:
    common = P.Convolution2DCommon(inputCount=weight.ic, outputCount=weight.oc)
    return Node("Convolution", name, P.Convolution2D(common=common), {"weight": weight})


def linear_reference(x: np.ndarray, dense: np.ndarray, bias) -> np.ndarray:
    y = x.astype(np.float64) @ dense.T
    return y if bias is None else y + bias


def fused_linear(kind: str, weights: list[QuantizedLinear]) -> Node:
    """runtime/fusion.py's LinearGroup / GatedLinear node over Convolutions."""
    return Node(kind, "fused", FusedLinearParam([conv_node(w, f"m{i}") for i, w in enumerate(weights)]))
