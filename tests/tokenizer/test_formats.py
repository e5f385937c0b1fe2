"""Every format's fixture against the recorded truth: the source library's ids and MNN's decode."""

from __future__ import annotations

import json
import warnings

import pytest
from tokenizers import Tokenizer as HfTokenizer

from mnngpu.tokenizer import Tokenizer
from mnngpu.tokenizer.header import TokenizerHeader
from mnngpu.tokenizer.unigram_lattice import UnigramLattice
from tests.tokenizer.tokenizer_fixtures import MNN_DECODE_NUL, encodes_as_source, lossless_text, tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_NAMES, reference


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_encode_gives_the_source_tokenizers_ids(name):
    tok = tokenizer(name)
    wrong = [(c["text"][:30], tok.encode(c["text"])[:10], c["source_ids"][:10])
             for c in reference(name)["cases"] if not encodes_as_source(name, tok.encode(c["text"]), c["source_ids"])]
    assert not wrong


def test_a_unigram_mtok_whose_split_the_lattice_cannot_do_says_so_once_at_load():
    tok = tokenizer("mtok_unigram")
    spec = json.loads(tok._backend.to_str())
    lattice = UnigramLattice([tuple(p) for p in spec["model"]["vocab"]], spec["model"]["unk_id"], False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer(tok.path, TokenizerHeader(0, [], [], []), tok._backend, [b""], lattice)
    spec["pre_tokenizer"]["prepend_scheme"] = "first"
    backend = HfTokenizer.from_str(json.dumps(spec))
    with pytest.warns(UserWarning, match="may differ from MNN's"):
        Tokenizer(tok.path, TokenizerHeader(0, [], [], []), backend, [b""], lattice)


def test_a_unigram_mtok_breaks_score_ties_as_mnn_does():
    """Where MNN and the source library cut a text into different, equally scored pieces
    ("1,000,000"), the .mtok file's ids are MNN's: on every recorded case."""
    cases = reference("mtok_unigram")["cases"]
    assert any(c["mnn_ids"] != c["source_ids"] for c in cases)
    tok = tokenizer("mtok_unigram")
    assert [tok.encode(c["text"]) for c in cases] == [c["mnn_ids"] for c in cases]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_encode_agrees_with_mnn_wherever_mnn_agrees_with_the_source(name):
    tok = tokenizer(name)
    cases = [c for c in reference(name)["cases"] if c["mnn_ids"] == c["source_ids"]]
    assert cases, "MNN agrees with the source on no string at all"
    assert [tok.encode(c["text"]) for c in cases] == [c["mnn_ids"] for c in cases]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_decode_of_each_id_is_mnns_tokenizer_decode(name):
    tok = tokenizer(name)
    mnn = reference(name)["mnn_decode"]
    checked = [(i, text) for i, text in enumerate(mnn)
               if text is not None and tok.token_bytes(i) != MNN_DECODE_NUL]
    assert len(checked) > tok.vocab_size // 2
    assert [(i, tok.decode(i)) for i, _ in checked] == checked


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_decode_of_encode_gives_the_text_back_where_the_format_is_lossless(name):
    tok = tokenizer(name)
    checked = 0
    for case in reference(name)["cases"]:
        expected = lossless_text(name, case["text"])
        if expected is None:
            continue
        ids = tok.encode(case["text"])[len(tok.prefix_ids):]
        assert b"".join(tok.token_bytes(i) for i in ids).decode() == expected
        checked += 1
    assert checked > 0 or lossless_text(name, "a") is None


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_prefix_ids_come_first(name):
    tok = tokenizer(name)
    for case in reference(name)["cases"]:
        assert tok.encode(case["text"])[:len(tok.prefix_ids)] == tok.prefix_ids
    assert tok.encode("") == tok.prefix_ids
