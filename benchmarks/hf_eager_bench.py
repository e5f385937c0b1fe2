"""The side-by-side peer of `mnngpu bench`: the benchmark model's HuggingFace source run by
transformers in eager attention and bf16 on a CUDA GPU, timed the way llm_bench times a model:
prefill tok/s over a P-token prompt and decode tok/s over N greedy steps with the KV cache.

The model is tools/make_bench_model.py's random-weight Qwen2.5-0.5B shape (same seed, so the
same weights it exports for mnngpu), built here unless --hf names an existing HF folder.

    python -m benchmarks.hf_eager_bench -p 512 -n 128 -rep 3 [--hf DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build_model(hf_dir: Path) -> None:
    from tools.make_bench_model import build_hf_model

    build_hf_model(hf_dir)


def load(hf_dir: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="eager")
    model = model.to(device=device, dtype=torch.bfloat16).eval()  # whatever dtype the loader kept
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "eager":
        sys.exit(f"error: transformers picked attention '{attn}', not eager")
    return model


def timed(device: str, work) -> tuple[float, object]:
    """(seconds, result) of work(), with the GPU's queue drained on both sides."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda _device: None)
    sync(device)
    start = time.perf_counter()
    result = work()
    sync(device)
    return time.perf_counter() - start, result


def one_run(model, prompt, decode_tokens: int, device: str) -> tuple[float, float]:
    """(prefill seconds, decode seconds) for one prompt and `decode_tokens` greedy steps."""
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache()
        prefill_s, out = timed(device, lambda: model(input_ids=prompt, past_key_values=cache, use_cache=True))
        token = out.logits[:, -1:].argmax(-1)

        def decode():
            nonlocal token
            past = out.past_key_values
            for _ in range(decode_tokens):
                step = model(input_ids=token, past_key_values=past, use_cache=True)
                past = step.past_key_values
                token = step.logits[:, -1:].argmax(-1)
            return token

        decode_s, _ = timed(device, decode)
    return prefill_s, decode_s


def main() -> None:
    parser = argparse.ArgumentParser(description="transformers eager bf16 prefill/decode speed on CUDA")
    parser.add_argument("--hf", type=Path, help="the HuggingFace model folder (default: build the bench model)")
    parser.add_argument("-p", "--prompt", type=int, default=512, help="prompt tokens (default 512)")
    parser.add_argument("-n", "--decode", type=int, default=128, help="decoded tokens (default 128)")
    parser.add_argument("-rep", "--repeat", type=int, default=3, help="timed repetitions (default 3)")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only for a dry run of this script)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: torch sees no CUDA device")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = args.hf
        if hf_dir is None:
            hf_dir = Path(tmp) / "hf"
            started = time.perf_counter()
            build_model(hf_dir)
            print(f"built the HuggingFace bench model in {time.perf_counter() - started:.1f} s", flush=True)
        model = load(hf_dir, args.device)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=generator).to(args.device)
    one_run(model, prompt[:, :16], 4, args.device)  # warm-up: kernels chosen, caches allocated
    runs = [one_run(model, prompt, args.decode, args.device) for _ in range(args.repeat)]
    prefill = [args.prompt / p for p, _ in runs]
    decode = [args.decode / d for _, d in runs]
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device
    result = {"engine": "transformers eager bf16", "device": device_name,
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "prompt_tokens": args.prompt, "decode_tokens": args.decode, "repeat": args.repeat,
              "prefill_tok_s": statistics.mean(prefill), "decode_tok_s": statistics.mean(decode),
              "prefill_runs": prefill, "decode_runs": decode}
    print(f"transformers eager bf16 on {result['device']}: prefill({args.prompt}) "
          f"{result['prefill_tok_s']:.1f} tok/s, decode({args.decode}) {result['decode_tok_s']:.2f} tok/s "
          f"(mean of {args.repeat})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
