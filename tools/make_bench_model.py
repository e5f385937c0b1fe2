"""Make the benchmark model: a Qwen2.5-0.5B-shaped qwen2 with random weights, exported by MNN's
real exporter (int4, block 64, tied embeddings) into bench_models/qwen2_5_0_5b_shape/.

The shape is Qwen2.5-0.5B's (24 layers, hidden 896, intermediate 4864, 14 heads / 2 KV heads,
vocab 151936, tied embeddings), so the weight file (~309 MB) and the per-token work match the
real model; the weights are random (fixed seed), so only speed and memory mean anything.
The tokenizer is a small byte-level BPE; the model's vocab stays 151936 regardless, and ids
above the tokenizer's range are simply never produced by encoding.

    pip install -e '.[fixtures]'
    python -m tools.make_bench_model                  # about 3-5 minutes, ~3 GB of RAM at peak
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
from tools.mnn_export import copy_model_files, export_mnn, folder_size, save_hf_tokenizer, train_bpe_tokenizer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench_models" / "qwen2_5_0_5b_shape"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EXPORT_ARGS = ("--quant_bit", "4", "--quant_block", "64")
SEED = 0
QWEN2_5_0_5B_SHAPE = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False,
}


def build_hf_model(hf_dir: Path) -> None:
    """Random-weight Qwen2.5-0.5B-shaped model plus tokenizer, saved as a HuggingFace folder."""
    import torch
    import transformers

    tok = train_bpe_tokenizer(corpus.sentences(3000, seed=1), vocab_size=1000, special_tokens=SPECIAL_TOKENS)
    save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    config = transformers.Qwen2Config(eos_token_id=eos, bos_token_id=pad, pad_token_id=pad,
                                      torch_dtype="bfloat16", **QWEN2_5_0_5B_SHAPE)
    torch.manual_seed(SEED)
    # Built directly in bf16: an fp32 model would need 2 GB more for nothing.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(hf_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description="Make the Qwen2.5-0.5B-shaped benchmark model.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--hf-out", type=Path, help="also keep the HuggingFace folder the export was made from")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, export_dir = args.hf_out or Path(tmp) / "hf", Path(tmp) / "mnn"
        started = time.time()
        build_hf_model(hf_dir)
        built = time.time()
        print(f"built the HuggingFace model in {built - started:.1f} s", flush=True)
        export_mnn(hf_dir, export_dir, *EXPORT_ARGS)
        print(f"exported in {time.time() - built:.1f} s", flush=True)
        copy_model_files(export_dir, args.out)
    for path in sorted(args.out.iterdir()):
        print(f"  {path.name:24s} {path.stat().st_size / 1e6:10.2f} MB")
    print(f"wrote {args.out}: {folder_size(args.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
