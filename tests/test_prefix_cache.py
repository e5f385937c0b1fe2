"""The prefix cache (prefix_cache_path): a prompt start's keys and values on disk, reloaded when a
later prompt starts with the same ids, so only the rest is prefilled.

On a model with recurrent layers (qwen3_5, lfm2) the file holds each layer's state after the
prefix too.

Truths: the same split prefill without the cache (identical logits), the unsplit prefill (within
float error), MNN's recorded greedy tokens, the HF tokenizer's token counts of the system turn.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mnngpu import llm
from mnngpu.apps.chat import ChatSession
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.protocol import parse_chat_request
from mnngpu.errors import CacheFileError, ConfigError
from mnngpu.runtime import prefix_cache
from tests.conformance.test_fixture_models import load
from tests.conftest import backend_or_skip, reference
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


# ---- recurrent state (qwen3_5's gated delta rule, lfm2's short convolution) ---------------------

RECURRENT = ("qwen3_5_int4_b64", "lfm2_int4_b64")


@pytest.mark.parametrize("backend_type", ["cpu", "opencl", "vulkan"])   # the backends with kv_transfer
@pytest.mark.parametrize("name", RECURRENT)
def test_a_prefix_round_trip_with_recurrent_state_gives_the_same_tokens(tmp_path, name, backend_type):
    """On cpu, and on a device backend whose CPU backup keeps the state: the prefix's state is stored
    and read back with its keys and values, and the reply is the one without the prefix cache."""
    backend_or_skip(backend_type)
    ids = reference(name)[0]["prompts"][4]["ids"]
    head, rest = ids[: len(ids) // 2], ids[len(ids) // 2:]
    settings = {"prefix_cache_path": str(tmp_path / "prefixes"), "sampler_type": "greedy"}
    plain = load(name, backend_type, sampler_type="greedy").generate(ids, 8)

    first = load(name, backend_type, **settings)
    assert first.cache_prefix(head) == 0                       # prefilled, then stored
    split = last_logits(first, rest)
    second = load(name, backend_type, **settings)
    assert second.cache_prefix(head) == len(head)              # read back: keys, values and state
    np.testing.assert_array_equal(last_logits(second, rest), split)

    third = load(name, backend_type, **settings)
    assert third.generate(ids, 8) == plain                     # generate finds the stored prefix itself
    assert third.context.prefix_cached == len(head)


def rewrite(path, change_header, keep_bytes=None) -> None:
    """Rewrite a prefix-cache file with its JSON header changed (and its body cut to `keep_bytes`),
    under a valid digest, as a file written by another version or for another model would be."""
    data = path.read_bytes()
    _, version, size = prefix_cache._HEADER.unpack_from(data)
    start = prefix_cache._HEADER.size
    header = json.loads(data[start: start + size])
    version = change_header(header) or version
    text = json.dumps(header).encode()
    body = data[start + size: len(data) - prefix_cache.DIGEST_BYTES][:keep_bytes]
    content = prefix_cache._HEADER.pack(prefix_cache.MAGIC, version, len(text)) + text + body
    digest = prefix_cache._digest()
    digest.update(content)
    path.write_bytes(content + digest.digest())


def as_version_1(header: dict) -> int:
    """What the version before recurrent state wrote: no "states" (and no state bytes)."""
    del header["states"]
    return 1


def test_a_file_without_the_state_or_with_other_state_shapes_is_refused(tmp_path):
    name = RECURRENT[0]
    cache = tmp_path / "prefixes"
    head = reference(name)[0]["prompts"][4]["ids"][:9]
    model = load(name, "cpu", prefix_cache_path=str(cache))
    model.cache_prefix(head)
    (path,) = cache.iterdir()
    original = path.read_bytes()
    layout = model.cache_layout
    state_bytes = 4 * sum(int(np.prod(shape)) for parts in layout.states.values() for shape in parts.values())
    assert len(layout.states) == 3 and state_bytes > 0

    rewrite(path, as_version_1, keep_bytes=-state_bytes)
    with pytest.raises(CacheFileError, match="holds no recurrent state") as caught:
        load(name, "cpu", prefix_cache_path=str(cache)).cache_prefix(head)
    assert str(path) in str(caught.value)

    layer = min(layout.states)
    path.write_bytes(original)
    rewrite(path, lambda header: header["states"][layer].update(conv=[128, 2]))
    fresh = load(name, "cpu", prefix_cache_path=str(cache))
    with pytest.raises(CacheFileError, match=f"for {layer}, the model's is"):
        fresh.generate(reference(name)[0]["prompts"][4]["ids"], 1)
    assert fresh.runtime.kv_meta.kept == 0                     # nothing of it was used

    path.write_bytes(original)
    assert load(name, "cpu", prefix_cache_path=str(cache)).cache_prefix(head) == len(head)


def test_a_version_1_file_still_serves_a_model_without_recurrent_state(tmp_path):
    cache = tmp_path / "prefixes"
    ids = recorded("hello")["ids"] * 3
    head, rest = ids[:8], ids[8:]
    first = load_model(prefix_cache_path=str(cache))
    first.cache_prefix(head)
    want = last_logits(first, rest)
    (path,) = cache.iterdir()
    rewrite(path, as_version_1)
    second = load_model(prefix_cache_path=str(cache))
    assert second.cache_prefix(head) == len(head)
    np.testing.assert_array_equal(last_logits(second, rest), want)
