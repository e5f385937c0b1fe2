"""Make the real-width conformance models: 1-2 layer exports at real models' widths, with the real
151,936-entry vocabulary, by MNN's real exporter (llmexport 0.0.5), and record MNN 3.6.1's runtime on
them (tests/mnn_oracle.py, a fresh instance per prompt, every greedy step's top logits kept, and every
row of one prompt's all_logits prefill).

They are too big to commit (the int4 lm_head alone is ~78 MB), so tests/conformance/conftest.py builds
them at test time into a cache folder keyed by the hash of the files the build reads; by hand:

    pip install -e '.[fixtures,test]'
    python -m tools.make_width_models OUT_DIR                 # all three
    python -m tools.make_width_models OUT_DIR dense_h1024     # only the named ones

Shapes (random weights, fixed seed; the tokenizer is tools/make_fixtures.py's tiny BPE, the ids above
its range are never produced by encoding but every logit is computed):
* dense_h1024: Qwen3-0.6B's width: hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072.
* moe_h1024: the qwen3_moe layer at that width: 8 experts, top 2, expert width 384.
* deltanet_h1024: a Qwen3.5 Gated-DeltaNet layer (16 k heads / 32 v heads of 128, conv kernel 4) then a
  full-attention layer (8 heads / 2 KV heads of 256 as in Qwen3.5, a quarter of the head rotary).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tools.make_fixtures import (
    QWEN3_5_VISION,
    WITHOUT_VISION,
    FixtureSpec,
    build_hf_model,
    build_tokenizer,
    to_readable_json,
)
from tools.mnn_export import (
    copy_model_files,
    disable_converter_telemetry,
    export_mnn,
    record_oracle,
    set_export_settings,
)

VOCAB = 151936
EXPORT_ARGS = ["--quant_bit", "4", "--quant_block", "64", "--embed_bit", "4"]
PROMPTS = ["hello", "The quick brown fox jumps over the lazy dog."]
STEPS, STEPS_TOP = 16, 8
ALL_ROWS_PROMPT = 1   # the prompt whose every all_logits row is recorded
# a real model's initialization scale (make_fixtures' 0.2 suits its width of 128, not 1024)
REAL_WIDTH = {"hidden_size": 1024, "head_dim": 128, "num_hidden_layers": 2, "initializer_range": 0.02,
              "max_position_embeddings": 4096}
QWEN3_ROPE = {"rope_theta": 1000000.0}
DELTANET_TEXT = {**REAL_WIDTH, "intermediate_size": 3072, "head_dim": 256, "num_attention_heads": 8,
                 "num_key_value_heads": 2, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                 "linear_value_head_dim": 128,
                 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 2,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                     "mrope_section": [11, 11, 10], "mrope_interleaved": True}}
SPECS = [
    FixtureSpec("dense_h1024", "qwen3", EXPORT_ARGS, tied=True,
                hf_overrides={**REAL_WIDTH, **QWEN3_ROPE, "intermediate_size": 3072, "num_attention_heads": 16,
                              "num_key_value_heads": 8}),
    FixtureSpec("moe_h1024", "qwen3_moe", EXPORT_ARGS, tied=True,
                hf_overrides={**REAL_WIDTH, **QWEN3_ROPE, "num_hidden_layers": 1, "num_attention_heads": 16,
                              "num_key_value_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 384, "intermediate_size": 3072, "norm_topk_prob": True,
                              "decoder_sparse_step": 1, "mlp_only_layers": []}),
    FixtureSpec("deltanet_h1024", "qwen3_5", EXPORT_ARGS, tied=True, stateful=True, hf_overrides=DELTANET_TEXT,
                vision={**QWEN3_5_VISION, "out_hidden_size": 1024}, settings=WITHOUT_VISION),
]
NAMES = [spec.name for spec in SPECS]


def record_fresh(model_dir: Path) -> dict:
    """MNN's runtime on each of PROMPTS in its own oracle process (its reset() keeps a Gated-DeltaNet
    layer's state), each greedy step's top logits kept."""
    records, logits = [], []
    for text in PROMPTS:
        records.append(record_oracle(model_dir, [text], "--steps-top", str(STEPS_TOP)))
        logits.append(np.load(model_dir / "first_logits.npy")[0])
    np.save(model_dir / "first_logits.npy", np.stack(logits))
    return {"settings": records[0]["settings"], "fresh_instance_per_prompt": True,
            "prompts": [record["prompts"][0] for record in records]}


def record_rows(model_dir: Path, prompt: str) -> list:
    """MNN's every prefill row of `prompt` with all_logits on: each row's top STEPS_TOP logits."""
    record = record_oracle(model_dir, [prompt], "--rows-top", str(STEPS_TOP))
    return record["prompts"][0]["rows_top"]


def make_model(spec: FixtureSpec, dest: Path) -> dict:
    """Build, export and record one shape into dest; returns the seconds each phase took."""
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / "hf", Path(tmp) / "out"
        started = time.perf_counter()
        build_tokenizer(hf_dir)
        build_hf_model(spec, hf_dir, vocab_size=VOCAB)
        seconds["build"] = time.perf_counter() - started
        started = time.perf_counter()
        export_mnn(hf_dir, out_dir, *spec.export_args)
        seconds["export"] = time.perf_counter() - started
        copy_model_files(out_dir, dest)
    set_export_settings(dest, spec.settings)
    started = time.perf_counter()
    reference = record_fresh(dest)
    reference["prompts"][ALL_ROWS_PROMPT]["rows_top"] = record_rows(dest, PROMPTS[ALL_ROWS_PROMPT])
    seconds["record"] = time.perf_counter() - started
    reference.update(export_args=spec.export_args, family=spec.family, tied=spec.tied,
                     hf_shape=spec.hf_overrides)
    (dest / "reference.json").write_text(to_readable_json(reference))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description="Make the real-width conformance models.")
    parser.add_argument("out", type=Path, help="the folder to write one model folder per shape into")
    parser.add_argument("names", nargs="*", help=f"shapes (default: all of {', '.join(NAMES)})")
    args = parser.parse_args()
    if set(args.names) - set(NAMES):
        parser.error(f"unknown shapes {sorted(set(args.names) - set(NAMES))}; the shapes are {NAMES}")
    disable_converter_telemetry()
    for spec in SPECS:
        if not args.names or spec.name in args.names:
            seconds = make_model(spec, args.out / spec.name)
            print(spec.name, json.dumps({k: round(v, 1) for k, v in seconds.items()}), flush=True)


if __name__ == "__main__":
    main()
