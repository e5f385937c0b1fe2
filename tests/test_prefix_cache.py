"""The prefix cache (prefix_cache_path): a prompt start's keys and values on disk, reloaded when a
later prompt starts with the same ids, so only the rest is prefilled.

Truths: the same split prefill without the cache (identical logits), the unsplit prefill (within
float error), MNN's recorded greedy tokens, the HF tokenizer's token counts of the system turn.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mnngpu import llm
from mnngpu.apps.chat import ChatSession
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.protocol import parse_chat_request
from mnngpu.errors import CacheFileError, ConfigError
from tests.conftest import backend_or_skip
from tests.reference_model import MODEL_DIR, hf_count, hf_render, load_model, recorded

SYSTEM = "You are a helpful farmer who answers in few words."
QUESTION = "Where does the farmer walk?"


def last_logits(model, ids) -> np.ndarray:
    return np.asarray(model.forward(ids))[0, -1]


def files_in(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_a_stored_prefix_is_reloaded_and_only_the_rest_prefilled(tmp_path):
    cache = tmp_path / "prefixes"
    model_files = files_in(MODEL_DIR)
    ids = recorded("hello")["ids"] * 6   # a prompt; its first 10 ids stand for a document
    head, rest = ids[:10], ids[10:]

    first = load_model(prefix_cache_path=str(cache))
    assert first.cache_prefix(head) == 0                      # prefilled, then stored
    split = last_logits(first, rest)
    assert len(files_in(cache)) == 1 and files_in(MODEL_DIR) == model_files

    second = load_model(prefix_cache_path=str(cache))
    assert second.cache_prefix(head) == len(head)             # read back from disk
    np.testing.assert_array_equal(last_logits(second, rest), split)

    third = load_model(prefix_cache_path=str(cache))
    out = third.generate(ids, max_new_tokens=3)               # generate finds the stored prefix itself
    assert third.context.prefix_cached == len(head) and third.context.prompt_len == len(ids)
    plain = load_model()
    assert out == plain.generate(ids, max_new_tokens=3)
    np.testing.assert_allclose(split, last_logits(load_model(), ids), rtol=0, atol=1e-4 * np.abs(split).max())


def test_a_damaged_or_foreign_file_is_refused_and_never_used(tmp_path):
    cache = tmp_path / "prefixes"
    ids = recorded("hello")["ids"] * 3
    head = ids[:8]
    load_model(prefix_cache_path=str(cache)).cache_prefix(head)
    (path,) = cache.iterdir()
    data = bytearray(path.read_bytes())

    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    model = load_model(prefix_cache_path=str(cache))
    with pytest.raises(CacheFileError, match="checksum") as caught:
        model.generate(ids, max_new_tokens=1)
    assert str(path) in str(caught.value)
    assert model.runtime.kv_meta.kept == 0                    # nothing of it was used

    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CacheFileError, match=str(path)):
        load_model(prefix_cache_path=str(cache)).cache_prefix(head)

    # the same prefix stored by another model (another quantization of the same graph), renamed to this one's name
    other_dir = tmp_path / "other"
    foreign = llm.create(MODEL_DIR.parent / "qwen2_int8_b0" / "config.json")
    foreign.set_config({"precision": "high", "prefix_cache_path": str(other_dir)})
    foreign.load()
    foreign.cache_prefix(head)
    (made,) = other_dir.iterdir()
    shutil.copy(made, path)
    with pytest.raises(CacheFileError, match="another model"):
        load_model(prefix_cache_path=str(cache)).cache_prefix(head)


def test_the_cache_folder_may_not_be_the_model_folder():
    with pytest.raises(ConfigError) as caught:
        load_model(prefix_cache_path=str(MODEL_DIR / "cache"))
    assert caught.value.field == "prefix_cache_path"


def test_a_backend_without_kv_transfer_is_a_config_error_naming_it(tmp_path):
    model = llm.create(MODEL_DIR / "config.json")
    model.set_config({"backend_type": "cuda", "prefix_cache_path": str(tmp_path)})
    with pytest.raises(ConfigError, match="cuda") as caught:
        model.load()
    assert caught.value.field == "prefix_cache_path"


@pytest.mark.parametrize("backend, attention_mode", [("opencl", 8), ("opencl", 10), ("vulkan", 8), ("vulkan", 10)])
def test_the_prefix_cache_on_device_backends(tmp_path, backend, attention_mode):
    """Stored from the device cache (fp32, or int8 codes) and written back into a fresh one: the
    same logits as the model that stored it."""
    backend_or_skip(backend)
    cache = str(tmp_path / "prefixes")
    ids = recorded("hello")["ids"] * 5
    head, rest = ids[:9], ids[9:]
    settings = {"prefix_cache_path": cache, "backend_type": backend, "attention_mode": attention_mode}
    first = load_model(**settings)
    assert first.cache_prefix(head) == 0
    want = last_logits(first, rest)
    second = load_model(**settings)
    assert second.cache_prefix(head) == len(head)
    np.testing.assert_array_equal(last_logits(second, rest), want)


def system_turn_tokens() -> int:
    return hf_count(hf_render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False))


def test_a_second_chat_session_with_the_same_system_prompt_prefills_only_the_new_part(tmp_path):
    cache = str(tmp_path / "prefixes")
    first = ChatSession(load_model(prefix_cache_path=cache), system_prompt=SYSTEM).ask(QUESTION, max_new_tokens=4)
    second_model = load_model(prefix_cache_path=cache)
    second = ChatSession(second_model, system_prompt=SYSTEM).ask(QUESTION, max_new_tokens=4)
    whole = hf_count(hf_render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]))
    assert (first.prompt_tokens, first.cached_tokens) == (whole, 0)
    assert (second.prompt_tokens, second.cached_tokens) == (whole, system_turn_tokens())
    assert second_model.context.prompt_len == whole - system_turn_tokens()   # what was prefilled
    assert second.token_ids == first.token_ids


def test_a_second_served_request_with_the_same_system_prompt_prefills_only_the_new_part(tmp_path):
    cache = str(tmp_path / "prefixes")
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
            "max_tokens": 3, "temperature": 0}
    usages = []
    for _ in range(2):   # two servers, as two runs of `mnngpu serve`
        served = ServedModel(load_model(prefix_cache_path=cache), "m")
        try:
            request = parse_chat_request(body)
            result = served.submit(served.new_job(served.chat_prompt(request.messages), request)).result()
        finally:
            served.close()
        usages.append(result.usage)
    assert usages[0].cached_tokens == 0
    assert usages[1].cached_tokens == system_turn_tokens()
    assert usages[1].prompt_tokens == usages[0].prompt_tokens


def test_a_prefix_stored_with_int8_kv_reloads_the_same_codes(tmp_path):
    """attention_mode 10 (int8 keys and values): the file holds the dequantized values, and
    coding them again gives back the same codes, so the reloaded model computes what the one
    that stored them computes."""
    cache = str(tmp_path / "prefixes")
    ids = recorded("hello")["ids"] * 5
    head, rest = ids[:9], ids[9:]
    first = load_model(prefix_cache_path=cache, attention_mode=10)
    first.cache_prefix(head)
    want = last_logits(first, rest)
    second = load_model(prefix_cache_path=cache, attention_mode=10)
    assert second.cache_prefix(head) == len(head)
    np.testing.assert_array_equal(last_logits(second, rest), want)
    assert len(list((tmp_path / "prefixes").iterdir())) == 1
    load_model(prefix_cache_path=cache).cache_prefix(head)   # float KV: another key, another file
    assert len(list((tmp_path / "prefixes").iterdir())) == 2


def test_prefix_cache_path_from_the_command_line_is_used(tmp_path):
    from mnngpu.config import CONFIG_FLAG

    model = llm.create(MODEL_DIR)
    model.config.set_config({"prefix_cache_path": str(tmp_path / "prefixes")}, source=CONFIG_FLAG)
    model.load()
    ids = recorded("hello")["ids"]
    assert model.cache_prefix(ids) == 0 and files_in(tmp_path / "prefixes")   # stored where --config said
