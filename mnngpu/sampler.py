"""MNN's token samplers: greedy, temperature, topK, topP, minP, tfs, typical, penalty and mixed.

A sampler turns the logits of the last position into one token id. It is a chain of
filters followed by a final pick:

    mixed:   logit_bias -> banned_tokens -> [penalty] -> mixed_samplers in order -> pick
    penalty: penalty -> pick (penalty_sampler: greedy, or temperature)
    other:   that one filter -> pick (temperature)

Each filter keeps a subset of the vocabulary. The kept tokens travel as `(ids, logits)`;
`ids is None` means "the whole vocabulary, in id order". Every filter that needs
probabilities recomputes softmax(logits / temperature) over what is left, as MNN does, so
the position of "temperature" in `mixed_samplers` does not matter: it scales every step.

The float32 arithmetic follows MNN's order (sequential sums, multiply by the reciprocal)
so that the thresholds cut where MNN's cut. Ties are broken by the lower token id.
docs/sampling.md lists every rule and default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnngpu.errors import ConfigError, InputError

FILTER_STEPS = ("penalty", "topK", "topP", "minP", "tfs", "typical")
SAMPLER_TYPES = ("greedy", "temperature", *FILTER_STEPS, "mixed")
DEFAULT_MIXED_SAMPLERS = ("topK", "tfs", "typical", "topP", "min_p", "temperature")
MAX_PENALTY = np.float32(10.0)  # MNN's cap for repetition_penalty and a full n-gram repeat
# When a sampler type picks by temperature without reading the `temperature` key (topK,
# penalty), MNN keeps its built-in 0.8 rather than the key's default of 1.0.
UNREAD_TEMPERATURE = 0.8
_STEPS_THAT_READ_TEMPERATURE = frozenset({"temperature", "topP", "minP", "tfs", "typical"})
_STEP_ALIASES = {"min_p": "minP"}

Candidates = tuple["np.ndarray | None", np.ndarray]  # (token ids or None for all, float32 logits)


# ---------------------------------------------------------------------------------------------
# Settings: the sampler keys of the merged config, with MNN's fallbacks and defaults
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerSettings:
    """Everything a Sampler needs, resolved from config keys once."""

    sampler_type: str = "mixed"
    steps: tuple[str, ...] = ()  # filter steps in run order (canonical names from FILTER_STEPS)
    pick: str = "temperature"  # "greedy" or "temperature"
    temperature: float = 1.0
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.1
    tfs_z: float = 1.0
    typical: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_window: int = 0
    n_gram: int = 8
    ngram_factor: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    banned_tokens: tuple[int, ...] = ()
    seed: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SamplerSettings:
        sampler_type = _read_str(config, "sampler_type", "mixed")
        if sampler_type not in SAMPLER_TYPES and sampler_type != "min_p":
            raise ConfigError(f"expected one of {', '.join(SAMPLER_TYPES)}, got {sampler_type!r}",
                              field="sampler_type")
        names = _mixed_names(config) if sampler_type == "mixed" else (sampler_type,)
        steps = tuple(_STEP_ALIASES.get(n, n) for n in names if _STEP_ALIASES.get(n, n) in FILTER_STEPS)
        mixed = sampler_type == "mixed"
        settings = cls(
            sampler_type=sampler_type,
            steps=steps,
            pick=_pick_rule(config, sampler_type, names),
            temperature=(_read_float(config, "temperature", None, 1.0)
                         if _STEPS_THAT_READ_TEMPERATURE.intersection(_STEP_ALIASES.get(n, n) for n in names)
                         else UNREAD_TEMPERATURE),
            top_k=_read_int(config, "top_k", "topK", 40),
            top_p=_read_float(config, "top_p", "topP", 0.9),
            min_p=_read_float(config, "min_p", "minP", 0.1),
            tfs_z=_read_float(config, "tfs_z", "tfsZ", 1.0),
            typical=_read_float(config, "typical", None, 1.0),
            repetition_penalty=_read_float(config, "repetition_penalty", "penalty", 1.0),
            presence_penalty=_read_float(config, "presence_penalty", None, 0.0),
            frequency_penalty=_read_float(config, "frequency_penalty", None, 0.0),
            penalty_window=_read_int(config, "penalty_window", None, 0),
            n_gram=_read_int(config, "n_gram", None, 8),
            ngram_factor=_read_float(config, "ngram_factor", None, 1.0),
            logit_bias=_read_logit_bias(config) if mixed else {},
            banned_tokens=_read_banned_tokens(config) if mixed else (),
            seed=_read_seed(config),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if "topK" in self.steps and self.top_k < 1:
            raise ConfigError(f"expected an integer >= 1, got {self.top_k}", field="top_k")
        uses_probabilities = self.pick == "temperature" or any(s not in ("penalty", "topK") for s in self.steps)
        if uses_probabilities and not self.temperature > 0:
            raise ConfigError(f"expected a value > 0, got {self.temperature} "
                              "(set sampler_type to \"greedy\" for argmax)", field="temperature")
        if "penalty" in self.steps and self.ngram_factor > 1 and self.n_gram < 1:
            raise ConfigError(f"expected an integer >= 1, got {self.n_gram}", field="n_gram")


def _mixed_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    raw = config.get("mixed_samplers", list(DEFAULT_MIXED_SAMPLERS))
    if not isinstance(raw, list | tuple) or not raw or not all(isinstance(n, str) for n in raw):
        raise ConfigError(f"expected a non-empty list of sampler names, got {raw!r}", field="mixed_samplers")
    for name in raw:
        if name not in SAMPLER_TYPES and name != "min_p" or name == "mixed":
            raise ConfigError(f"expected names from {', '.join(SAMPLER_TYPES[:-1])}, got {name!r}",
                              field="mixed_samplers")
    # MNN runs the penalty before every other filter, wherever it is listed.
    if "penalty" in raw:
        return ("penalty", *(n for n in raw if n != "penalty"))
    return tuple(raw)


def _pick_rule(config: Mapping[str, Any], sampler_type: str, names: tuple[str, ...]) -> str:
    if sampler_type == "greedy":
        return "greedy"
    if sampler_type == "penalty":
        return "greedy" if _read_str(config, "penalty_sampler", "greedy") == "greedy" else "temperature"
    if sampler_type == "mixed":
        return "greedy" if names[-1] == "greedy" else "temperature"
    return "temperature"


def _read_number(config: Mapping[str, Any], key: str) -> float | None:
    if key not in config:
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"expected a number, got {value!r}", field=key)
    return value


def _read_float(config: Mapping[str, Any], key: str, fallback_key: str | None, default: float) -> float:
    # MNN: a negative snake_case value means "not set", then the camelCase key is read.
    value = _read_number(config, key)
    if value is not None and (fallback_key is None or value >= 0):
        return float(value)
    if fallback_key is not None:
        value = _read_number(config, fallback_key)
        if value is not None:
            return float(value)
    return default


def _read_int(config: Mapping[str, Any], key: str, fallback_key: str | None, default: int) -> int:
    return int(_read_float(config, key, fallback_key, default))


def _read_str(config: Mapping[str, Any], key: str, default: str) -> str:
    value = config.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", field=key)
    return value


def _read_logit_bias(config: Mapping[str, Any]) -> dict[int, float]:
    raw = config.get("logit_bias", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"expected an object of token id -> bias, got {raw!r}", field="logit_bias")
    bias = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise ConfigError(f"expected integer token ids as keys, got {key!r}", field="logit_bias") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"expected a number for token {key}, got {value!r}", field="logit_bias")
        bias[token] = float(value)
    return bias


def _read_banned_tokens(config: Mapping[str, Any]) -> tuple[int, ...]:
    raw = config.get("banned_tokens", [])
    if not isinstance(raw, list | tuple) or not all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raise ConfigError(f"expected a list of token ids, got {raw!r}", field="banned_tokens")
    return tuple(raw)


def _read_seed(config: Mapping[str, Any]) -> int | None:
    seed = config.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"expected a non-negative integer, got {seed!r}", field="seed")
    return seed


# ---------------------------------------------------------------------------------------------
# The filters: pure functions over (ids, logits)
# ---------------------------------------------------------------------------------------------


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) in float32, summed in order like MNN. A temperature too small for
    float32 (1 / temperature not finite) gives the limit: all weight on the first largest logit."""
    with np.errstate(divide="ignore", over="ignore"):
        inv_temperature = np.float32(1.0) / np.float32(temperature)
    if not np.isfinite(inv_temperature):
        weights = np.zeros(logits.shape, dtype=np.float32)
        weights[np.argmax(logits)] = 1.0
        return weights
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp((logits - logits.max()) * inv_temperature, dtype=np.float32)
    return weights * (np.float32(1.0) / _ordered_sum(weights))


def _ordered_sum(values: np.ndarray) -> np.float32:
    # np.sum adds pairwise; MNN adds left to right. cumsum is left to right.
    return np.cumsum(values, dtype=np.float32)[-1] if values.size else np.float32(0)


def _keep(candidates: Candidates, positions: np.ndarray) -> Candidates:
    ids, logits = candidates
    kept_ids = positions if ids is None else ids[positions]
    return kept_ids.astype(np.int64, copy=False), logits[positions]


def _by_probability(probs: np.ndarray) -> np.ndarray:
    return np.argsort(-probs, kind="stable")


def _count_until_mass(mass: np.ndarray, threshold: float) -> int:
    """How many leading entries are kept when the running sum is checked after each one."""
    reached = np.flatnonzero(np.cumsum(mass, dtype=np.float32) >= np.float32(threshold))
    return int(reached[0]) + 1 if reached.size else mass.size


TOP_K_SAMPLE_STRIDE = 32   # top_k looks for its threshold among every 32nd logit first
# Elements per comparison in top_k's pass over the vocab. Its mask then stays under 128 KB: the CPU
# backend fixes malloc's mmap threshold there, and a larger temporary would be mapped, faulted in
# and unmapped again at every token.
SCAN_BLOCK = 65_536


def top_k(candidates: Candidates, k: int) -> Candidates:
    """The k highest logits (ties: lower id first), highest first."""
    logits = candidates[1]
    if k >= logits.size:
        return candidates
    pool = _top_k_pool(logits, k)
    values = logits[pool]
    kth_value = np.partition(values, values.size - k)[values.size - k]
    above = pool[values > kth_value]
    tied = pool[values == kth_value][: k - above.size]
    chosen = np.concatenate([above, tied])
    order = np.lexsort((chosen, -logits[chosen]))
    return _keep(candidates, chosen[order])


def _top_k_pool(logits: np.ndarray, k: int) -> np.ndarray:
    """The ascending positions of every logit at or above the k-th highest (about k * stride of them).

    The k-th highest of a sample is at most the k-th highest of all (the sample's top k are k
    logits at least that high), so every logit at or above it includes the top k and all their
    ties. Partitioning the sample and then the pool costs a small part of partitioning the vocab."""
    sample = logits[::TOP_K_SAMPLE_STRIDE]
    if sample.size <= k:
        return np.arange(logits.size)
    floor = np.partition(sample, sample.size - k)[sample.size - k]
    if np.isnan(floor):   # NaN sorts above everything and compares false: search the whole vocab
        return np.arange(logits.size)
    return np.concatenate([np.flatnonzero(logits[start: start + SCAN_BLOCK] >= floor) + start
                           for start in range(0, logits.size, SCAN_BLOCK)])


def top_p(candidates: Candidates, p: float, temperature: float) -> Candidates:
    """The most likely tokens until their probability mass reaches p (the one crossing p stays)."""
    probs = softmax(candidates[1], temperature)
    order = _by_probability(probs)
    return _keep(candidates, order[: _count_until_mass(probs[order], p)])


def min_p(candidates: Candidates, p: float, temperature: float) -> Candidates:
    """Tokens whose probability is at least p (an absolute threshold); at least the top one."""
    probs = softmax(candidates[1], temperature)
    order = _by_probability(probs)
    count = max(1, int(np.count_nonzero(probs >= np.float32(p))))
    return _keep(candidates, order[:count])


def tail_free(candidates: Candidates, z: float, temperature: float) -> Candidates:
    """Tail-free sampling: cut where the normalised |second difference| of sorted probs reaches z.

    Like MNN, the two least likely tokens are always dropped (they have no second
    difference), and fewer than three candidates are left untouched.
    """
    probs = softmax(candidates[1], temperature)
    if probs.size < 3:
        return candidates
    order = _by_probability(probs)
    sorted_probs = probs[order]
    first = sorted_probs[:-1] - sorted_probs[1:]
    curvature = np.abs(first[:-1] - first[1:])
    total = _ordered_sum(curvature)
    if total > 0:
        curvature = curvature * (np.float32(1.0) / total)
    running = np.cumsum(curvature, dtype=np.float32)
    # The first token is kept before the check is made; the cut is at the first later index.
    reached = np.flatnonzero(running[1:] >= np.float32(z))
    count = int(reached[0]) + 1 if reached.size else curvature.size
    return _keep(candidates, order[:count])


def locally_typical(candidates: Candidates, mass: float, temperature: float) -> Candidates:
    """Tokens whose surprisal is closest to the entropy, until their mass reaches `mass`."""
    probs = softmax(candidates[1], temperature)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_probs = np.log(probs, dtype=np.float32)
        terms = np.where(probs > 0, probs * log_probs, np.float32(0))
    entropy = -_ordered_sum(terms.astype(np.float32))
    distance = np.abs(entropy + log_probs)
    order = np.argsort(distance, kind="stable")
    return _keep(candidates, order[: _count_until_mass(probs[order], mass)])


def apply_logit_bias(candidates: Candidates, bias: Mapping[int, float]) -> Candidates:
    ids, logits = candidates
    tokens = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    amounts = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    positions, present = _locate(ids, logits.size, tokens)
    logits = logits.copy()
    np.add.at(logits, positions, amounts[present])
    return ids, logits


def ban_tokens(candidates: Candidates, banned: Sequence[int]) -> Candidates:
    ids, logits = candidates
    positions, _ = _locate(ids, logits.size, np.asarray(banned, dtype=np.int64))
    logits = logits.copy()
    logits[positions] = -np.inf
    return ids, logits


def _locate(ids: np.ndarray | None, size: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, present): where the given token ids sit among the candidates.

    `present` marks which of `tokens` are candidates at all; absent ones are skipped, as MNN
    skips ids outside the vocabulary or already filtered out.
    """
    if ids is None:
        present = (tokens >= 0) & (tokens < size)
        return tokens[present], present
    order = np.argsort(ids, kind="stable")
    slots = np.clip(np.searchsorted(ids, tokens, sorter=order), 0, max(ids.size - 1, 0))
    present = ids[order[slots]] == tokens if ids.size else np.zeros(tokens.shape, dtype=bool)
    return order[slots[present]], present


def penalize(candidates: Candidates, history: Sequence[int], settings: SamplerSettings) -> Candidates:
    """Repetition, presence, frequency and n-gram penalties on the tokens seen in the window.

    For each token t that occurs in the last `penalty_window` tokens (all, when 0):
      factor = repetition_penalty (capped at 10), raised to repetition_penalty *
               ngram_factor**m when an occurrence of t follows the same m tokens that end the
               history now, and set to 10 when m reaches n_gram - 1 (a full n-gram repeat);
      logit  = logit / factor if logit >= 0 else logit * factor      (only when factor > 1)
      logit -= presence_penalty
      logit -= frequency_penalty * count(t)                          (only when > 0)
    """
    ids, logits = candidates
    repetition = np.float32(settings.repetition_penalty)
    presence = np.float32(settings.presence_penalty)
    frequency = np.float32(settings.frequency_penalty)
    if repetition <= 1 and presence <= 0 and frequency <= 0 or len(history) == 0:
        return candidates
    repetition = min(repetition, MAX_PENALTY)
    everything = np.asarray(history, dtype=np.int64)
    start = max(0, everything.size - settings.penalty_window) if settings.penalty_window > 0 else 0
    window = everything[start:]
    factors = _ngram_factors(everything, start, repetition, settings)
    tokens, where, counts = np.unique(window, return_inverse=True, return_counts=True)
    token_factor = np.full(tokens.size, repetition, dtype=np.float32)
    np.maximum.at(token_factor, where, factors)
    positions, present = _locate(ids, logits.size, tokens)
    token_factor, counts = token_factor[present], counts[present].astype(np.float32)
    picked = logits[positions]
    scaled = np.where(picked >= 0, picked / token_factor, picked * token_factor)
    picked = np.where(token_factor > 1, scaled, picked).astype(np.float32)
    picked = picked - presence
    if frequency > 0:
        picked = picked - frequency * counts
    logits = logits.copy()
    logits[positions] = picked
    return ids, logits


def _ngram_factors(history: np.ndarray, start: int, repetition: np.float32,
                   settings: SamplerSettings) -> np.ndarray:
    """The n-gram-raised penalty of each window position (repetition where nothing matches)."""
    size = history.size - start
    factors = np.full(size, repetition, dtype=np.float32)
    ngram_factor = np.float32(settings.ngram_factor)
    n = settings.n_gram
    if ngram_factor <= 1 or history.size < n:
        return factors
    positions = np.arange(start, history.size)
    still_matching = np.ones(size, dtype=bool)
    for back in range(1, n):  # compare the token `back` places before each position ...
        earlier = positions - back
        in_range = earlier >= 0
        same = np.zeros(size, dtype=bool)
        same[in_range] = history[earlier[in_range]] == history[history.size - back]  # ... with the tail
        still_matching &= same
        factors = np.where(still_matching, factors * ngram_factor, factors)
        if back == n - 1:
            factors = np.where(still_matching, MAX_PENALTY, factors)
    return factors


# ---------------------------------------------------------------------------------------------
# The final pick and the Sampler
# ---------------------------------------------------------------------------------------------


def pick_greedy(candidates: Candidates) -> int:
    ids, logits = candidates
    best = int(np.argmax(logits))  # first maximum, like MNN
    return best if ids is None else int(ids[best])


def pick_by_temperature(candidates: Candidates, temperature: float, rng: np.random.Generator) -> int:
    ids, logits = candidates
    running = np.cumsum(softmax(logits, temperature), dtype=np.float32)
    target = rng.random(dtype=np.float32)
    chosen = min(int(np.searchsorted(running, target, side="right")), logits.size - 1)
    return chosen if ids is None else int(ids[chosen])


class Sampler:
    """Picks the next token from the last position's logits, with MNN's sampler semantics.

    `config` is the merged model config (config.json + llm_config.json) as a plain dict.
    Set `seed` there, or pass one to reset(), to make sampling repeatable.
    """

    def __init__(self, config: Mapping[str, Any]):
        self.settings = SamplerSettings.from_config(config)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """Restart the random stream from `seed`, else from the config's seed (fresh if none)."""
        self._rng = np.random.default_rng(seed if seed is not None else self.settings.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """One token id. `history` is every token so far (prompt and generated), for penalties."""
        logits = _as_vocab_row(logits)
        settings = self.settings
        if settings.sampler_type == "greedy":
            return int(np.argmax(logits))
        candidates = self.filter(logits, history)
        if settings.pick == "greedy":
            return pick_greedy(candidates)
        return pick_by_temperature(candidates, settings.temperature, self._rng)

    def filter(self, logits: np.ndarray, history: Sequence[int]) -> Candidates:
        """Run the filter chain; returns the kept (ids, logits) the final pick chooses from."""
        settings = self.settings
        candidates: Candidates = (None, _as_vocab_row(logits))
        if settings.logit_bias:
            candidates = apply_logit_bias(candidates, settings.logit_bias)
        if settings.banned_tokens:
            candidates = ban_tokens(candidates, settings.banned_tokens)
        for step in settings.steps:
            candidates = self._run_step(step, candidates, history)
        return candidates

    def _run_step(self, step: str, candidates: Candidates, history: Sequence[int]) -> Candidates:
        s = self.settings
        if step == "penalty":
            return penalize(candidates, history, s)
        if step == "topK":
            return top_k(candidates, s.top_k)
        if step == "topP":
            return top_p(candidates, s.top_p, s.temperature)
        if step == "minP":
            return min_p(candidates, s.min_p, s.temperature)
        if step == "tfs":
            return tail_free(candidates, s.tfs_z, s.temperature)
        return locally_typical(candidates, s.typical, s.temperature)


def _as_vocab_row(logits: np.ndarray) -> np.ndarray:
    array = np.asarray(logits, dtype=np.float32)
    if array.ndim > 1 and all(d == 1 for d in array.shape[:-1]):
        array = array.reshape(-1)
    if array.ndim != 1 or array.size == 0:
        raise InputError(f"expected the logits of one position, shape [vocab], got shape {array.shape}",
                         field="logits")
    return array


# ---------------------------------------------------------------------------------------------
# OpenAI's logit_bias and penalties (the HTTP server's request fields)
# ---------------------------------------------------------------------------------------------


def openai_adjusted(logits: np.ndarray, bias: Mapping[int, float], generated: Mapping[int, int],
                    presence: float, frequency: float) -> np.ndarray:
    """One row of logits with OpenAI's logit_bias and presence/frequency penalties applied (a copy):

        logit[t] += bias[t]
        logit[t] -= presence * (c[t] > 0) + frequency * c[t]    c[t]: times t was generated so far

    Unlike MNN's penalty step (`penalize`), c counts only the reply's tokens (not the prompt's),
    a negative penalty favours a token instead of being skipped, and no repetition factor applies.
    The work grows with the number of biased and generated tokens, not with the vocabulary."""
    logits = np.array(_as_vocab_row(logits), dtype=np.float32)
    if bias:
        tokens = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        np.add.at(logits, tokens, np.fromiter(bias.values(), dtype=np.float32, count=len(bias)))
    if generated and (presence or frequency):
        tokens = np.fromiter(generated.keys(), dtype=np.int64, count=len(generated))
        counts = np.fromiter(generated.values(), dtype=np.float32, count=len(generated))
        logits[tokens] -= np.float32(presence) + np.float32(frequency) * counts
    return logits
