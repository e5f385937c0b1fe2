"""load_tokenizer: find the tokenizer file of a model folder, read its header, pick the format."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from mnngpu.errors import TokenizerError
from mnngpu.tokenizer import bert, huggingface, mtok, sentencepiece, tiktoken
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.header import (
    BERT,
    HUGGINGFACE,
    MAGIC_NUMBER,
    MTOK,
    SENTENCEPIECE,
    TIKTOKEN,
    read_header,
)

DEFAULT_TOKENIZER_FILE = "tokenizer.txt"  # MNN's default for a config without tokenizer_file
LOADERS = {SENTENCEPIECE: sentencepiece.load, TIKTOKEN: tiktoken.load, BERT: bert.load,
           HUGGINGFACE: huggingface.load, MTOK: mtok.load}
_warned: set[str] = set()


def _is_mnn_tokenizer(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == f"{MAGIC_NUMBER} ".encode()
    except OSError:
        return False


def resolve_tokenizer_path(base_dir: str | os.PathLike, tokenizer_file: str | None) -> Path:
    """base_dir/tokenizer_file, or, when that file is missing, the folder's only MNN tokenizer.* file.

    llmexport 0.0.5 writes "tokenizer_file": "tokenizer.mtok" into config.json even when it wrote a
    tokenizer.txt, so a missing configured file with exactly one candidate beside it is that file."""
    base = Path(base_dir)
    configured = base / (tokenizer_file or DEFAULT_TOKENIZER_FILE)
    if configured.is_file():
        return configured
    candidates = sorted(p for p in base.glob("tokenizer.*") if p.is_file() and _is_mnn_tokenizer(p))
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise TokenizerError(f"the configured tokenizer file is missing, and the folder does not hold "
                             f"exactly one MNN tokenizer.* file to use instead (found: {found}); set "
                             f"tokenizer_file in config.json", path=configured, field="tokenizer_file")
    chosen = candidates[0]
    if str(configured) not in _warned:
        _warned.add(str(configured))
        warnings.warn(f"{configured} does not exist; using {chosen.name}, the only tokenizer file in "
                      f"{base} (set tokenizer_file in config.json to silence this)", stacklevel=3)
    return chosen


def load_tokenizer(base_dir: str | os.PathLike, tokenizer_file: str | None = None) -> Tokenizer:
    """The tokenizer of an MNN model folder; raises TokenizerError naming the file and line/offset."""
    path = resolve_tokenizer_path(base_dir, tokenizer_file)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TokenizerError(f"a readable tokenizer file ({err.strerror})", path=path) from None
    header, body_offset = read_header(path, data)
    loader = LOADERS.get(header.type)
    if loader is None:
        raise TokenizerError(f"expected tokenizer type 0-4 (SentencePiece, Tiktoken, BERT, HuggingFace, "
                             f"mtok), found {header.type}", path=path, field="line 1")
    return loader(path, header, data, body_offset)
