"""The short prefill module of the fixed-shape backends (vulkan, opencl): a short prompt, or a long
prompt's last piece, runs through the smallest prefill width that holds it rather than padded to
PREFILL_LEN rows. Truths: MNN's recorded greedy tokens and first-step logits, and the same model
loaded with PREFILL_LEN as its one width (MNNGPU_PREFILL_WIDTHS=100): logits within float error,
the same KV cache rows. The CPU backend, whose module takes any length, keeps the one width."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend.widths import PREFILL_LEN, SMALL_PREFILL_LEN, WIDTHS_ENV, prefill_widths
from mnngpu.errors import ConfigError
from mnngpu.runtime.module_pool import ModulePool
from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, greedy, load
from tests.conftest import backend_or_skip, reference

MODELS = ("qwen2_int4_b64", "lfm2_int4_b64")   # attention; recurrent LinearAttention layers
DEVICES = ("vulkan", "opencl")


def load_with_widths(monkeypatch, widths: str | None, name: str, backend: str, **overrides):
    if widths is None:
        monkeypatch.delenv(WIDTHS_ENV, raising=False)
    else:
        monkeypatch.setenv(WIDTHS_ENV, widths)
    return load(name, backend, **overrides)


def count_rows(model) -> list[int]:
    """The rows of every module forward from now on (the position_ids feed's length)."""
    rows: list[int] = []
    for module in model.pool.modules.values():
        original = module.forward
        module.forward = lambda feeds, names, original=original: rows.append(len(feeds["position_ids"][0])) \
            or original(feeds, names)
    return rows


def caches(model) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    backend = model.runtime.backend()
    backend.finish()
    length = model.runtime.kv_meta.previous
    return {layer: cache.read(length) for layer, cache in sorted(backend.kv_caches.items())}


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", DEVICES)
def test_short_prompts_run_the_small_module_and_give_mnn_tokens(monkeypatch, backend, name):
    backend_or_skip(backend)
    ref, first_logits = reference(name)
    small = load_with_widths(monkeypatch, None, name, backend)
    wide = load_with_widths(monkeypatch, str(PREFILL_LEN), name, backend)
    assert small.pool.widths == (SMALL_PREFILL_LEN, PREFILL_LEN) and wide.pool.widths == (PREFILL_LEN,)
    for k, prompt in enumerate(ref["prompts"]):
        rows = count_rows(small)
        tokens, first = greedy(small, prompt["ids"], len(prompt["greedy"]))
        if len(prompt["ids"]) - 1 <= SMALL_PREFILL_LEN:   # all but the last id prefilled, that one decoded
            assert rows[:2] == [SMALL_PREFILL_LEN, 1], prompt["text"]
        assert tokens == prompt["greedy"], prompt["text"]
        assert np.abs(first - first_logits[k]).max() <= LOGIT_TOLERANCE * float(first_logits[k].std())
        _, wide_first = greedy(wide, prompt["ids"], 1)
        assert_close(first, wide_first)


@pytest.mark.parametrize("backend", DEVICES)
def test_a_long_prompts_last_piece_and_its_cache_match_the_wide_module(monkeypatch, backend):
    backend_or_skip(backend)
    ref, _ = reference("qwen2_int4_b64")
    ids = (ref["prompts"][4]["ids"] * 2)[:131]   # 130 prefilled: 100 rows, then 30 in the small module
    small = load_with_widths(monkeypatch, None, "qwen2_int4_b64", backend)
    wide = load_with_widths(monkeypatch, str(PREFILL_LEN), "qwen2_int4_b64", backend)
    rows = count_rows(small)
    got = np.asarray(small.forward(ids))[0, -1]
    assert rows == [PREFILL_LEN, SMALL_PREFILL_LEN, 1]
    assert small.padded_rows(len(ids)) == SMALL_PREFILL_LEN - 30 and wide.padded_rows(len(ids)) == 70
    assert_close(got, np.asarray(wide.forward(ids))[0, -1])
    want = caches(wide)
    for layer, (keys, values) in caches(small).items():
        assert_close(keys, want[layer][0])
        assert_close(values, want[layer][1])
    # the next turn reads those rows back
    assert_close(np.asarray(small.forward(ids[:5]))[0, -1], np.asarray(wide.forward(ids[:5]))[0, -1])


@pytest.mark.parametrize("backend", DEVICES)
def test_chunks_and_all_logits_run_in_the_small_module(monkeypatch, backend):
    backend_or_skip(backend)
    ids = reference("qwen2_int4_b64")[0]["prompts"][1]["ids"]   # 27 ids
    chunked = load_with_widths(monkeypatch, None, "qwen2_int4_b64", backend, chunk=10, all_logits=True)
    wide = load_with_widths(monkeypatch, str(PREFILL_LEN), "qwen2_int4_b64", backend, all_logits=True)
    rows = count_rows(chunked)
    got = np.asarray(chunked.forward(ids))[0]
    assert rows == [SMALL_PREFILL_LEN] * 3   # pieces of 10, 10 and 7 ids
    assert_close(got, np.asarray(wide.forward(ids))[0])


def test_the_cpu_backend_keeps_one_prefill_module(monkeypatch):
    model = load_with_widths(monkeypatch, "16,32", "qwen2_int4_b64", "cpu")
    assert model.pool.widths == (PREFILL_LEN,)
    assert sorted(model.pool.modules) == [("decode", 1, False), ("prefill", PREFILL_LEN, False)]
    assert model.padded_rows(27) == 0


@pytest.mark.parametrize("count, size, pieces", [(20, 100, [20]), (50, 100, [32, 18]), (64, 100, [32, 32]),
                                                 (70, 100, [70]), (130, 100, [100, 30]),
                                                 (264, 100, [100, 100, 32, 32]), (100, 50, [32, 18, 32, 18]),
                                                 (27, 10, [10, 10, 7])])
def test_a_prefill_is_cut_where_padding_and_forwards_cost_least(monkeypatch, count, size, pieces):
    """Chunks of `size` (the chunk key's), each cut where its forwards' rows plus 8 a forward
    (FORWARD_ROWS) are fewest: 70 ids take one 100-row forward (108) rather than three 32-row
    ones (120), a 50-id chunk two 32-row ones (80)."""
    model = load_with_widths(monkeypatch, None, "qwen2_int4_b64", "cpu")
    pool = ModulePool(model.pool.modules[("prefill", PREFILL_LEN, False)], False, 0, prefill_widths())   # vulkan's
    assert pool.pieces(count, size) == pieces


@pytest.mark.parametrize("value", ["", "0", "1", "101", "16,abc", "sixteen"])
def test_a_bad_widths_variable_is_a_config_error(monkeypatch, value):
    monkeypatch.setenv(WIDTHS_ENV, value)
    with pytest.raises(ConfigError) as caught:
        prefill_widths()
    assert caught.value.field == WIDTHS_ENV


def test_the_widths_variable_sets_the_small_modules(monkeypatch):
    monkeypatch.setenv(WIDTHS_ENV, "32,16")
    assert prefill_widths() == (16, 32, PREFILL_LEN)


class _Module:
    def clone(self):
        return _Module()


@pytest.mark.parametrize("all_logits", [False, True])
def test_no_two_kinds_of_module_share_one(all_logits):
    """A 32-row prefill module with every row's logits, a batched decode step of 32 sequences and a
    verify block of 32 ids are resized for different work: each kind keeps its own module."""
    pool = ModulePool(_Module(), all_logits, verify_length=SMALL_PREFILL_LEN, widths=(SMALL_PREFILL_LEN, PREFILL_LEN))
    modules = [pool.select(10, True), pool.rows(SMALL_PREFILL_LEN), pool.verify(), pool.select(1, False)]
    assert len({id(module) for module in modules}) == len(modules)
    assert pool.select(10, True) is modules[0] and pool.rows(SMALL_PREFILL_LEN) is modules[1]


def test_padded_rows_are_the_rows_computed_beyond_the_ids(monkeypatch):
    model = load_with_widths(monkeypatch, None, "qwen2_int4_b64", "vulkan")
    assert model.padded_rows(30) == SMALL_PREFILL_LEN - 29   # 29 prefilled in the 32-row module
    assert model.padded_rows(34) == 0   # 33 prefilled: 32 rows, then 1 through the unpadded decode module
    assert model.padded_rows(112) == SMALL_PREFILL_LEN - 11   # 111 prefilled: 100 rows, then 11 in 32 rows
