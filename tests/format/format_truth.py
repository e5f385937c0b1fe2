"""Independent truths for the format tests: the fixtures, HF safetensors, mnnconvert's JSON.

Nothing here uses mnngpu's readers: the safetensors reader and the JSON comparison are
written from the file formats themselves.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import hf_dir

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "models"
# a newer-format fixture's dump by the converter that wrote it (tools/make_fixtures.py: CONVERTER_TRUTH)
CONVERTER_TRUTH = "mnnconvert.json"
FIXTURE_NAMES = sorted(p.name for p in FIXTURES_DIR.glob("*") if (p / "llm.mnn").is_file())

needs_fixtures = pytest.mark.skipif(not FIXTURE_NAMES, reason="no fixture models under tests/fixtures/models")


def fixture_dir(name: str) -> Path:
    return FIXTURES_DIR / name


def reference(name: str) -> dict:
    return json.loads((fixture_dir(name) / "reference.json").read_text())


def llm_config(name: str) -> dict:
    return json.loads((fixture_dir(name) / "llm_config.json").read_text())


def hf_config(name: str) -> dict:
    return json.loads((hf_dir(name) / "config.json").read_text())


_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4"}


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as float32 (bf16 widened exactly)."""
    data = path.read_bytes()
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8: 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = np.frombuffer(data[base + start: base + end], dtype=_SAFETENSORS_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float32).reshape(info["shape"])
    return tensors


def hf_tensors(name: str) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(hf_dir(name).glob("*.safetensors")):
        tensors.update(load_safetensors(path))
    for gate in [key for key in tensors if key.endswith(".gate_proj.weight") and ".experts." in key]:
        # the exporter writes an expert's gate and up projections as one gate_up linear, gate rows first
        up = tensors[gate.replace(".gate_proj.", ".up_proj.")]
        tensors[gate.replace(".gate_proj.", ".gate_up_proj.")] = np.concatenate([tensors[gate], up])
    add_exporter_names(tensors, hf_config(name))
    return tensors


# the exporter's names for tensors some families name or pack their own way
RENAMED = {".self_attn.dense.": ".self_attn.o_proj.",              # Phi-2
           "model.final_layernorm.": "model.norm.",                # Phi-2
           ".self_attn.query_layernorm.": ".self_attn.q_norm.",    # Hunyuan
           ".self_attn.key_layernorm.": ".self_attn.k_norm."}


def add_exporter_names(tensors: dict, hf: dict) -> None:
    """Alias renamed tensors, and split Phi-3's packed qkv_proj (q, k, v rows) and gate_up_proj
    (gate rows, then up rows) into the linears the exporter writes."""
    for key in list(tensors):
        for source, exported in RENAMED.items():
            if source in key:
                tensors[key.replace(source, exported)] = tensors[key]
        if key.endswith(".qkv_proj.weight"):
            head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
            q_rows, kv_rows = hf["num_attention_heads"] * head_dim, hf["num_key_value_heads"] * head_dim
            q, k, v = np.split(tensors[key], [q_rows, q_rows + kv_rows])
            assert v.shape[0] == kv_rows
            for proj, rows in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                tensors[key.replace("qkv_proj", proj)] = rows
        if key.endswith(".mlp.gate_up_proj.weight") and ".experts." not in key:
            gate, up = np.split(tensors[key], 2)
            tensors[key.replace("gate_up_proj", "gate_proj")] = gate
            tensors[key.replace("gate_up_proj", "up_proj")] = up


# llmexport names every family's modules as Llama's; where HF's own names differ, one of these
# chains of renames, applied in turn, gives the checkpoint's name: LFM2's short convolution layers,
# attention output, feed-forward and norms; Qwen3.5's Gated DeltaNet layers.
HF_RENAMES = (
    (("self_attn.in_proj", "conv.in_proj"), ("self_attn.out_proj", "conv.out_proj"), ("mlp.", "feed_forward."),
     ("input_layernorm", "operator_norm"), ("post_attention_layernorm", "ffn_norm"), ("q_norm", "q_layernorm"),
     ("k_norm", "k_layernorm"), ("model.norm.", "model.embedding_norm."), ("self_attn.o_proj", "self_attn.out_proj")),
    (("self_attn.in_proj_", "linear_attn.in_proj_"), ("self_attn.out_proj", "linear_attn.out_proj"),
     ("self_attn.norm.", "linear_attn.norm.")),
)


def in_checkpoint(name: str, tensors: dict) -> str:
    """`name` as the checkpoint spells it: as is, or renamed by the first HF_RENAMES chain that finds it
    (unchanged when none does, so the caller's lookup names it)."""
    if name in tensors:
        return name
    for chain in HF_RENAMES:
        renamed = name
        for old, new in chain:
            renamed = renamed.replace(old, new)
        if renamed in tensors:
            return renamed
    return name


# HF text-only configs whose model_type llmexport writes as the family's (Gemma 3's keeps its own)
EXPORTED_FAMILY = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "gemma4_text": "gemma4"}


# families whose export writes each RMSNorm as plain ops (its weight a Const of the graph), no LayerNorm op
NORMS_AS_PLAIN_OPS = {"gemma4"}


def family(hf: dict) -> str:
    """The model_type llmexport writes for this HF config."""
    return EXPORTED_FAMILY.get(hf["model_type"], hf["model_type"])


def fixture_family(name: str) -> str:
    """The model_type the fixture's exporter wrote: a newer-format fixture was exported from the committed
    source as it is (a text-only config keeps its text model_type), the others from the full model."""
    hf = hf_config(name)
    return hf["model_type"] if "hf_from" in reference(name) else family(hf)


def linear_layers(net) -> list[tuple[str, object]]:
    """(name, Convolution2D) of every linear layer, a MoE export's experts and a newer export's FusedLinear
    projections included: q, k, v[, z] named by their outputs (MNN's converter keeps each member's op
    name as its output's), gate and up by the op's name (the gate's) and the up_proj beside it."""
    found = []
    for graph in (net, *net.subgraphs):
        for op in graph.ops:
            if op.type == "Convolution":
                found.append((op.name, op.param))
            elif op.type == "FusedLinear" and op.param.act_silu_mul:
                found += [(op.name, op.param.convs[0]), (op.name.replace("gate_proj", "up_proj"), op.param.convs[1])]
            elif op.type == "FusedLinear":
                found += [(graph.tensor_names[t], conv) for t, conv in zip(op.outputs, op.param.convs)]
    return found


def expert_count(hf: dict) -> int:
    return hf.get("num_local_experts") or hf.get("num_experts") or 0


def hf_linear_name(op_name: str, tensors: dict) -> str:
    """'/layers.0/self_attn/q_proj/Linear' -> 'model.layers.0.self_attn.q_proj.weight'."""
    if "lm_head" in op_name:
        return "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    expert = re.fullmatch(r"/expert/(\d+)_(\d+)/(\w+)_linear", op_name)
    if expert:   # '/expert/0_3/down_proj_linear' -> 'model.layers.0.mlp.experts.3.down_proj.weight'
        layer, index, proj = expert.groups()
        return f"model.layers.{layer}.mlp.experts.{index}.{proj}.weight"
    parts = [p for p in op_name.split("/") if p and p != "Linear"]
    return in_checkpoint("model." + ".".join(parts) + ".weight", tensors)


# MNN's newer exporter splits a gated query projection (Qwen3.5's q_proj: per head the query's rows,
# then its output gate's) into q_proj and q_gate_proj, one FusedLinear member each
SPLIT_GATE = "q_gate_proj"


def hf_linear_truth(op_name: str, tensors: dict, hf: dict, rows: int) -> np.ndarray:
    """The source weight of a linear layer of `rows` outputs: hf_linear_name's tensor, or for a split
    gated query (SPLIT_GATE) the query's or the gate's rows of the source q_proj."""
    gated = op_name.replace(SPLIT_GATE, "q_proj")
    truth = tensors[hf_linear_name(gated, tensors)]
    if truth.shape[0] != 2 * rows or "q_proj" not in gated:
        return truth
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    per_head = truth.reshape(-1, 2, head_dim, truth.shape[1])
    return per_head[:, 1 if SPLIT_GATE in op_name else 0].reshape(rows, truth.shape[1])


def split_projections(net) -> int:
    """How many gated query projections the export split in two (SPLIT_GATE)."""
    return sum(SPLIT_GATE in name for name, _ in linear_layers(net))


# A recurrent layer's own linear layers, by HF's layer_types name: LFM2's short convolution (in_proj,
# out_proj), Qwen3.5's Gated DeltaNet (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj); any
# other layer type is attention's q, k, v, o.
RECURRENT_LINEARS = {"conv": 2, "linear_attention": 5}


# Gemma 4's per-layer embeddings: each layer's per_layer_input_gate and per_layer_projection, and the
# model's one per_layer_model_projection
PLE_LINEARS = 2


def linears_in_layers(hf: dict) -> int:
    """Every decoder layer's linear layers: its attention's (or recurrent layer's), then gate, up, down
    (Phi-2: fc1, fc2, no gate; Phi-3: gate_up packed, down); or for a MoE layer its router, each
    expert's gate_up and down, and a shared expert's gate, up, down and gate (Qwen3.5-MoE); and Gemma 4's
    per-layer embedding linears (PLE_LINEARS, plus the model's projection)."""
    experts = expert_count(hf)
    shared = 4 if hf.get("shared_expert_intermediate_size") else 0
    mlp = 1 + 2 * experts + shared if experts else 2 if hf["model_type"] in ("phi", "phi3") else 3
    kinds = hf.get("layer_types") or ["full_attention"] * hf["num_hidden_layers"]
    per_layer = PLE_LINEARS if hf.get("hidden_size_per_layer_input") else 0
    return sum(RECURRENT_LINEARS.get(kind, 4) + mlp + per_layer for kind in kinds) + (per_layer > 0)


def hf_norm_name(op_name: str, tensors: dict) -> str:
    """'/blocks.0/input_layernorm/Mul_1_output_0' -> 'model.layers.0.input_layernorm.weight';
    the final norm's op is named after its output, 'hidden_states' -> 'model.norm.weight' (in an
    EAGLE export, where hidden_states is another output, '/final_layernorm/...')."""
    if op_name == "hidden_states" or op_name.startswith("/final_layernorm/"):
        return in_checkpoint("model.norm.weight", tensors)
    parts = [p for p in op_name.split("/") if p][:-1]
    parts[0] = parts[0].replace("blocks.", "layers.")
    return in_checkpoint("model." + ".".join(parts) + ".weight", tensors)


# --- mnnconvert -------------------------------------------------------------------------

def _converter_available() -> bool:
    return importlib.util.find_spec("_tools") is not None and importlib.util.find_spec("MNN") is not None


# MNN's extension module `_tools` runs the converter without importing MNN/tools/utils/log.py
# (the module that installs packages and posts usage logs).
_CONVERT = "import sys, _tools; sys.exit(0 if _tools.mnnconvert(['mnnconvert', *sys.argv[1:]]) else 1)"


def mnnconvert(*args: str) -> None:
    if not _converter_available():
        pytest.skip("MNN's converter (the mnn package) is not installed")
    done = subprocess.run([sys.executable, "-c", _CONVERT, *args], capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        raise AssertionError(f"mnnconvert {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def mnn_to_json(mnn_path: Path, out_dir: Path) -> dict:
    json_path = out_dir / (mnn_path.parent.name + "_" + mnn_path.name + ".json")
    mnnconvert("-f", "MNN", "--modelFile", str(mnn_path), "--JsonFile", str(json_path))
    return json.loads(json_path.read_text())


def json_to_mnn(graph: dict, out_dir: Path, name: str) -> Path:
    json_path, mnn_path = out_dir / f"{name}.json", out_dir / f"{name}.mnn"
    json_path.write_text(json.dumps(graph))
    mnnconvert("-f", "JSON", "--modelFile", str(json_path), "--MNNModel", str(mnn_path))
    return mnn_path


# --- comparing a decoded table with its JSON dump -----------------------------------------

def mismatches(value, expected, where: str) -> list[str]:
    """Differences between a decoded value and mnnconvert's JSON for it.

    A dataclass field missing from the JSON was absent from the buffer, so it must hold
    its schema default (None for an absent vector or table)."""
    if dataclasses.is_dataclass(value):
        if not isinstance(expected, dict):
            return [f"{where}: decoded a table, JSON has {expected!r}"]
        found = []
        names = {f.name for f in dataclasses.fields(value)}
        found += [f"{where}.{key}: in the JSON, not decoded" for key in expected if key not in names]
        for f in dataclasses.fields(value):
            ours = getattr(value, f.name)
            if f.name in expected:
                found += mismatches(ours, expected[f.name], f"{where}.{f.name}")
            elif not _is_default(ours, f.default):
                found.append(f"{where}.{f.name}: decoded {ours!r}, JSON omits it (default {f.default!r})")
        return found
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(expected, dict) and "summary_of" in expected and isinstance(value, list):
        return _summary_mismatches(value, expected, where)
    if isinstance(value, list) and isinstance(expected, list):
        if len(value) != len(expected):
            return [f"{where}: {len(value)} items, JSON has {len(expected)}"]
        return [m for i, (a, b) in enumerate(zip(value, expected)) for m in mismatches(a, b, f"{where}[{i}]")]
    if isinstance(value, float) or isinstance(expected, float):
        if isinstance(value, bool) or not math.isclose(value, expected, rel_tol=1e-5, abs_tol=1e-12):
            return [f"{where}: decoded {value!r}, JSON has {expected!r}"]
        return []
    if type(value) is not type(expected) or value != expected:
        return [f"{where}: decoded {value!r}, JSON has {expected!r}"]
    return []


def _summary_mismatches(value: list, summary: dict, where: str) -> list[str]:
    """A long vector the committed dump keeps as {"summary_of": length, "head", "tail", "sum"}."""
    if len(value) != summary["summary_of"]:
        return [f"{where}: {len(value)} items, JSON has {summary['summary_of']}"]
    found = mismatches(value[:4], summary["head"], f"{where}[:4]") + mismatches(value[-4:], summary["tail"],
                                                                                 f"{where}[-4:]")
    if not math.isclose(sum(value), summary["sum"], rel_tol=1e-5, abs_tol=1e-3):
        found.append(f"{where}: sums to {sum(value)}, JSON's sums to {summary['sum']}")
    return found


def _is_default(ours, default) -> bool:
    if default is dataclasses.MISSING:
        return False
    if isinstance(ours, np.ndarray):
        return False
    return ours == default
