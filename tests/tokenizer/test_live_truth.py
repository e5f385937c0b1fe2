"""Live checks, where the libraries are installed: the source library on the committed source
files, on the battery and on random text; MNN's own reader on the battery; the model fixtures'
.mtok files against their tokenizer.json."""

from __future__ import annotations

import importlib.util
import random
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnngpu.tokenizer import load_tokenizer
from tests.conftest import hf_dir
from tests.tokenizer.tokenizer_fixtures import MODEL_FIXTURES, encodes_as_source, tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_NAMES, FIXTURE_ROOT, reference
from tools.mnn_tokenizer import mnn_available, run_mnn_tokenizer
from tools.tokenizer_truth import SOURCE_MODULES, source_encoder


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@lru_cache(maxsize=None)
def truth(name: str):
    source = reference(name)["source"]
    module = SOURCE_MODULES[source["library"]]
    if not installed(module):
        pytest.skip(f"{module} is not installed: only the recorded truth is checked")
    return source_encoder(FIXTURE_ROOT / name, source)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_recorded_truth_is_what_the_source_library_gives_now(name):
    encode = truth(name)
    cases = reference(name)["cases"]
    assert [encode(c["text"]) for c in cases] == [c["source_ids"] for c in cases]


# Characters that stress each stage: spaces and controls, accents (composed and not), CJK,
# emoji with modifiers and joiners, digits of several scripts, and ASCII punctuation.
ALPHABET = list(" \t\n\r  ab AZ'sllé\u0301ñßİ你好的中文日本語한😀👍🏽\u200d🏳️\ufe0f0123456789٣²½.,!?-_()[]<>|#") + \
    ["<|im_end|>", "<s>", "[SEP]"]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(ALPHABET), max_size=40))
def test_random_text_encodes_as_the_source_library_does(name, pieces):
    text = "".join(pieces)
    assert encodes_as_source(name, tokenizer(name).encode(text), truth(name)(text))


@pytest.fixture(scope="module")
def mnn():
    if not installed("MNN") or not mnn_available():
        pytest.skip("MNN (the oracle) is not installed: its recorded ids are checked instead")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_recorded_mnn_ids_are_what_mnn_gives_now(name, mnn):
    ref = reference(name)
    cases = ref["cases"]
    live = run_mnn_tokenizer(FIXTURE_ROOT / name / ref["tokenizer_file"], [c["text"] for c in cases])
    assert live["ids"] == [c["mnn_ids"] for c in cases]


def test_random_text_encodes_as_mnn_does_with_a_unigram_mtok(mnn):
    """Exact score ties are common in Unigram vocabularies (runs of one character, digit groups):
    MNN's own reader on random text, with runs of tie-prone characters, in one call."""
    rng = random.Random(1234)
    alphabet = [*ALPHABET, "l", "ll", "0", "00", ",", ".", "-", " "]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(300)]
    path = FIXTURE_ROOT / "mtok_unigram" / reference("mtok_unigram")["tokenizer_file"]
    tok = tokenizer("mtok_unigram")
    assert [tok.encode(t) for t in texts] == run_mnn_tokenizer(path, texts)["ids"]


@pytest.mark.parametrize("tokenizer_path", MODEL_FIXTURES, ids=lambda p: p.parent.name)
def test_model_fixture_mtok_encodes_as_its_tokenizer_json(tokenizer_path):
    from tokenizers import Tokenizer as HfTokenizer

    source = HfTokenizer.from_file(str(hf_dir(tokenizer_path.parent.name) / "tokenizer.json"))
    tok = load_tokenizer(tokenizer_path.parent, "tokenizer.mtok")
    specials = [t.content for t in source.get_added_tokens_decoder().values()]
    texts = [c["text"] for c in reference("mtok_qwen")["cases"]] + [f"a{s} b{s}\n" for s in specials]
    expected = [tok.prefix_ids + source.encode(t, add_special_tokens=False).ids for t in texts]
    assert [tok.encode(t) for t in texts] == expected
