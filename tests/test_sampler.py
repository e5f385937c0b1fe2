"""The samplers against MNN's semantics.

Truths used here:
- reference filters written below as plain loops, straight from the definitions;
- hand-worked penalty arithmetic;
- a chi-square goodness-of-fit test of the draws against the filtered softmax;
- MNN's own runtime (MNN.llm, in a subprocess) on a fixture model, for every sampler whose
  pick is deterministic: the penalty family, the mixed chain with logit_bias and
  banned_tokens, and typical sampling cut to one token.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from mnngpu.errors import ConfigError, InputError
from mnngpu.sampler import TOP_K_SAMPLE_STRIDE, Sampler, SamplerSettings, penalize

FIXTURE_MODEL = Path(__file__).resolve().parent / "fixtures" / "models" / "qwen2_int4_b64"

# 24 tokens with well-separated probabilities, placed at shuffled ids.
WEIGHTS = np.array([30, 22, 17, 13, 10, 8, 6.5, 5, 4, 3.2, 2.5, 2, 1.6, 1.3, 1.0, 0.8, 0.65, 0.5, 0.4,
                    0.32, 0.25, 0.2, 0.16, 0.12])
PERMUTATION = np.random.default_rng(1234).permutation(WEIGHTS.size)
LOGITS = np.empty(WEIGHTS.size, dtype=np.float32)
LOGITS[PERMUTATION] = np.log(WEIGHTS).astype(np.float32)


# --- reference filters: loops over (id, logit) pairs, float64 ------------------------------


def ref_probs(pairs, temperature):
    top = max(logit for _, logit in pairs)
    weights = [math.exp((logit - top) / temperature) for _, logit in pairs]
    total = sum(weights)
    return [w / total for w in weights]


def ref_sorted_by_prob(pairs, temperature):
    probs = ref_probs(pairs, temperature)
    ranked = sorted(range(len(pairs)), key=lambda i: (-probs[i], pairs[i][0]))
    return [pairs[i] for i in ranked], [probs[i] for i in ranked]


def ref_top_k(pairs, k, temperature):
    return sorted(pairs, key=lambda pair: (-pair[1], pair[0]))[:k]


def ref_top_p(pairs, p, temperature):
    ranked, probs = ref_sorted_by_prob(pairs, temperature)
    total = 0.0
    for count, prob in enumerate(probs, start=1):
        total += prob
        assert abs(total - p) > 1e-4, "p is too close to a cumulative sum for an exact check"
        if total >= p:
            return ranked[:count]
    return ranked


def ref_min_p(pairs, p, temperature):
    ranked, probs = ref_sorted_by_prob(pairs, temperature)
    assert all(abs(prob - p) > 1e-5 for prob in probs)
    kept = [pair for pair, prob in zip(ranked, probs) if prob >= p]
    return kept or ranked[:1]


def ref_tfs(pairs, z, temperature):
    ranked, probs = ref_sorted_by_prob(pairs, temperature)
    if len(pairs) < 3:
        return pairs
    curvature = [abs((probs[i] - probs[i + 1]) - (probs[i + 1] - probs[i + 2])) for i in range(len(probs) - 2)]
    total = sum(curvature)
    curvature = [c / total for c in curvature]
    kept, running = [], 0.0
    for i, c in enumerate(curvature):
        running += c
        if kept:
            assert abs(running - z) > 1e-4
        if running >= z and kept:
            break
        kept.append(ranked[i])
    return kept


def ref_typical(pairs, mass, temperature):
    probs = ref_probs(pairs, temperature)
    entropy = -sum(p * math.log(p) for p in probs)
    ranked = sorted(range(len(pairs)), key=lambda i: (abs(entropy + math.log(probs[i])), pairs[i][0]))
    kept, running = [], 0.0
    for i in ranked:
        running += probs[i]
        kept.append(pairs[i])
        assert abs(running - mass) > 1e-4
        if running >= mass:
            break
    return kept


REFERENCE = {"topK": ref_top_k, "topP": ref_top_p, "minP": ref_min_p, "tfs": ref_tfs, "typical": ref_typical}
PARAMETER = {"topK": "top_k", "topP": "top_p", "minP": "min_p", "tfs": "tfs_z", "typical": "typical"}


def all_pairs(logits=LOGITS):
    return [(i, float(v)) for i, v in enumerate(logits)]


def kept_ids(sampler: Sampler, logits=LOGITS, history=()) -> list[int]:
    ids, _ = sampler.filter(logits, list(history))
    return list(range(len(logits))) if ids is None else [int(i) for i in ids]


# --- the settings: keys, fallbacks and MNN's defaults -----------------------------------------


def test_defaults_are_mnns():
    settings = Sampler({}).settings
    assert settings.sampler_type == "mixed"
    assert settings.steps == ("topK", "tfs", "typical", "topP", "minP")
    assert settings.pick == "temperature"
    assert (settings.temperature, settings.top_k, settings.top_p, settings.min_p) == (1.0, 40, 0.9, 0.1)
    assert (settings.tfs_z, settings.typical, settings.repetition_penalty) == (1.0, 1.0, 1.0)
    assert (settings.n_gram, settings.ngram_factor, settings.penalty_window) == (8, 1.0, 0)


def test_reads_the_exported_config():
    config = json.loads((FIXTURE_MODEL / "config.json").read_text())
    settings = Sampler(config).settings
    assert (settings.temperature, settings.top_k, settings.top_p, settings.min_p) == (0.8, 40, 0.9, 0.05)
    assert (settings.tfs_z, settings.typical) == (1.0, 0.95)


@pytest.mark.parametrize(("config", "expected"), [
    ({"topK": 7}, 7),
    ({"top_k": 5, "topK": 7}, 5),
    ({"top_k": -1, "topK": 7}, 7),  # a negative snake_case value means "unset"
])
def test_camel_case_is_the_fallback(config, expected):
    assert Sampler(config).settings.top_k == expected


def test_camel_case_fallbacks_for_every_key():
    settings = Sampler({"topP": 0.5, "minP": 0.2, "tfsZ": 0.7, "penalty": 1.3}).settings
    assert (settings.top_p, settings.min_p, settings.tfs_z, settings.repetition_penalty) == (0.5, 0.2, 0.7, 1.3)


@pytest.mark.parametrize(("config", "temperature"), [
    ({"sampler_type": "temperature", "temperature": 0.3}, 0.3),
    ({"sampler_type": "topP", "temperature": 0.3}, 0.3),
    ({"sampler_type": "topK", "temperature": 0.3}, 0.8),  # MNN's topK never reads temperature
    ({"sampler_type": "penalty", "penalty_sampler": "temperature", "temperature": 0.3}, 0.8),
    ({"sampler_type": "mixed", "mixed_samplers": ["topK"], "temperature": 0.3}, 0.8),
    ({"sampler_type": "mixed", "mixed_samplers": ["topK", "temperature"], "temperature": 0.3}, 0.3),
])
def test_which_temperature_applies(config, temperature):
    assert Sampler(config).settings.temperature == pytest.approx(temperature)


def test_mixed_runs_penalty_first_and_picks_by_the_last_name():
    settings = Sampler({"mixed_samplers": ["topK", "min_p", "penalty", "greedy"]}).settings
    assert settings.steps == ("penalty", "topK", "minP")
    assert settings.pick == "greedy"
    assert Sampler({"mixed_samplers": ["greedy", "topK"]}).settings.pick == "temperature"


def test_penalty_picks_by_penalty_sampler():
    assert Sampler({"sampler_type": "penalty"}).settings.pick == "greedy"
    assert Sampler({"sampler_type": "penalty", "penalty_sampler": "temperature"}).settings.pick == "temperature"


def test_logit_bias_and_banned_tokens_belong_to_mixed_only():
    config = {"logit_bias": {"3": 1.5}, "banned_tokens": [4]}
    assert Sampler({**config, "sampler_type": "mixed"}).settings.logit_bias == {3: 1.5}
    assert Sampler({**config, "sampler_type": "topK"}).settings.banned_tokens == ()


@pytest.mark.parametrize(("config", "field"), [
    ({"sampler_type": "nucleus"}, "sampler_type"),
    ({"mixed_samplers": ["topK", "beam"]}, "mixed_samplers"),
    ({"mixed_samplers": []}, "mixed_samplers"),
    ({"sampler_type": "topK", "top_k": 0}, "top_k"),
    ({"sampler_type": "temperature", "temperature": 0}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"banned_tokens": "7"}, "banned_tokens"),
    ({"seed": -3}, "seed"),
])
def test_bad_values_name_the_key(config, field):
    with pytest.raises(ConfigError) as error:
        Sampler(config)
    assert error.value.field == field


# --- greedy ------------------------------------------------------------------------------------


def test_greedy_is_the_first_maximum():
    logits = np.array([0.5, 3.0, -1.0, 3.0, 2.9], dtype=np.float32)
    assert Sampler({"sampler_type": "greedy"}).sample(logits, []) == 1


def test_greedy_ignores_penalties_and_bias():
    config = {"sampler_type": "greedy", "repetition_penalty": 5.0, "logit_bias": {"1": -100}}
    assert Sampler(config).sample(np.array([0.0, 1.0], dtype=np.float32), [1, 1]) == 1


def test_logits_must_be_one_row():
    sampler = Sampler({"sampler_type": "greedy"})
    assert sampler.sample(LOGITS[None, None, :], []) == int(np.argmax(LOGITS))
    with pytest.raises(InputError):
        sampler.sample(np.zeros((2, 5), dtype=np.float32), [])


# --- each filter's kept set, exactly ------------------------------------------------------------


@pytest.mark.parametrize(("step", "value", "temperature"), [
    ("topK", 1, 1.0), ("topK", 5, 1.0), ("topK", 23, 1.0), ("topK", 100, 1.0),
    ("topP", 0.05, 1.0), ("topP", 0.5, 1.0), ("topP", 0.93, 0.7), ("topP", 0.97, 1.6),
    ("minP", 0.01, 1.0), ("minP", 0.04, 0.6), ("minP", 0.13, 1.0), ("minP", 0.9, 1.0),
    ("tfs", 0.3, 1.0), ("tfs", 0.6, 0.8), ("tfs", 0.95, 1.5),
    ("typical", 0.2, 1.0), ("typical", 0.5, 0.7), ("typical", 0.9, 1.4),
])
def test_single_filter_keeps_the_reference_set(step, value, temperature):
    sampler = Sampler({"sampler_type": step, PARAMETER[step]: value, "temperature": temperature})
    if step == "topK":
        temperature = 0.8
    expected = [i for i, _ in REFERENCE[step](all_pairs(), value, temperature)]
    assert sorted(kept_ids(sampler)) == sorted(expected)


def test_top_k_ties_keep_lower_ids():
    logits = np.array([1.0, 2.0, 2.0, 0.0, 2.0, 2.0], dtype=np.float32)
    assert kept_ids(Sampler({"sampler_type": "topK", "top_k": 3}), logits) == [1, 2, 4]


def vocab_scale_logits(case: str, size: int = 151_936) -> np.ndarray:
    """Logits the size of a real vocab, shaped to corner top_k's search for its threshold."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(size) * 3).astype(np.float32)
    if case == "rounded":   # many exact ties everywhere, the k-th value among them
        logits = np.round(logits).astype(np.float32)
    elif case == "hidden_top":   # the highest logits all at ids that top_k's strided sample skips
        sampled = np.arange(size) % TOP_K_SAMPLE_STRIDE == 0
        logits[sampled] = -5.0
        logits[rng.choice(np.flatnonzero(~sampled), 60, replace=False)] = 9.0
    elif case == "banned":   # most of the vocab banned (-inf), fewer than k finite in the sample
        logits[rng.random(size) < 0.995] = -np.inf
    elif case == "flat":   # every logit the same: the lowest ids win
        logits[:] = 1.5
    return logits


@pytest.mark.parametrize("case", ["normal", "rounded", "hidden_top", "banned", "flat"])
@pytest.mark.parametrize("k", [1, 40, 700])
def test_top_k_at_vocab_scale_keeps_the_reference_order(case, k):
    logits = vocab_scale_logits(case)
    expected = [i for i, _ in ref_top_k(all_pairs(logits), k, 1.0)]
    assert kept_ids(Sampler({"sampler_type": "topK", "top_k": k}), logits) == expected


def test_top_k_after_bias_keeps_the_reference_order():
    # with logit_bias the kept ids are positions in a biased copy; the whole-vocab path still applies
    logits = vocab_scale_logits("normal", 151_936)
    config = {"mixed_samplers": ["topK", "greedy"], "top_k": 40, "logit_bias": {"3": 50.0, "99": -100.0}}
    biased = logits.copy()
    biased[3] += 50.0
    biased[99] -= 100.0
    expected = [i for i, _ in ref_top_k(all_pairs(biased), 40, 1.0)]
    assert kept_ids(Sampler(config), logits) == expected


def test_min_p_is_absolute_and_keeps_at_least_one():
    logits = np.log(np.array([0.5, 0.3, 0.2])).astype(np.float32)
    config = {"sampler_type": "minP", "temperature": 1.0}
    assert kept_ids(Sampler({**config, "min_p": 0.25}), logits) == [0, 1]  # not 0.25 x the top probability
    assert kept_ids(Sampler({**config, "min_p": 0.6}), logits) == [0]


def test_tfs_drops_the_two_least_likely_and_spares_tiny_sets():
    assert len(kept_ids(Sampler({"sampler_type": "tfs", "tfs_z": 1.0}))) <= LOGITS.size - 2
    two = np.array([0.0, 1.0], dtype=np.float32)
    assert kept_ids(Sampler({"sampler_type": "tfs", "tfs_z": 0.01}), two) == [0, 1]


def test_mixed_chain_filters_in_order_on_renormalised_subsets():
    names = ["topK", "typical", "topP", "minP", "temperature"]
    config = {"mixed_samplers": names, "top_k": 12, "typical": 0.9, "top_p": 0.8, "min_p": 0.07,
              "temperature": 1.2}
    pairs = all_pairs()
    pairs = ref_top_k(pairs, 12, 1.2)
    pairs = ref_typical(pairs, 0.9, 1.2)
    pairs = ref_top_p(pairs, 0.8, 1.2)
    pairs = ref_min_p(pairs, 0.07, 1.2)
    assert sorted(kept_ids(Sampler(config))) == sorted(i for i, _ in pairs)


def test_logit_bias_and_banned_tokens_come_first():
    top = int(np.argmax(LOGITS))
    low = int(np.argmin(LOGITS))
    config = {"mixed_samplers": ["topK", "greedy"], "top_k": 3, "banned_tokens": [top, 999],
              "logit_bias": {str(low): 10.0, "-4": 1.0}}
    sampler = Sampler(config)
    assert sampler.sample(LOGITS, []) == low
    assert top not in kept_ids(sampler)


# --- the penalty's arithmetic ---------------------------------------------------------------------


def penalized(config: dict, logits, history) -> np.ndarray:
    settings = SamplerSettings.from_config({"sampler_type": "penalty", **config})
    return penalize((None, np.asarray(logits, dtype=np.float32)), history, settings)[1]


def test_penalty_by_hand():
    logits = [2.0, -1.0, 0.5, 4.0]
    config = {"repetition_penalty": 2.0, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    # token 0 seen twice: 2/2 - 0.5 - 0.25*2; token 1 once: -1*2 - 0.5 - 0.25; 2 and 3 unseen.
    assert penalized(config, logits, [0, 1, 0]).tolist() == [0.0, -2.75, 0.5, 4.0]


def test_penalty_window_counts_only_recent_tokens():
    config = {"repetition_penalty": 2.0, "frequency_penalty": 1.0, "penalty_window": 2}
    assert penalized(config, [1.0, 1.0, 1.0], [0, 0, 0, 1, 2]).tolist() == [1.0, -0.5, -0.5]


def test_repetition_is_capped_at_ten():
    assert penalized({"repetition_penalty": 50.0}, [5.0, -5.0], [0, 1]).tolist() == [0.5, -50.0]


def test_no_penalty_when_every_knob_is_neutral():
    config = {"repetition_penalty": 1.0, "ngram_factor": 3.0, "presence_penalty": 0.0}
    assert penalized(config, [1.0, 2.0], [0, 1, 0, 1]).tolist() == [1.0, 2.0]


def test_ngram_full_repeat_gets_the_maximum_penalty():
    # The history ends "5 6"; "5 6" was followed by 7 before, so 7 would repeat a 3-gram.
    config = {"repetition_penalty": 1.2, "ngram_factor": 1.5, "n_gram": 3}
    out = penalized(config, [0, 0, 0, 0, 0, 6.0, 6.0, 6.0], [5, 6, 7, 5, 6])
    assert out[7] == np.float32(6.0) / np.float32(10.0)
    assert out[5] == out[6] == np.float32(6.0) / np.float32(1.2)


def test_ngram_partial_repeat_raises_the_penalty_per_matched_token():
    config = {"repetition_penalty": 1.2, "ngram_factor": 1.5, "n_gram": 4}
    out = penalized(config, [0, 0, 0, 0, 0, 6.0, 6.0, 6.0], [5, 6, 7, 5, 6])
    factor = np.float32(1.2) * np.float32(1.5) * np.float32(1.5)
    assert out[7] == np.float32(6.0) / factor


def ref_penalty(logits, history, rep, presence, frequency, window, n_gram, factor):
    out = np.asarray(logits, dtype=np.float32).copy()
    rep, presence, frequency, factor = map(np.float32, (rep, presence, frequency, factor))
    if rep <= 1 and presence <= 0 and frequency <= 0 or not history:
        return out
    rep = min(rep, np.float32(10))
    start = max(0, len(history) - window) if window > 0 else 0
    use_ngram = factor > 1 and len(history) >= n_gram
    recent = history[::-1][: n_gram - 1]
    strongest, counts = {}, {}
    for i in range(start, len(history)):
        token = history[i]
        counts[token] = counts.get(token, 0) + 1
        strength = rep
        if use_ngram:
            matched = 0
            while matched < n_gram - 1 and i - 1 - matched >= 0 and history[i - 1 - matched] == recent[matched]:
                strength = strength * factor
                matched += 1
            if matched == n_gram - 1:
                strength = np.float32(10)
        strongest[token] = max(strongest.get(token, rep), strength)
    for token, strength in strongest.items():
        if not 0 <= token < out.size:
            continue
        value = out[token]
        if strength > 1:
            value = value / strength if value >= 0 else value * strength
        value = value - presence
        if frequency > 0:
            value = value - frequency * np.float32(counts[token])
        out[token] = value
    return out


@pytest.mark.parametrize("seed", range(6))
def test_penalty_matches_the_reference_on_random_histories(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=40).astype(np.float32)
    pattern = list(rng.integers(0, 45, size=5))
    history = [int(t) for t in (pattern * 3 + list(rng.integers(0, 45, size=10)) + pattern[:3])]
    knobs = {"rep": float(rng.uniform(1.0, 3.0)), "presence": float(rng.uniform(-0.5, 1)),
             "frequency": float(rng.uniform(0, 0.6)), "window": int(rng.integers(0, 30)),
             "n_gram": int(rng.integers(2, 6)), "factor": float(rng.uniform(1.0, 2.0))}
    config = {"repetition_penalty": knobs["rep"], "presence_penalty": knobs["presence"],
              "frequency_penalty": knobs["frequency"], "penalty_window": knobs["window"],
              "n_gram": knobs["n_gram"], "ngram_factor": knobs["factor"]}
    np.testing.assert_array_equal(penalized(config, logits, history), ref_penalty(logits, history, **knobs))


# --- the draws: chi-square against the filtered softmax ---------------------------------------------


def chi_square_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper incomplete gamma Q."""
    a, x = dof / 2.0, statistic / 2.0
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # the series for the lower part converges here
        term = total = 1.0 / a
        n = a
        while term > total * 1e-16:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    # the continued fraction for the upper part (modified Lentz)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_front) * h


@pytest.mark.parametrize(("statistic", "dof", "tail"), [
    (10.828, 1, 0.001), (13.816, 2, 0.001), (20.515, 5, 0.001), (29.588, 10, 0.001),
    (45.315, 20, 0.001), (18.307, 10, 0.05), (3.940, 10, 0.95), (124.342, 100, 0.05),
])
def test_chi_square_survival_matches_the_printed_table(statistic, dof, tail):
    assert chi_square_survival(statistic, dof) == pytest.approx(tail, rel=2e-3)


def draw(sampler: Sampler, logits, count: int) -> np.ndarray:
    return np.array([sampler.sample(logits, []) for _ in range(count)])


@pytest.mark.parametrize(("config", "reference_chain"), [
    ({"sampler_type": "temperature", "temperature": 1.0}, []),
    ({"sampler_type": "temperature", "temperature": 0.6}, []),
    ({"sampler_type": "topK", "top_k": 6}, [("topK", 6)]),
    ({"sampler_type": "topP", "top_p": 0.8, "temperature": 1.3}, [("topP", 0.8)]),
    ({"sampler_type": "minP", "min_p": 0.03, "temperature": 0.9}, [("minP", 0.03)]),
    ({"mixed_samplers": ["topK", "topP", "temperature"], "top_k": 10, "top_p": 0.85, "temperature": 1.1},
     [("topK", 10), ("topP", 0.85)]),
])
def test_draws_follow_the_filtered_softmax(config, reference_chain):
    settings = Sampler(config).settings
    pairs = all_pairs()
    for step, value in reference_chain:
        pairs = REFERENCE[step](pairs, value, settings.temperature)
    expected = dict(zip((i for i, _ in pairs), ref_probs(pairs, settings.temperature)))
    draws = draw(Sampler({**config, "seed": 2024}), LOGITS, 12000)
    assert set(draws.tolist()) <= set(expected), "drew a token the filters removed"
    observed, wanted = binned_counts(draws, expected)
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    assert chi_square_survival(statistic, observed.size - 1) > 1e-3


def binned_counts(draws: np.ndarray, expected: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts per token; tokens expected fewer than 5 times share one bin."""
    tokens = sorted(expected)
    observed = np.array([np.count_nonzero(draws == t) for t in tokens], dtype=float)
    wanted = np.array([expected[t] * draws.size for t in tokens])
    rare = wanted < 5
    if rare.any():
        observed = np.append(observed[~rare], observed[rare].sum())
        wanted = np.append(wanted[~rare], wanted[rare].sum())
    assert wanted.min() >= 5 and wanted.size >= 3, "too few draws per bin for a chi-square test"
    return observed, wanted


# --- seeds ---------------------------------------------------------------------------------------------


def test_a_seeded_run_repeats_exactly():
    config = {"sampler_type": "temperature", "temperature": 1.5, "seed": 7}
    first, second = draw(Sampler(config), LOGITS, 300), draw(Sampler(config), LOGITS, 300)
    np.testing.assert_array_equal(first, second)
    assert len(set(first.tolist())) > 5


def test_reset_restarts_the_stream():
    sampler = Sampler({"sampler_type": "temperature", "seed": 11})
    first = draw(sampler, LOGITS, 100)
    sampler.reset()
    np.testing.assert_array_equal(draw(sampler, LOGITS, 100), first)
    sampler.reset(seed=12)
    other = draw(sampler, LOGITS, 100)
    sampler.reset(seed=12)
    np.testing.assert_array_equal(draw(sampler, LOGITS, 100), other)
    assert not np.array_equal(other, first)


# --- MNN's own sampler on a fixture model ------------------------------------------------------------

# For each case: MNN generates with the sampler; a greedy MNN replays the same tokens to get
# the logits MNN's sampler saw at each step.
MNN_SCRIPT = r"""
import json, sys
import numpy as np
import MNN.llm as mnn_llm
model, cases_path, out_path = sys.argv[1:4]
def load(overrides):
    llm = mnn_llm.create(model + "/config.json")
    llm.set_config({"precision": "high", "memory": "high", "thread_num": 1, **overrides})
    llm.load()
    return llm
def row(var):
    values = np.array(var.read(), dtype=np.float32)
    return values.reshape(-1, values.shape[-1])[-1].tolist()
results = []
for case in json.load(open(cases_path)):
    tokens = [int(t) for t in load(case["config"])._c_obj.generate(case["prompt"], case["steps"])]
    teacher = load({"sampler_type": "greedy"})
    logits = [row(teacher.forward(case["prompt"]))]
    for token in tokens[:-1]:
        logits.append(row(teacher.forward([token])))
    results.append({"tokens": tokens, "logits": logits})
json.dump(results, open(out_path, "w"))
"""

EVEN_IDS = list(range(0, 400, 2))
# a history holding the bigram (363, 358) that greedy decoding of this model would produce next
REPEATS = [363, 358, 363, 358, 363, 358, 243, 25, 160, 363]
MNN_CASES = {
    "repetition": ({"sampler_type": "penalty", "repetition_penalty": 3.0}, EVEN_IDS),
    "presence_frequency": ({"sampler_type": "penalty", "repetition_penalty": 1.0, "presence_penalty": 1.5,
                            "frequency_penalty": 0.7}, EVEN_IDS),
    "window": ({"sampler_type": "penalty", "repetition_penalty": 4.0, "penalty_window": 100}, EVEN_IDS),
    "capped": ({"sampler_type": "penalty", "repetition_penalty": 25.0}, EVEN_IDS),
    "ngram2": ({"sampler_type": "penalty", "repetition_penalty": 1.0001, "ngram_factor": 1.5, "n_gram": 2},
               REPEATS),
    "ngram3": ({"sampler_type": "penalty", "repetition_penalty": 1.0001, "ngram_factor": 1.5, "n_gram": 3},
               REPEATS),
    "mixed_bias_banned": ({"sampler_type": "mixed", "mixed_samplers": ["topK", "penalty", "greedy"], "top_k": 5,
                           "repetition_penalty": 2.0, "logit_bias": {"269": -100, "7": 2.5},
                           "banned_tokens": [141]}, EVEN_IDS),
    "typical_one_token": ({"sampler_type": "typical", "typical": 1e-6, "temperature": 0.7}, EVEN_IDS[:20]),
    "mixed_typical_penalty": ({"sampler_type": "mixed", "mixed_samplers": ["typical", "penalty", "temperature"],
                               "typical": 1e-6, "temperature": 1.3, "repetition_penalty": 2.0}, EVEN_IDS),
}
WEAKER = {"ngram2": {"ngram_factor": 1.0}, "ngram3": {"ngram_factor": 1.0}, "window": {"penalty_window": 0}}


@pytest.fixture(scope="module")
def mnn_runs() -> dict:
    pytest.importorskip("MNN")
    if not (FIXTURE_MODEL / "llm.mnn").exists():
        pytest.skip(f"fixture model missing: {FIXTURE_MODEL}")
    with tempfile.TemporaryDirectory() as folder:
        cases_path, out_path = os.path.join(folder, "cases.json"), os.path.join(folder, "out.json")
        cases = [{"config": config, "prompt": prompt, "steps": 8} for config, prompt in MNN_CASES.values()]
        Path(cases_path).write_text(json.dumps(cases))
        subprocess.run([sys.executable, "-c", MNN_SCRIPT, str(FIXTURE_MODEL), cases_path, out_path],
                       check=True, capture_output=True, timeout=300)
        return dict(zip(MNN_CASES, json.loads(Path(out_path).read_text())))


def replay(config: dict, prompt: list[int], run: dict) -> list[int]:
    sampler, history, picked = Sampler(config), list(prompt), []
    for logits, mnn_token in zip(run["logits"], run["tokens"]):
        picked.append(sampler.sample(np.array(logits, dtype=np.float32), history))
        history.append(mnn_token)
    return picked


@pytest.mark.parametrize("name", MNN_CASES)
def test_same_tokens_as_mnns_sampler(mnn_runs, name):
    config, prompt = MNN_CASES[name]
    run = mnn_runs[name]
    greedy = [int(np.argmax(logits)) for logits in run["logits"]]
    assert run["tokens"] != greedy, "this case does not exercise the sampler"
    assert replay(config, prompt, run) == run["tokens"]
    if name in WEAKER:
        assert replay({**config, **WEAKER[name]}, prompt, run) != run["tokens"], "the case misses its knob"
