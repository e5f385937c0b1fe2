"""The tokenizer every format loads into: MNN's header ids around an encoder and a byte table."""

from __future__ import annotations

import warnings
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer

from mnngpu.errors import InputError, TokenizerError
from mnngpu.tokenizer.fast_encoder import FastEncoder
from mnngpu.tokenizer.header import TokenizerHeader
from mnngpu.tokenizer.stream import StreamDecoder
from mnngpu.tokenizer.unigram_lattice import LatticeEncoder, UnigramLattice


class Tokenizer:
    """encode: the prefix ids, then the text's ids with the special tokens split out first.
    decode: one id's text, as MNN's `tokenizer_decode` gives it (invalid UTF-8 as U+FFFD).

    `backend` is the HuggingFace tokenizer that computes the same ids as the file's source;
    the special tokens are in it as added tokens, so it splits them out before it normalizes.
    Where every stage of it has an exact stand-in, `FastEncoder` computes those ids faster.
    A .mtok Unigram model comes with its `lattice`, which breaks exact score ties as MNN does
    (unigram_lattice.py); the library then only splits the text into words.
    `token_bytes[id]` is the text each id stands for, as bytes (a byte-fallback id is one byte)."""

    def __init__(self, path: Path, header: TokenizerHeader, backend: HfTokenizer, token_bytes: list[bytes],
                 lattice: UnigramLattice | None = None):
        self.path = Path(path)
        self.format_type = header.type
        self.special_ids = list(header.special_ids)
        self.stop_ids = list(header.stop_ids)
        self._special_set = frozenset(self.special_ids)   # is_special/is_stop run once per generated token
        self._stop_set = frozenset(self.stop_ids)
        self.prefix_ids = list(header.prefix_ids)
        self._backend = backend
        self._encode_fast = getattr(backend, "encode_batch_fast", None)  # tokenizers >= 0.20
        self._lattice_path = LatticeEncoder.for_backend(backend, lattice) if lattice else None
        if lattice is not None and self._lattice_path is None:
            warnings.warn(f"{self.path}: the tokenizers library splits this Unigram model's text on its own (added "
                          "tokens with lstrip/rstrip/single_word, or a pre-tokenizer that prepends to the first "
                          "piece only), so where two cuts of a word score the same its ids may differ from MNN's",
                          stacklevel=2)
        self._fast_path = FastEncoder.for_backend(backend) if self._lattice_path is None else None
        self._fast_path_compiled = self._fast_path.compiled_check(backend) if self._fast_path else None
        self._token_bytes = token_bytes
        self._ids_by_text: dict[str, int] | None = None
        # Only a .mtok file carries these; for tokenizer.txt they come from llm_config.json's jinja.
        self.chat_template: str | None = None
        self.eos_token: str | None = None
        self.bos_token: str | None = None

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"expected text (str), got {type(text).__name__}", field="prompt")
        if not text:
            return list(self.prefix_ids)
        if self._lattice_path is not None:
            try:
                return self._lattice_path.encode(text, self.prefix_ids)
            except UnicodeEncodeError as exc:
                raise InputError(f"the text is not valid Unicode text ({exc})", field="prompt") from exc
        if self._fast_path is not None and self._fast_path_compiled():
            try:
                return self._fast_path.encode(text, self.prefix_ids)
            except UnicodeEncodeError:
                pass                 # a lone surrogate: the library's own error follows
        try:
            if self._encode_fast is not None:
                # The batch call without offsets: the same ids, about twice as fast on long text.
                return self.prefix_ids + self._encode_fast([text], add_special_tokens=False)[0].ids
            return self.prefix_ids + self._backend.encode(text, add_special_tokens=False).ids
        except (UnicodeError, TypeError) as exc:  # the library's answer to a lone surrogate is a TypeError
            raise InputError(f"the text is not valid Unicode text ({exc})", field="prompt") from exc
        except Exception as exc:  # noqa: BLE001 -- the library raises bare Exception on a damaged model
            raise TokenizerError(f"cannot encode with this tokenizer: {exc}", path=self.path) from exc

    def decode(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes an id stands for; empty for an id outside the vocab, as in MNN."""
        if 0 <= token_id < len(self._token_bytes):
            return self._token_bytes[token_id]
        return b""

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.token_bytes)

    def is_stop(self, token_id: int) -> bool:
        return token_id in self._stop_set

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_set

    def token_id(self, text: str) -> int | None:
        """The id whose text is exactly `text` (a special token's first), or None."""
        if self._ids_by_text is None:
            ids: dict[str, int] = {}
            for token_id, data in enumerate(self._token_bytes):
                ids.setdefault(data.decode("utf-8", errors="replace"), token_id)
            for token_id in self.special_ids:
                ids[self.decode(token_id)] = token_id
            self._ids_by_text = ids
        return self._ids_by_text.get(text)
