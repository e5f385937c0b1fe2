"""Make the tiny real-export audio fixture under tests/fixtures/audio/.

NEEDS transformers 4.57 (in its own environment): llmexport 0.0.5 maps Qwen2-Audio by the
transformers 4.x attribute names (language_model.model.embed_tokens), and with transformers 5.x
it fails at load with `AttributeError: 'NoneType' object has no attribute 'weight'`. The
script checks the version first.

    python -m venv venv-tf4 && venv-tf4/bin/pip install "transformers==4.57.*" (plus this project's
    torch, onnx, onnxslim, llmexport, mnn) && venv-tf4/bin/python -m tools.make_audio_fixture

A random-weight Qwen2-Audio (2 text layers of width 64; a 1-layer audio encoder of width 32) is
built with transformers, exported by MNN's real exporter (`llmexport`, offline, telemetry
disabled), and recorded with MNN's own runtime (tests/mnn_oracle.py): greedy tokens and
first-step logits for prompts with `<audio>…</audio>`, and for the bundled tone MNN's waveform,
whisper features and audio embeddings.

Two settings are written into the fixture so the engine and MNN read the same: audio_pad, the
id of <|AUDIO|> in the fixture's small vocabulary (the exporter writes none, and MNN's default
is Qwen2-Audio's 151646), and "mllm" precision/memory high (as the vision fixtures).
"""

from __future__ import annotations

import json
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

from tools import corpus
from tools.mnn_export import (
    copy_model_files,
    disable_converter_telemetry,
    export_mnn,
    folder_size,
    record_oracle,
    save_hf_tokenizer,
    set_export_settings,
    train_bpe_tokenizer,
)

REPO = Path(__file__).resolve().parent.parent
DEST = REPO / "tests" / "fixtures" / "audio" / "qwen2_audio_int4"
TRANSFORMERS = "4.57."
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
TONE, TONE_RATE, TONE_SECONDS = "tone.wav", 11025, 1.0   # resampled to 16 kHz on reading
MLLM = {"backend_type": "cpu", "thread_num": 2, "precision": "high", "memory": "high"}
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "initializer_range": 0.2, "model_type": "qwen2"}
AUDIO = {"num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "d_model": 32, "max_source_positions": 1500, "init_std": 0.2}
EXPORT_ARGS = ["--quant_bit", "4", "--quant_block", "32"]
# {audio} is the fixture's tone at recording and test time
PROMPTS = [
    ("<|im_start|>user\n<|audio_bos|><audio>{audio}</audio><|audio_eos|>What does it say?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "<|im_start|>user\nWhere does the farmer walk?<|im_end|>\n<|im_start|>assistant\n",
    # what `mnngpu run --audio FILE -p "What does it say?"` and the server's input_audio part make
    "<|im_start|>user\n<audio>{audio}</audio>What does it say?<|im_end|>\n<|im_start|>assistant\n",
]


def check_transformers() -> None:
    import transformers

    if not transformers.__version__.startswith(TRANSFORMERS):
        sys.exit(f"error: this fixture needs transformers {TRANSFORMERS}x (llmexport 0.0.5 maps Qwen2-Audio by "
                 f"its 4.x names), found {transformers.__version__}; see the module docstring")


def make_tone(path: Path) -> None:
    """One second of 16-bit mono PCM at 11025 Hz: a 440 Hz tone under a rising chirp, with a
    short silence, so the features have structure in time and frequency."""
    t = np.arange(int(TONE_RATE * TONE_SECONDS)) / TONE_RATE
    signal = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 900 * t * (1 + t))
    signal[int(0.6 * TONE_RATE): int(0.7 * TONE_RATE)] = 0
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(TONE_RATE)
        out.writeframes((signal * 32767).astype("<i2").tobytes())


def build_hf_model(hf_dir: Path, vocab_size: int) -> None:
    import torch
    import transformers

    eos = SPECIAL_TOKENS.index("<|im_end|>")
    text = dict(TEXT, vocab_size=vocab_size, eos_token_id=eos, bos_token_id=0, pad_token_id=0)
    config = transformers.Qwen2AudioConfig(audio_config=AUDIO, text_config=text,
                                           audio_token_index=SPECIAL_TOKENS.index("<|AUDIO|>"))
    torch.manual_seed(3)
    model = transformers.Qwen2AudioForConditionalGeneration(config)   # float32 weights
    model.generation_config.eos_token_id = eos
    model.save_pretrained(hf_dir)


def set_fixture_settings(dest: Path) -> None:
    set_export_settings(dest, {"llm_config.json": {"audio_pad": SPECIAL_TOKENS.index("<|AUDIO|>")},
                               "config.json": {"mllm": MLLM}})


def record_mnn(dest: Path) -> dict:
    tone = dest / TONE
    prompts = [p.format(audio=tone) for p in PROMPTS]
    result = record_oracle(dest, prompts, "--audio-embeds", str(tone),
                           "--audio-embeds-out", str(dest / "audio_embeds.npz"))
    for prompt, template in zip(result["prompts"], PROMPTS):
        prompt["text"] = template
    return result


def make_fixture() -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / "hf", Path(tmp) / "out"
        tok = train_bpe_tokenizer(corpus.sentences(3000, seed=1), vocab_size=480, special_tokens=SPECIAL_TOKENS)
        save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
        build_hf_model(hf_dir, tok.get_vocab_size())
        export_mnn(hf_dir, out_dir, *EXPORT_ARGS)
        copy_model_files(out_dir, DEST)
        for file in ("audio.mnn", "audio.mnn.weight"):
            (DEST / file).write_bytes((out_dir / file).read_bytes())
        make_tone(DEST / TONE)
        set_fixture_settings(DEST)
        reference = record_mnn(DEST)
    reference.update(export_args=EXPORT_ARGS, family="qwen2_audio",
                     fixture_settings={"audio_pad": SPECIAL_TOKENS.index("<|AUDIO|>"), "mllm": MLLM})
    (DEST / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    return DEST


def main() -> None:
    check_transformers()
    disable_converter_telemetry()
    print(f"{DEST.name}: {folder_size(make_fixture()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
