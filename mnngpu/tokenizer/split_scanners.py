"""Hand-written scanners that split text exactly as the known pre-tokenizers do.

Each scanner takes code points (uint32) and a class byte per code point, and cuts every input
range [in_starts[k], in_ends[k]) into words, written to out_starts/out_ends; it returns the word
count. A Sequence of pre-tokenizers is scanners applied one after another, each to the words of
the one before, as `tokenizers` applies them.

The regex scanners follow Oniguruma's leftmost-first alternation with greedy quantifiers and
backtracking, alternative by alternative:

  QWEN    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*
          |\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+                       (Llama-3: \\p{N}{1,3} for \\p{N})
  GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

Every character matches one of them, so the words cover the range. The classes come from the
same Oniguruma (`regex_classes()`), asked a character at a time.
"""

from __future__ import annotations

from functools import cache

import numba
from tokenizers import Regex, normalizers, pre_tokenizers

from mnngpu.tokenizer.code_point_table import CodePointTable

LETTER, NUMBER, SPACE_CLASS = 1, 2, 4          # \p{L}, \p{N}, \s in the regex table
ANY_CLASS = LETTER | NUMBER | SPACE_CLASS      # none of them: [^\s\p{L}\p{N}]
BERT_SPACE, BERT_PUNCT = 1, 2                  # removed, isolated by BertPreTokenizer
APOSTROPHE, SPACE, CR, LF = 0x27, 0x20, 0x0D, 0x0A
METASPACE = 0x2581

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
METASPACE_RUNS_PATTERN = "\u2581*[^\u2581]+|\u2581+"


def _probe_regex_classes(chars: list[str]) -> list[int]:
    """Each character's \\p{L}, \\p{N} and \\s membership, as Oniguruma in `tokenizers` decides it.
    A Replace of the class by one marker character keeps positions, so one call answers all
    characters; the marker is outside the class, so a replaced position is a member."""
    text = "".join(chars)
    classes = [0] * len(chars)
    for bit, pattern, marker in ((LETTER, r"\p{L}", "0"), (NUMBER, r"\p{N}", "a"), (SPACE_CLASS, r"\s", "a")):
        replaced = normalizers.Replace(Regex(pattern), marker).normalize_str(text)
        assert len(replaced) == len(text)
        for k, (before, after) in enumerate(zip(text, replaced)):
            if after == marker and before != marker:
                classes[k] |= bit
    return classes


def _probe_bert_classes(chars: list[str]) -> list[int]:
    """Whether BertPreTokenizer removes each character (whitespace) or isolates it (punctuation),
    from one split of "a" c1 "a" c2 "a" ...: a character no word covers was removed, one that is a
    word alone was isolated, and any other joins its neighbours "a"."""
    text = "a" + "".join(f"{c}a" for c in chars)
    covered = {}
    for _, (start, end) in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text):
        for position in range(start, end):
            covered[position] = (start, end)
    classes = []
    for k, char in enumerate(chars):
        word = covered.get(2 * k + 1)
        isolated = word == (2 * k + 1, 2 * k + 2) and char != "a"
        classes.append(BERT_SPACE if word is None else BERT_PUNCT if isolated else 0)
    return classes


@cache
def regex_classes() -> CodePointTable:
    return CodePointTable(_probe_regex_classes)


@cache
def bert_classes() -> CodePointTable:
    return CodePointTable(_probe_bert_classes)


@numba.njit(cache=True)
def _folded(c: int, ignore_case: bool) -> int:
    if ignore_case:
        if 0x41 <= c <= 0x5A:
            return c + 0x20
        if c == 0x17F:             # LATIN SMALL LETTER LONG S case-folds to "s"
            return 0x73
    return c


@numba.njit(cache=True)
def _contraction_end(cps, i, end, ignore_case) -> int:
    """Where 's 't 're 've 'm 'll 'd ends when it starts at i, else -1."""
    if cps[i] != APOSTROPHE or i + 1 >= end:
        return -1
    length = _contraction_length(cps[i + 1], cps[i + 2] if i + 2 < end else -1, ignore_case)
    return i + length if length else -1


@numba.njit(cache=True)
def _contraction_length(c: int, next_c: int, ignore_case: bool) -> int:
    """2 or 3 when an apostrophe followed by c (then next_c; -1 at the end) starts 's 't 're 've
    'm 'll 'd; else 0."""
    a, b = _folded(c, ignore_case), _folded(next_c, ignore_case)
    if a == 0x73 or a == 0x74 or a == 0x6D or a == 0x64:          # s t m d
        return 2
    if (a == 0x72 and b == 0x65) or (a == 0x76 and b == 0x65) or (a == 0x6C and b == 0x6C):  # re ve ll
        return 3
    return 0


# The regex scanners are written as one loop each, alike in shape: with a numba function per word
# (taking the arrays) they ran ten times slower, the calls costing more than the scanning.

@numba.njit(cache=True)
def split_qwen_words(cps, cls, in_starts, in_ends, n_in, out_starts, out_ends, max_digits) -> int:
    """The Qwen pattern (max_digits 1), or Llama-3's with \\p{N}{1,3} (max_digits 3)."""
    n = 0
    for k in range(n_in):
        i, end = in_starts[k], in_ends[k]
        while i < end:
            c = cps[i]
            kind = cls[c]
            j = _contraction_end(cps, i, end, True)                  # (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if j >= 0:
                pass
            elif kind & LETTER or (c != CR and c != LF and kind & NUMBER == 0 and i + 1 < end
                                   and cls[cps[i + 1]] & LETTER):   # [^\r\n\p{L}\p{N}]?\p{L}+
                j = i + 1
                while j < end and cls[cps[j]] & LETTER:
                    j += 1
            elif kind & NUMBER:                                        # \p{N} or \p{N}{1,3}
                j = i + 1
                while j < end and j - i < max_digits and cls[cps[j]] & NUMBER:
                    j += 1
            else:
                first = i + 1 if c == SPACE and i + 1 < end and cls[cps[i + 1]] & ANY_CLASS == 0 else i
                if cls[cps[first]] & ANY_CLASS == 0:                   # ?[^\s\p{L}\p{N}]+[\r\n]*
                    j = first + 1
                    while j < end and cls[cps[j]] & ANY_CLASS == 0:
                        j += 1
                    while j < end and (cps[j] == CR or cps[j] == LF):
                        j += 1
                else:                                                  # c is whitespace
                    run = i + 1
                    while run < end and cls[cps[run]] & SPACE_CLASS:
                        run += 1
                    last = run - 1
                    while last >= i and cps[last] != CR and cps[last] != LF:
                        last -= 1
                    if last >= i:
                        j = last + 1           # \s*[\r\n]+ : \s* backs off to the run's last newline
                    elif run == end or run - 1 == i:
                        j = run                # \s+(?!\S) at the end, or \s+ of one character
                    else:
                        j = run - 1            # \s+(?!\S) backs off one, so that a space follows
            out_starts[n] = i
            out_ends[n] = j
            n += 1
            i = j
    return n


@numba.njit(cache=True)
def split_gpt2_words(cps, cls, in_starts, in_ends, n_in, out_starts, out_ends) -> int:
    n = 0
    for k in range(n_in):
        i, end = in_starts[k], in_ends[k]
        while i < end:
            c = cps[i]
            j = _contraction_end(cps, i, end, False)                 # 's|'t|'re|'ve|'m|'ll|'d
            if j < 0:
                # " ?" takes a space that a non-space follows; then a run of that one's class.
                first = i + 1 if c == SPACE and i + 1 < end and cls[cps[i + 1]] & SPACE_CLASS == 0 else i
                kind = cls[cps[first]]
                if kind & SPACE_CLASS:                                 # \s+(?!\S)|\s+
                    run = i + 1
                    while run < end and cls[cps[run]] & SPACE_CLASS:
                        run += 1
                    j = run if run == end or run - 1 == i else run - 1
                elif kind & (LETTER | NUMBER):                         # ?\p{L}+ | ?\p{N}+
                    j = first + 1
                    while j < end and cls[cps[j]] & kind:
                        j += 1
                else:                                                  # ?[^\s\p{L}\p{N}]+
                    j = first + 1
                    while j < end and cls[cps[j]] & ANY_CLASS == 0:
                        j += 1
            out_starts[n] = i
            out_ends[n] = j
            n += 1
            i = j
    return n


@numba.njit(cache=True)
def split_bert_words(cps, cls, in_starts, in_ends, n_in, out_starts, out_ends) -> int:
    """BertPreTokenizer: whitespace removed, each punctuation character a word of its own."""
    n = 0
    for k in range(n_in):
        i, end = in_starts[k], in_ends[k]
        while i < end:
            kind = cls[cps[i]]
            if kind & BERT_SPACE:
                i += 1
                continue
            j = i + 1
            if not kind & BERT_PUNCT:
                while j < end and cls[cps[j]] & (BERT_SPACE | BERT_PUNCT) == 0:
                    j += 1
            out_starts[n] = i
            out_ends[n] = j
            n += 1
            i = j
    return n


@numba.njit(cache=True)
def split_metaspace_runs(cps, in_starts, in_ends, n_in, out_starts, out_ends) -> int:
    """`▁*[^▁]+|▁+`: a word starts at each run of "▁"."""
    n = 0
    for k in range(n_in):
        start, end = in_starts[k], in_ends[k]
        if start >= end:
            continue
        out_starts[n] = start
        for i in range(start + 1, end):
            if cps[i] == METASPACE and cps[i - 1] != METASPACE:
                out_ends[n] = i
                n += 1
                out_starts[n] = i
        out_ends[n] = end
        n += 1
    return n
