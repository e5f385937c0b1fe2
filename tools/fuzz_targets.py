"""What one fuzz case does: mutate a real fixture file, hand it to a reader, accept only a clean result.

A case is `(target, source, mutations)`. `mutate` applies the mutations, a list of
`(kind, a, b)` integer triples, to the source file's bytes; the same triples come from
hypothesis in the short suite (tests/fuzz/test_fuzz.py) and from a seeded random stream in
the long run (`python -m tools.fuzz`), so any case either finds can be replayed by the other.

A case passes when the reader returns or raises an MnnGpuError; anything else (another
exception, a crash, a hang) is a finding. The targets cover the `.mnn` graph reader and the
graph checks, the weight decoder, the embedding reader, every tokenizer reader and the
config loader with what reads it (sampler, chat template), plus, on request, the whole
folder flow `create -> load -> forward -> response`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import random
import shutil
import signal
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from mnngpu.errors import InputError, MnnGpuError

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
MODELS = FIXTURES / "models"
TOKENIZERS = FIXTURES / "tokenizers"

Mutation = tuple[str, int, int]

# ---- mutations ---------------------------------------------------------------------------

INTERESTING_U32 = (0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
                   0xFFFFFFFE, 0xFFFFFFFF)
INTERESTING_JSON = (None, True, False, 0, 1, -1, 2, 3, 64, 0.5, -0.5, 1e308, -1e308, 2**31, 2**63, 2**64,
                    "", "x", "cpu", "tpu", "high", "mixed", "greedy", "{{", "llm.mnn", "../config.json", [], [0],
                    [1, 2, 3], [0, 0, 0, 0, 0], [-1, 2**40, 0, 4, 64], {}, {"a": 1}, float("nan"), float("inf"))
BYTE_KINDS = ("flip", "byte", "u8", "u16", "u32", "truncate", "delete", "insert", "copy")
TEXT_KINDS = BYTE_KINDS + ("number", "line")
JSON_KINDS = TEXT_KINDS + ("json_value", "json_delete", "json_add")


def mutate(data: bytes, mutations: list[Mutation]) -> bytes:
    """The bytes after each mutation in turn; positions wrap around the current length."""
    buffer = bytearray(data)
    for kind, a, b in mutations:
        buffer = _MUTATORS[kind](buffer, a, b)
    return bytes(buffer)


def _flip(buf: bytearray, a: int, b: int) -> bytearray:
    if buf:
        buf[a % len(buf)] ^= 1 << (b % 8)
    return buf


def _byte(buf: bytearray, a: int, b: int) -> bytearray:
    if buf:
        buf[a % len(buf)] = b % 256
    return buf


def _word(width: int) -> Callable[[bytearray, int, int], bytearray]:
    """Write an interesting little-endian value at an aligned position (offsets, counts, lengths)."""
    def put(buf: bytearray, a: int, b: int) -> bytearray:
        if len(buf) < width:
            return buf
        pos = (a % (len(buf) - width + 1)) // width * width
        value = INTERESTING_U32[b % len(INTERESTING_U32)] if b % 3 else len(buf) + (b >> 8) % 9 - 4
        buf[pos: pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        return buf
    return put


def _truncate(buf: bytearray, a: int, b: int) -> bytearray:
    return buf[: a % (len(buf) + 1)]


def _delete(buf: bytearray, a: int, b: int) -> bytearray:
    if buf:
        pos = a % len(buf)
        del buf[pos: pos + 1 + b % 64]
    return buf


def _insert(buf: bytearray, a: int, b: int) -> bytearray:
    pos = a % (len(buf) + 1)
    buf[pos:pos] = bytes([b % 256]) * (1 + (b >> 8) % 16)
    return buf


def _copy(buf: bytearray, a: int, b: int) -> bytearray:
    if buf:
        src, length = b % len(buf), 1 + (b >> 16) % 64
        chunk = buf[src: src + length]
        pos = a % len(buf)
        buf[pos: pos + len(chunk)] = chunk
    return buf


_NUMBERS = (b"0", b"-1", b"1", b"65535", b"4294967296", b"99999999999999999999", b"", b"1e400", b"-0", b"x")


def _number(buf: bytearray, a: int, b: int) -> bytearray:
    """Replace the run of digits at or after a position by another number (or none)."""
    if not buf:
        return buf
    start = a % len(buf)
    while start < len(buf) and not chr(buf[start]).isdigit():
        start += 1
    end = start
    while end < len(buf) and chr(buf[end]).isdigit():
        end += 1
    buf[start:end] = _NUMBERS[b % len(_NUMBERS)]
    return buf


def _line(buf: bytearray, a: int, b: int) -> bytearray:
    """Delete or duplicate the line holding a position."""
    if not buf:
        return buf
    pos = a % len(buf)
    start = buf.rfind(b"\n", 0, pos) + 1
    end = buf.find(b"\n", pos)
    end = len(buf) if end < 0 else end + 1
    line = buf[start:end]
    buf[start:end] = b"" if b % 2 else line + line
    return buf


def _json_edit(edit: Callable[[dict, list, int], None]) -> Callable[[bytearray, int, int], bytearray]:
    """Edit a parsed JSON object at the key a position picks; bytes that are not a JSON object stay."""
    def apply(buf: bytearray, a: int, b: int) -> bytearray:
        try:
            value = json.loads(bytes(buf))
        except (ValueError, RecursionError):
            return buf
        if not isinstance(value, dict):
            return buf
        paths = list(_json_paths(value))
        if not paths:
            return buf
        parent, key = paths[a % len(paths)]
        edit(parent, key, b)
        return bytearray(json.dumps(value).encode())
    return apply


def _json_paths(node, depth: int = 0):
    if isinstance(node, dict) and depth < 4:
        for key, child in node.items():
            yield node, key
            yield from _json_paths(child, depth + 1)


def _set_value(parent: dict, key, b: int) -> None:
    parent[key] = INTERESTING_JSON[b % len(INTERESTING_JSON)]


def _delete_key(parent: dict, key, b: int) -> None:
    del parent[key]


def _add_key(parent: dict, key, b: int) -> None:
    from mnngpu.config import KNOWN_KEYS

    keys = sorted(KNOWN_KEYS)
    parent[keys[b % len(keys)]] = INTERESTING_JSON[(b >> 12) % len(INTERESTING_JSON)]


_MUTATORS: dict[str, Callable[[bytearray, int, int], bytearray]] = {
    "flip": _flip, "byte": _byte, "u8": _word(1), "u16": _word(2), "u32": _word(4), "truncate": _truncate,
    "delete": _delete, "insert": _insert, "copy": _copy, "number": _number, "line": _line,
    "json_value": _json_edit(_set_value), "json_delete": _json_edit(_delete_key), "json_add": _json_edit(_add_key),
}


def random_mutations(rng: random.Random, kinds: tuple[str, ...]) -> list[Mutation]:
    """One to eight mutations, fewer more often (a small change gets deeper into a reader)."""
    count = min(8, 1 + int(rng.expovariate(0.6)))
    return [(rng.choice(kinds), rng.getrandbits(32), rng.getrandbits(32)) for _ in range(count)]


# ---- what each target reads --------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    sources: tuple[Path, ...]  # the real files whose mutations it reads
    kinds: tuple[str, ...]  # the mutation kinds that fit those files
    run: Callable[[Path, bytes, Path], None]  # (source, mutated bytes, an empty scratch folder)


def model_dirs() -> list[Path]:
    return sorted(p for p in MODELS.iterdir() if (p / "llm.mnn").is_file())


@cache
def _real_graph(model: Path):
    from mnngpu.format import read_net

    return read_net(model / "llm.mnn")


@cache
def _real_config(model: Path):
    from mnngpu.config import LlmConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlmConfig.load(model)


def decode_op(op, weights) -> None:
    """Decode one op's weights fully, as StaticModule and the backends' rearrange do."""
    from mnngpu.format.params import Blob, Convolution2D, LayerNorm
    from mnngpu.format.quant import read_linear
    from mnngpu.ops.norm import read_layernorm

    if op.type == "Convolution" and isinstance(op.param, Convolution2D):
        linear = read_linear(weights, op.param, op.name)
        linear.dequantize([0, linear.oc - 1])
        if linear.is_quantized:
            linear.unpacked_codes()
    elif op.type == "LayerNorm" and isinstance(op.param, LayerNorm):
        read_layernorm(weights, op.param, op.name)
    elif op.type == "Const" and isinstance(op.param, Blob):
        op.param.array(weights)


def _decode_all(net, weights) -> None:
    for op in net.ops:
        decode_op(op, weights)


def run_graph(source: Path, data: bytes, scratch: Path) -> None:
    """The .mnn reader, the graph checks, then every weight the (damaged) graph points at."""
    from mnngpu.format import parse_net
    from mnngpu.format.weights import WeightFile
    from mnngpu.runtime.validate import check_graph

    net = parse_net(data, source)
    _rejected(check_graph, net)
    with WeightFile(source.with_name("llm.mnn.weight")) as weights:
        for op in net.ops:
            _rejected(decode_op, op, weights)


def run_weights(source: Path, data: bytes, scratch: Path) -> None:
    """The weight decoder over a damaged llm.mnn.weight, for every op of the real graph."""
    from mnngpu.format.rows import QuantizedRows, check_table_bounds, read_quantized_rows
    from mnngpu.format.weights import WeightFile

    path = scratch / source.name
    path.write_bytes(data)
    model = source.parent
    with WeightFile(path) as weights:
        _decode_all(_real_graph(model), weights)
        config = _real_config(model)
        tie = config.tie_embeddings
        if tie is not None and tie[0] != 0:
            layout = QuantizedRows.from_tie_embeddings(tie, config.hidden_size)
            check_table_bounds(weights, layout)
            read_quantized_rows(weights, layout, [0, layout.n_rows - 1])


def run_embedding(source: Path, data: bytes, scratch: Path) -> None:
    """DiskEmbedding over a damaged embeddings_*.bin: open, then read the first, the last and a bad row."""
    from mnngpu.embedding import DiskEmbedding

    path = scratch / source.name
    path.write_bytes(data)
    config = _real_config(source.parent)
    embedding = DiskEmbedding(config.hidden_size, path, source.with_name("llm.mnn.weight"), config.tie_embeddings)
    embedding.rows([0, embedding.vocab_size - 1])
    try:
        embedding.rows([embedding.vocab_size])
    except InputError:
        return
    raise AssertionError("a row beyond the vocab was read without an InputError")


TEXTS = ("hello world", "<|im_start|>user\nhi<|im_end|>", "naïve café 東京 🙂", "  spaces\tand\nnewlines  ", "")


def run_tokenizer(source: Path, data: bytes, scratch: Path) -> None:
    """load_tokenizer on a damaged tokenizer file, then encode and decode with it."""
    from mnngpu.tokenizer import load_tokenizer

    (scratch / source.name).write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = load_tokenizer(scratch, source.name)
    for text in TEXTS:
        tokenizer.encode(text)
    decoder = tokenizer.stream_decoder()
    for token_id in [*range(min(tokenizer.vocab_size, 64)), tokenizer.vocab_size, -1]:
        tokenizer.decode(token_id)
        decoder.feed(token_id)
        tokenizer.is_stop(token_id)
    decoder.flush()


def run_config(source: Path, data: bytes, scratch: Path) -> None:
    """LlmConfig.load on a damaged config.json or llm_config.json, then what reads the values."""
    from mnngpu.config import LlmConfig
    from mnngpu.format.rows import QuantizedRows
    from mnngpu.prompt import Prompt
    from mnngpu.sampler import Sampler

    for name in ("config.json", "llm_config.json"):
        shutil.copy(source.with_name(name), scratch / name)
    (scratch / source.name).write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = LlmConfig.load(scratch)
    for name in dir(LlmConfig):
        if isinstance(getattr(LlmConfig, name), property):
            getattr(config, name)
    config.validate_backend()
    if config.tie_embeddings is not None:
        QuantizedRows.from_tie_embeddings(config.tie_embeddings, config.hidden_size)
    sampler = Sampler(config.raw)
    logits = np.linspace(-4.0, 4.0, 480, dtype=np.float32)
    sampler.sample(logits, [1, 2, 3, 2])
    Prompt(config.raw).apply_chat_template("hi")


def run_flow(source: Path, data: bytes, scratch: Path) -> None:
    """The whole folder flow with one damaged file: create, load, forward, encode, response."""
    from mnngpu import llm

    folder = scratch / "model"
    shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns("hf", "reference.json", "*.npy"))
    (folder / source.name).write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = llm.create(folder)
        model.set_config({"thread_num": 1})
        model.load()
    model.forward([1, 2, 3])
    model.tokenizer_encode("hello")
    model.response("hi", max_new_tokens=2)


SELF_TEST = ("accept", "reject", "error", "python hang", "segfault", "stuck")


def self_test_behaviour(data: bytes) -> str:
    return SELF_TEST[zlib.crc32(data) % len(SELF_TEST)]


def run_self_test(source: Path, data: bytes, scratch: Path) -> None:
    """Not a reader: a case that misbehaves on purpose (its kind picked by its bytes), to test the harness."""
    behaviour = self_test_behaviour(data)
    if behaviour == "reject":
        raise InputError("rejected on purpose")
    if behaviour == "error":
        raise ValueError("an error on purpose")
    if behaviour == "python hang":
        time.sleep(3600)  # the per-case alarm ends it
    if behaviour == "segfault":
        ctypes.string_at(0)
    if behaviour == "stuck":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as if stuck in C: only the parent sees it
        time.sleep(3600)


def _rejected(function, *args) -> bool:
    """Run a reader step that may reject its (damaged) input; True when it did."""
    try:
        function(*args)
    except MnnGpuError:
        return True
    return False


def _tokenizer_files() -> tuple[Path, ...]:
    files = sorted(p for folder in TOKENIZERS.iterdir() for p in folder.glob("tokenizer.*"))
    return tuple(files) + (MODELS / "qwen2_int4_b64" / "tokenizer.mtok",)


def _model_files(*names: str) -> tuple[Path, ...]:
    return tuple(model / name for model in model_dirs() for name in names if (model / name).is_file())


def targets() -> dict[str, Target]:
    """Every fuzz target by name; `flow` (the whole folder) is slower and runs on request, `selftest` tests
    the harness."""
    embeddings = tuple(p for model in model_dirs() for p in sorted(model.glob("embeddings_*.bin")))
    found = [
        Target("graph", _model_files("llm.mnn"), BYTE_KINDS, run_graph),
        Target("weights", _model_files("llm.mnn.weight"), BYTE_KINDS, run_weights),
        Target("embedding", embeddings, BYTE_KINDS, run_embedding),
        Target("tokenizer", _tokenizer_files(), TEXT_KINDS, run_tokenizer),
        Target("config", _model_files("config.json", "llm_config.json"), JSON_KINDS, run_config),
        Target("flow", _model_files("llm.mnn", "llm.mnn.weight", "tokenizer.mtok", "config.json",
                                    "llm_config.json") + embeddings, JSON_KINDS, run_flow),
        Target("selftest", (MODELS / "qwen2_int4_b64" / "config.json",), ("byte",), run_self_test),
    ]
    return {target.name: target for target in found}


DEFAULT_TARGETS = ("graph", "weights", "embedding", "tokenizer", "config")


class CaseTimeout(Exception):
    """A case ran past its time limit: a hang, as far as fuzzing is concerned."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; reaches Python code only,
    which is why the long run also watches each worker from outside)."""
    def expire(signum, frame):
        raise CaseTimeout(f"the case ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@cache
def source_bytes(source: Path) -> bytes:
    return source.read_bytes()


def run_case(target: Target, source: Path, mutations: list[Mutation], scratch: Path) -> str:
    """Run one case in an emptied scratch folder: "accepted", or the MnnGpuError class that rejected it.

    Raises whatever the reader raised that is not an MnnGpuError."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    try:
        target.run(source, mutate(source_bytes(source), mutations), scratch)
    except MnnGpuError as error:
        return type(error).__name__
    return "accepted"
