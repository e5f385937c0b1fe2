"""tokenizer.txt type 2: a BERT WordPiece vocabulary, one base64 token per line.

The truth is HuggingFace's BERT tokenizer on the source vocab.txt: BertNormalizer (clean text,
spaces around CJK characters, accents stripped when lowercasing), BertPreTokenizer, WordPiece.
MNN 3.6.1's reader only lowercases ASCII and splits every non-ASCII character off on its own, so it
differs on accented, CJK and emoji text, and on words longer than 100 characters (HF: [UNK]).

The file does not say whether the model is uncased; a vocab without upper-case letters is.
"""

from __future__ import annotations

import re
from pathlib import Path

from mnngpu.errors import TokenizerError
from mnngpu.tokenizer import tokenizer_json as tj
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.header import TokenizerHeader, text_body
from mnngpu.tokenizer.tiktoken import read_tokens

UNK_TOKEN = "[UNK]"
MNN_UNK_FALLBACK_ID = 100  # MNN's choice when the vocab holds no [UNK]
BRACKETED = re.compile(r"\[[A-Za-z0-9_]+\]|<[^<>]+>")


def is_uncased(vocab: dict[str, int], special_ids: set[int]) -> bool:
    return not any(t != t.lower() for t, i in vocab.items() if i not in special_ids and not BRACKETED.fullmatch(t))


def load(path: Path, header: TokenizerHeader, data: bytes, body_offset: int) -> Tokenizer:
    tokens = read_tokens(text_body(path, data, body_offset))
    texts = [t.decode("utf-8", errors="replace") for t in tokens]
    vocab: dict[str, int] = {}
    for token_id, text in enumerate(texts):
        vocab.setdefault(text, token_id)
    if not texts:
        raise TokenizerError("the WordPiece vocabulary has no tokens", path=path, field="vocabulary")
    special_ids = {i for i in header.special_ids if 0 <= i < len(texts)}
    unk = UNK_TOKEN if UNK_TOKEN in vocab else texts[min(MNN_UNK_FALLBACK_ID, len(texts) - 1)]
    lowercase = is_uncased(vocab, special_ids)
    normalizer = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                  "strip_accents": None, "lowercase": lowercase}
    added = [tj.added_token(i, texts[i]) for i in sorted(special_ids)]
    backend = tj.build(path, tj.wordpiece_model(vocab, unk), normalizer, {"type": "BertPreTokenizer"}, added)
    return Tokenizer(path, header, backend, tokens)
