"""Audio input on the Qwen2-Audio fixture: `mnngpu run --audio`, the server's input_audio parts,
`inspect`'s audio module, and one clear error for each bad WAV or missing module.

Truths: MNN 3.6.1's greedy tokens for the fixture's prompts (tools/make_audio_fixture.py; the
conformance test checks them on every backend), the standard library's `wave` writer for the bad
files, and the Qwen2-Audio token count worked out by hand.
"""

from __future__ import annotations

import base64
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.apps.cli import main
from mnngpu.apps.inspect import format_inspect_table, inspect_model
from mnngpu.errors import ConfigError, InputError
from mnngpu.omni import Omni
from mnngpu.omni.audio import audio_tokens, read_wav
from tests.conftest import FIXTURES, copy_model_files, folder_state

AUDIO = FIXTURES.parent / "audio" / "qwen2_audio_int4"
TONE = AUDIO / "tone.wav"
QUESTION = "What does it say?"
MODEL_FILES = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "embeddings_bf16.bin",
               "tokenizer.mtok", "audio.mnn", "audio.mnn.weight")


@pytest.fixture(scope="module")
def model() -> Omni:
    loaded = mnngpu_llm.create(AUDIO)
    loaded.set_config({"precision": "high", "thread_num": 2, "sampler_type": "greedy"})
    loaded.load()
    return loaded


def mnn_reply(model) -> str:
    """The text of MNN's greedy tokens for <audio>TONE</audio>QUESTION in the chat template (their
    bytes decoded together: a character may span two tokens)."""
    ref = json.loads((AUDIO / "reference.json").read_text())
    (prompt,) = [p for p in ref["prompts"] if p["text"].startswith("<|im_start|>user\n<audio>")]
    return b"".join(model.tokenizer.token_bytes(t) for t in prompt["greedy"]).decode("utf-8", errors="replace")


def write_wav(path: Path, seconds: float, rate: int = 8000, width: int = 1, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(bytes(int(seconds * rate) * width * channels))
    return path


def test_a_clip_takes_one_token_per_four_mel_frames(model):
    """1 s at 16 kHz: 100 mel frames, 50 after the stride-2 convolution, 25 after pooling."""
    assert audio_tokens(100) == 25 and audio_tokens(3) == 1 and audio_tokens(2) == 0
    ids = model.tokenizer_encode(f"<audio>{TONE}</audio>hi")
    assert ids.count(model.config.get("audio_pad")) == 25
    assert model.count_prompt_tokens(f"<audio>{TONE}</audio>hi") == len(ids)


def test_run_with_audio_streams_mnns_reply(capsys, model):
    code = main(["run", str(AUDIO), "--audio", str(TONE), "-p", QUESTION, "-n", "16", "--sampler", "greedy",
                 "--precision", "high"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.rstrip("\n") == mnn_reply(model)


def test_the_server_reads_input_audio_parts(model):
    from mnngpu.apps.server.engine import ServedModel
    from mnngpu.apps.server.protocol import ApiError, parse_chat_request

    def body(audio: dict) -> dict:
        parts = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": QUESTION}]
        return {"messages": [{"role": "user", "content": parts}], "max_tokens": 16, "temperature": 0}

    served = ServedModel(model, "audio")
    try:
        request = parse_chat_request(body({"data": base64.b64encode(TONE.read_bytes()).decode(), "format": "wav"}))
        job = served.new_job(served.chat_prompt(request.messages), request)
        assert served.submit(job).result(timeout=300).text == mnn_reply(model)
        with pytest.raises(ApiError, match="only 'wav'"):
            parse_chat_request(body({"data": "AAAA", "format": "mp3"}))
        with pytest.raises(ApiError, match="not valid base64"):
            parse_chat_request(body({"data": "%%%", "format": "wav"}))
        damaged = parse_chat_request(body({"data": base64.b64encode(b"RIFF-not-a-wav").decode(), "format": "wav"}))
        with pytest.raises(ApiError, match="not a readable PCM WAV"):
            served.new_job(served.chat_prompt(damaged.messages), damaged)
        named = parse_chat_request({"messages": [{"role": "user", "content": f"<audio>{TONE}</audio>hi"}]})
        with pytest.raises(ApiError, match="media come as data"):   # a client names no file of the server's
            served.new_job(served.chat_prompt(named.messages), named)
    finally:
        served.close()


def test_inspect_lists_the_audio_module(tmp_path):
    table = format_inspect_table(inspect_model(AUDIO))
    assert "audio: audio.mnn, 179 ops" in table and "inputs input_features" in table
    assert "NOT SUPPORTED" not in table
    missing = format_inspect_table(inspect_model(copy_model(tmp_path, skip=("audio.mnn",))))
    assert "audio: audio.mnn is MISSING" in missing


# ---- one clear error each ------------------------------------------------------------------------------

def copy_model(tmp_path: Path, skip: tuple[str, ...] = ()) -> Path:
    return copy_model_files(AUDIO, tmp_path, MODEL_FILES, skip)


@pytest.mark.parametrize("make, message", [
    (lambda d: d.joinpath("cut.wav").write_bytes(TONE.read_bytes()[:5000]) and d / "cut.wav", "truncated"),
    (lambda d: d.joinpath("x.wav").write_bytes(b"\x00garbage" * 50) and d / "x.wav", "not a readable PCM WAV"),
    (lambda d: d.joinpath("head.wav").write_bytes(TONE.read_bytes()[:30]) and d / "head.wav", "not a readable"),
    (lambda d: write_wav(d / "long.wav", 31.0), "too long: 31.0 s"),
    (lambda d: write_wav(d / "short.wav", 0.01), "too short"),
    (lambda d: write_wav(d / "deep.wav", 0.5, width=3), "24-bit samples are not supported"),
    (lambda d: d / "absent.wav", "no such audio file"),
])
def test_a_bad_wav_gets_one_clear_error(tmp_path, model, make, message):
    path = make(tmp_path)
    with pytest.raises(InputError, match=message) as caught:
        read_wav(path)
    assert str(path) in str(caught.value) and caught.value.field == "audio"
    with pytest.raises(InputError, match=message):
        model.tokenizer_encode(f"<audio>{path}</audio>hi")


def test_a_stereo_clip_reads_its_first_channel(tmp_path):
    """As MNN's loader: the first channel, scaled by 1/32768 for 16-bit PCM."""
    left = (np.arange(1600) % 200 - 100).astype("<i2") * 300
    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.stack([left, np.full_like(left, 7)], axis=1).tobytes())
    assert np.array_equal(read_wav(path), left.astype(np.float32) / 32768)


def test_a_missing_audio_graph_is_one_config_error(tmp_path):
    broken = mnngpu_llm.create(copy_model(tmp_path, skip=("audio.mnn",)))
    with pytest.raises(ConfigError, match="audio.mnn is missing") as caught:
        broken.load()
    assert caught.value.field == "audio_model"


def test_audio_pad_ids_without_audio_are_refused(model):
    pad = model.config.get("audio_pad")
    model.reset()
    with pytest.raises(InputError, match="audio_pad tokens with no audio"):
        model.forward([1, pad, pad, 2])


def test_nothing_is_written_into_the_model_folder(tmp_path):
    folder = copy_model(tmp_path)
    before = folder_state(folder)
    omni = mnngpu_llm.create(folder)
    omni.set_config({"precision": "high"})
    omni.load()
    omni.generate(omni.tokenizer_encode(f"<audio>{TONE}</audio>hi"), max_new_tokens=2)
    assert folder_state(folder) == before
