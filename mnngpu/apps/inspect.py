"""`mnngpu inspect`: what a model folder holds, read from its graph, weights and config.

It loads no model: a config value mnngpu does not compute (which `load` rejects) is listed, not
raised, so inspect describes any folder MNN's exporter writes.

`inspect_model` returns plain JSON-ready data; `format_inspect_table` renders it for a
terminal. Model facts come from the graph where it states them (the lm_head's shape,
the attention reshapes), from llm_config.json otherwise.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from mnngpu.apps.families import family_facts
from mnngpu.backend import registry
from mnngpu.config import LlmConfig
from mnngpu.engine.embedding_model import model_kind
from mnngpu.errors import ModelFormatError
from mnngpu.format import Net, Op, read_net
from mnngpu.format.quant import QuantizedLinear, read_linear
from mnngpu.format.weights import WeightFile
from mnngpu.ops import op_table
from mnngpu.ops.routing import SPARSE_MOE
from mnngpu.runtime.c4_ops import is_exported_fusion, rewrite_exported_fusions
from mnngpu.runtime.moe import moe_param
from mnngpu.runtime.validate import needed_ops


def inspect_model(path: str | os.PathLike) -> dict[str, Any]:
    """Facts about the model in `path` (its folder, or its config.json)."""
    config = LlmConfig.load(path, check_support=False)
    net = read_net(config.model_path)
    runs = _as_loaded(net)
    weight_path = Path(config.weight_path)
    weights = WeightFile(weight_path) if weight_path.is_file() else None
    linears = _linears(runs, weights)
    return {
        "path": str(config.base_dir),
        "mnn_version": net.version,
        **model_kind(net, config.get("model_type")),
        "model": _model_facts(runs, config, linears),
        "files": _file_sizes(Path(config.base_dir)),
        "weight_bytes": weights.size if weights is not None else 0,
        "quant": _quant_facts(linears, has_lm_head(net)),
        "ops": dict(sorted(Counter(op.type for op in net.ops).items())),
        "n_ops": len(net.ops),
        "n_subgraphs": len(net.subgraphs),
        "rewritten": _rewritten_ops(net, runs),
        "moe": moe_facts(net, weights.size if weights is not None else 0),
        "family": family_facts(config.get("model_type")),
        "support": op_support(net),
        "unsupported_keys": [{"key": error.field, "path": error.path, "error": str(error)}
                             for error in config.unsupported()],
        "modules": extra_modules(config),
    }


# An Omni's modules besides llm.mnn: (config flag, role, config key of the graph, MNN's default file)
EXTRA_MODULES = (("is_visual", "vision", "visual_model", "visual.mnn"),
                 ("is_audio", "audio", "audio_model", "audio.mnn"),
                 ("has_talker", "talker", "talker_model", "talker.mnn"))


def extra_modules(config: LlmConfig) -> list[dict[str, Any]]:
    """The vision, audio and talker graphs the config names, each with its inputs and op support."""
    modules = []
    for flag, role, key, default in EXTRA_MODULES:
        if not config.get(flag):
            continue
        path = Path(config.base_dir) / config.get(key, default)
        facts: dict[str, Any] = {"role": role, "file": path.name, "present": path.is_file(),
                                 "runs": role in ("vision", "audio")}
        if facts["present"]:
            net = read_net(path)
            weight = path.with_name(path.name + ".weight")
            facts.update(n_ops=len(net.ops), inputs=[op.name for op in net.ops if op.type == "Input"],
                         weight_bytes=weight.stat().st_size if weight.is_file() else 0, support=op_support(net))
        modules.append(facts)
    return modules


def placement_on(path: str | os.PathLike, overrides: dict[str, Any]):
    """The model loaded with `overrides` (backend_type, ...) and its PlacementTable: where every
    op runs, and why the backend declined each op that falls back to the CPU."""
    from mnngpu import llm

    model = llm.create(path)
    model.set_config(overrides)
    model.load()
    return model.runtime.describe(), model.placement()


def placement_rows(table) -> list[dict[str, str]]:
    return [{"node": p.node, "op_type": p.op_type, "backend": p.backend, "reason": p.reason}
            for p in table.entries.values()]


def _as_loaded(net: Net) -> Net:
    """The graph as the engine loads it (a C4 export's fused ops rewritten); the file's graph where
    a damaged fused op stops that (loading names the op)."""
    try:
        return rewrite_exported_fusions(needed_ops(net))
    except ModelFormatError:
        return net


def _rewritten_ops(net: Net, runs: Net) -> dict[str, dict[str, int]] | None:
    """The newer export format's fused ops the file has, and the engine ops they become at load
    (runtime/c4_ops.py), by type; None for a file without them."""
    had = Counter(op.type for op in net.ops if is_exported_fusion(op))
    if not had:
        return None
    made, before = Counter(op.type for op in runs.ops), Counter(op.type for op in net.ops)
    return {"file": dict(sorted(had.items())),
            "engine": dict(sorted((kind, made[kind] - before.get(kind, 0)) for kind in made
                                  if made[kind] > before.get(kind, 0)))}


def _linears(net: Net, weights: WeightFile | None) -> list[QuantizedLinear]:
    """Every linear layer, a MoE export's experts (in its subgraphs) included."""
    return [read_linear(weights, op.param, op.name) for graph in [net, *net.subgraphs] for op in graph.ops
            if op.type == "Convolution" and op.param_type == "Convolution2D"]


def moe_facts(net: Net, weight_bytes: int) -> dict[str, Any] | None:
    """A MoE export's experts: how many run per token, the weight bytes a decode step reads where
    only those run, and the backends that run only those (their op table has the sparse node,
    SPARSE_MOE) and those that run every expert, reading the file whole. None for a model without
    MoE ops."""
    moe_ops = [(position, op) for position, op in enumerate(net.ops) if op.type == "MoE"]
    if not moe_ops:
        return None
    by_name = {graph.name: graph for graph in net.subgraphs}
    expert_bytes = chosen_bytes = 0.0
    params = [moe_param(net, op, f"oplists[{position}] ({op.name})") for position, op in moe_ops]
    for param in params:
        layer = sum(_stored_bytes(sub_op) for expert in range(param.num_experts)
                    for sub_op in by_name[f"/expert/{param.layer_id}_{expert}"].ops if sub_op.type == "Convolution")
        expert_bytes += layer
        chosen_bytes += layer * param.top_k / param.num_experts
    first = params[0]
    tables = {backend: table for backend, table in registry.backend_op_tables().items() if table is not None}
    return {"layers": len(params), "num_experts": first.num_experts, "top_k": first.top_k,
            "expert_bytes": int(expert_bytes), "bytes_per_token": int(weight_bytes - expert_bytes + chosen_bytes),
            "sparse_backends": [backend for backend, table in tables.items() if SPARSE_MOE in table],
            "dense_backends": [backend for backend, table in tables.items() if SPARSE_MOE not in table]}


def _stored_bytes(op: Op) -> int:
    """The weight file bytes of a Convolution: its codes, alpha and bias (`external` sizes)."""
    external = getattr(op.param, "external", None) or []
    return int(sum(external[1:4]))


def _file_sizes(folder: Path) -> dict[str, int]:
    return {entry.name: entry.stat().st_size for entry in sorted(folder.iterdir()) if entry.is_file()}


# --- model shape -----------------------------------------------------------------------

def _model_facts(net: Net, config: LlmConfig, linears: list[QuantizedLinear]) -> dict[str, Any]:
    lm_head = _lm_head(linears, has_lm_head(net))
    heads, head_dim = _attention_heads(net, 0)
    kv_heads, _ = _attention_heads(net, 1)
    kinds = layer_kinds(net)
    return {
        "type": config.get("model_type"),
        "hidden_size": lm_head.ic if lm_head is not None else config.get("hidden_size"),
        "layers": len(kinds) or config.get("layer_nums"),
        "linear_layers": sum(kind != ATTENTION for kind in kinds),
        "layer_kinds": kinds,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": lm_head.oc if lm_head is not None else None,
        "embeddings": _embedding_source(config),
    }


ATTENTION = "attention"   # a layer_kinds entry: softmax attention over a KV cache (full or sliding)
# LinearAttention's modes (mnngpu/ops/linear_attention.py), as the table names them
LINEAR_KINDS = {"gated_delta_rule": "Gated DeltaNet", "short_conv": "short convolution"}


def layer_kinds(net: Net) -> list[str]:
    """Each decoder layer's token mixer, in graph order: ATTENTION, or a LinearAttention op's
    attn_type (a layer with a recurrent state instead of a KV cache). The exporter writes one such
    op per layer, so they count the layers whichever kind they are."""
    return [ATTENTION if op.type == "Attention" else str(getattr(op.param, "attn_type", None) or "linear attention")
            for op in net.ops if op.type in ("Attention", "LinearAttention")]


def describe_layer_kinds(kinds: list[str]) -> str:
    """`0-2, 4-6 Gated DeltaNet; 3, 7 attention`: which layers are of which kind."""
    parts = []
    for kind in dict.fromkeys(kinds):
        indices = [i for i, k in enumerate(kinds) if k == kind]
        runs, start = [], indices[0]
        for previous, index in zip(indices, [*indices[1:], None]):
            if index != previous + 1:
                runs.append(str(start) if start == previous else f"{start}-{previous}")
                start = index
        parts.append(f"{', '.join(runs)} {LINEAR_KINDS.get(kind, kind)}")
    return "; ".join(parts)


def _embedding_source(config: LlmConfig) -> str:
    """Where the embedding rows come from: tied to the lm_head, or which file in what format."""
    tie = config.tie_embeddings
    if tie is None:
        return f"{Path(config.embedding_path).name} (bf16)"
    kind = f"int{tie[3]}, {'channel-wise' if tie[4] == 0 else f'block {tie[4]}'}"
    if tie[0] != 0:
        return f"tied to the lm_head in {Path(config.weight_path).name} ({kind})"
    return f"{Path(config.embedding_rows_path).name} ({kind})"


def has_lm_head(net: Net) -> bool:
    """An LLM's graph ends in the lm_head (its logits); an embedding model's does not."""
    return "logits" in net.output_names


def _lm_head(linears: list[QuantizedLinear], has_head: bool = True) -> QuantizedLinear | None:
    if not has_head:
        return None
    named = [lin for lin in linears if "lm_head" in lin.name]
    if named:
        return named[-1]
    return linears[-1] if linears else None


def _attention_heads(net: Net, input_slot: int) -> tuple[int | None, int | None]:
    """(heads, head_dim) of the first Attention op's q (slot 0) or k (slot 1) input.

    The exporter reshapes each projection to [batch, seq, heads, head_dim] a few ops
    (RoPE, q/k norm) before the Attention op, so the nearest upstream Reshape tells both.
    """
    attention = next((op for op in net.ops if op.type == "Attention" and len(op.inputs) > input_slot), None)
    if attention is None:
        return None, None
    producers = {tensor: op for op in net.ops for tensor in op.outputs}
    frontier, seen = [attention.inputs[input_slot]], set()
    for _ in range(8):
        upstream = []
        for tensor in frontier:
            op = producers.get(tensor)
            if op is None or tensor in seen:
                continue
            seen.add(tensor)
            dims = _reshape_target(op, producers) if op.type == "Reshape" else None
            if dims is not None and len(dims) == 4 and all(isinstance(d, int) and d > 0 for d in dims[2:]):
                return dims[2], dims[3]
            upstream.extend(op.inputs)
        frontier = upstream
    return None, None


def _reshape_target(op: Op, producers: dict[int, Op]) -> list[int | None] | None:
    if op.param is not None and getattr(op.param, "dims", None):
        return list(op.param.dims)
    if len(op.inputs) < 2:
        return None
    shape_op = producers.get(op.inputs[1])
    if shape_op is None:
        return None
    if shape_op.type == "Concat":
        return [_constant_scalar(tensor, producers) for tensor in shape_op.inputs]
    return _constant_values(shape_op)


def _constant_scalar(tensor: int, producers: dict[int, Op]) -> int | None:
    op = producers.get(tensor)
    while op is not None and op.type in ("Unsqueeze", "Squeeze", "Cast") and op.inputs:
        op = producers.get(op.inputs[0])
    values = _constant_values(op) if op is not None else None
    return values[0] if values is not None and len(values) == 1 else None


def _constant_values(op: Op) -> list[int] | None:
    if op.type != "Const" or op.param_type != "Blob" or op.param.dataType not in ("DT_INT32", "DT_INT64"):
        return None
    if op.param.external:
        return None
    return [int(v) for v in op.param.array().reshape(-1)]


# --- what runs where ------------------------------------------------------------------

def op_support(net: Net) -> dict[str, Any]:
    """Which backends run each op type of the graph (subgraphs included), by op type alone (an op
    the loader rewrites, MoE, by the node type that runs it):
    from the op table, before any load. A backend lacking an op the CPU runs falls back to the
    CPU for it; `inspect --backend` shows the per-node placement of a real load. A backend whose
    Python package is not installed here (its module cannot load, or its driver binding, which it
    imports only when it starts, is missing) is not available: `missing` names the package."""
    counts = Counter(op.type for graph in [net, *net.subgraphs] for op in graph.ops
                     if op.type not in op_table.SOURCES)
    tables = registry.backend_op_tables()
    known = op_table.graph_op_types()
    runs_as = {name: (op_table.OPS[name].runs_as or name) if name in known else name for name in counts}
    ops = {name: {"count": count, "host": name in known and op_table.OPS[name].shape_only,
                  "backends": [b for b, table in tables.items() if table is not None and runs_as[name] in table]}
           for name, count in sorted(counts.items())}
    unsupported = [name for name in ops if name not in known]
    cpu = tables.get("cpu") or frozenset()
    backends = {}
    for backend_type, table in tables.items():
        missing = registry.missing_package(backend_type)
        if table is None or missing is not None:
            backends[backend_type] = {"available": False, "missing": missing or registry.DRIVER_PACKAGES.get(backend_type),
                                      "cpu_fallback": [], "unsupported": unsupported}
            continue
        fallback = [name for name, op in ops.items()
                    if name in known and not op["host"] and runs_as[name] not in table and runs_as[name] in cpu]
        backends[backend_type] = {"available": True, "missing": None, "cpu_fallback": fallback,
                                  "unsupported": unsupported}
    return {"all_supported": not unsupported, "unsupported": unsupported, "ops": ops, "backends": backends}


# --- quantization ----------------------------------------------------------------------

def _quant_facts(linears: list[QuantizedLinear], has_head: bool = True) -> dict[str, Any]:
    layers = [_layer_quant(lin) for lin in linears]
    lm_head = _lm_head(linears, has_head)
    body = [entry for entry, lin in zip(layers, linears) if lin is not lm_head] or layers
    return {
        "layers": layers,
        "summary": _summarize(body),
        "lm_head": _summarize([layers[next(i for i, lin in enumerate(linears) if lin is lm_head)]])
        if lm_head is not None else None,
    }


def _layer_quant(lin: QuantizedLinear) -> dict[str, Any]:
    return {"name": lin.name, "bits": lin.bits, "block": lin.block_size, "n_blocks": lin.n_blocks,
            "symmetric": lin.symmetric, "oc": lin.oc, "ic": lin.ic}


def _summarize(layers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One line for a set of layers. block 0 = channel-wise; otherwise the export's block size
    (a layer no wider than a block shows as one block, and the exporter halves a block that does
    not divide a layer's width: once any layer has several blocks, the widest block is the one
    it was given)."""
    if not layers:
        return None
    bits = sorted({layer["bits"] for layer in layers})
    symmetric = sorted({layer["symmetric"] for layer in layers})
    blocked = any(layer["n_blocks"] > 1 for layer in layers)
    block = max(layer["block"] for layer in layers) if blocked else 0
    return {"bits": bits[0] if len(bits) == 1 else bits, "block": block,
            "symmetric": symmetric[0] if len(symmetric) == 1 else None,
            "mixed": len(bits) > 1 or len(symmetric) > 1, "count": len(layers)}


def describe_quant(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "none"
    bits = summary["bits"]
    if isinstance(bits, list):
        kind = "mixed " + "/".join(_bits_name(b) for b in bits)
    else:
        kind = _bits_name(bits)
    if isinstance(bits, int) and bits > 8:
        return kind
    block = "channel-wise" if summary["block"] == 0 else f"block {summary['block']}"
    sym = {True: "symmetric", False: "asymmetric", None: "mixed symmetry"}[summary["symmetric"]]
    return f"{kind}, {block}, {sym}"


def _bits_name(bits: int) -> str:
    return {16: "fp16", 32: "fp32"}.get(bits, f"int{bits}")


# --- text rendering --------------------------------------------------------------------

def format_inspect_table(info: dict[str, Any]) -> str:
    """A terminal rendering of `inspect_model`'s result."""
    rows = [("model", _model_line(info["model"])), ("written by", f"MNN {info['mnn_version'] or '?'}")]
    if info.get("kind") == "embedding":
        rows.append(("kind", f"embedding model: {info['pooling']}"))
    quant = info["quant"]
    quant_line = f"{describe_quant(quant['summary'])} ({quant['summary']['count'] if quant['summary'] else 0} layers)"
    if quant["lm_head"] is not None:
        quant_line += f"; lm_head {describe_quant(quant['lm_head'])}"
    rows.append(("weights", f"{_size(info['weight_bytes'])}, {quant_line}"))
    for i, (name, size) in enumerate(info["files"].items()):
        rows.append(("files" if i == 0 else "", f"{name:<24} {_size(size):>10}"))
    rows.append(("graph", f"{info['n_ops']} ops, {info['n_subgraphs']} subgraphs"))
    by_count = sorted(info["ops"].items(), key=lambda item: (-item[1], item[0]))
    for i in range(0, len(by_count), 3):
        rows.append(("", "   ".join(f"{name:<14}{count:>5}" for name, count in by_count[i: i + 3])))
    rewritten = info.get("rewritten")
    if rewritten:
        had = ", ".join(f"{name} {count}" for name, count in rewritten["file"].items())
        made = ", ".join(f"{name} {count}" for name, count in rewritten["engine"].items())
        rows.append(("fused ops", f"the file's {had} (MNN's newer export) run as {made}"))
    if info.get("moe"):
        rows.append(("experts", _moe_line(info["moe"], info["weight_bytes"])))
    rows.extend(_support_rows(info["family"], info["support"]))
    rows.extend(_module_rows(info.get("modules", [])))
    keys = info["unsupported_keys"]
    rows.extend(("config" if i == 0 else "", f"NOT SUPPORTED: {key['error']}") for i, key in enumerate(keys))
    if not keys:
        rows.append(("config", "every key's value is supported"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}".rstrip() for label, text in rows)


def _support_rows(family: dict[str, Any], support: dict[str, Any]) -> list[tuple[str, str]]:
    state = "supported" if family["supported"] else "NOT SUPPORTED"
    rows = [("family", f"{family['model_type'] or '?'}: {state}; {family['note']}")]
    if support["all_supported"]:
        rows.append(("ops", f"all {len(support['ops'])} op types are supported"))
    else:
        names = ", ".join(f"{name} ({support['ops'][name]['count']})" for name in support["unsupported"])
        rows.append(("ops", f"NOT SUPPORTED by any backend: {names}"))
    for backend_type, facts in support["backends"].items():
        if not facts["available"]:
            needs = f"{facts['missing']} is" if facts.get("missing") else "its package is"
            line = f"unavailable: {needs} not installed here (pip install 'mnngpu[{backend_type}]')"
        elif facts["unsupported"]:
            line = "cannot run this graph"
        elif facts["cpu_fallback"]:
            line = f"runs it; falls back to the CPU for {', '.join(facts['cpu_fallback'])}"
        else:
            line = "runs every op"
        rows.append((backend_type, line))
    return rows


def _module_rows(modules: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = []
    for i, module in enumerate(modules):
        label = "modules" if i == 0 else ""
        if not module["present"]:
            rows.append((label, f"{module['role']}: {module['file']} is MISSING"))
            continue
        line = (f"{module['role']}: {module['file']}, {module['n_ops']} ops, {_size(module['weight_bytes'])} of "
                f"weights, inputs {', '.join(module['inputs'])}")
        if not module["runs"]:
            line += f"; NOT SUPPORTED: {module['role']} is not implemented"
        elif not module["support"]["all_supported"]:
            line += f"; NOT SUPPORTED by any backend: {', '.join(module['support']['unsupported'])}"
        else:
            fallback = sorted({name for facts in module["support"]["backends"].values()
                               for name in facts["cpu_fallback"]})
            line += "; every op runs" + (f" (on the CPU where a backend lacks {', '.join(fallback)})"
                                         if fallback else "")
        rows.append((label, line))
    return rows


def _model_line(model: dict[str, Any]) -> str:
    def known(value: Any) -> str:
        return "?" if value is None else str(value)

    layers = f"{known(model['layers'])} layers"
    if model["linear_layers"]:
        layers += f" ({describe_layer_kinds(model['layer_kinds'])})"
    line = (f"{known(model['type'])}: hidden {known(model['hidden_size'])}, {layers}, "
            f"{known(model['heads'])} heads ({known(model['kv_heads'])} kv) of {known(model['head_dim'])}, "
            f"vocab {known(model['vocab'])}")
    return line + f"; embeddings: {model['embeddings']}"


BACKEND_NAMES = {"cpu": "the CPU", "opencl": "OpenCL", "vulkan": "Vulkan", "cuda": "CUDA"}


def _moe_line(moe: dict[str, Any], weight_bytes: int) -> str:
    line = f"{moe['top_k']} of {moe['num_experts']} run per token in {moe['layers']} MoE layers"
    sparse, dense = (_backend_names(moe.get(key, [])) for key in ("sparse_backends", "dense_backends"))
    reads = []
    if sparse:
        reads.append(f"{_size(moe['bytes_per_token'])} of the {_size(weight_bytes)} file on {sparse} "
                     "(only the chosen experts)")
    if dense:
        reads.append(f"the whole file on {dense} (every expert runs)")
    return line + (f"; a decode step reads {', '.join(reads)}" if reads else "")


def _backend_names(backends: list[str]) -> str:
    """`the CPU, OpenCL and Vulkan`; "" for none."""
    names = [BACKEND_NAMES.get(backend, backend) for backend in backends]
    return " and ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"
