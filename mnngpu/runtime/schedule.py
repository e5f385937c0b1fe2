"""ScheduleConfig / RuntimeManager: which backend runs the graph, with what settings.

Mirrors MNN's Executor::RuntimeManager: one per Llm, created from the config's
backend_type, thread_num, precision, power and memory. It owns the KVMeta the
Attention executions share, and a CPU backup backend for ops a device backend lacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from dataclasses import dataclass, field

from mnngpu.backend import REGISTRY, Backend, BackendConfig, backend_class, create_backend
from mnngpu.backend.kv import KVMeta, Segment, Sequence
from mnngpu.backend.sequences import enter
from mnngpu.backend.widths import PREFILL_LEN, prefill_widths
from mnngpu.config import ConfigWarning
from mnngpu.errors import ConfigError
from mnngpu.runtime.placement import PlacementTable


@dataclass
class ScheduleConfig:
    backend_type: str = "cpu"
    backend_config: BackendConfig = field(default_factory=BackendConfig)


class RuntimeManager:
    def __init__(self, schedule: ScheduleConfig):
        self.schedule = schedule
        self.sequence = Sequence(KVMeta())   # the one the backends run now (use_sequence)
        self.placements = PlacementTable(schedule.backend_type)   # every resize's node -> backend
        self._backend: Backend | None = None
        self._cpu_backup: Backend | None = None

    @classmethod
    def from_config(cls, config) -> RuntimeManager:
        backend = BackendConfig(precision=config.precision, power=config.power, memory=config.memory,
                                thread_num=config.thread_num, max_all_tokens=config.max_all_tokens,
                                strict_device=config.strict_device, kv_quant=_kv_quant(config),
                                int8_activations=_int8_activations(config), prefill_len=PREFILL_LEN,
                                prefill_widths=_prefill_widths(config.backend_type),
                                **_mapped_files(config))
        manager = cls(ScheduleConfig(config.backend_type, backend))
        manager.kv_meta.attn_scale = config.attn_scale or 0.0
        return manager

    @property
    def kv_meta(self) -> KVMeta:
        """The current sequence's KVMeta, shared with the Attention executions."""
        return self.sequence.meta

    def new_sequence(self) -> Sequence:
        """An empty sequence with caches of its own, beside the current one (use_sequence runs it)."""
        return Sequence(KVMeta(attn_scale=self.kv_meta.attn_scale))

    def use_sequence(self, sequence: Sequence) -> None:
        """Run `sequence` from now on, on the backend and its CPU backup; the others keep their caches."""
        self.sequence = sequence
        for backend in self._backends():
            enter(backend, sequence)

    @contextlib.contextmanager
    def batched(self, segments: list[Segment]):
        """A forward whose rows belong to several sequences, `segments` saying whose (backend.sequences.segments)."""
        backends = self._backends()
        for backend in backends:
            backend.batch = segments
        try:
            yield
        finally:
            for backend in backends:
                backend.batch = None

    def _backends(self) -> list[Backend]:
        return list({id(b): b for b in (self._backend, self._cpu_backup) if b is not None}.values())

    @property
    def caps(self):
        """The backend's Capabilities (without creating it)."""
        return backend_class(self.schedule.backend_type).caps

    @property
    def fixed_shape(self) -> bool:
        return self.caps.fixed_shape

    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = create_backend(self.schedule.backend_type, self.schedule.backend_config, self.kv_meta)
            enter(self._backend, self.sequence)
        return self._backend

    def cpu_backup(self) -> Backend:
        """The backend that takes ops the main backend's onCreate declines."""
        if self.schedule.backend_type == "cpu":
            return self.backend()
        if self._cpu_backup is None:
            # the device backend reads its tensors mid-run: no two of them may share memory
            config = dataclasses.replace(self.schedule.backend_config, keep_tensors=True)
            self._cpu_backup = create_backend("cpu", config, self.kv_meta)
            enter(self._cpu_backup, self.sequence)
        return self._cpu_backup

    def cache_bytes(self) -> int:
        """Bytes the sequence holds: every KV cache and recurrent state, on the backend and on the CPU
        backup where one was made (it keeps the states of the layers it runs)."""
        return self.sequence.nbytes()

    def describe(self) -> str:
        """The backend and its device, e.g. "vulkan on llvmpipe (CPU)"."""
        return self.backend().description


def _mapped_files(config) -> dict:
    """kvcache_mmap and use_mmap: files under tmp_path, on the CPU backend. A device backend keeps
    its KV cache and weights in device memory; there either key draws one warning."""
    wanted = {key: config.value(key) for key in ("kvcache_mmap", "use_mmap")}
    if not any(wanted.values()):
        return {}
    if config.backend_type != "cpu":
        on = ", ".join(key for key, value in wanted.items() if value)
        warnings.warn(f"{on}: no effect on the {config.backend_type} backend, which keeps its KV cache and "
                      "weights in device memory", ConfigWarning, stacklevel=4)
        return {}
    needed_by = " and ".join(key for key, value in wanted.items() if value)
    return {**wanted, "tmp_path": str(config.writable_folder("tmp_path", needed_by))}


def _prefill_widths(backend_type: str) -> tuple[int, ...]:
    """A fixed-shape backend's prefill module rows (backend.widths.prefill_widths), read once at load; one
    module of any rows elsewhere. An unknown backend_type is left to create_backend's error, which
    names the file that set it."""
    fixed = backend_type in REGISTRY and backend_class(backend_type).caps.fixed_shape
    return prefill_widths() if fixed else (PREFILL_LEN,)


def _int8_activations(config) -> bool:
    """The key as set; only the CPU's int4 lane kernels (precision low) have an int8 path."""
    if config.int8_activations and (config.backend_type != "cpu" or config.precision != "low"):
        raise ConfigError(f"true needs backend_type cpu and precision low (the CPU's int4 kernels quantize "
                          f"activations only there), got {config.backend_type} at precision {config.precision}",
                          path=config.origin("int8_activations"), field="int8_activations")
    return bool(config.int8_activations)


def _kv_quant(config) -> int:
    """attention_mode % 8 as MNN's CPU attention applies it: 1 quantizes keys to int8, 2 keys and
    values; values only with flash attention (attention_mode >= 8), and, with reuse_kv, mode 10
    runs as 9 (MNN's Llm::setRuntimeHint). Only backends with kv_int8 have it."""
    mode = config.attention_mode
    if config.reuse_kv and mode == 10:
        mode = 9
    quant = mode % 8
    if quant == 2 and mode < 8:
        quant = 1
    if quant and not backend_class(config.backend_type).caps.kv_int8:
        have = [name for name in REGISTRY if backend_class(name).caps.kv_int8]
        raise ConfigError(f"{config.attention_mode}: KV cache quantization is not implemented on the "
                          f"{config.backend_type} backend (only on {', '.join(have)}); use a multiple of 8",
                          path=config.origin("attention_mode") or config.origin("quant_qkv"), field="attention_mode")
    return quant
