"""Lookahead on every backend and fixture model: with greedy sampling it gives exactly the tokens
MNN's runtime recorded (AR), and on long repetitive prompts exactly mnngpu's own AR tokens
(which the fixture test holds to MNN). The verify forward and the KV cache's `remove` are
checked row by row against one-token decoding; on the models with recurrent state (lfm2,
qwen3_5) that `remove` also rolls the state back to the kept rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnngpu.format import read_net
from mnngpu.runtime.validate import has_recurrent_state
from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, load
from tests.conftest import FIXTURES, MODEL_NAMES, reference

GREEDY = {"sampler_type": "greedy", "max_all_tokens": 4096}
LOOKAHEAD = {**GREEDY, "speculative_type": "lookahead", "ngram_update": True}
REPEATS = "The river looks at a warm loaf of bread in the spring. "


def until_stop(model, tokens: list[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if model.tokenizer.is_stop(token):
            return tokens[:i]
    return tokens


RECURRENT = [name for name in MODEL_NAMES if has_recurrent_state(read_net(FIXTURES / name / "llm.mnn"))]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_lookahead_gives_mnn_greedy_tokens(name, backend_type):
    ref, _ = reference(name)
    model = load(name, backend_type, **LOOKAHEAD)
    for prompt in ref["prompts"]:
        model.reset()
        out = model.generate(prompt["ids"], len(prompt["greedy"]))
        assert out == until_stop(model, prompt["greedy"]), prompt["text"]


@pytest.mark.parametrize("name", MODEL_NAMES[-2:] + RECURRENT)
def test_lookahead_gives_ar_tokens_on_repetitive_text(name, backend_type):
    ar = load(name, backend_type, **GREEDY)
    spec = load(name, backend_type, **LOOKAHEAD)
    ids = ar.tokenizer_encode(REPEATS * 6)
    expected = ar.generate(ids, 96)
    assert spec.generate(ids, 96) == expected
    stats = spec.strategy.stats
    assert stats.drafted > 0
    if name in RECURRENT:   # some drafts were rejected: the state was rolled back
        assert stats.accepted < stats.drafted
    # the cache holds what AR's does: a second turn continues identically
    more = ar.tokenizer_encode(REPEATS)
    assert spec.generate(more, 24) == ar.generate(more, 24)


@pytest.mark.parametrize("name", MODEL_NAMES[:1] + RECURRENT)
def test_verify_rows_and_kv_remove_match_one_token_decoding(name, backend_type):
    ref, _ = reference(name)
    prompt = ref["prompts"][1]
    ar = load(name, backend_type, **GREEDY)
    spec = load(name, backend_type, **LOOKAHEAD, draft_predict_length=4)
    block = prompt["greedy"][:5]
    ar.forward(prompt["ids"])
    ar_rows = [np.asarray(ar.forward([t]))[0, -1] for t in block]   # what follows prompt + block[:k+1]
    scale = LOGIT_TOLERANCE * float(np.std(ar_rows[0]))
    spec.forward(prompt["ids"])
    caches = spec.runtime.backend().kv_caches
    buffers = {layer: cache.k for layer, cache in caches.items()}
    rows = np.asarray(spec.verify(block))[0]
    assert rows.shape == (5, ar_rows[0].size)
    assert max(np.abs(row - ar_row).max() for row, ar_row in zip(rows, ar_rows)) <= scale
    spec.discard(2)   # keep block[:2]: the next forward must see exactly prompt + block[:3]
    after = np.asarray(spec.forward([block[2]]))[0, -1]
    assert np.abs(after - ar_rows[2]).max() <= scale
    assert spec.runtime.kv_meta.previous == len(prompt["ids"]) + 3
    assert buffers and all(caches[layer].k is k for layer, k in buffers.items())   # no reallocation


def test_mnn_runtime_streams_the_same_lookahead_reply(tmp_path):
    """MNN's own engine with speculative_type lookahead on the same folder: response() streams
    exactly the bytes of mnngpu's lookahead tokens (skipped without the `mnn` wheel)."""
    pytest.importorskip("MNN.llm")
    for text, reply, tokens, ours in both_replies(MODEL_NAMES[-1], LOOKAHEAD, tmp_path):
        assert ours == reply, text


def both_replies(name: str, strategy: dict, tmp_path: Path) -> list[tuple[str, bytes, list[int], bytes]]:
    """(prompt, MNN's streamed bytes, mnngpu's tokens, their bytes) on fixture `name` with these
    strategy settings, for its first prompt and a repetitive one, 40 new tokens, no template."""
    ref, _ = reference(name)
    prompts = [ref["prompts"][0]["text"], REPEATS * 6]
    settings = {**strategy, "max_new_tokens": 40, "use_template": False}
    replies = mnn_replies(name, prompts, settings, tmp_path)
    model = load(name, "cpu", **settings)
    found = []
    for text, reply in zip(prompts, replies):
        model.reset()
        tokens = model.generate(model.tokenizer_encode(text))
        found.append((text, reply, tokens, b"".join(model.tokenizer.token_bytes(t) for t in tokens)))
    return found


def mnn_replies(name: str, prompts: list[str], settings: dict, tmp_path: Path) -> list[bytes]:
    """The bytes MNN's response() streams for each prompt on fixture `name` with `settings`."""
    out = tmp_path / "replies.json"
    oracle = Path(__file__).resolve().parents[1] / "mnn_oracle.py"
    # the wheel may crash on exit after writing its record; the record is what counts
    subprocess.run([sys.executable, str(oracle), str(FIXTURES / name), "--replies", "--prompts-json",
                    json.dumps(prompts), "--config-json", json.dumps(settings), "--json-out", str(out)],
                   check=False, capture_output=True, timeout=300)
    replies = [bytes.fromhex(reply["reply_hex"]) for reply in json.loads(out.read_text())["replies"]]
    assert len(replies) == len(prompts) and all(replies)
    return replies
