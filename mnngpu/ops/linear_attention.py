"""LinearAttention: MNN's recurrent layer op (type 305, table LinearAttentionParam), which keeps a
state from one forward to the next instead of a KV cache (mnngpu/backend/kv.py's StateCache).

What the exporter (llmexport) writes, and what MNN's CPU kernel reads:

    inputs   0 qkv          (batch, channels, seq): the projection before the causal convolution, or
                            (seq, channels, 1, 1) inside the region MNN's converter lays out for its
                            fused transformer kernels (FuseTransformerC4: a row per token)
             1 gate         (batch, seq, num_v_heads): the delta rule's log-decay (zeros for short_conv)
             2 beta         (batch, seq, num_v_heads): the delta rule's learning rate (zeros for short_conv)
             3 conv_weight  (conv channels, 1, kernel): a depthwise causal convolution, a Const
    output   (batch, seq, num_v_heads, head_v_dim); (seq * num_v_heads, head_v_dim, 1, 1) in that region

Two modes (`attn_type`):

* `short_conv` (LFM2): qkv's channels are three blocks of num_v_heads * head_v_dim, b, c and x.
  y = c * conv(b * x), the convolution running over the previous kernel - 1 values of b * x
  (the state, conv channels x (kernel - 1)) and then this forward's. No activation.
* `gated_delta_rule` (Qwen3.5): qkv's channels are q and k (num_k_heads * head_k_dim each) and v
  (num_v_heads * head_v_dim); a SiLU'd causal convolution over all of them (its state as above),
  then per v head h a (head_k_dim, head_v_dim) state S. v head h reads k head h // (num_v_heads /
  num_k_heads). With use_qk_l2norm, q and k are divided by sqrt(sum of squares + 1e-6); q is then
  scaled by 1 / sqrt(head_k_dim). Per token, with decay exp(gate) and beta:
      S <- exp(gate) * S;  delta = beta * (v - S^T k);  S <- S + k delta^T;  out = S^T q
  A table with gate_fold set (a C4 export: the decay computed inside the op from input 1 with
  gate_coef and gate_bias, beta from input 2) is rewritten at load into this form (runtime/c4_ops.py).

The op has no host rule (it reads and writes its state), so no backend folds it; a device backend
without a kernel declines it (`NO_DEVICE_KERNEL`) and it runs on the CPU backup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, FLOAT, OpType, Shape

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor
    from mnngpu.format.params import LinearAttentionParam

SHORT_CONV, GATED_DELTA_RULE = "short_conv", "gated_delta_rule"
MODES = (SHORT_CONV, GATED_DELTA_RULE)
RUNS = (SHORT_CONV, GATED_DELTA_RULE)   # the modes mnngpu runs
L2_EPSILON = 1e-6   # added to the sum of squares before q and k are normalised
NO_DEVICE_KERNEL = ("LinearAttention has no device kernel yet: it runs on the CPU backup, which keeps its "
                    "recurrent state")
HEAD_FIELDS = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")


def batching_declined(backend_type: str) -> str:
    """Why a batched forward of a model with recurrent layers is refused on a backend whose
    Capabilities.batched_state is off."""
    return f"batching models with recurrent layers (LinearAttention) is not implemented on the {backend_type} backend"


def decline_table(param: LinearAttentionParam) -> tuple[str, str] | None:
    """(field, what was expected) for a table that no LinearAttention can run with, else None."""
    if param.attn_type not in MODES:
        return "attn_type", f"one of {list(MODES)}, got {param.attn_type!r}"
    for name in HEAD_FIELDS:
        if getattr(param, name) < 1:
            return name, f"a positive {name}, got {getattr(param, name)}"
    if param.attn_type == GATED_DELTA_RULE and param.num_v_heads % param.num_k_heads:
        return "num_v_heads", (f"a multiple of num_k_heads ({param.num_k_heads}) for the gated delta rule's "
                               f"grouped heads, got {param.num_v_heads}")
    return None


def decline_mode(param: LinearAttentionParam) -> str | None:
    """Why mnngpu cannot run this table yet, or None."""
    if param.attn_type in RUNS:
        return None
    return f"LinearAttention mode {param.attn_type} is not implemented yet; mnngpu runs {list(RUNS)}"


def qkv_channels(param: LinearAttentionParam) -> int:
    """The channels of input 0: b, c, x for short_conv; q, k, v for the gated delta rule."""
    values = param.num_v_heads * param.head_v_dim
    if param.attn_type == SHORT_CONV:
        return 3 * values
    return 2 * param.num_k_heads * param.head_k_dim + values


def conv_channels(param: LinearAttentionParam) -> int:
    """The channels the causal convolution runs over (the conv_weight's rows, the state's rows)."""
    if param.attn_type == SHORT_CONV:
        return param.num_v_heads * param.head_v_dim
    return qkv_channels(param)


def conv_weight_problem(param: LinearAttentionParam, dims: tuple[int, ...]) -> str | None:
    """What a conv_weight of these dims should have been, or None when it fits the table."""
    channels = conv_channels(param)
    if len(dims) != 3 or dims[0] != channels or dims[1] != 1 or dims[2] < 1:
        return (f"a conv_weight (input 3) of ({channels}, 1, kernel) for {param.attn_type} with num_v_heads "
                f"{param.num_v_heads} x head_v_dim {param.head_v_dim}, got {tuple(dims)}")
    return None


def state_shapes(param: LinearAttentionParam, kernel: int) -> dict[str, tuple[int, ...]]:
    """What one layer's state holds (float32, batch 1): the convolution's last kernel - 1 inputs per
    channel, and for the gated delta rule a (head_k_dim, head_v_dim) matrix per v head."""
    shapes = {"conv": (conv_channels(param), kernel - 1)}
    if param.attn_type == GATED_DELTA_RULE:
        shapes["recurrent"] = (param.num_v_heads, param.head_k_dim, param.head_v_dim)
    return shapes


# The device kernels' (OpenCL, Vulkan) limits: the convolution's window and a column of a head's
# state sit in registers.
DEVICE_MAX_KERNEL = 16
DEVICE_MAX_HEAD_K_DIM = 256


def decline(inputs: list[Tensor], outputs: list[Tensor], node: Node) -> str | None:
    """Why a device LinearAttention kernel cannot run this node, or None."""
    param, shape = node.param, inputs[0].shape
    if not token_rows(shape) and shape[0] != 1:
        return f"LinearAttention over a batch of {shape[0]} sequences (the device kernels take one)"
    if inputs[3].host is None:
        return "a LinearAttention conv_weight computed at run time (the device kernels take a constant)"
    if inputs[3].shape[2] > DEVICE_MAX_KERNEL:
        return f"a convolution of {inputs[3].shape[2]} taps (the device kernels hold at most {DEVICE_MAX_KERNEL})"
    if param.attn_type == GATED_DELTA_RULE and param.head_k_dim > DEVICE_MAX_HEAD_K_DIM:
        return f"head_k_dim {param.head_k_dim} (the device kernels hold at most {DEVICE_MAX_HEAD_K_DIM})"
    return None


def saves_verify_rows(seq: int, prefill_len: int) -> bool:
    """Whether a fixed-shape module of `seq` rows may run a verify block (so its layer keeps what
    rolls the state back): longer than a decode step and shorter than a prefill chunk (any length
    where no prefill chunk is configured)."""
    return seq > 1 and (prefill_len == 0 or seq < prefill_len)


def _error(node: Node, field: str, expected: str) -> ModelFormatError:
    return ModelFormatError(f"LinearAttention: expected {expected}", field=f"{node.name}.{field}")


def token_rows(shape: Shape) -> bool:
    """Whether a qkv input is laid out a row per token, (seq, channels, 1, 1), not (batch, channels, seq)."""
    return len(shape) == 4 and tuple(shape[2:]) == (1, 1)


def linear_attention(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    param = node.param
    problem = decline_table(param)
    if problem is not None:
        raise _error(node, *problem)
    if param.gate_fold:
        raise _error(node, "gate_fold", "a table with gate_fold rewritten at load into the gate and beta it "
                                        "computes (runtime/c4_ops.py) before it runs")
    qkv = inputs[0].shape
    if not (len(qkv) == 3 or token_rows(qkv)) or qkv[1] != qkv_channels(param):
        raise _error(node, "head_v_dim", f"a qkv input (input 0) of (batch, {qkv_channels(param)}, seq) or "
                                         f"(seq, {qkv_channels(param)}, 1, 1) for {param.attn_type} with these "
                                         f"head dims, got {qkv}")
    weight_problem = conv_weight_problem(param, inputs[3].shape)
    if weight_problem is not None:
        raise _error(node, "head_v_dim", weight_problem)
    if token_rows(qkv):
        return [((qkv[0] * param.num_v_heads, param.head_v_dim, 1, 1), FLOAT)]
    return [((qkv[0], qkv[2], param.num_v_heads, param.head_v_dim), FLOAT)]


ROWS = {
    "LinearAttention": OpType(linear_attention, param="LinearAttentionParam", param_required=ALWAYS, min_inputs=4),
}
