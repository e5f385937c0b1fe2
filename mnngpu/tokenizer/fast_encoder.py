"""Encoding without the library's pipeline where we can do each stage exactly: the fast path.

HuggingFace's `tokenizers` spends most of an encode in its Oniguruma split regex and its
normalizers. For the pipelines MNN's formats produce, each stage has an exact stand-in here:
added tokens (`added_tokens.py`), normalizers (`normalize_steps.py`), pre-tokenizers
(`split_scanners.py`). Each distinct word goes to the model once (`word_cache.py`): to our numba
BPE (`bpe_model.py`) where it can stand in for the library's, else to the library's own model.
`FastEncoder.for_backend` returns None for any pipeline with a part it cannot do exactly; the
Tokenizer then leaves everything to the library.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer as HfTokenizer

from mnngpu import jit
from mnngpu.tokenizer import bpe_model, code_point_table, normalize_steps, word_cache
from mnngpu.tokenizer import split_scanners as scan
from mnngpu.tokenizer.added_tokens import TokenSplitter, split_out, token_splitters
from mnngpu.tokenizer.bpe_model import BpeWords
from mnngpu.tokenizer.byte_level import BYTE_TO_CHAR
from mnngpu.tokenizer.normalize_steps import Step, code_points, normalizer_steps
from mnngpu.tokenizer.word_cache import WordCache

# Touches every kind of word the scanners tell apart, so the background compile covers them.
WARM_UP_TEXT = "Hello, World! It's 2026: naïve café costs $12.50 —\n\tx_1 = f(42) 你好，世界 🙂 ...  end."
BYTE_LEVEL_CHARS = str.maketrans({chr(b): c for b, c in enumerate(BYTE_TO_CHAR)})
REGEX_STEPS = {scan.QWEN_PATTERN: ("qwen", 1), scan.LLAMA3_PATTERN: ("qwen", 3), scan.GPT2_PATTERN: ("gpt2", 0)}


@dataclass(frozen=True)
class SplitStep:
    """One pre-tokenizer that cuts words into smaller words."""
    kind: str                       # "qwen" (also Llama-3's), "gpt2", "bert" or "metaspace"
    max_digits: int = 0             # qwen: digits per word (Qwen 1, Llama-3 3)

    def apply(self, cps: np.ndarray, starts: np.ndarray, ends: np.ndarray, count: int) -> tuple:
        out_starts, out_ends = np.empty(len(cps), np.int64), np.empty(len(cps), np.int64)
        words = (starts, ends, count, out_starts, out_ends)
        if self.kind == "metaspace":
            return out_starts, out_ends, scan.split_metaspace_runs(cps, *words)
        table = scan.bert_classes() if self.kind == "bert" else scan.regex_classes()
        table.fill_for(cps)
        if self.kind == "bert":
            n = scan.split_bert_words(cps, table.values, *words)
        elif self.kind == "gpt2":
            n = scan.split_gpt2_words(cps, table.values, *words)
        else:
            n = scan.split_qwen_words(cps, table.values, *words, self.max_digits)
        return out_starts, out_ends, n


def _split_step(spec: dict) -> SplitStep | None:
    kind = spec.get("type")
    if kind == "BertPreTokenizer":
        return SplitStep("bert")
    if kind == "Split" and spec.get("behavior") == "Isolated" and not spec.get("invert"):
        pattern = spec["pattern"].get("Regex")
        if pattern in REGEX_STEPS:
            return SplitStep(*REGEX_STEPS[pattern])
        if pattern == scan.METASPACE_RUNS_PATTERN:
            return SplitStep("metaspace")
    return None


def pre_tokenizer_steps(spec: dict | None) -> tuple[list[SplitStep], bool] | None:
    """The split steps and whether the words are then mapped to byte-level characters (a last
    ByteLevel). None when a part is not one we do, or when nothing splits (a whole text would be
    one word, and caching it gains nothing)."""
    if spec is None:
        return None
    items = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
    steps: list[SplitStep] = []
    byte_level = False
    for item in items:
        if byte_level or item is None:
            return None
        if item.get("type") == "ByteLevel":
            if item.get("add_prefix_space"):
                return None
            if item.get("use_regex", True):
                steps.append(SplitStep("gpt2"))
            byte_level = True
            continue
        step = _split_step(item)
        if step is None:
            return None
        steps.append(step)
    return (steps, byte_level) if steps else None


def _component(part) -> dict | None:
    """A normalizer or pre-tokenizer as its tokenizer.json dict, as the library holds it."""
    return None if part is None else json.loads(part.__getstate__())


class LibraryWords:
    """The library model's ids for words given as (start, length) spans of a code point pool."""

    def __init__(self, model: HfTokenizer, byte_level: bool):
        self._encode_batch = getattr(model, "encode_batch_fast", model.encode_batch)
        self._byte_level = byte_level

    def __call__(self, cp_pool: np.ndarray, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        base = int(spans[:, 0].min())
        text = cp_pool[base:int((spans[:, 0] + spans[:, 1]).max())].tobytes().decode("utf-32-le")
        words = [text[start - base:start - base + length] for start, length in spans.tolist()]
        if self._byte_level:
            words = [w.encode("utf-8").decode("latin-1").translate(BYTE_LEVEL_CHARS) for w in words]
        ids = [encoding.ids for encoding in self._encode_batch(words, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return lengths, np.fromiter((i for x in ids for i in x), np.int64, int(lengths.sum()))


def word_model(backend: HfTokenizer, byte_level: bool):
    """Our numba BPE where it computes the library model's ids, else the library model itself."""
    model = backend.model
    words = BpeWords.for_model(model.__getstate__(), byte_level) if type(model).__name__ == "BPE" else None
    return words or LibraryWords(HfTokenizer(model), byte_level)


class FastEncoder:
    """encode(text): the library's ids for text (without its post-processor), found faster."""

    def __init__(self, raw_tokens: TokenSplitter, normalized_tokens: TokenSplitter, normalize: list[Step],
                 steps: list[SplitStep], words):
        self._raw_tokens = raw_tokens
        self._normalized_tokens = normalized_tokens
        self._normalize = normalize
        self._steps = steps
        self._words = words              # (cp_pool, spans) -> (lengths, flat ids)
        self._cache = WordCache()
        self._lock = threading.Lock()

    @classmethod
    def for_backend(cls, backend: HfTokenizer) -> FastEncoder | None:
        """The fast path for this library tokenizer, or None when it has a part we do not do."""
        if backend.truncation or backend.padding or getattr(backend, "encode_special_tokens", False):
            return None
        normalize = normalizer_steps(_component(backend.normalizer))
        pre = pre_tokenizer_steps(_component(backend.pre_tokenizer))
        splitters = token_splitters(backend)
        if normalize is None or pre is None or splitters is None:
            return None
        steps, byte_level = pre
        return cls(*splitters, normalize, steps, word_model(backend, byte_level))

    def compiled_check(self, backend: HfTokenizer):
        """A check that is True once this path's numba kernels are in the cache (mnngpu/jit.py); until
        then the caller encodes with the library, while a background process compiles them."""
        kinds = f"{self._steps}|{[type(n).__name__ for n in self._normalize]}|{type(self._words).__name__}"
        key = f"{jit.source_key(scan, bpe_model, code_point_table, normalize_steps, word_cache)}|{kinds}"
        return jit.warm_up("tokenizer", key, warm_up, lambda: (backend.to_str(),))

    def encode(self, text: str, prefix_ids: list[int] = ()) -> list[int]:
        """prefix_ids, then the ids of text."""
        with self._lock:
            parts = [np.array(prefix_ids, np.int64)]
            for piece in split_out(text, self._raw_tokens, self._normalized_tokens, self._normalized):
                parts.append(np.array([piece], np.int64) if isinstance(piece, int) else self._encode_words(piece))
            return np.concatenate(parts).tolist()

    def _normalized(self, text: str) -> str:
        for step in self._normalize:
            text = step(text)
        return text

    def _encode_words(self, text: str) -> np.ndarray:
        cps = code_points(text)
        starts, ends, count = np.zeros(1, np.int64), np.full(1, len(cps), np.int64), 1
        for step in self._steps:
            starts, ends, count = step.apply(cps, starts, ends, count)
        return self._cache.ids(cps, starts, ends, count, self._words)



def warm_up(tokenizer_json: str) -> None:
    """The background job: compile the fast path's kernels for this tokenizer by using them once."""
    encoder = FastEncoder.for_backend(HfTokenizer.from_str(tokenizer_json))
    if encoder is not None:
        encoder.encode(WARM_UP_TEXT)
