"""The normalizers of a tokenizer.json, done without the library where that is exact and faster.

`normalizer_steps(spec)` turns a normalizer spec into a list of str -> str steps, or None when some
part is not one we do (then the library runs the whole tokenizer). Each step gives exactly the text
HuggingFace's normalizer gives:

- NFC / NFKC: a text Python already finds normalized is left as it is. Unicode's normalization
  stability makes that exact for the library's (older) Unicode tables too; a text with a code
  point Python does not know, or one Python would change, goes to the library's normalizer.
- BertNormalizer: each character maps on its own (clean-up, CJK padding, accent stripping,
  lowercasing), so the map is asked of the library one character at a time and applied in numba.
  Stripping accents also reorders combining marks; a text holding a character that maps to a
  mark which survives the stripping goes to the library.
- Prepend, Replace (a plain string), Strip: str operations with the library's semantics.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from functools import cache

import numba
import numpy as np
from tokenizers import normalizers

from mnngpu.tokenizer.code_point_table import CodePointMap, CodePointTable

Step = Callable[[str], str]
NEEDS_LIBRARY = 1                 # flag: a character whose neighbours can change its mapping
# Rust's char::is_whitespace (Unicode White_Space), which the library's Strip uses.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), np.uint32)


@cache
def python_unassigned() -> CodePointTable:
    return CodePointTable(lambda chars: [unicodedata.category(c) == "Cn" for c in chars])


@numba.njit(cache=True)
def _any_flagged(cps, values) -> bool:
    for c in cps:
        if values[c]:
            return True
    return False


class UnicodeForm:
    def __init__(self, form: str):
        self._form = form
        self._library = normalizers.NFC() if form == "NFC" else normalizers.NFKC()

    def __call__(self, text: str) -> str:
        if unicodedata.is_normalized(self._form, text):
            cps = code_points(text)
            unassigned = python_unassigned()
            unassigned.fill_for(cps)
            if not _any_flagged(cps, unassigned.values):
                return text
        return self._library.normalize_str(text)


@numba.njit(cache=True)
def _map_code_points(cps, offset, length, pool):
    total = 0
    for c in cps:
        total += length[c]
    out = np.empty(total, np.uint32)
    at = 0
    for c in cps:
        start = offset[c]
        for k in range(length[c]):
            out[at + k] = pool[start + k]
        at += length[c]
    return out


def _bert_probe(library: normalizers.BertNormalizer, strips_accents: bool):
    def mapped_each(chars: list[str]) -> list[str]:
        """One call for all: "|" maps to itself under every option and is in no other character's
        mapping, and as a starter it keeps accent stripping from reordering across it."""
        batch = [c for c in chars if c != "|"]
        pieces = library.normalize_str("|".join(batch)).split("|")
        if len(pieces) != len(batch):
            return [library.normalize_str(c) for c in chars]
        by_char = dict(zip(batch, pieces))
        return [by_char.get(c, c) for c in chars]

    def probe(chars: list[str]) -> list[tuple[str, int]]:
        answers = []
        for mapped in mapped_each(chars):
            reorders = strips_accents and any(unicodedata.combining(m) for m in mapped)
            answers.append((mapped, NEEDS_LIBRARY if reorders else 0))
        return answers
    return probe


@cache
def _bert_map(clean_text: bool, chinese: bool, strip_accents: bool | None, lowercase: bool) -> CodePointMap:
    library = normalizers.BertNormalizer(clean_text=clean_text, handle_chinese_chars=chinese,
                                         strip_accents=strip_accents, lowercase=lowercase)
    strips = lowercase if strip_accents is None else strip_accents
    return CodePointMap(_bert_probe(library, strips))


class BertNormalizerStep:
    def __init__(self, spec: dict):
        flags = (bool(spec["clean_text"]), bool(spec["handle_chinese_chars"]), spec["strip_accents"],
                 bool(spec["lowercase"]))
        self._map = _bert_map(*flags)
        self._library = normalizers.BertNormalizer(clean_text=flags[0], handle_chinese_chars=flags[1],
                                                   strip_accents=flags[2], lowercase=flags[3])

    def __call__(self, text: str) -> str:
        cps = code_points(text)
        table = self._map
        table.fill_for(cps)
        if _any_flagged(cps, table.flags):
            return self._library.normalize_str(text)
        return _map_code_points(cps, table.offset, table.length, table.pool).tobytes().decode("utf-32-le")


def _prepend(prefix: str) -> Step:
    return lambda text: prefix + text if text else text


def _replace(pattern: str, content: str) -> Step:
    return lambda text: text.replace(pattern, content)


def _strip(left: bool, right: bool) -> Step:
    def strip(text: str) -> str:
        if left:
            text = text.lstrip(WHITE_SPACE)
        return text.rstrip(WHITE_SPACE) if right else text
    return strip


def _step(spec: dict) -> list[Step] | None:
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [_step(item) for item in spec["normalizers"]]
        return None if None in steps else [s for group in steps for s in group]
    if kind in ("NFC", "NFKC"):
        return [UnicodeForm(kind)]
    if kind == "BertNormalizer":
        return [BertNormalizerStep(spec)]
    if kind == "Prepend":
        return [_prepend(spec["prepend"])]
    if kind == "Replace" and set(spec["pattern"]) == {"String"} and spec["pattern"]["String"]:
        return [_replace(spec["pattern"]["String"], spec["content"])]
    if kind == "Strip":
        return [_strip(bool(spec["strip_left"]), bool(spec["strip_right"]))]
    return None


def normalizer_steps(spec: dict | None) -> list[Step] | None:
    """The steps of a tokenizer.json normalizer (none for no normalizer), or None if unsupported."""
    if spec is None:
        return []
    return _step(json.loads(json.dumps(spec)))
