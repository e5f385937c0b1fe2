"""LinearAttention on the OpenCL device (shaders/opencl/linear_attention.cl): LFM2's short
convolution and Qwen3.5's gated delta rule, the state kept on the device (state.py's CLStateCache).

The kernels are prepared once per module. A forward's token loop runs inside them, parallel over
channels and over state columns. Only the real rows (KVMeta `add`) and whether to save them for a
rollback change from step to step: two scalar arguments set before the enqueue.

A verify forward (KVMeta `verify`) keeps the state from before it and its real rows; when the
next forward removes some of them, the state is put back and the kept rows run again through the
same kernels, bound to the saved rows. Only modules shorter than a prefill chunk (the verify
module, and the short prefill modules, which its rows cannot tell apart) have room to save rows, all
of them the same room (backend.widths.saved_rows_room); a prefill chunk or decode step is never a
verify block.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from mnngpu.backend.kv import begin_state_forward
from mnngpu.backend.widths import saved_rows_room
from mnngpu.backends.opencl.ops.base import Launch, OpenCLExecution
from mnngpu.backends.opencl.state import CLStateCache, adopt
from mnngpu.errors import MnnGpuError
from mnngpu.ops import linear_attention
from mnngpu.ops.linear_attention import (
    GATED_DELTA_RULE,
    conv_channels,
    saves_verify_rows,
    state_shapes,
    token_rows,
)

SOURCE = "linear_attention.cl"


class OpenCLLinearAttention(OpenCLExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return linear_attention.decline(inputs, outputs, node)

    def plan(self, inputs, outputs):
        param, shape = self.node.param, inputs[0].shape
        self.delta_rule = param.attn_type == GATED_DELTA_RULE
        rows_first = token_rows(shape)   # (seq, channels, 1, 1), else (1, channels, seq)
        self.seq, self.channels = (shape[0], shape[1]) if rows_first else (shape[2], shape[1])
        self.strides = (self.channels, 1) if rows_first else (1, self.seq)
        kernel = inputs[3].shape[2]
        self.shapes = state_shapes(param, kernel)
        self.state = adopt(self.backend, self.node.name, self.shapes)
        self.weight = self.backend.device.constant(np.asarray(inputs[3].host, dtype=np.float32).reshape(-1))
        self.defines = {"KERNEL": kernel, "HEAD_K_DIM": param.head_k_dim, **({"L2NORM": 1} if param.use_qk_l2norm
                                                                               else {})}
        self.saves = saves_verify_rows(self.seq, self.backend.config.prefill_len)
        if self.saves:
            self.state.room_for_rows(self._saved_rows(), self._row_widths())
        self.launches_for(inputs[0], self.strides, inputs[1], inputs[2], outputs[0], self.seq,
                          self._saved_args() if self.saves else None)
        self.replay: list[Launch] = []   # the kept rows of a verify block again, prepared at the first rollback
        self.replay_saved: dict | None = None   # the saved-row buffers `replay` reads

    def _saved_rows(self) -> int:
        return saved_rows_room(self.seq, self.backend.config.prefill_widths)

    def _row_widths(self) -> dict[str, int]:
        heads = self.node.param.num_v_heads
        return {"qkv": self.channels, **({"gate": heads, "beta": heads} if self.delta_rule else {})}

    def _saved_args(self) -> list:
        return [self.state.saved[name] for name in self._row_widths()]

    def launches_for(self, qkv, strides, gate, beta, out, seq: int, saved: list | None) -> None:
        """Prepare the kernels over `seq` rows of these inputs into `out` (None: rows not saved)."""
        param, backend = self.node.param, self.backend
        ints = [np.int32(n) for n in strides]
        saved = saved or [backend.placeholder] * len(self._row_widths())
        state = self.state.parts
        if not self.delta_rule:
            channels = conv_channels(param)
            self.prepare(SOURCE, "short_conv", [qkv, *ints, self.weight, state["conv"], out, np.int32(channels),
                                                np.int32(seq), np.int32(0), saved[0], np.int32(0)],
                         (channels,), defines=self.defines)
            return
        heads, keys = param.num_v_heads, param.num_k_heads
        mixed = backend._scratch(seq * self.channels * 4 // backend.float_storage.itemsize)
        self.prepare(SOURCE, "conv_silu", [qkv, *ints, self.weight, state["conv"], mixed, np.int32(self.channels),
                                           np.int32(seq), np.int32(0), saved[0], np.int32(0), gate, beta,
                                           np.int32(heads), saved[1], saved[2]],
                     (self.channels,), defines=self.defines)
        self.prepare(SOURCE, "qk_norm", [mixed, np.int32(self.channels), np.int32(keys), np.int32(seq)],
                     (seq * 2 * keys,), defines=self.defines)
        self.prepare(SOURCE, "delta_rule", [mixed, np.int32(self.channels), gate, beta, state["recurrent"], out,
                                            np.int32(heads), np.int32(param.head_v_dim), np.int32(keys),
                                            np.int32(seq), np.int32(0)],
                     (heads * param.head_v_dim,), defines=self.defines)

    def onExecute(self, inputs, outputs):
        meta, state = self.backend.kv_meta, self._current_state()
        rows, save = begin_state_forward(state, meta, self.node.name, self.seq, self._take_back)
        if save:
            if not self.saves:
                raise MnnGpuError(f"LinearAttention {self.node.name}: a verify block of {self.seq} rows on opencl "
                                  "(only modules shorter than a prefill chunk keep the rows that roll it back)")
            state.remember(rows)
        else:
            state.forget()
        self._enqueue(self.launches, rows, save)

    def _current_state(self) -> CLStateCache:
        """The state of the sequence the backend runs now (its `state_caches`), bound to the kernels."""
        state = adopt(self.backend, self.node.name, self.shapes)
        if state is not self.state:
            self.state = state
            if self.saves:
                state.room_for_rows(self._saved_rows(), self._row_widths())
            for launch in self.launches:   # every kernel takes its state part as argument 4
                name = "recurrent" if launch.kernel.function_name == "delta_rule" else "conv"
                if launch.kernel.function_name != "qk_norm":
                    launch.kernel.set_arg(4, state.parts[name])
            self.replay_saved = None
        return state

    def _enqueue(self, launches: list[Launch], rows: int, save: bool) -> None:
        queue = self.backend.queue
        for launch in launches:
            self._set_step_args(launch, rows, save)
            cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.global_size, launch.local_size)

    def _set_step_args(self, launch: Launch, rows: int, save: bool) -> None:
        """This step's real rows, and whether the conv kernel saves them (into the state's current
        saved-row buffers, which a longer verify module may have grown since this one was planned)."""
        kernel = launch.kernel
        if kernel.function_name == "delta_rule":
            kernel.set_arg(10, np.int32(rows))
        elif kernel.function_name in ("short_conv", "conv_silu"):
            kernel.set_arg(8, np.int32(rows))
            kernel.set_arg(10, np.int32(save))
            if save:
                saved = self._saved_args()
                for index, buffer in zip((9, 14, 15), saved):
                    kernel.set_arg(index, buffer)

    def _take_back(self, dropped: int) -> None:
        """Put the state back to before the last verify forward, then run its kept rows again."""
        state: CLStateCache = self.state
        kept = state.undo_rows - dropped
        state.restore()
        if not kept:
            return
        if self.replay_saved is not state.saved:   # none yet, grown, or another sequence's
            self._prepare_replay()
        self._enqueue(self.replay, kept, False)

    def _prepare_replay(self) -> None:
        """Kernels over the saved rows (laid out (rows, width)), their output unused."""
        saved, capacity = self.state.saved, self.state.saved_rows
        out_width = self.node.param.num_v_heads * self.node.param.head_v_dim
        unused = self.backend.device.buffer(capacity * out_width * self.backend.float_storage.itemsize)
        main, self.launches = self.launches, []
        self.launches_for(saved["qkv"], (self.channels, 1), saved.get("gate"), saved.get("beta"), unused,
                          capacity, None)
        self.replay, self.launches = self.launches, main
        self.replay_saved = saved
        for launch in self.replay:
            launch.kernel.set_args(*launch.args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LinearAttention": OpenCLLinearAttention}
