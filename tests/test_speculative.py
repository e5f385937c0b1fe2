"""Generation strategies on a toy model whose next token is a known function of the sequence,
so AR's output is computed directly and the KV cache's contents are visible.

The real-model checks (every backend, MNN's runtime) are in tests/conformance/test_speculative_models.py.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from mnngpu.config import LlmConfig
from mnngpu.errors import ConfigError
from mnngpu.generation.ar import ArGeneration
from mnngpu.generation.eagle import EagleGeneration
from mnngpu.generation.eagle_draft import _kept_prefix
from mnngpu.generation.factory import create_strategy
from mnngpu.generation.lookahead import LookaheadGeneration
from mnngpu.generation.ngram import NgramTable
from mnngpu.generation.steps import DecodeSteps
from tests.conftest import FIXTURES

VOCAB = 12
STOP = 11


def next_token(sequence: list[int]) -> int:
    """Mostly a cycle through 1..7 (so n-gram drafts are often right), broken every 13th position."""
    if len(sequence) % 13 == 0:
        return (sequence[-1] * 5 + 3) % 10
    return sequence[-1] % 7 + 1


class ToyModel:
    """Forwards that keep a token cache the way KVMeta does: `discard` takes effect at the next forward."""

    def __init__(self):
        self.cache: list[int] = []
        self.remove = 0
        self.block = 0   # the length of the last verify block
        self.forwards = 0

    def _append(self, ids: list[int]) -> None:
        if self.remove:
            del self.cache[-self.remove:]
            self.remove = 0
        self.fed_positions = np.arange(len(self.cache), len(self.cache) + len(ids))
        self.cache.extend(ids)
        self.forwards += 1

    def hidden(self) -> np.ndarray:
        """A toy hidden_states output: each fed row's position in the sequence."""
        return self.fed_positions[:, None].astype(np.float32)

    def _row(self, sequence: list[int]) -> np.ndarray:
        logits = np.zeros(VOCAB, dtype=np.float32)
        logits[next_token(sequence)] = 1.0
        return logits

    def forward(self, ids: list[int]) -> np.ndarray:
        self._append(ids)
        return self._row(self.cache)

    def verify(self, ids: list[int]) -> np.ndarray:
        self._append(ids)
        return np.stack([self._row(self.cache[: len(self.cache) - len(ids) + i + 1]) for i in range(len(ids))])

    def discard(self, keep: int) -> None:
        self.remove = self.block - keep

    def steps(self, prompt: list[int], stop: set[int], on_token=None) -> DecodeSteps:
        history = list(prompt)

        def sample(logits: np.ndarray) -> int:
            history.append(int(np.argmax(logits)))
            return history[-1]

        def verify(ids: list[int]) -> np.ndarray:
            self.block = len(ids)
            return self.verify(ids)

        return DecodeSteps(self.forward, sample, lambda t: t in stop, history, on_token, verify, self.discard,
                           hidden=self.hidden)


def ar_rollout(prompt: list[int], limit: int, stop: set[int]) -> list[int]:
    sequence, out = list(prompt), []
    while len(out) < limit:
        token = next_token(sequence)
        if token in stop:
            break
        out.append(token)
        sequence.append(token)
    return out


def lookahead(draft_length=3, max_key_len=4, strictness="low", rule="freqxlen", update=True):
    return LookaheadGeneration(draft_length, max_key_len, strictness, rule, update, None)


PROMPT = [3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 9]


@pytest.mark.parametrize("strategy", [lookahead(), lookahead(draft_length=1), lookahead(draft_length=6),
                                      lookahead(rule="fcfs"), lookahead(update=False),
                                      lookahead(strictness="high", max_key_len=2)],
                         ids=["default", "draft1", "draft6", "fcfs", "no-update", "high-k2"])
@pytest.mark.parametrize("limit", [1, 2, 7, 40, 97])
def test_lookahead_gives_ar_tokens_and_cache(strategy, limit):
    model = ToyModel()
    out = strategy.generate(model.steps(PROMPT, set()), PROMPT, limit)
    assert out.tokens == ar_rollout(PROMPT, limit, set())
    # the contract Llm relies on: every token but the last is in the cache, once pending removes apply
    model._append([])
    assert model.cache == PROMPT + out.tokens[:-1]
    if limit >= 40:
        assert strategy.stats.accepted > 0
        assert strategy.stats.decode_forwards < limit - 1


@pytest.mark.parametrize("stop_token", [2, 5, 8])
def test_lookahead_stops_where_ar_does(stop_token):
    stop = {stop_token}
    model = ToyModel()
    out = lookahead(draft_length=5).generate(model.steps(PROMPT[:-1], stop), PROMPT[:-1], 50)
    expected = ar_rollout(PROMPT[:-1], 50, stop)
    assert out.tokens == expected and out.ended_on_stop_id
    model._append([])
    assert model.cache == PROMPT[:-1] + expected   # a stop id ends with every kept token cached


def test_on_token_can_end_a_reply_inside_a_verify_block():
    seen: list[int] = []

    def on_token(token: int) -> bool:
        seen.append(token)
        return len(seen) == 12

    model = ToyModel()
    out = lookahead(draft_length=6).generate(model.steps(PROMPT, set(), on_token), PROMPT, 50)
    assert out.tokens == seen == ar_rollout(PROMPT, 12, set())
    model._append([])
    assert model.cache == PROMPT + out.tokens[:-1]


def test_ar_counts_one_token_per_forward():
    model = ToyModel()
    strategy = ArGeneration()
    out = strategy.generate(model.steps(PROMPT, set()), PROMPT, 20)
    assert out.tokens == ar_rollout(PROMPT, 20, set())
    assert strategy.stats.decode_forwards == 19 and strategy.stats.tokens_per_forward == 1.0


# ---- the n-gram table, against a direct count over the sequence ------------------------------

def followers_by_scan(sequence: list[int], key: tuple[int, ...]) -> Counter:
    size = len(key)
    return Counter(sequence[i] for i in range(size, len(sequence)) if tuple(sequence[i - size: i]) == key)


def best_by_scan(text: list[int], sequence: list[int], max_len: int) -> int | None:
    """freqxlen at strictness low: the highest count x key length over every key length."""
    best, best_score = None, 0
    for size in range(min(max_len, len(sequence)), 0, -1):
        counts = followers_by_scan(text, tuple(sequence[-size:]))
        for token in counts:   # in the order they first follow the key: a tie goes to the first
            if counts[token] * size > best_score:
                best, best_score = token, counts[token] * size
    return best


@pytest.mark.parametrize("seed", range(5))
def test_ngram_freqxlen_matches_a_direct_count(seed):
    rng = np.random.default_rng(seed)
    text = [int(t) for t in rng.integers(0, 6, size=300)]
    table = NgramTable(4, "freqxlen")
    table.add(text)
    for end in range(5, 300, 17):
        sequence = text[:end]
        drafts = table.draft(sequence, 1)
        assert drafts == [best_by_scan(text, sequence, 4)]


def test_ngram_fcfs_takes_the_longest_key_and_its_first_follower():
    text = [1, 2, 3, 9, 5, 3, 4, 2, 3, 7, 2, 3, 8]
    table = NgramTable(3, "fcfs")
    table.add(text)
    assert table.draft([5, 2, 3], 1) == [9]     # key (2, 3): followers 9, 7, 8 in that order
    assert table.draft([1, 2, 3], 1) == [9]     # key (1, 2, 3) is longer and says 9
    assert table.draft([6, 6], 1) == []


def test_ngram_strictness_asks_for_a_share():
    text = [1, 2, 1, 3, 1, 4, 1, 2]
    table = NgramTable(1, "freqxlen")
    table.add(text)
    assert table.draft([1], 1, "low") == [2]        # 2 of 4 followers
    assert table.draft([1], 1, "medium") == []      # needs 60 % at key length 1
    assert table.draft([1], 2, "medium") == []


# ---- EAGLE ----------------------------------------------------------------------------------------

class ScriptedDraft:
    """A draft head that knows the toy model: it drafts the true continuation, spoiling one draft
    of every other call, and records what it was given."""

    def __init__(self, model: ToyModel):
        self.model, self.calls = model, []

    def reset(self) -> None:
        self.calls = []

    def propose(self, tokens: list[int], hidden: np.ndarray, count: int) -> list[int]:
        self.calls.append((list(tokens), hidden[:, 0].astype(int).tolist()))
        sequence = self.model.cache[: int(hidden[-1, 0]) + 1] + [tokens[-1]]
        drafts = []
        for _ in range(count):
            drafts.append(next_token(sequence + drafts))
        if len(self.calls) % 2 == 0:
            spoiled = len(self.calls) % count
            drafts[spoiled] = (drafts[spoiled] + 1) % 10
        return drafts


@pytest.mark.parametrize("draft_length", [1, 3, 5])
@pytest.mark.parametrize("limit", [1, 2, 9, 60])
def test_eagle_gives_ar_tokens_and_feeds_the_draft_each_kept_row_with_the_token_after_it(draft_length, limit):
    model = ToyModel()
    draft = ScriptedDraft(model)
    strategy = EagleGeneration(draft_length, draft)
    out = strategy.generate(model.steps(PROMPT, set()), PROMPT, limit)
    assert out.tokens == ar_rollout(PROMPT, limit, set())
    model._append([])
    assert model.cache == PROMPT + out.tokens[:-1]
    sequence = PROMPT + out.tokens
    for tokens, positions in draft.calls:
        assert [sequence[p + 1] for p in positions] == tokens
    if limit >= 60:
        assert strategy.stats.accepted > 0 and strategy.stats.decode_forwards < limit - 1
        assert strategy.stats.drafted == draft_length * strategy.stats.decode_forwards


@pytest.mark.parametrize("stop_token", [2, 5, 8])
def test_eagle_stops_where_ar_does(stop_token):
    model = ToyModel()
    out = EagleGeneration(4, ScriptedDraft(model)).generate(model.steps(PROMPT[:-1], {stop_token}), PROMPT[:-1], 50)
    assert out.tokens == ar_rollout(PROMPT[:-1], 50, {stop_token}) and out.ended_on_stop_id


@pytest.mark.parametrize("cumulative, count, kept", [
    ([-0.5, -1.0, -2.0], 3, 3), ([-0.5, -1.0, -2.0], 2, 2), ([-0.5, -1.0, -2.0], 0, 0),
    ([0.0, 0.0, -1.0], 1, 1),     # a tie keeps the earlier node
    ([-1.0, 0.5, 0.2], 2, 0),     # the first node dropped: nothing follows the chain
    ([-1.0, -3.0, -2.0], 2, 1),   # scores may rise when they are not log-probabilities
])
def test_eagle_keeps_the_chain_prefix_mnns_token_tree_keeps(cumulative, count, kept):
    assert _kept_prefix(cumulative, count) == kept


# ---- the factory --------------------------------------------------------------------------------

def config(**keys) -> LlmConfig:
    cfg = LlmConfig.load(FIXTURES / "qwen2_int8_b0")
    cfg.set_config(keys)
    return cfg


def test_factory_picks_by_speculative_type():
    assert isinstance(create_strategy(config(), ["logits"]), ArGeneration)
    strategy = create_strategy(config(speculative_type="lookahead", draft_predict_length=5,
                                      draft_selection_rule="fcfs"), ["logits"])
    assert isinstance(strategy, LookaheadGeneration)
    assert strategy.verify_length == 6 and strategy.rule == "fcfs" and strategy.lookup_file is None


@pytest.mark.parametrize("keys, words", [
    ({"speculative_type": "draftmodel"}, "not a strategy MNN's engine has"),
    ({"speculative_type": "mtp"}, "needs mtp.mnn (mtp_model)"),
    ({"speculative_type": "eagle"}, "needs eagle.mnn (eagle_model)"),
    ({"speculative_type": "dflash"}, "needs dflash.mnn (dflash_model)"),
    ({"speculative_type": "lookahead", "ngram_match_maxlen": 9}, "at most 8"),
    ({"speculative_type": "lookahead", "lookup_file": "absent.txt"}, "no such file: absent.txt"),
])
def test_factory_says_why_a_strategy_cannot_run(keys, words):
    with pytest.raises(ConfigError) as error:
        create_strategy(config(**keys), ["logits"])
    assert words in str(error.value) and "\n" not in str(error.value)


def test_lookup_file_tokens_become_drafts(tmp_path):
    class Tokens:
        def encode(self, text):
            return json.loads(text)

        def decode(self, token):
            return str(token)

    lookup = tmp_path / "lookup.txt"
    lookup.write_text(json.dumps([9, 8, 7, 6, 5, 4]))
    strategy = LookaheadGeneration(3, 4, "low", "freqxlen", False, lookup)
    seen, history = [], [1, 9]

    def sample(logits):
        history.append(int(np.argmax(logits)))
        return history[-1]

    steps = DecodeSteps(lambda ids: np.eye(VOCAB)[8], sample, lambda t: False, history,
                        verify=lambda ids: seen.append(ids) or np.eye(VOCAB)[[7, 6, 5, 4]],
                        discard=lambda keep: None, tokenizer=Tokens())
    strategy.generate(steps, [1, 9], 3)
    assert seen[0] == [8, 7, 6, 5]   # after ..., 9, 8 the lookup text says 7, 6, 5


def test_verify_needs_a_speculative_model():
    from mnngpu import llm as mnngpu_llm
    from mnngpu.errors import MnnGpuError

    model = mnngpu_llm.create(FIXTURES / "qwen2_int8_b0")
    model.set_config({"backend_type": "cpu", "thread_num": 1})
    model.load()
    with pytest.raises(MnnGpuError, match="needs a speculative_type"):
        model.verify([1, 2, 3, 4])
    model.set_config({"speculative_type": "lookahead"})
    model.load()
    with pytest.raises(MnnGpuError, match="a verify block is 4 ids"):
        model.verify([1, 2])
