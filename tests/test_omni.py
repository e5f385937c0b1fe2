"""Omni and its surfaces on the Qwen2-VL fixture: the config test that makes one, MNN's mrope positions,
`mnngpu run --image`, the server's image_url data: URLs, `inspect`'s modules, and one clear error for
each bad image or missing module; Qwen3-VL's position table and deepstack rows; Qwen3.5's image
prompts (a tower without deepstack before Gated-DeltaNet layers) against HF float64 and MNN.

Truths: the fixture's HuggingFace float64 greedy tokens (tests/conformance/test_vision_model.py
checks them on every backend), MNN's position rule worked out by hand, and Pillow-made bad files.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image

from mnngpu import llm as mnngpu_llm
from mnngpu.apps.cli import main
from mnngpu.apps.inspect import format_inspect_table, inspect_model
from mnngpu.errors import ConfigError, InputError
from mnngpu.omni import MropePositions, Omni
from mnngpu.omni.vision import read_image
from tests.conformance.test_fixture_models import greedy
from tests.conftest import FIXTURES, copy_model_files, folder_state

VISION = FIXTURES.parent / "vision" / "qwen2_vl_int4"
IMAGE = VISION / "image.png"
QUESTION = "What is in the picture?"
MODEL_FILES = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "embeddings_bf16.bin",
               "tokenizer.mtok", "visual.mnn", "visual.mnn.weight")


@pytest.fixture(scope="module")
def model() -> Omni:
    loaded = mnngpu_llm.create(VISION)
    loaded.set_config({"precision": "high", "thread_num": 2, "sampler_type": "greedy"})
    loaded.load()
    return loaded


def expected_reply(model, steps: int = 16) -> str:
    """The text of the fixture's HF float64 greedy tokens for <img>…</img>QUESTION."""
    ref = json.loads((VISION / "reference.json").read_text())
    return "".join(model.tokenizer_decode(t) for t in ref["prompts"][0]["hf_greedy"][:steps])


def copy_model(tmp_path: Path, skip: tuple[str, ...] = (), **llm_config) -> Path:
    return copy_model_files(VISION, tmp_path, MODEL_FILES, skip, **llm_config)


# ---- positions and the config test -------------------------------------------------------------------

def test_mrope_positions_follow_mnns_rule():
    """Two text tokens, an image whose merged grid is 2x3, one text token: the image's start takes
    index 2, its grid (3, 3 + row, 3 + column), its end the index after the last width (6), the
    text continues from 7."""
    positions = MropePositions()
    positions.add_text(2)
    positions.add_image(2, 3)
    positions.add_text(1)
    assert positions.array().tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]


def test_create_makes_an_omni_only_for_a_multimodal_config(model):
    assert isinstance(model, Omni) and model.position_axes == 3
    assert not isinstance(mnngpu_llm.create(FIXTURES / "qwen2_int4_b64"), Omni)


def test_a_talker_model_loads_its_text_and_vision_parts_and_says_speech_is_not_supported(tmp_path):
    folder = copy_model(tmp_path, has_talker=True)
    with pytest.warns(UserWarning, match="has_talker.*speech output is not supported"):
        talker = mnngpu_llm.create(folder)
    talker.set_config({"precision": "high"})
    talker.load()
    assert isinstance(talker, Omni) and talker.vision is not None


# ---- surfaces ------------------------------------------------------------------------------------------

def test_run_with_image_streams_the_reference_reply(capsys, model):
    code = main(["run", str(VISION), "--image", str(IMAGE), "-p", QUESTION, "-n", "16", "--sampler", "greedy",
                 "--precision", "high"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.rstrip("\n") == expected_reply(model)


def test_run_refuses_audio_and_an_image_for_a_text_model(capsys):
    assert main(["run", str(VISION), "--audio", "tone.wav", "-p", "hi", "-n", "1"]) != 0
    assert "no audio module" in capsys.readouterr().err
    assert main(["run", str(FIXTURES / "qwen2_int4_b64"), "--image", str(IMAGE), "-p", "hi", "-n", "1"]) != 0
    assert "no vision module" in capsys.readouterr().err


def test_inspect_lists_the_vision_module(tmp_path):
    table = format_inspect_table(inspect_model(VISION))
    assert "vision: visual.mnn, 277 ops" in table and "inputs patches, position_ids, attention_mask" in table
    missing = format_inspect_table(inspect_model(copy_model(tmp_path, skip=("visual.mnn",))))
    assert "vision: visual.mnn is MISSING" in missing


def test_the_server_reads_image_url_data_urls_only(model):
    from mnngpu.apps.server.engine import ServedModel
    from mnngpu.apps.server.protocol import ApiError, parse_chat_request

    data = base64.b64encode(IMAGE.read_bytes()).decode()

    def body(url: str) -> dict:
        parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
        return {"messages": [{"role": "user", "content": parts}], "max_tokens": 16, "temperature": 0}

    served = ServedModel(model, "vision")
    try:
        request = parse_chat_request(body(f"data:image/png;base64,{data}"))
        job = served.new_job(served.chat_prompt(request.messages), request)
        assert served.submit(job).result(timeout=300).text == expected_reply(model)
        with pytest.raises(ApiError, match="only data: URLs"):
            parse_chat_request(body("https://example.com/cat.png"))
        damaged = parse_chat_request(body("data:image/png;base64," + base64.b64encode(b"not an image").decode()))
        job = served.new_job(served.chat_prompt(damaged.messages), damaged)
        with pytest.raises(ApiError, match="not a readable image"):
            served.submit(job).result(timeout=300)
        text_only = parse_chat_request({"messages": [{"role": "user", "content": f"<img>{IMAGE}</img>hi"}]})
        job = served.new_job(served.chat_prompt(text_only.messages), text_only)
        with pytest.raises(ApiError, match="data: URLs"):   # a client names no file of the server's machine
            served.submit(job).result(timeout=300)
    finally:
        served.close()


# ---- one clear error each ------------------------------------------------------------------------------

def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR says width x height (8-bit RGB) and whose pixels are absent."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def test_an_image_over_the_engines_limit_is_refused_before_decoding(tmp_path):
    path = tmp_path / "wide.png"
    path.write_bytes(png_header(12000, 6000))   # under Pillow's own limit, over the engine's
    with pytest.raises(InputError, match="too large: 12000x6000 pixels"):
        read_image(path)


def saved(image: Image.Image, path: Path, **options) -> Path:
    image.save(path, **options)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda d: d.joinpath("x.png").write_bytes(b"\x00garbage" * 50) and d / "x.png", "not a readable image"),
    (lambda d: d.joinpath("cut.png").write_bytes(IMAGE.read_bytes()[:200]) and d / "cut.png", "not a readable image"),
    (lambda d: saved(Image.new("CMYK", (28, 28)), d / "cmyk.jpg"), "mode CMYK is not supported"),
    (lambda d: saved(Image.new("I;16", (28, 28)), d / "deep.png"), "mode I;16 is not supported"),
    (lambda d: saved(Image.new("RGB", (28, 28)), d / "anim.gif", save_all=True,
                     append_images=[Image.new("RGB", (28, 28), (255, 0, 0))]), "animated image"),
    (lambda d: d.joinpath("huge.png").write_bytes(png_header(20000, 20000)) and d / "huge.png", "too large"),
    (lambda d: d / "absent.png", "no such image file"),
    (lambda d: "https://example.com/cat.png", "URLs are not fetched"),
])
def test_a_bad_image_gets_one_clear_error(tmp_path, model, make, message):
    path = make(tmp_path)
    with pytest.raises(InputError, match=message) as caught:
        read_image(path)
    assert str(path) in str(caught.value)
    with pytest.raises(InputError, match=message):
        model.tokenizer_encode(f"<img>{path}</img>hi")


def test_image_pad_ids_without_an_image_and_audio_parts_are_refused(model):
    pad = model.config.get("image_pad")
    model.reset()
    with pytest.raises(InputError, match="image_pad tokens with no image"):
        model.forward([1, pad, pad, 2])
    with pytest.raises(InputError, match="no audio module"):
        model.tokenizer_encode("<audio>tone.wav</audio>hi")
    with pytest.raises(InputError, match="no audio module"):
        model.count_prompt_tokens("<audio>tone.wav</audio>hi")


def test_a_missing_visual_graph_is_one_config_error(tmp_path):
    broken = mnngpu_llm.create(copy_model(tmp_path, skip=("visual.mnn",)))
    with pytest.raises(ConfigError, match="visual.mnn is missing") as caught:
        broken.load()
    assert caught.value.field == "visual_model"


def test_nothing_is_written_into_the_model_folder(tmp_path):
    folder = copy_model(tmp_path)
    before = folder_state(folder)
    omni = mnngpu_llm.create(folder)
    omni.set_config({"precision": "high"})
    omni.load()
    omni.generate(omni.tokenizer_encode(f"<img>{IMAGE}</img>hi"), max_new_tokens=2)
    assert folder_state(folder) == before


def test_a_big_image_is_resized_to_the_configured_size_without_keeping_it(model):
    """An image of 2000x1500 is read, resized to image_size and dropped: the prompt holds 16
    image rows whatever the source size (memory follows image_size, not the file)."""
    big = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (1500, 2000, 3), dtype=np.uint8)).save(big, "PNG")
    with model.media_sources({"big": big.getvalue()}):
        ids = model.tokenizer_encode("<img>big</img>hi")
    assert ids.count(model.config.get("image_pad")) == 16
    assert sum(image.rows.nbytes for image in model._encoded.images) == 16 * 128 * 4


def test_a_size_over_the_patch_limit_is_refused_before_the_vision_graph_runs(model):
    with pytest.raises(InputError, match="more than the 4096"):
        model.tokenizer_encode(f"<img><hw>1400,1400</hw>{IMAGE}</img>hi")


def test_counting_a_prompts_tokens_runs_no_vision_and_agrees_with_encoding(model):
    ref = json.loads((VISION / "reference.json").read_text())
    for prompt in ref["prompts"]:
        text = prompt["text"].format(image=IMAGE)
        assert model.count_prompt_tokens(text) == len(model.tokenizer_encode(text)) == len(prompt["ids"])


@pytest.mark.parametrize("size", ["0,56", "56", "a,b"])
def test_a_bad_hw_size_is_one_clear_error(model, size):
    with pytest.raises(InputError, match="<hw>"):
        model.tokenizer_encode(f"<img><hw>{size}</hw>{IMAGE}</img>hi")


# ---- Qwen3-VL ----------------------------------------------------------------------------------------

QWEN3 = FIXTURES.parent / "vision" / "qwen3_vl_int4"


@pytest.mark.parametrize("grid", [(2, 2), (4, 6), (8, 8), (14, 10)])
def test_qwen3_position_table_lookup_follows_mnns_loops(grid):
    """The engine's vectorized idx_tensor/weight_tensor against MNN's Omni loops written out one
    patch at a time (tests/mnn_oracle.py)."""
    from mnngpu.omni.vision import position_table_lookup
    from tests.mnn_oracle import mnn_position_table

    index, weight = position_table_lookup(8, *grid)
    expected_index, expected_weight = mnn_position_table(8, *grid)
    assert index.tolist() == expected_index.tolist()
    assert np.array_equal(weight, expected_weight)


def test_qwen3_counts_32_pixel_blocks_and_feeds_deepstack_rows():
    model = mnngpu_llm.create(QWEN3)
    model.set_config({"precision": "high", "thread_num": 2})
    model.load()
    ref = json.loads((QWEN3 / "reference.json").read_text())
    for prompt in ref["prompts"]:
        text = prompt["text"].format(image=QWEN3 / "image.png")
        assert model.count_prompt_tokens(text) == len(model.tokenizer_encode(text)) == len(prompt["ids"])
    ids = model.tokenizer_encode(ref["prompts"][0]["text"].format(image=QWEN3 / "image.png"))
    image = model._encoded.images[0]
    slots = [i for i, token in enumerate(ids) if token == model.config.get("image_pad")]
    # what forward() of those ids arranges for its graph run: image rows and their deepstack rows
    model._media_rows = {model.config.get("image_pad"): list(image.rows)}
    model._deepstack_rows = list(image.deepstack.transpose(1, 0, 2))
    model._embed(ids)
    feed = model._extra_feeds(len(ids) + 2)["deepstack_embeds"]   # two pad rows of a fixed-shape chunk
    assert feed.shape == (3, len(ids) + 2, 128)
    assert np.array_equal(feed[:, slots], image.deepstack)
    assert not np.delete(feed, slots, axis=1).any()
    model._embed(ids[:1])   # a decode step: zeros
    assert not model._extra_feeds(1)["deepstack_embeds"].any()


def test_qwen3_deepstack_rows_follow_their_image_across_prefill_chunks():
    """chunk 8 cuts the image's 16 rows over three graph runs: each run's deepstack_embeds must
    hold the rows of its own image_pad ids (truth: the fixture's HF float64 reference)."""
    model = mnngpu_llm.create(QWEN3)
    model.set_config({"precision": "high", "thread_num": 2, "chunk": 8})
    model.load()
    ref = json.loads((QWEN3 / "reference.json").read_text())
    hf_logits = np.load(QWEN3 / "hf_first_logits.npy")
    prompt = ref["prompts"][0]
    ids = model.tokenizer_encode(prompt["text"].format(image=QWEN3 / "image.png"))
    tokens, first = greedy(model, ids, len(prompt["hf_greedy"]))
    assert np.abs(first - hf_logits[0]).max() <= 1e-3 * hf_logits[0].std()
    assert tokens == prompt["hf_greedy"]


def test_has_deepstack_without_vision_is_one_config_error(tmp_path):
    folder = copy_model_files(QWEN3, tmp_path, [p.name for p in QWEN3.iterdir() if p.is_file()], is_visual=False)
    with pytest.raises(ConfigError, match="deepstack rows come from the vision graph") as caught:
        mnngpu_llm.create(folder).load()
    assert caught.value.field == "has_deepstack"


def test_a_graph_without_deepstack_embeds_runs_without_it_whatever_has_deepstack_says():
    """Qwen3.5's exporter writes has_deepstack true beside an LLM graph with no deepstack_embeds input
    (only its vision graph has deepstack features); MNN runs such a folder, and so must mnngpu."""
    from mnngpu.config import LlmConfig
    from mnngpu.embedding import DiskEmbedding
    from mnngpu.runtime.validate import graph_inputs, validate_model

    config = LlmConfig.load(FIXTURES / "qwen3_5_int4_b64")
    config.set_config({"is_visual": True, "has_deepstack": True})
    embedding = DiskEmbedding(config.hidden_size, config.embedding_path, config.weight_path,
                              config.tie_embeddings)
    net = validate_model(config, embedding)
    assert "deepstack_embeds" not in graph_inputs(net)
    qwen3_vl = LlmConfig.load(QWEN3)   # a graph that takes the input still gets it
    assert "deepstack_embeds" in graph_inputs(validate_model(qwen3_vl, DiskEmbedding(
        qwen3_vl.hidden_size, qwen3_vl.embedding_path, qwen3_vl.weight_path, qwen3_vl.tie_embeddings)))


# ---- Qwen3.5: Qwen3-VL's tower without deepstack, a hybrid Gated-DeltaNet LLM --------------------------

QWEN3_5 = FIXTURES.parent / "vision" / "qwen3_5_int4"


def load_qwen3_5(**settings) -> Omni:
    model = mnngpu_llm.create(QWEN3_5)
    model.set_config({"precision": "high", "thread_num": 2, "sampler_type": "greedy", **settings})
    model.load()
    return model


def test_qwen3_5_image_prompts_give_the_hf_and_mnn_tokens_one_after_another():
    """Each image prompt after the last one's reset (the recurrent state cleared, which MNN's own
    reset() does not do): first-step logits within 1e-3 of the std of the HF float64 truth and of
    MNN's fresh-instance record (the two agree on this family), and both's 16 greedy tokens."""
    model = load_qwen3_5()
    assert model.vision.has_deepstack is False and "deepstack_embeds" not in model.graph_inputs
    ref = json.loads((QWEN3_5 / "reference.json").read_text())
    assert ref["fresh_instance_per_prompt"]
    hf_logits, mnn_logits = np.load(QWEN3_5 / "hf_first_logits.npy"), np.load(QWEN3_5 / "first_logits.npy")
    for k, prompt in enumerate(ref["prompts"]):
        text = prompt["text"].format(image=QWEN3_5 / "image.png")
        ids = model.tokenizer_encode(text)
        assert ids == prompt["ids"] and model.count_prompt_tokens(text) == len(ids)
        tokens, first = greedy(model, ids, len(prompt["hf_greedy"]))
        for truth in (hf_logits[k], mnn_logits[k]):
            assert np.abs(first - truth).max() <= 1e-3 * truth.std(), prompt["text"]
        assert tokens == prompt["hf_greedy"] == prompt["greedy"], prompt["text"]


def test_qwen3_5_image_rows_and_recurrent_state_carry_across_prefill_chunks():
    """chunk 8 cuts the image's 16 rows over three graph runs, each starting from the state the
    last one left in the Gated-DeltaNet layers (truth: the HF float64 reference)."""
    model = load_qwen3_5(chunk=8)
    ref = json.loads((QWEN3_5 / "reference.json").read_text())
    hf_logits = np.load(QWEN3_5 / "hf_first_logits.npy")
    prompt = ref["prompts"][0]
    tokens, first = greedy(model, model.tokenizer_encode(prompt["text"].format(image=QWEN3_5 / "image.png")), 16)
    assert np.abs(first - hf_logits[0]).max() <= 1e-3 * hf_logits[0].std()
    assert tokens == prompt["hf_greedy"]


def test_qwen3_5_run_with_image_streams_the_reference_reply(capsys):
    ref = json.loads((QWEN3_5 / "reference.json").read_text())
    code = main(["run", str(QWEN3_5), "--image", str(QWEN3_5 / "image.png"), "-p", QUESTION, "-n", "16",
                 "--sampler", "greedy", "--precision", "high"])
    out, _ = capsys.readouterr()
    model = load_qwen3_5()
    assert code == 0 and out.rstrip("\n") == "".join(model.tokenizer_decode(t) for t in ref["prompts"][0]["hf_greedy"])


@pytest.mark.parametrize("llm_folder, vision_folder, message", [
    (QWEN3_5, QWEN3, "vision graph has a deepstack_feature output but the LLM graph takes no deepstack_embeds"),
    (QWEN3, QWEN3_5, "LLM graph takes deepstack_embeds but the vision graph has no deepstack_feature output"),
])
def test_a_vision_graph_from_another_export_is_one_format_error(tmp_path, llm_folder, vision_folder, message):
    """Qwen3-VL's tower (with deepstack) beside Qwen3.5's LLM, and the reverse: both 128 wide with
    an 8x8 position table, so only the deepstack pairing tells them apart."""
    import shutil

    from mnngpu.errors import ModelFormatError

    folder = copy_model_files(llm_folder, tmp_path, [p.name for p in llm_folder.iterdir() if p.is_file()])
    for name in ("visual.mnn", "visual.mnn.weight"):
        shutil.copy2(vision_folder / name, folder / name)
    with pytest.raises(ModelFormatError, match=message) as caught:
        mnngpu_llm.create(folder).load()
    assert caught.value.field == "deepstack_feature"
