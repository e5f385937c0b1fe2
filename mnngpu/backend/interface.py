"""The backend interface every compute backend implements, and the registry of backends.

Names follow MNN's vocabulary (`onCreate`, `onResize`, `onExecute`) so the code reads next
to MNN's `Backend.hpp` / `Execution.hpp`; everything else is PEP 8.

A Pipeline drives a backend like this, once per shape (once per pool module for a
fixed-shape backend) and then every step:

    backend.rearrange(node)                                  # once per node, at load
    backend.onResizeBegin()
    for node: reason = placement.decline(backend, inputs, outputs, node)  # runtime/placement.py: None, or why not
              exe = backend.onCreate(inputs, outputs, node)  # (a declined node goes to the CPU backup)
              backend.alloc(t) for each output; exe.onResize(inputs, outputs)
    backend.onResizeEnd()
    ...
    for exe: exe.onExecute(inputs, outputs)                  # GPU backends only enqueue
    backend.finish()                                         # wait for the queue
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mnngpu.backend.kv import KVCache, Segment, StateCache


@dataclass(eq=False)
class Tensor:
    """One graph tensor. `host` holds its value when known on the host (constants and
    shape-derived values folded at resize); `device` is the owning backend's buffer."""

    shape: tuple[int, ...]
    dtype: np.dtype
    name: str = ""
    host: np.ndarray | None = None
    device: Any = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(eq=False)
class Node:
    """An op as a backend sees it: MNN's op type and parameter table, plus the decoded
    weights the loader attached (e.g. "weight": QuantizedLinear, "gamma", "beta")."""

    type: str
    name: str
    param: Any = None
    weights: dict[str, Any] = field(default_factory=dict)
    # Decodes the raw weights again from the weight file, for a second backend's rearrange (the
    # CPU backup taking a node the main backend packed and declined); None where there are none.
    source: Callable[[], dict[str, Any]] | None = None
    packed_for: set[str] = field(default_factory=set)   # backend types whose rearrange has run


@dataclass
class BackendConfig:
    """MNN's BackendConfig: precision high|normal|low, power, memory; plus thread count."""

    precision: str = "low"
    power: str = "normal"
    memory: str = "low"
    thread_num: int = 4
    max_all_tokens: int = 2048  # fixed-shape backends size their device KV cache for it
    prefill_len: int = 0        # rows of a prefill chunk (runtime/module_pool.py): the KV cache's padding
    prefill_widths: tuple[int, ...] = ()   # a fixed-shape backend's prefill module rows, read once at load
    strict_device: bool = False  # an op the backend declines is an error, not a CPU fallback
    keep_tensors: bool = False   # no two tensors share memory: every op's output readable after a run (diff)
    tmp_path: str = ""          # where kvcache_mmap and use_mmap put their files
    kvcache_mmap: bool = False  # the KV cache in files under tmp_path
    use_mmap: bool = False      # the weights a backend converts at load in files under tmp_path
    kv_quant: int = 0           # KV cache: 0 float, 1 int8 keys, 2 int8 keys and values (attention_mode)
    int8_activations: bool = False  # cpu, precision low: the int4 layers' activations in int8, not int16

    @property
    def fp32(self) -> bool:
        """precision high means fp32 math everywhere, whatever `memory` says."""
        return self.precision == "high"


class Execution(ABC):
    """The work of one op on one backend. Shape-dependent setup lives in onResize so
    that onExecute is only the per-step work."""

    # False once onResize has done all the work (e.g. a reshape that aliased its input's
    # buffer): the Pipeline then leaves it out of the per-step replay.
    needs_run: bool = True

    def __init__(self, backend: "Backend", node: Node):
        self.backend = backend
        self.node = node

    @classmethod
    def variant_for(cls, inputs: list[Tensor], node: Node) -> type[Execution]:
        """The class that runs `node` on these inputs: this one (the op table's entry), or a
        subclass of the same op for a case the op type alone cannot key (an encoder's Attention, a
        sliding-window Convolution). Placement and onCreate ask it first."""
        return cls

    @classmethod
    def pack(cls, backend: Backend, node: Node) -> None:
        """Pack node.weights into `backend`'s layout, once at load, and drop the raw arrays the
        packed form replaces (Backend.rearrange calls it for the class its op table names).
        Every Execution later made for the node shares the packed form. Default: nothing to pack."""

    @classmethod
    def decline(cls, inputs: list[Tensor], outputs: list[Tensor], node: Node) -> str | None:
        """Why this Execution cannot run `node` on these inputs (a shape or dtype limit of its
        kernels), or None when it can. Placement asks before onCreate."""
        return None

    def onResize(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:  # noqa: N802 (MNN's name)
        """Shapes are known: plan, bind, (re)record. Default: nothing to plan."""

    @abstractmethod
    def onExecute(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:  # noqa: N802
        """Run (GPU backends enqueue)."""


def merged_table(families) -> dict[str, type[Execution]]:
    """A backend's op table from its family files' `EXECUTIONS` (ops/<family>.py), in order: a later
    family's row replaces an earlier one's for the same op type (the CPU's host-rule rows first)."""
    return {op_type: execution for family in families for op_type, execution in family.EXECUTIONS.items()}


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once per backend class (`caps`); callers read these flags
    instead of probing the backend. A backend instance may refine its class's record
    (`dataclasses.replace`), e.g. with the storage its precision chose."""

    # True for GPU/NPU backends (MNN's shapeMutable=false): each pool module is resized once and
    # the same commands replay every step.
    fixed_shape: bool = False
    # attention_mode 1 and 2: the backend's Attention keeps int8 keys (and values), kv_quant.
    kv_int8: bool = False
    # An Attention op with kv_cache false (a vision encoder's: every query over every key, plus
    # the mask input) runs here; where not, it falls back to the CPU.
    encoder_attention: bool = False
    # A Convolution whose window slides over its input (not a 1x1 or a patch embedding) runs
    # here; where not, it falls back to the CPU.
    windowed_convolution: bool = False
    # Packed weights are host arrays any instance can use: create_lora shares them with the base.
    host_weights: bool = False
    # The prefix cache (runtime/prefix_cache.py) reads a prompt's keys and values (and recurrent
    # states, state_caches) back and writes them into a fresh cache (backend.kv).
    kv_transfer: bool = False
    # The format the backend stores floats in: float32, float16 or bfloat16 (Vulkan's KV cache and
    # dense weights; its activations stay float32).
    storage: str = "float32"
    # A forward's rows may belong to several sequences (backend.sequences.segments): continuous batching.
    # A fixed-shape backend runs them in a module of a fixed number of rows, the rows no sequence
    # holds idle (they store nothing in any cache).
    batched: bool = False
    # A batched forward may hold several sequences' rows of a recurrent layer (LinearAttention): its
    # state kernels run each sequence's state. Where not, placement refuses such a forward.
    batched_state: bool = False
    # Op types the backend knowingly has no Execution for, and why (the reason placement gives).
    declines: Mapping[str, str] = field(default_factory=dict)


class Backend(ABC):
    """One compute device. Its Pipeline-facing methods are all declared here; what a backend's
    own executions call on it is private to that backend (a leading underscore)."""

    type: str = ""
    caps: Capabilities = Capabilities()
    executions: dict[str, type[Execution]] = {}  # op type -> Execution class

    def __init__(self, config: BackendConfig, kv_meta=None):
        self.config = config
        self.kv_meta = kv_meta         # backend.kv.KVMeta shared with the Attention executions
        self.description = self.type   # the backend and its device, for the ready line
        self.kv_caches: dict[int, KVCache] = {}   # layer index -> its cache, made by kv_cache()
        self.state_caches: dict[str, StateCache] = {}   # recurrent op name -> its state, made by its execution
        self.batch: list[Segment] | None = None   # a batched forward's rows by sequence (backend.sequences.segments)

    def rearrange(self, node: Node) -> None:
        """Pack node.weights into this backend's layout once, at load (rearrange=true): the op's own
        Execution does it (`Execution.pack`), so a new weighted op needs no edit here."""
        execution = self.executions.get(node.type)
        if execution is not None:
            execution.pack(self, node)

    def declined(self, inputs: list[Tensor], outputs: list[Tensor], node: Node) -> None:
        """Told that `node` runs on the CPU backup instead, between this backend's ops (a device
        backend ends its command segment or keeps the inputs' buffers for the copies out)."""

    def onCreate(self, inputs: list[Tensor], outputs: list[Tensor], node: Node) -> Execution | None:  # noqa: N802
        """The Execution of `node`, or None where this backend has none for these inputs (placement,
        runtime/placement.py, asks first and sends such a node to the CPU backup)."""
        execution = self.executions.get(node.type)
        if execution is None:
            return None
        execution = execution.variant_for(inputs, node)
        if execution.decline(inputs, outputs, node) is not None:
            return None
        return execution(self, node)

    def onResizeBegin(self) -> None:  # noqa: N802
        """Called before a Pipeline resizes its executions."""

    def onResizeEnd(self) -> None:  # noqa: N802
        """Called after; a GPU backend may finalize command recording here."""

    @abstractmethod
    def alloc(self, tensor: Tensor) -> None:
        """Give `tensor` a device buffer of tensor.nbytes (tensor.device)."""

    @abstractmethod
    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        """Copy host data into tensor.device (allocating when needed)."""

    @abstractmethod
    def download(self, tensor: Tensor) -> np.ndarray:
        """A host copy of tensor.device, shaped tensor.shape."""

    def finish(self) -> None:
        """Wait until every enqueued execution is done (no-op for CPU)."""

    @abstractmethod
    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> KVCache:
        """Layer `layer`'s cache, made empty (and kept in `kv_caches`) when absent."""


class DeviceWarning(UserWarning):
    """A backend runs with less than was asked: a CPU device, a lower precision, no CUDA graph."""


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """One warning line per process for each such drop (the CLI prints it as `warning: ...`)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, DeviceWarning, stacklevel=2)
