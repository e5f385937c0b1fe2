"""The contract a backend builds on, all of it here: a backend folder (backends/<name>/) imports
only this package, `mnngpu.ops`, `mnngpu.errors`, `mnngpu.jit` and `mnngpu.shaders`
(tests/test_layout.py checks it).

    interface.py        Tensor, Node, BackendConfig, Execution, Capabilities, Backend: what the
                        Pipeline calls, and what a backend declares
    registry.py         backend_type -> Backend class, imported when chosen; which backends run an op
    kv.py               KVMeta, the KVCache and StateCache protocols, sequences and their segments
                        (several sequences in one forward), the recurrent-state rules
    device_caches.py    what device backends' caches share: PooledKVCaches, DeviceStateCache
    widths.py           the rows of the pool's modules (prefill chunk, fixed-shape prefill widths)
    planned.py          PlannedExecution and Recording: record at resize, plan buffers, bind
    lifetimes.py        the buffer lifetimes a planned backend lays its memory out by
    movement.py         strides and index maps for data-movement kernels
    stacked_experts.py  a sparse MoE's experts stacked in one buffer each, for a device kernel

The names a backend uses most are re-exported here.
"""

from mnngpu.backend.interface import (
    Backend,
    BackendConfig,
    Capabilities,
    DeviceWarning,
    Execution,
    Node,
    Tensor,
    merged_table,
    warn_once,
)
from mnngpu.backend.registry import REGISTRY, backend_class, create_backend

__all__ = ["REGISTRY", "Backend", "BackendConfig", "Capabilities", "DeviceWarning", "Execution", "Node", "Tensor",
           "backend_class", "create_backend", "merged_table", "warn_once"]
