"""The Qwen2-Audio fixture (tools/make_audio_fixture.py) on every backend, against MNN 3.6.1's record.

* the WAV as MNN reads it (first channel, resampled from 11025 Hz to 16 kHz): the same samples;
* whisper features: within 1e-3 of their std wherever a bin lies within four decades of the
  clip's peak power, and within 2.5e-2 everywhere (MNN's float32 STFT rounds the quietest bins,
  near the floor 8 decades below the peak, by up to 1.7e-2 of the std; the engine's is float64);
* audio embeddings: audio.mnn run by the engine on MNN's features within 1e-3 of MNN's output;
  and the engine's whole path (its features, then the graph) within 1e-2 of it;
* prompts: the ids MNN's Omni made, first-step logits within 1e-2 of their std (the audio prompt;
  the text-only prompt within 1e-3) and 16 identical greedy tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.omni import Omni
from mnngpu.omni.audio import read_wav, whisper_features
from tests.conformance.test_fixture_models import greedy
from tests.conftest import FIXTURES, load_multimodal

AUDIO = FIXTURES.parent / "audio" / "qwen2_audio_int4"
TONE = AUDIO / "tone.wav"


@pytest.fixture(scope="module")
def record():
    return json.loads((AUDIO / "reference.json").read_text()), dict(np.load(AUDIO / "audio_embeds.npz"))


def test_the_tone_reads_and_turns_into_mnns_features(record):
    _, mnn = record
    waveform = read_wav(TONE)
    assert waveform.shape == mnn["waveform"].shape
    assert np.abs(waveform - mnn["waveform"]).max() <= 1e-6
    features, expected = whisper_features(waveform), mnn["features"]
    assert features.shape == expected.shape
    loud = expected > expected.max() - 1.0   # within 4 decades of the peak (the features are log10 / 4)
    assert loud.mean() > 0.05
    assert np.abs(features - expected)[loud].max() <= 1e-3 * expected.std()
    assert np.abs(features - expected).max() <= 2.5e-2 * expected.std()


def test_audio_model_matches_mnn(record, backend_type):
    ref, mnn = record
    model = load_multimodal(AUDIO, backend_type)
    assert isinstance(model, Omni) and model.audio is not None
    expected = mnn["audio_embeds"]
    (on_mnn_features,) = model.audio.module.forward({"input_features": mnn["features"]}, ["audio_embeds"])
    on_mnn_features = np.asarray(on_mnn_features).reshape(expected.shape)
    assert np.abs(on_mnn_features - expected).max() <= 1e-3 * expected.std()
    own = model.audio.encode(read_wav(TONE))
    assert np.abs(own - expected).max() <= 1e-2 * expected.std()
    logits = np.load(AUDIO / "first_logits.npy")
    for k, prompt in enumerate(ref["prompts"]):
        model.reset()
        ids = model.tokenizer_encode(prompt["text"].format(audio=TONE))
        assert ids == prompt["ids"], prompt["text"]
        tokens, first = greedy(model, ids, len(prompt["greedy"]))
        bound = 1e-2 if "<audio>" in prompt["text"] else 1e-3
        assert np.abs(first - logits[k]).max() <= bound * logits[k].std(), prompt["text"]
        assert tokens == prompt["greedy"], prompt["text"]
