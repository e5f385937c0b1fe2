"""LinearAttention on the Vulkan device (shaders/vulkan/linear_attention_*.comp): LFM2's short
convolution and Qwen3.5's gated delta rule, the state kept on the device (state.py's
VulkanStateCache).

The dispatches are recorded once per module. A forward's token loop runs inside them, parallel
over channels and over state columns. What changes from step to step (the real rows, KVMeta
`add`, and whether to save them for a rollback) the host writes into this execution's small
control buffer before the submit.

A verify forward (KVMeta `verify`) keeps the state from before it and its real rows; when the
next forward removes some of them, the state is put back and the kept rows run again through the
same kernels, recorded once into a segment of their own over the saved rows and submitted at
once. Only modules shorter than a prefill chunk (the verify module, and the short prefill modules,
which its rows cannot tell apart) have room to save rows, all of them the same room
(backend.widths.saved_rows_room).
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend.kv import begin_state_forward
from mnngpu.backend.widths import saved_rows_room
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.program import CommandSegment, Dispatch, grid, pack_push
from mnngpu.backends.vulkan.state import VulkanStateCache, adopt
from mnngpu.errors import MnnGpuError
from mnngpu.ops import linear_attention
from mnngpu.ops.linear_attention import (
    GATED_DELTA_RULE,
    conv_channels,
    saves_verify_rows,
    state_shapes,
    token_rows,
)

FLOAT32 = np.dtype(np.float32)


class VulkanLinearAttention(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return linear_attention.decline(inputs, outputs, node)

    def onResize(self, inputs, outputs):
        backend, param, shape = self.backend, self.node.param, inputs[0].shape
        self.delta_rule = param.attn_type == GATED_DELTA_RULE
        rows_first = token_rows(shape)   # (seq, channels, 1, 1), else (1, channels, seq)
        self.seq, self.channels = (shape[0], shape[1]) if rows_first else (shape[2], shape[1])
        self.kernel = inputs[3].shape[2]
        self.state: VulkanStateCache = adopt(backend, self.node.name, state_shapes(param, self.kernel))
        self.weight = backend._constant(np.asarray(inputs[3].host, dtype=FLOAT32).reshape(-1))
        self.control = backend._new_buffer(16, np.int32, backend.step_arena)   # uint rows, save
        self.saves = saves_verify_rows(self.seq, backend.config.prefill_len)
        if self.saves:
            room = saved_rows_room(self.seq, backend.config.prefill_widths)
            self.state.room_for_rows(room, self._row_widths())
        self.bound_saved = self.state.saved if self.saves else None
        saved = list(self.bound_saved.values()) if self.saves else None
        out = outputs[0].device = backend._new_tensor(outputs[0])
        strides = (self.channels, 1) if rows_first else (1, self.seq)
        for dispatch in self.dispatches(inputs[0].device, strides, inputs[1].device, inputs[2].device, out,
                                        self.seq, self.control, saved):
            self.segment = backend._record(dispatch)
        self.replay: CommandSegment | None = None   # the kept rows of a verify block again, recorded at the first rollback
        self.replay_saved: dict | None = None
        self.replay_control = None

    def _row_widths(self) -> dict[str, int]:
        heads = self.node.param.num_v_heads
        return {"qkv": self.channels, **({"gate": heads, "beta": heads} if self.delta_rule else {})}

    def dispatches(self, qkv, strides, gate, beta, out, seq: int, control, saved: list | None) -> list[Dispatch]:
        """The kernels over `seq` rows of these inputs into `out`, steered by `control` (None
        saved: this module never saves rows)."""
        param, backend = self.node.param, self.backend
        device = backend.device
        saved = saved or [backend.placeholder] * len(self._row_widths())
        state = self.state.parts

        def dispatch(name: str, bindings: list, push: bytes, items: int, writes: tuple[int, ...]) -> Dispatch:
            counts = grid(element_groups(items), device.max_groups)
            return Dispatch(device.kernel(name, len(bindings)), bindings, push, counts, writes)

        if not self.delta_rule:
            channels = conv_channels(param)
            push = pack_push("6I", *strides, channels, seq, self.kernel, 0)
            return [dispatch("linear_attention_conv_short", [qkv, self.weight, state["conv"], out, saved[0], control],
                             push, channels, (2, 3, 4))]
        heads, keys, k_dim = param.num_v_heads, param.num_k_heads, param.head_k_dim
        mixed = backend._scratch(seq * self.channels * FLOAT32.itemsize)
        backend._materialize(mixed)
        conv_push = pack_push("6I", *strides, self.channels, seq, self.kernel, heads)
        norm_push = pack_push("5I", self.channels, keys, seq, k_dim, int(bool(param.use_qk_l2norm)))
        delta_push = pack_push("6I", self.channels, heads, param.head_v_dim, keys, seq, k_dim)
        return [
            dispatch("linear_attention_conv_silu", [qkv, self.weight, state["conv"], mixed, saved[0], control, gate,
                                                    beta, saved[1], saved[2]], conv_push, self.channels,
                     (2, 3, 4, 8, 9)),
            dispatch("linear_attention_qk_norm", [mixed], norm_push, seq * 2 * keys, (0,)),
            dispatch("linear_attention_delta", [mixed, gate, beta, state["recurrent"], out, control], delta_push,
                     heads * param.head_v_dim, (3, 4)),
        ]

    def onExecute(self, inputs, outputs):
        meta, state = self.backend.kv_meta, self._current_state()
        rows, save = begin_state_forward(state, meta, self.node.name, self.seq, self._take_back)
        if save:
            if self.bound_saved is None or self.bound_saved is not state.saved:
                raise MnnGpuError(f"LinearAttention {self.node.name}: a verify block of {self.seq} rows on vulkan "
                                  "(only modules shorter than a prefill chunk keep the rows that roll it back)")
            state.remember(rows)
        else:
            state.forget()
        self.control.write(np.array([rows, int(save), 0, 0], dtype=np.int32))
        super().onExecute(inputs, outputs)

    def _current_state(self) -> VulkanStateCache:
        """The state bound into the recorded commands, which must be the one the backend's
        `state_caches` hold now (the prefix cache writes into it in place)."""
        if self.backend.state_caches.get(self.node.name) is not self.state:
            raise MnnGpuError(f"LinearAttention {self.node.name}: the vulkan backend's recorded commands hold one "
                              "sequence's recurrent state; running another sequence needs them recorded again",
                              field="backend_type")
        return self.state

    def _take_back(self, dropped: int) -> None:
        """Put the state back to before the last verify forward, then run its kept rows again."""
        state = self.state
        kept = state.undo_rows - dropped
        state.restore()
        if not kept:
            return
        if self.replay_saved is not state.saved:
            self._record_replay()
        self.replay_control.write(np.array([kept, 0, 0, 0], dtype=np.int32))
        self.backend.device.submit([self.replay.command_buffer])

    def _record_replay(self) -> None:
        """The kernels over the saved rows (laid out (rows, width)), their output unused."""
        backend, saved, capacity = self.backend, self.state.saved, self.state.saved_rows
        out_width = self.node.param.num_v_heads * self.node.param.head_v_dim
        unused = backend._new_buffer(capacity * out_width * FLOAT32.itemsize, FLOAT32)
        self.replay_control = backend._new_buffer(16, np.int32, backend.step_arena)
        self.replay = CommandSegment()
        for dispatch in self.dispatches(saved["qkv"], (self.channels, 1), saved.get("gate"), saved.get("beta"),
                                        unused, capacity, self.replay_control, None):
            self.replay.add(dispatch)
        self.replay.record(backend.device, backend.command_pool, backend.descriptors)
        self.replay_saved = saved


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LinearAttention": VulkanLinearAttention}
