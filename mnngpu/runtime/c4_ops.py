"""MNN's export-time fused ops (a C4 export: llmexport after MNN 3.6.1, Transformer C4 fusion on)
rewritten at load into the engine's own nodes, so that one decoder-layer path runs both formats.

In a C4 graph a token's hidden state is a row of a [seq, channels, 1, 1] tensor (MNN keeps it
NC4HW4; here every tensor is logical NCHW, so a ConvertTensor is the identity).

* FusedLinear (op 307) runs N 1x1 projections of one input. q/k/v[/z] become one Convolution
  each, which runtime/fusion.py groups into a LinearGroup where the backend has one; gate/up
  (act_silu_mul) become two Convolutions and MUL_SILU(up, gate), a GatedLinear after fusion.
  With has_ln the op first adds its two inputs and normalizes the sum with `ln` (MNN's binary
  RMSNorm), and returns the sum as its last output: one two-output LayerNorm (mnngpu/ops/norm.py).
* RoPE (op 306) takes q and k as [seq, heads*head_dim, 1, 1] and gives (1, seq, heads, head_dim):
  each head normalized by q_norm / k_norm where the table has a gamma, then rotated (rotate-half
  over the first rope_cut_head_dim dims; cos and sin one row per token): a Reshape, a LayerNorm
  and a ROPE node of known split for each of q and k.
* GatedRMSNorm (op 308, a LayerNorm table) takes x [seq*heads, head_dim, 1, 1] (a LinearAttention's
  output) and z [seq, heads*head_dim, 1, 1]: each row of x normed, laid out as z, times silu(z).
  A LayerNorm, a Reshape to z's shape and MUL_SILU.
* LinearAttention with gate_fold computes its decay from input 1 (the `a` projection) itself:
  gate = gate_coef * softplus(a + gate_bias), the exp's argument clamped to [-87, 87]; and beta from
  input 2 as sigmoid(b). Those become ops over constants here, feeding the LinearAttention the
  engine runs (mnngpu/ops/linear_attention.py), which takes gate and beta as inputs.

The other way round, an old export's residual add and the norm after it become the two-output
LayerNorm a has_ln FusedLinear gives (fold_residual_norms), so both formats run the same nodes.

Read from MNN's source (after 3.6.1): source/shape/ShapeFusedProj.cpp,
source/geometry/GeometryFusedProj.cpp, source/core/FusedProjCommon.hpp, source/shape/ShapeAttention.cpp,
source/backend/cpu/CPURoPE.cpp with MNNRoPEComputeBasic in compute/CommonOptFunction.cpp,
source/shape/ShapeGatedRMSNorm.cpp, source/geometry/GeometryGatedRMSNorm.cpp and
source/backend/cpu/CPULinearAttention.cpp.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.format import Net
from mnngpu.format.net import Op
from mnngpu.format.params import BinaryOp, Blob, Reshape, UnaryOp
from mnngpu.ops.rope import ROPE, RoPEParam

EXPORTED_FUSIONS = ("FusedLinear", "RoPE", "GatedRMSNorm")
EXP_CLAMP = 87.0   # MNN clamps the softplus's exp argument to +-this (float32 exp stays finite)


def rewrite_exported_fusions(net: Net) -> Net:
    """The graph (and its expert subgraphs) with every exported fused op as engine nodes, and each
    residual add folded into the norm after it (fold_residual_norms)."""
    tensor_names = list(net.tensor_names)
    # the exported ops first, so that an error names the op by its index in the file
    ops = fold_residual_norms(_rewrite(net, net.ops, tensor_names, "oplists"), tensor_names)
    unchanged = len(ops) == len(net.ops) and all(new is old for new, old in zip(ops, net.ops))
    if unchanged and not any(is_exported_fusion(op) for sub in net.subgraphs for op in sub.ops):
        return net
    subgraphs = []
    for index, sub in enumerate(net.subgraphs):
        names = list(sub.tensor_names)
        subgraphs.append(replace(sub, ops=_rewrite(net, sub.ops, names, f"subgraphs[{index}].nodes"),
                                 tensor_names=names))
    return replace(net, ops=ops, tensor_names=tensor_names, subgraphs=subgraphs)


def _rewrite(net: Net, ops: list[Op], names: list[str], where: str) -> list[Op]:
    widths = _projection_widths(ops)
    out: list[Op] = []
    for position, op in enumerate(ops):
        field = f"{where}[{position}] ({op.name})"
        if op.type == "FusedLinear":
            out += _fused_linear(net, op, names, field)
        elif op.type == "RoPE":
            out += _rope(net, op, names, field, widths)
        elif op.type == "GatedRMSNorm":
            out += _gated_rms_norm(net, op, names, field)
        elif is_exported_fusion(op):   # a LinearAttention with gate_fold
            out += _folded_gate(net, op, names, field)
        else:
            out.append(op)
    return out


def is_exported_fusion(op: Op) -> bool:
    """An op of MNN's newer export format that the loader rewrites (EXPORTED_FUSIONS, gate_fold)."""
    gate_fold = op.type == "LinearAttention" and bool(getattr(op.param, "gate_fold", False))
    return op.type in EXPORTED_FUSIONS or gate_fold


def _projection_widths(ops: list[Op]) -> dict[int, int]:
    """The channels of every tensor a projection (a Convolution or a FusedLinear's) writes."""
    widths = {}
    for op in ops:
        if op.type == "Convolution" and getattr(op.param, "common", None) is not None:
            widths[op.outputs[0]] = op.param.common.outputCount
        elif op.type == "FusedLinear" and op.param is not None and not op.param.act_silu_mul:
            for tensor, conv in zip(op.outputs, op.param.convs or []):
                if conv.common is not None:
                    widths[tensor] = conv.common.outputCount
    return widths


def _new_tensor(names: list[str], name: str) -> int:
    names.append(name)
    return len(names) - 1


def _table(net: Net, op: Op, field: str, table: str):
    """The op's parameter table, which validate requires (inspect reads graphs validate has not seen)."""
    if op.param is None or type(op.param).__name__ != table:
        raise ModelFormatError(f"a {table} parameter table for a {op.type} op, got {op.param_type}",
                               path=net.path, field=field)
    return op.param


def _fused_linear(net: Net, op: Op, names: list[str], field: str) -> list[Op]:
    p = _table(net, op, field, "FusedLinearParam")
    convs = list(p.convs or [])
    projections = 1 if p.act_silu_mul else len(convs)
    if (p.act_silu_mul and len(convs) != 2) or (not p.act_silu_mul and len(convs) not in (3, 4)):
        raise ModelFormatError(f"a FusedLinear of gate and up (2 projections, act_silu_mul) or of q, k, v[, z] "
                               f"(3 or 4), got {len(convs)} projections with act_silu_mul {p.act_silu_mul}",
                               path=net.path, field=field)
    if any(conv.common is None for conv in convs):
        raise ModelFormatError("every FusedLinear projection with its Convolution2DCommon", path=net.path, field=field)
    if len({conv.common.inputCount for conv in convs}) != 1:
        raise ModelFormatError(f"FusedLinear projections over one input of one width, got input widths "
                               f"{[conv.common.inputCount for conv in convs]}", path=net.path, field=field)
    windowed = [i for i, conv in enumerate(convs) if (conv.common.kernelX, conv.common.kernelY, conv.common.strideX,
                                                      conv.common.strideY, conv.common.group) != (1, 1, 1, 1, 1)]
    if windowed:
        raise ModelFormatError(f"FusedLinear projections that are 1x1 linear layers, projection {windowed[0]} "
                               "is not", path=net.path, field=field)
    want_inputs, want_outputs = (2, projections + 1) if p.has_ln else (1, projections)
    if len(op.inputs) != want_inputs or len(op.outputs) != want_outputs or (p.has_ln and p.ln is None):
        raise ModelFormatError(f"a FusedLinear with has_ln {p.has_ln} takes {want_inputs} input(s) and gives "
                               f"{want_outputs} output(s){' and an ln table' if p.has_ln else ''}, got "
                               f"{len(op.inputs)} and {len(op.outputs)}", path=net.path, field=field)
    rewritten, x = [], op.inputs[0]
    if p.has_ln:
        x = _new_tensor(names, f"{op.name}/normed")
        rewritten.append(Op("LayerNorm", f"{op.name}/ln", list(op.inputs), [op.outputs[-1], x], "LayerNorm", p.ln))
    if p.act_silu_mul:
        gate, up = _new_tensor(names, f"{op.name}/gate"), _new_tensor(names, f"{op.name}/up")
        targets = [gate, up]
    else:
        targets = op.outputs[:projections]
    rewritten += [Op("Convolution", name, [x], [target], "Convolution2D", conv, op.default_format, op.external_path)
                  for name, conv, target in zip(projection_names(op, names), convs, targets)]
    if p.act_silu_mul:
        rewritten.append(Op("BinaryOp", f"{op.name}/silu_mul", [up, gate], [op.outputs[0]], "BinaryOp",
                            BinaryOp(opType="MUL_SILU")))
    return rewritten


def projection_names(op: Op, names: list[str]) -> list[str]:
    """A FusedLinear's projections by name: q, k, v[, z] by their outputs (MNN's converter keeps each
    member's op name as its output's); gate and up (one output) as the op's name with #gate, #up."""
    if op.param.act_silu_mul:
        return [f"{op.name}#gate", f"{op.name}#up"]
    return [names[tensor] for tensor in op.outputs[:len(op.param.convs)]]


def _has_gamma(norm) -> bool:
    """MNN applies q_norm / k_norm only where the table carries a gamma (inline or in the weight file)."""
    return norm is not None and ((norm.gamma is not None and len(norm.gamma) > 0) or bool(norm.external))


def _rope(net: Net, op: Op, names: list[str], field: str, widths: dict[int, int]) -> list[Op]:
    p = _table(net, op, field, "RoPEParam")
    if min(p.num_head, p.kv_num_head, p.head_dim) <= 0 or p.head_dim % 2:
        raise ModelFormatError(f"a RoPE with positive num_head, kv_num_head and an even head_dim, got "
                               f"{p.num_head}, {p.kv_num_head} and {p.head_dim}", path=net.path, field=field)
    # as MNN: a cut outside (0, head_dim] rotates the whole head, an odd one rounds down
    rotary = (p.rope_cut_head_dim if 0 < p.rope_cut_head_dim <= p.head_dim else p.head_dim) // 2 * 2
    if rotary == 0:
        raise ModelFormatError(f"a RoPE that rotates at least 2 dims, got rope_cut_head_dim {p.rope_cut_head_dim}",
                               path=net.path, field=field)
    if len(op.inputs) != 4 or len(op.outputs) != 2:
        raise ModelFormatError(f"a RoPE of (q, k, cos, sin) giving (q, k), got {len(op.inputs)} inputs and "
                               f"{len(op.outputs)} outputs", path=net.path, field=field)
    q, k, cos, sin = op.inputs
    for what, tensor, heads in (("num_head", q, p.num_head), ("kv_num_head", k, p.kv_num_head)):
        if widths.get(tensor, heads * p.head_dim) != heads * p.head_dim:
            raise ModelFormatError(f"RoPE {what} x head_dim = {heads} x {p.head_dim}, the width of the projection "
                                   f"'{names[tensor]}' ({widths[tensor]})", path=net.path, field=field)
    rewritten = []
    for tag, x, heads, norm, target in (("q", q, p.num_head, p.q_norm, op.outputs[0]),
                                        ("k", k, p.kv_num_head, p.k_norm, op.outputs[1])):
        heads_view = _new_tensor(names, f"{op.name}/{tag}_heads")
        rewritten.append(Op("Reshape", f"{op.name}/{tag}_heads", [x], [heads_view], "Reshape",
                            Reshape(dims=[1, -1, heads, p.head_dim])))
        if _has_gamma(norm):
            normed = _new_tensor(names, f"{op.name}/{tag}_normed")
            rewritten.append(Op("LayerNorm", f"{op.name}/{tag}_norm", [heads_view], [normed], "LayerNorm", norm))
            heads_view = normed
        rewritten.append(Op(ROPE, f"{op.name}/{tag}", [heads_view, cos, sin], [target], "NONE",
                            RoPEParam(split=rotary // 2, rotary_dim=None if rotary == p.head_dim else rotary)))
    return rewritten


def _gated_rms_norm(net: Net, op: Op, names: list[str], field: str) -> list[Op]:
    _table(net, op, field, "LayerNorm")
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        raise ModelFormatError(f"a GatedRMSNorm of (x, z) giving one output, got {len(op.inputs)} inputs and "
                               f"{len(op.outputs)} outputs",
                               path=net.path, field=field)
    x, z = op.inputs
    normed, z_shape, laid_out = (_new_tensor(names, f"{op.name}/{what}") for what in ("normed", "z_shape", "as_z"))
    return [Op("LayerNorm", f"{op.name}/norm", [x], [normed], "LayerNorm", op.param),
            Op("Shape", f"{op.name}/z_shape", [z], [z_shape], "NONE", None),
            Op("Reshape", f"{op.name}/as_z", [normed, z_shape], [laid_out], "Reshape", Reshape(dims=[])),
            Op("BinaryOp", op.name, [laid_out, z], list(op.outputs), "BinaryOp", BinaryOp(opType="MUL_SILU"))]


def _folded_gate(net: Net, op: Op, names: list[str], field: str) -> list[Op]:
    p = op.param
    heads = p.num_v_heads
    for what, values in (("gate_coef", p.gate_coef), ("gate_bias", p.gate_bias)):
        if values is None or len(values) != heads:
            raise ModelFormatError(f"a LinearAttention with gate_fold and a {what} of num_v_heads ({heads}) values, "
                                   f"got {0 if values is None else len(values)}", path=net.path,
                                   field=f"{field}.{what}")
    if len(op.inputs) != 4:
        raise ModelFormatError(f"a LinearAttention of (qkv, a, b, conv_weight), got {len(op.inputs)} inputs",
                               path=net.path, field=field)
    qkv, a, b, conv_weight = op.inputs
    ops: list[Op] = []

    def constant(what: str, values) -> int:
        tensor = _new_tensor(names, f"{op.name}/{what}")
        array = np.asarray(values, dtype=np.float32)
        dims = [heads, 1, 1] if array.size == heads else []
        ops.append(Op("Const", f"{op.name}/{what}", [], [tensor], "Blob", Blob(dims=dims, float32s=array.reshape(-1))))
        return tensor

    def apply(what: str, op_type: str, param_type: str, param, *inputs: int) -> int:
        tensor = _new_tensor(names, f"{op.name}/{what}")
        ops.append(Op(op_type, f"{op.name}/{what}", list(inputs), [tensor], param_type, param))
        return tensor

    def binary(what: str, kind: str, *inputs: int) -> int:
        return apply(what, "BinaryOp", "BinaryOp", BinaryOp(opType=kind), *inputs)

    def unary(what: str, kind: str, x: int) -> int:
        return apply(what, "UnaryOp", "UnaryOp", UnaryOp(opType=kind), x)

    shifted = binary("gate_in", "ADD", a, constant("gate_bias", p.gate_bias))
    below = binary("gate_clamp_high", "MINIMUM", shifted, constant("exp_max", [EXP_CLAMP]))
    clamped = binary("gate_clamp_low", "MAXIMUM", below, constant("exp_min", [-EXP_CLAMP]))
    exp_plus_one = binary("exp_plus_one", "ADD", unary("exp", "EXP", clamped), constant("one", [1.0]))
    gate = binary("gate", "MUL", constant("gate_coef", p.gate_coef), unary("softplus", "LOG", exp_plus_one))
    beta = unary("beta", "SIGMOID", b)
    given = replace(p, gate_fold=False, gate_coef=None, gate_bias=None)
    ops.append(replace(op, inputs=[qkv, gate, beta, conv_weight], param=given))
    return ops


def fold_residual_norms(ops: list[Op], names: list[str]) -> list[Op]:
    """An old export's residual add and the norm after it as one two-output LayerNorm, as a FusedLinear's
    has_ln becomes: LayerNorm(ADD(a, b)) -> LayerNorm(a, b) giving (a + b, its norm), in the ADD's place.
    The exporter may view the sum through a Reshape before the norm (a block's input); that Reshape
    then views the sum for its other readers, and a copy of it the norm for the norm's."""
    producer = {tensor: op for op in ops for tensor in op.outputs}
    folded: dict[int, Op] = {}     # id(ADD) -> the two-output LayerNorm
    replaced: dict[int, Op | None] = {}   # id(LayerNorm) -> the Reshape of its norm, or None
    for op in ops:
        if op.type != "LayerNorm" or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        view = producer.get(op.inputs[0])
        add = producer.get(view.inputs[0]) if view is not None and view.type == "Reshape" and view.inputs else view
        if add is view:
            view = None
        if (add is None or add.type != "BinaryOp" or getattr(add.param, "opType", None) != "ADD"
                or getattr(add.param, "activationType", 0) or len(add.inputs) != 2
                or add.inputs[0] == add.inputs[1] or id(add) in folded):
            continue
        norm = op.outputs[0] if view is None else _new_tensor(names, f"{op.name}/rows")
        folded[id(add)] = replace(op, inputs=list(add.inputs), outputs=[add.outputs[0], norm])
        replaced[id(op)] = None if view is None else replace(
            view, name=f"{op.name}/view", inputs=[norm, *view.inputs[1:]], outputs=list(op.outputs))
    out = []
    for op in ops:
        if id(op) in folded:
            out.append(folded[id(op)])
        elif id(op) in replaced:
            if replaced[id(op)] is not None:
                out.append(replaced[id(op)])
        else:
            out.append(op)
    return out
