"""Echo logprobs and lm-evaluation-harness loglikelihoods from the server, against MNN's own
all_logits rows.

Truth: the rows MNN's runtime recorded for each fixture's prompt 1 (reference.json's
prompts[1]["rows_top"]: per prompt position, MNN's 8 largest logits as [ids, values]). A difference of
two log-softmax values of one row is the difference of the two logits (the normalizer cancels), so
for every two tokens that the server lists at a position and MNN recorded among that row's top 8,
the difference of the server's logprobs must be MNN's logit difference; and the k-th likeliest
alternative the server lists must carry MNN's k-th largest logit.

Bound: the suite holds each logit to 1e-3 x the row's std (tests/conformance/checks.py); a difference
of two logits to twice that. Rows' full stds are not recorded, so the std is that of the fixture's
recorded last row of the same prompt (first_logits.npy). Measured: at most 1.7e-4 of it on cpu (qwen3_5),
2.1e-5 on opencl and vulkan.

The completions endpoint names its alternatives by text; their ids come from the fixture's HF
tokenizer (byte-level tokens written as the server documents them, "bytes:\\x.."). A row of the
server's broken on purpose (its runner-up lowered by 0.01 of its std) fails both checks.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from mnngpu.apps.server import choice as server_choice
from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.conformance import checks
from tests.conftest import FIXTURES, hf_dir, reference
from tests.serving import openai_client, running

FIXTURE_NAMES = ["qwen2_int4_b64", "qwen3_c4", "qwen3_5_int4_b64"]
PROMPT = 1           # the prompt whose all_logits rows MNN recorded
TOP = 5              # alternatives the server lists per position (as lm-eval's and OpenAI's logprobs: <= 5)
FAULT_FIXTURE, FAULTY_ROW = "qwen3_c4", 5
FAULT_STD = 0.01     # a fifth of the 0.05 x std fault tests/conformance/test_injected_faults.py injects


class Recording:
    """MNN's all_logits rows of one fixture's prompt 1, and the bound for a logit difference."""

    def __init__(self, name: str):
        ref, first_logits = reference(name)
        prompt = ref["prompts"][PROMPT]
        assert "rows_top" in prompt, f"{name}: no rows_top recorded"
        self.ids: list[int] = prompt["ids"]
        self.rows = [dict(zip(ids, values)) for ids, values in prompt["rows_top"]]   # id -> logit, largest first
        self.std = float(first_logits[PROMPT].std())
        self.bound = 2 * checks.LOGIT_TOLERANCE * self.std


@contextlib.contextmanager
def served(name: str, backend_type: str):
    """An httpx client for the fixture served on backend_type."""
    model = checks.load(FIXTURES / name, backend_type, sampler_type="greedy")
    with running(create_app(ServedModel(model, name))) as client:
        yield client


def difference_errors(listed: dict[int, float], mnn_row: dict[int, float]) -> list[float]:
    """|server's logprob difference - MNN's logit difference| for every two tokens listed by both."""
    both = [token for token in listed if token in mnn_row]
    return [abs((listed[a] - listed[b]) - (mnn_row[a] - mnn_row[b])) for a in both for b in both if a < b]


def check_row(listed: dict[int, float], order: list[int], mnn_row: dict[int, float], bound: float,
              where: str) -> float:
    """A position's listed logprobs (token -> logprob) and its alternatives' order (likeliest first)
    against MNN's row; returns the worst difference error."""
    errors = difference_errors(listed, mnn_row)
    assert errors, f"{where}: no two listed tokens among MNN's top 8 of the row"
    worst = max(errors)
    assert worst <= bound, f"{where}: a logprob difference is off MNN's logit difference by {worst:.3g} " \
                           f"(bound {bound:.3g})"
    mnn_values = list(mnn_row.values())
    for k, token in enumerate(order):
        assert token in mnn_row, f"{where}: alternative {k} (id {token}) is not in MNN's top 8"
        assert abs(mnn_row[token] - mnn_values[k]) <= bound, \
            f"{where}: alternative {k} is id {token}, MNN's {k}-th likeliest is {list(mnn_row)[k]}"
    return worst


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, which Qwen's tokenizers use: the character each byte is written
    as in a token's name -> the byte. Printable Latin-1 bytes stand for themselves, the others for
    256 + their rank."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{chr(byte): byte for byte in printable}, **{chr(256 + k): byte for k, byte in enumerate(others)}}


def token_ids(name: str) -> dict[str, int]:
    """The completions' token strings of the fixture's HF tokenizer (its UTF-8 text, or "bytes:\\x.."
    where its bytes are not whole UTF-8 text) that name one id only."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(hf_dir(name) / "tokenizer.json"))
    alphabet = byte_level_alphabet()
    added = {token: added.content for token, added in tokenizer.get_added_tokens_decoder().items()}
    by_text: dict[str, list[int]] = {}
    for token in range(tokenizer.get_vocab_size()):
        if token in added:
            text = added[token]
        else:
            data = bytes(alphabet[char] for char in tokenizer.id_to_token(token))
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)
        by_text.setdefault(text, []).append(token)
    return {text: ids[0] for text, ids in by_text.items() if len(ids) == 1}


def echo_errors(name: str, backend_type: str) -> list[float]:
    """Prompt 1's ids sent with echo and logprobs; each position checked against MNN's row."""
    recording = Recording(name)
    with served(name, backend_type) as client:
        reply = openai_client(client).completions.create(model=name, prompt=recording.ids, echo=True,
                                                         logprobs=TOP, max_tokens=0)
    by_text = token_ids(name)
    logprobs = reply.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and len(logprobs.token_logprobs) == len(recording.ids)
    worst = []
    for i in range(1, len(recording.ids)):
        alternatives = [(by_text.get(text), lp) for text, lp in logprobs.top_logprobs[i].items()]
        listed = {token: lp for token, lp in alternatives if token is not None}
        listed[recording.ids[i]] = logprobs.token_logprobs[i]
        order = [token for token, _ in alternatives[:TOP]]
        if None in order:      # a token string that names several ids: the order is checked up to it
            order = order[:order.index(None)]
        worst.append(check_row(listed, order, recording.rows[i - 1], recording.bound,
                               f"{name} on {backend_type}, echo position {i}"))
    return worst


def continuations(recording: Recording, i: int) -> list[int]:
    """The one-token continuations lm-eval scores after the prompt's first i ids: MNN's 1st, 2nd and
    8th likeliest tokens there, and the prompt's next token where MNN has it among the 8 (on the
    random-weight fixtures it rarely is)."""
    ranked = list(recording.rows[i - 1])
    prompt_token = [recording.ids[i]] if recording.ids[i] in recording.rows[i - 1] else []
    return list(dict.fromkeys([*ranked[:2], ranked[-1], *prompt_token]))


def lm_eval_errors(name: str, backend_type: str) -> list[float]:
    """lm-eval's `local-completions` loglikelihoods (its echo request to /v1/completions) of each
    position's continuations; each position's checked against MNN's row."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    recording = Recording(name)
    asked = [(i, token) for i in range(1, len(recording.ids)) for token in continuations(recording, i)]
    # given as ids ((strings, context ids, continuation ids), as lm-eval's loglikelihood passes them on):
    # a token's text need not tokenize back to that token
    requests = [(("", ""), recording.ids[:i], [token]) for i, token in asked]
    with served(name, backend_type) as client:
        url = client.base_url
        lm = LocalCompletionsAPI(base_url=f"http://{url.host}:{url.port}/v1/completions", model=name,
                                 tokenizer_backend="remote", max_retries=1)
        answers = lm._loglikelihood_tokens(requests)
    by_position: dict[int, dict[int, float]] = {}
    for (i, token), (loglikelihood, is_greedy) in zip(asked, answers, strict=True):
        by_position.setdefault(i, {})[token] = loglikelihood
        mnn_values = list(recording.rows[i - 1].values())
        if token == likeliest(recording, i):
            assert is_greedy or mnn_values[0] - mnn_values[1] <= recording.bound, \
                f"{name} on {backend_type}, lm-eval position {i}: MNN's likeliest token is not the greedy one"
    return [check_row(listed, [], recording.rows[i - 1], recording.bound,
                      f"{name} on {backend_type}, lm-eval position {i}") for i, listed in by_position.items()]


def likeliest(recording: Recording, i: int) -> int:
    """MNN's likeliest token after the prompt's first i ids."""
    return next(iter(recording.rows[i - 1]))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_echo_logprobs_differ_as_mnns_logits(name, backend_type):
    worst = echo_errors(name, backend_type)
    print(f"{name} on {backend_type}: echo, worst error {max(worst):.3g} "
          f"= {max(worst) / Recording(name).std:.3g} std")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_lm_eval_loglikelihoods_differ_as_mnns_logits(name, backend_type):
    pytest.importorskip("lm_eval")
    worst = lm_eval_errors(name, backend_type)
    print(f"{name} on {backend_type}: lm-eval, worst error {max(worst):.3g} "
          f"= {max(worst) / Recording(name).std:.3g} std")


@pytest.fixture
def wrong_row(monkeypatch):
    """The server's prompt logprobs taken from rows whose FAULTY_ROW has its runner-up logit lowered
    by FAULT_STD x the row's std (the argmax stays put)."""
    original = server_choice.prompt_logprobs

    def broken(rows, ids, top):
        rows = np.array(rows, dtype=np.float32)
        if len(rows) > FAULTY_ROW:
            row = rows[FAULTY_ROW]
            row[np.argsort(row)[-2]] -= FAULT_STD * row.std()
        return original(rows, ids, top)

    monkeypatch.setattr(server_choice, "prompt_logprobs", broken)


def test_a_wrong_row_fails_the_echo_check(wrong_row):
    with pytest.raises(AssertionError, match=f"echo position {FAULTY_ROW + 1}: a logprob difference"):
        echo_errors(FAULT_FIXTURE, "cpu")


def test_a_wrong_row_fails_the_lm_eval_check(wrong_row):
    pytest.importorskip("lm_eval")
    with pytest.raises(AssertionError, match=f"lm-eval position {FAULTY_ROW + 1}: a logprob difference"):
        lm_eval_errors(FAULT_FIXTURE, "cpu")
