"""Lookahead against AR decoding on one model folder: decode tok/s, identical output, acceptance.

    python -m benchmarks.lookahead_speed bench_models/qwen2_5_0_5b_shape --threads 2 --rounds 3

The prompt is a text with repeats (a short function written out several times, or --text FILE).
Each round decodes --tokens greedy tokens with AR and then with lookahead, past stop ids, from
the same prompt; the two outputs must be identical. It prints each engine's decode tok/s
(median over rounds), the speed-up, lookahead's acceptance rate and tokens per forward, and what
one verify forward costs in CPU time against one decode step, which bounds the speed-up:
    speed-up <= tokens per forward / (verify cost / decode cost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

from mnngpu import llm as mnngpu_llm

CODE = '''def clamp(value, low, high):
    """value, moved into [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value

'''


def load(folder: str, threads: int, precision: str, speculative: str, draft_length: int, rule: str = "freqxlen"):
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": "cpu", "thread_num": threads, "precision": precision,
                      "sampler_type": "greedy", "use_template": False, "reuse_kv": False,
                      "speculative_type": speculative, "draft_predict_length": draft_length,
                      "ngram_update": True, "draft_selection_rule": rule})
    model.load()
    return model


def decode(model, ids: list[int], tokens: int) -> tuple[list[int], float]:
    model.reset()
    out = model.generate(ids, tokens, stop_ids=())
    return out, model.context.gen_seq_len / (model.context.decode_us / 1e6)


def cost_ratio(model, ids: list[int], repeats: int = 3) -> float:
    """CPU seconds of one verify forward over those of one decode step (less noisy than wall
    time on a shared machine)."""
    model.reset()
    model.forward(ids)
    block = ids[: model.pool.verify_length]

    def cpu_seconds(step) -> float:
        step()   # the first run of a shape may compile
        start = time.process_time()
        for _ in range(repeats):
            step()
        return (time.process_time() - start) / repeats

    decode_s = cpu_seconds(lambda: model.forward(ids[:1]))
    verify_s = cpu_seconds(lambda: (model.verify(block), model.discard(1)))
    return verify_s / decode_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="low", choices=["low", "normal", "high"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=6, help="copies of the text in the prompt")
    parser.add_argument("--draft-length", type=int, default=3, help="draft_predict_length")
    parser.add_argument("--rule", default="freqxlen", choices=["freqxlen", "fcfs"],
                        help="draft_selection_rule (MNN's default: freqxlen)")
    parser.add_argument("--text", help="a text file to repeat instead of the built-in function")
    args = parser.parse_args()

    text = Path(args.text).read_text(encoding="utf-8") if args.text else CODE
    ar = load(args.model, args.threads, args.precision, "", args.draft_length)
    spec = load(args.model, args.threads, args.precision, "lookahead", args.draft_length, args.rule)
    ids = ar.tokenizer_encode(text * args.repeats)
    for model in (ar, spec):   # warm-up: kernel compilation (verify blocks too), then their first run
        decode(model, ids, 16)
        decode(model, ids, 16)
    ar_speeds, spec_speeds = [], []
    for _ in range(args.rounds):
        ar_out, ar_speed = decode(ar, ids, args.tokens)
        spec_out, spec_speed = decode(spec, ids, args.tokens)
        if spec_out != ar_out:
            print("lookahead's output differs from AR's", file=sys.stderr)
            return 1
        ar_speeds.append(ar_speed)
        spec_speeds.append(spec_speed)
    stats = spec.strategy.stats
    ar_median, spec_median = statistics.median(ar_speeds), statistics.median(spec_speeds)
    print(f"prompt {len(ids)} tokens, {args.tokens} decoded, threads {args.threads}, precision {args.precision}, "
          f"draft_predict_length {args.draft_length}, draft_selection_rule {args.rule}; outputs identical in {args.rounds} rounds")
    print(f"AR        decode {ar_median:8.2f} tok/s   (rounds: {', '.join(f'{s:.2f}' for s in ar_speeds)})")
    print(f"lookahead decode {spec_median:8.2f} tok/s   (rounds: {', '.join(f'{s:.2f}' for s in spec_speeds)})")
    print(f"speed-up {spec_median / ar_median:.2f}x; acceptance {100 * stats.acceptance_rate:.1f} %, "
          f"{stats.tokens_per_forward:.2f} tokens per forward; one verify forward costs "
          f"{cost_ratio(spec, ids):.2f} decode steps of CPU time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
