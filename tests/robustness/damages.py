"""The catalogue of damage done to a copy of a fixture folder, and what each must raise, and when.

A Damage edits a folder in place. `error` is the MnnGpuError subclass (or classes) it must
raise, `stage` the first step of `folders.first_failure` that must raise it, and `names` the
file the message must name (None where no file is to blame).
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mnngpu.errors import ConfigError, InputError, ModelFormatError, TokenizerError, WeightFileError
from mnngpu.format import read_net
from tests.robustness.folders import (
    CONVOLUTION,
    MODELS,
    OP_INPUTS,
    OP_MAIN_TYPE,
    OP_OUTPUTS,
    OP_TYPE,
    TOKENIZERS,
    field_position,
    first_op_of_type,
    subgraph_tables,
    vector_at,
)


@dataclass(frozen=True)
class Damage:
    name: str
    apply: Callable[[Path], None]
    error: type | tuple[type, ...]
    stage: str
    names: str | None

    def __str__(self) -> str:
        return self.name


# ---- edits -------------------------------------------------------------------------------

def truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])
    return apply


def cut_bytes(name: str, count: int) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        path.write_bytes(path.read_bytes()[:-count])
    return apply


def remove(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(data)


def garbage(name: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        path.write_bytes(random.Random(name).randbytes(path.stat().st_size))
    return apply


def set_json(name: str, **values) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        config = json.loads(path.read_text())
        config.update(values)
        path.write_text(json.dumps(config))
    return apply


def drop_json_key(name: str, key: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        config = json.loads(path.read_text())
        del config[key]
        path.write_text(json.dumps(config))
    return apply


def patch(name: str, edit: Callable[[bytearray, Path], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        data = bytearray(path.read_bytes())
        edit(data, folder)
        path.write_bytes(bytes(data))
    return apply


def _set_op_field(index: int, fmt: str, value: int) -> Callable[[bytearray, Path], None]:
    """Overwrite a scalar field of the first Convolution op."""
    def edit(data: bytearray, folder: Path) -> None:
        pos = field_position(data, first_op_of_type(data, CONVOLUTION), index)
        struct.pack_into(fmt, data, pos, value)
    return edit


def _set_op_input(value_of: Callable[[bytearray, int], int]) -> Callable[[bytearray, Path], None]:
    """Overwrite the first input tensor index of the first Convolution op."""
    def edit(data: bytearray, folder: Path) -> None:
        op = first_op_of_type(data, CONVOLUTION)
        first, _ = vector_at(data, field_position(data, op, OP_INPUTS))
        struct.pack_into("<i", data, first, value_of(data, op))
    return edit


def _own_output(data: bytearray, op: int) -> int:
    first, _ = vector_at(data, field_position(data, op, OP_OUTPUTS))
    return struct.unpack_from("<i", data, first)[0]


def _first_linear(folder: Path):
    return next(op for op in read_net(folder / "llm.mnn").ops if op.type == "Convolution").param.external


def _quantized(model: str) -> bool:
    args = json.loads((MODELS / model / "reference.json").read_text())["export_args"]
    return args[args.index("--quant_bit") + 1] != "16"


def _weight_header(data: bytearray, folder: Path) -> None:
    data[_first_linear(folder)[0]] = 9  # the IDST section's dimension count: 1 to 4


def _alpha_nan(data: bytearray, folder: Path) -> None:
    offset, weight_bytes, alpha_bytes = _first_linear(folder)[:3]
    start = offset + weight_bytes
    data[start: start + alpha_bytes] = struct.pack("<f", float("nan")) * (alpha_bytes // 4)


def _nan_row(row: int, hidden: int = 128) -> Callable[[bytearray, Path], None]:
    def edit(data: bytearray, folder: Path) -> None:
        data[row * hidden * 2: (row + 1) * hidden * 2] = b"\xc0\x7f" * hidden  # bf16 NaN
    return edit


def _rename_subgraph(old: str, new: str) -> Callable[[bytearray, Path], None]:
    """Rename a subgraph: its name is the one string in the file that is exactly `old`."""
    def edit(data: bytearray, folder: Path) -> None:
        assert len(old) == len(new)
        stored = struct.pack("<I", len(old)) + old.encode() + b"\0"
        at = data.find(stored)
        assert at >= 0 and data.find(stored, at + 1) < 0, f"no single string {old}"
        data[at + 4: at + 4 + len(old)] = new.encode()
    return edit


def _first_subgraph_input(data: bytearray, folder: Path) -> None:
    """Point the first subgraph's input (SubGraphProto field 1) at a tensor an op inside produces."""
    inputs, _ = vector_at(data, field_position(data, subgraph_tables(data)[0], 1))
    struct.pack_into("<i", data, inputs, 5)


def _tie(**changes) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / "llm_config.json"
        config = json.loads(path.read_text())
        fields = dict(zip(("weight_offset", "alpha_offset", "alpha_size", "quant_bit", "quant_block"),
                          config["tie_embeddings"]))
        fields.update(changes)
        config["tie_embeddings"] = list(fields.values())
        path.write_text(json.dumps(config))
    return apply


def use_tokenizer(fixture: str, edit: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """Swap in a tokenizer fixture of another format (optionally damaged) as the model's tokenizer."""
    def apply(folder: Path) -> None:
        source = next((TOKENIZERS / fixture).glob("tokenizer.*"))
        (folder / "tokenizer.mtok").unlink()
        shutil.copy(source, folder / source.name)
        set_json("config.json", tokenizer_file=source.name)(folder)
        if edit is not None:
            edit(folder)
    return apply


def swap_in(name: str, other_model: str) -> Callable[[Path], None]:
    return lambda folder: shutil.copy(MODELS / other_model / name, folder / name)


# ---- the catalogue -----------------------------------------------------------------------

def embedding_file(model: str) -> str | None:
    found = sorted(p.name for p in (MODELS / model).glob("embeddings_*.bin"))
    return found[0] if found else None


def every_model_damages(model: str) -> list[Damage]:
    """Damage that applies to any fixture folder."""
    damages = [
        Damage("weights cut in half", truncate("llm.mnn.weight"), WeightFileError, "load", "llm.mnn.weight"),
        Damage("weights empty", write("llm.mnn.weight", b""), WeightFileError, "load", "llm.mnn.weight"),
        Damage("weights missing", remove("llm.mnn.weight"), WeightFileError, "load", "llm.mnn.weight"),
        Damage("graph cut in half", truncate("llm.mnn"), ModelFormatError, "load", "llm.mnn"),
        Damage("graph cut to 3 bytes", truncate("llm.mnn", 3 / 40000), ModelFormatError, "load", "llm.mnn"),
        Damage("graph random bytes", garbage("llm.mnn"), ModelFormatError, "load", "llm.mnn"),
        Damage("graph missing", remove("llm.mnn"), ModelFormatError, "load", "llm.mnn"),
        Damage("graph op type unknown", patch("llm.mnn", _set_op_field(OP_TYPE, "<i", 9999)), ModelFormatError,
               "load", "llm.mnn"),
        Damage("graph union type unknown", patch("llm.mnn", _set_op_field(OP_MAIN_TYPE, "<B", 250)),
               ModelFormatError, "load", "llm.mnn"),
        Damage("graph union type of another table", patch("llm.mnn", _set_op_field(OP_MAIN_TYPE, "<B", 7)),
               ModelFormatError, "load", "llm.mnn"),
        Damage("graph tensor index out of range", patch("llm.mnn", _set_op_input(lambda data, op: 10**6)),
               ModelFormatError, "load", "llm.mnn"),
        Damage("graph reads a tensor before it exists", patch("llm.mnn", _set_op_input(_own_output)),
               ModelFormatError, "load", "llm.mnn"),
        Damage("tokenizer cut in half", truncate("tokenizer.mtok"), TokenizerError, "load", "tokenizer.mtok"),
        Damage("tokenizer empty", write("tokenizer.mtok", b""), TokenizerError, "load", "tokenizer.mtok"),
        Damage("tokenizer magic wrong", patch("tokenizer.mtok", lambda d, f: d.__setitem__(slice(0, 3), b"431")),
               TokenizerError, "load", "tokenizer.mtok"),
        Damage("tokenizer missing", remove("tokenizer.mtok"), TokenizerError, "load", "tokenizer.mtok"),
        Damage("config.json not JSON", write("config.json", b'{"backend_type": "cpu",'), ConfigError, "create",
               "config.json"),
        Damage("config.json a list", write("config.json", b"[1, 2]"), ConfigError, "create", "config.json"),
        Damage("config.json not UTF-8", write("config.json", b'{"llm_model": "\xff\xfe"}'), ConfigError, "create",
               "config.json"),
        Damage("config.json missing", remove("config.json"), ConfigError, "create", "config.json"),
        Damage("llm_config.json not JSON", write("llm_config.json", b"hidden_size = 128"), ConfigError, "create",
               "llm_config.json"),
        Damage("thread_num a string", set_json("config.json", thread_num="four"), ConfigError, "create",
               "config.json"),
        Damage("max_new_tokens negative", set_json("config.json", max_new_tokens=-1), ConfigError, "create",
               "config.json"),
        Damage("precision unknown", set_json("config.json", precision="ultra"), ConfigError, "create",
               "config.json"),
        Damage("sampler unknown", set_json("config.json", sampler_type="best"), ConfigError, "create",
               "config.json"),
        Damage("hidden_size a string", set_json("llm_config.json", hidden_size="128"), ConfigError, "create",
               "llm_config.json"),
        Damage("backend_type unknown", set_json("config.json", backend_type="tpu"), ConfigError, "load",
               "config.json"),
        Damage("llm_model names a missing file", set_json("config.json", llm_model="nothing.mnn"),
               ModelFormatError, "load", "nothing.mnn"),
        Damage("hidden_size disagrees with the weights", set_json("llm_config.json", hidden_size=96), ConfigError,
               "load", "llm_config.json"),
        Damage("layer_nums disagrees with the graph", set_json("llm_config.json", layer_nums=99), ConfigError,
               "load", "llm_config.json"),
        Damage("tokenizer vocab larger than the model's", use_tokenizer("huggingface"), InputError, "response",
               None),
    ]
    if _quantized(model):  # an fp16 export's weight sections have no header and no scales
        damages += [
            Damage("weight section header corrupt", patch("llm.mnn.weight", _weight_header), ModelFormatError,
                   "load", "llm.mnn.weight"),
            Damage("weight scales NaN", patch("llm.mnn.weight", _alpha_nan), ModelFormatError, "load",
                   "llm.mnn.weight"),
        ]
    embedding = embedding_file(model)
    if embedding is not None:
        damages += [
            Damage("embedding cut mid-row", cut_bytes(embedding, 3), WeightFileError, "load", embedding),
            Damage("embedding empty", write(embedding, b""), WeightFileError, "load", embedding),
            Damage("embedding missing", remove(embedding), WeightFileError, "load", embedding),
        ]
    return damages


def specific_damages() -> list[tuple[str, Damage]]:
    """Damage that needs a particular kind of folder: bf16, int8 or int4 embeddings, tied rows."""
    return [
        ("qwen2_int4_b64", Damage("bf16 embedding short by whole rows", cut_bytes("embeddings_bf16.bin", 256 * 10),
                                  WeightFileError, "load", "embeddings_bf16.bin")),
        ("qwen2_int4_b64", Damage("bf16 embedding row NaN", patch("embeddings_bf16.bin", _nan_row(2)),
                                  WeightFileError, "forward", "embeddings_bf16.bin")),
        ("qwen2_embed_int8", Damage("int8 embedding cut in half", truncate("embeddings_int8.bin"),
                                    WeightFileError, "load", "embeddings_int8.bin")),
        ("qwen3_embed_int4", Damage("int4 embedding cut in half", truncate("embeddings_int4.bin"),
                                    WeightFileError, "load", "embeddings_int4.bin")),
        ("qwen3_embed_int4", Damage("int4 embedding block size wrong", _tie(quant_block=16), WeightFileError,
                                    "load", "embeddings_int4.bin")),
        ("llama_tied_int4", Damage("tied rows beyond the weight file", _tie(alpha_offset=10**9), WeightFileError,
                                   "load", "llm.mnn.weight")),
        ("llama_tied_int4", Damage("tied rows alpha size wrong", _tie(alpha_size=7000), WeightFileError, "load",
                                   "llm.mnn.weight")),
        ("llama_tied_int4", Damage("tied rows bit width unknown", _tie(quant_bit=9), ConfigError, "load", None)),
        ("qwen2_int4_b64", Damage("graph of another architecture", swap_in("llm.mnn", "qwen3_int4_b64"),
                                  (WeightFileError, ModelFormatError), "load", None)),
        ("qwen3_moe_int4_b64", Damage("MoE expert subgraph missing",
                                      patch("llm.mnn", _rename_subgraph("/expert/1_3", "/expert/1_9")),
                                      ModelFormatError, "load", "llm.mnn")),
        ("qwen3_moe_int4_b64", Damage("MoE expert subgraph input damaged", patch("llm.mnn", _first_subgraph_input),
                                      ModelFormatError, "load", "llm.mnn")),
        ("qwen2_int4_b64", Damage("weights of another quantization", swap_in("llm.mnn.weight", "qwen2_int8_b0"),
                                  (WeightFileError, ModelFormatError), "load", None)),
        *((GEMMA4, damage) for damage in per_layer_embedding_damages()),
        ("qwen2_int4_b64", per_layer_embedding_without_its_input()),
    ]


GEMMA4, PLE_FILE, PLE_WIDTH = "gemma4_int4_b64", "ple_embeddings_bf16.bin", 128


def per_layer_embedding_damages() -> list[Damage]:
    """Gemma 4's per-layer embedding file (ple_embed_file) and the keys that describe it."""
    return [
        Damage("per-layer embedding missing", remove(PLE_FILE), WeightFileError, "load", PLE_FILE),
        Damage("per-layer embedding short by a row", cut_bytes(PLE_FILE, 2 * PLE_WIDTH), WeightFileError, "load",
               PLE_FILE),
        Damage("per-layer embedding a row too long", patch(PLE_FILE, _append(2 * PLE_WIDTH)), WeightFileError,
               "load", PLE_FILE),
        Damage("per-layer embedding row NaN", patch(PLE_FILE, _nan_row(2, PLE_WIDTH)), WeightFileError, "forward",
               PLE_FILE),
        Damage("ple_embed_dim not the graph's", set_json("llm_config.json", ple_embed_dim=64), ConfigError, "load",
               "llm_config.json"),
        Damage("ple_embed_file unset for a graph with per-layer embeddings",
               drop_json_key("llm_config.json", "ple_embed_file"), ConfigError, "load", "llm_config.json"),
        Damage("ple_embed_file names a missing file", set_json("llm_config.json", ple_embed_file="ple.bin"),
               WeightFileError, "load", "ple.bin"),
    ]


def per_layer_embedding_without_its_input() -> Damage:
    """ple_embed_file set for a graph that takes no ple_embeddings (any other family's)."""
    return Damage("ple_embed_file set for a graph without per-layer embeddings",
                  set_json("llm_config.json", ple_embed_file="embeddings_bf16.bin", ple_embed_dim=64), ConfigError,
                  "load", "llm_config.json")


def _append(count: int) -> Callable[[bytearray, Path], None]:
    def edit(data: bytearray, folder: Path) -> None:
        data.extend(b"\0" * count)
    return edit


def tokenizer_format_damages() -> list[Damage]:
    """Each tokenizer format in the model folder, damaged: the error must come from that format's reader."""
    found = []
    for fixture in sorted(p.name for p in TOKENIZERS.iterdir()):
        name = next((TOKENIZERS / fixture).glob("tokenizer.*")).name
        found += [
            Damage(f"{fixture} tokenizer cut in half", use_tokenizer(fixture, truncate(name)), TokenizerError,
                   "load", name),
            Damage(f"{fixture} tokenizer vocab count too large",
                   use_tokenizer(fixture, patch(name, _raise_count)), TokenizerError, "load", name),
        ]
    return found


def _raise_count(data: bytearray, folder: Path) -> None:
    """Make the first count after the header promise more entries than the file holds."""
    header_end = 0
    for _ in range(3):
        header_end = data.index(b"\n", header_end) + 1
    if data[header_end: header_end + 1].isdigit():  # a text format: "<count>\n" or "<vocab> <merges>\n"
        end = header_end
        while data[end: end + 1].isdigit():
            end += 1
        data[header_end:end] = str(int(data[header_end:end]) + 10**6).encode()
    else:  # .mtok: the normalizer/pre-tokenizer trees come first; cut the file to fail inside them instead
        del data[header_end + 2:]
