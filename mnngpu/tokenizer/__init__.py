"""MNN's tokenizer files, all five formats, encoding as the model's own tokenizer does.

    tok = load_tokenizer(base_dir, tokenizer_file)
    tok.encode(text) -> ids (prefix ids first, special tokens split out)
    tok.decode(id) -> text;  tok.stream_decoder().feed(id) -> complete UTF-8 text only
"""

from mnngpu import jit  # noqa: F401 -- first: it tells numba where the kernel cache is
from mnngpu.errors import TokenizerError
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.loader import load_tokenizer, resolve_tokenizer_path

__all__ = ["Tokenizer", "TokenizerError", "load_tokenizer", "resolve_tokenizer_path"]
