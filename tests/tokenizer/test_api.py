"""The engine-facing API: header ids, token lookup, streaming decode."""

from __future__ import annotations

import pytest

from tests.tokenizer.tokenizer_fixtures import tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_NAMES, reference


def header_ids(name: str) -> tuple[list[int], list[int], list[int]]:
    path = tokenizer(name).path
    lines = path.read_bytes().split(b"\n")[:3]
    n_special, n_stop, n_prefix = (int(x) for x in lines[1].split())
    ids = [int(x) for x in lines[2].split()]
    return ids[:n_special], ids[n_special:n_special + n_stop], ids[n_special + n_stop:][:n_prefix]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_header_ids_are_exposed(name):
    tok = tokenizer(name)
    special, stop, prefix = header_ids(name)
    assert (tok.special_ids, tok.stop_ids, tok.prefix_ids) == (special, stop, prefix)
    assert all(tok.is_stop(i) for i in stop)
    assert not tok.is_stop(-1)


def test_token_id_finds_special_and_plain_tokens():
    tok = tokenizer("mtok_qwen")
    im_end = tok.token_id("<|im_end|>")
    assert im_end is not None and tok.encode("<|im_end|>") == [im_end]
    assert tok.token_id("no such token at all") is None
    assert tokenizer("sentencepiece").token_id("<s>") == tokenizer("sentencepiece").prefix_ids[0]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_vocab_size_counts_every_id_decode_knows(name):
    assert tokenizer(name).vocab_size == len(reference(name)["mnn_decode"])


def stream(tok, ids: list[int]) -> list[str]:
    decoder = tok.stream_decoder()
    return [decoder.feed(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("name", ["sentencepiece", "tiktoken", "huggingface", "mtok_qwen", "mtok_llama"])
@pytest.mark.parametrize("text", ["日本語のテキスト 👨‍👩‍👧‍👦 🏳️‍🌈", "😀" * 20, "한국어 텍스트 ٣٤٥"])
def test_stream_decoder_holds_partial_utf8_until_it_completes(name, text):
    tok = tokenizer(name)
    ids = tok.encode(text)[len(tok.prefix_ids):]
    pieces = stream(tok, ids)
    split_somewhere = any(tok.decode(i) == "\ufffd" for i in ids)
    assert split_somewhere, "the fixture should split these characters into byte tokens"
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces).lstrip(" ") == text


def test_stream_decoder_gives_replacement_for_bytes_that_never_complete():
    tok = tokenizer("tiktoken")
    lead_byte = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xe4")
    letter = tok.encode("a")[0]
    assert stream(tok, [lead_byte, letter]) == ["", "\ufffda", ""]
    assert stream(tok, [letter, lead_byte]) == ["a", "", "\ufffd"]
