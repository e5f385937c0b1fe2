"""Make a benchmark model: random weights in a real model's shape, exported by MNN's real exporter
(int4, block 64, tied embeddings) into bench_models/<shape>/.

* qwen2_5_0_5b_shape (the default): a qwen2 in Qwen2.5-0.5B's shape, described below.
* qwen3_moe_shape (--model qwen3_moe): a Qwen3-MoE in Qwen3-30B-A3B's proportions scaled down so
  that mnngpu and MNN both run it on 2 cores: 12 layers, hidden 1024, 16 heads / 4 KV heads of 64,
  32 experts with top 4 (expert width 512), vocab 32768, tied (~400 MB).
* qwen3_5_shape (--model qwen3_5): a Qwen3.5 at Qwen2.5-0.5B's width (hidden 896, 24 layers, intermediate
  4864, vocab 151936, tied): three Gated-DeltaNet layers (7 k heads / 14 v heads of 128, conv kernel 4)
  for each full-attention layer (14 heads / 2 KV heads of 64, a quarter of the head rotary). The HF
  model carries a tiny vision tower the exporter needs; the export is used as a text model.
* qwen3_30b_a3b_shape (--model qwen3_30b_a3b): Qwen3-30B-A3B's full width (48 layers, hidden 2048,
  128 experts, top 8, expert width 768, vocab 151936): about 60 GB of bf16 to build and 16 GB
  exported; for a machine that has them.

The shape is Qwen2.5-0.5B's (24 layers, hidden 896, intermediate 4864, 14 heads / 2 KV heads,
vocab 151936, tied embeddings), so the weight file (~309 MB) and the per-token work match the
real model; the weights are random (fixed seed), so only speed and memory mean anything.
The tokenizer is a small byte-level BPE; the model's vocab stays 151936 regardless, and ids
above the tokenizer's range are simply never produced by encoding.

    pip install -e '.[fixtures]'
    python -m tools.make_bench_model                  # about 3-5 minutes, ~3 GB of RAM at peak
    python -m tools.make_bench_model --model qwen3_moe
    python -m tools.make_bench_model --model qwen3_5
    python -m tools.make_bench_model --out /elsewhere
    python -m tools.make_bench_model --hf-out bench_models/qwen2_5_0_5b_shape_hf   # also keep the HF folder

--hf-out keeps the HuggingFace folder the export was made from, so that another engine's converter
(llama.cpp's convert_hf_to_gguf.py, see tools/build_llama_cpp.sh) starts from the same weights.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tools import corpus
from tools.make_fixtures import QWEN3_5_VISION, VISION_TOKEN_IDS, WITHOUT_VISION, restore_text_keys
from tools.mnn_export import (
    copy_model_files,
    export_mnn,
    folder_size,
    save_hf_tokenizer,
    set_export_settings,
    train_bpe_tokenizer,
)

REPO = Path(__file__).resolve().parent.parent
BENCH_MODELS = REPO / "bench_models"
DEFAULT_OUT = BENCH_MODELS / "qwen2_5_0_5b_shape"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EXPORT_ARGS = ("--quant_bit", "4", "--quant_block", "64")
SEED = 0
QWEN2_5_0_5B_SHAPE = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False,
}
QWEN3_MOE_COMMON = {"max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "norm_topk_prob": True, "decoder_sparse_step": 1,
                    "mlp_only_layers": []}
QWEN3_MOE_SHAPE = {
    "vocab_size": 32768, "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4,
    "moe_intermediate_size": 512, "intermediate_size": 3072, **QWEN3_MOE_COMMON,
}
QWEN3_30B_A3B_SHAPE = {
    "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768, "intermediate_size": 6144, **QWEN3_MOE_COMMON,
}
QWEN3_5_SHAPE = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 7, "linear_num_value_heads": 14, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                        "mrope_section": [3, 3, 2], "mrope_interleaved": True},
}
# --model: (HF model_type, config, HF model class, output folder)
MODELS = {
    "qwen2_5_0_5b": ("qwen2", QWEN2_5_0_5B_SHAPE, "Qwen2ForCausalLM", DEFAULT_OUT),
    "qwen3_moe": ("qwen3_moe", QWEN3_MOE_SHAPE, "Qwen3MoeForCausalLM", BENCH_MODELS / "qwen3_moe_shape"),
    "qwen3_5": ("qwen3_5", QWEN3_5_SHAPE, "AutoModelForImageTextToText", BENCH_MODELS / "qwen3_5_shape"),
    "qwen3_30b_a3b": ("qwen3_moe", QWEN3_30B_A3B_SHAPE, "Qwen3MoeForCausalLM", BENCH_MODELS / "qwen3_30b_a3b_shape"),
}


def build_hf_model(hf_dir: Path, model: str = "qwen2_5_0_5b") -> None:
    """A random-weight model of one of MODELS' shapes plus tokenizer, saved as a HuggingFace folder."""
    import torch
    import transformers

    tok = train_bpe_tokenizer(corpus.sentences(3000, seed=1), vocab_size=1000, special_tokens=SPECIAL_TOKENS)
    save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    family, shape, model_class, _ = MODELS[model]
    ids = {"eos_token_id": eos, "bos_token_id": pad, "pad_token_id": pad}
    if family == "qwen3_5":
        config = transformers.AutoConfig.for_model(family, text_config={**shape, **ids}, tie_word_embeddings=True,
                                                   vision_config={**QWEN3_5_VISION, "out_hidden_size": 896},
                                                   torch_dtype="bfloat16", **VISION_TOKEN_IDS)
    else:
        config = transformers.AutoConfig.for_model(family, torch_dtype="bfloat16", **ids, **shape)
    torch.manual_seed(SEED)
    # Built directly in bf16: an fp32 model would need 2 GB more for nothing.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model_type = getattr(transformers, model_class)
        hf_model = model_type.from_config(config) if model_class.startswith("Auto") else model_type(config)
    finally:
        torch.set_default_dtype(previous)
    hf_model.generation_config.eos_token_id = eos
    hf_model.save_pretrained(hf_dir)
    if family == "qwen3_5":
        restore_text_keys(hf_dir / "config.json", shape)


def main() -> None:
    parser = argparse.ArgumentParser(description="Make a benchmark model in a real model's shape.")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2_5_0_5b",
                        help="the shape (default qwen2_5_0_5b; qwen3_moe for the MoE benchmark)")
    parser.add_argument("--out", type=Path, help="output folder (default bench_models/<the shape's folder>)")
    parser.add_argument("--hf-out", type=Path, help="also keep the HuggingFace folder the export was made from")
    args = parser.parse_args()
    args.out = args.out or MODELS[args.model][3]
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, export_dir = args.hf_out or Path(tmp) / "hf", Path(tmp) / "mnn"
        started = time.time()
        build_hf_model(hf_dir, args.model)
        built = time.time()
        print(f"built the HuggingFace model in {built - started:.1f} s", flush=True)
        export_mnn(hf_dir, export_dir, *EXPORT_ARGS)
        print(f"exported in {time.time() - built:.1f} s", flush=True)
        copy_model_files(export_dir, args.out)
        if MODELS[args.model][0] == "qwen3_5":
            set_export_settings(args.out, WITHOUT_VISION)
    for path in sorted(args.out.iterdir()):
        print(f"  {path.name:24s} {path.stat().st_size / 1e6:10.2f} MB")
    print(f"wrote {args.out}: {folder_size(args.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
