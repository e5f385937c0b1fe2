"""What a structured-output grammar costs per generated token, against the decode step itself.

    python -m benchmarks.grammar_cost                                   # the demo model
    python -m benchmarks.grammar_cost bench_models/qwen2_5_0_5b_shape --tokens 48

For each grammar (any JSON object, a JSON schema, a required tool call) one reply is generated
through the server's RequestSampler, which masks the logits with llguidance before the model's
sampler and moves the matcher on after it. The time spent in the grammar (the mask and the
advance) is summed per token and set against the decode time per token of the same model with no
grammar, measured in the same run: the ratio is the grammar's share of a decode step. The CPU
and the 1-minute load average are printed: on a shared machine compare only figures of one run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")   # time compiled kernels, not their stand-ins

from benchmarks.machine import cpu_description
from mnngpu import llm as mnn_llm
from mnngpu.apps.chat import PromptCache
from mnngpu.apps.server.logprobs import RequestSampler
from mnngpu.apps.server.structured import GrammarSpec, json_schema_grammar
from mnngpu.apps.server.tool_calls import parse_tool_request
from mnngpu.sampler import Sampler

DEMO = Path(__file__).resolve().parents[1] / "mnngpu" / "demo" / "model"
PROMPT = "Once upon a time"
STORY = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                          "words": {"type": "array", "items": {"type": "string"}}},
         "required": ["title", "year", "words"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


def grammars() -> dict[str, GrammarSpec]:
    return {"json_object": json_schema_grammar({"type": "object"}, "response_format"),
            "json_schema": json_schema_grammar(STORY, "response_format"),
            "tool call": parse_tool_request([WEATHER], "required", False).grammar()}


class GrammarClock:
    """Seconds spent in one grammar's mask and advance."""

    def __init__(self, grammar):
        self.seconds = 0.0
        for name in ("mask", "advance"):
            setattr(grammar, name, self._timed(getattr(grammar, name)))

    def _timed(self, method):
        def call(*args):
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.seconds += time.perf_counter() - start
        return call


def decode(model, prompt_ids: list[int], sampler: RequestSampler, tokens: int, stop_ids) -> tuple[int, float]:
    """(tokens generated, seconds of decode) for one reply; the prefill is not counted."""
    model.reset()
    model.sampler = sampler
    sampler.start_choice()
    model.context.decode_us = 0
    out = model.generate(prompt_ids, tokens, stop_ids=stop_ids)
    return len(out), model.context.decode_us / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=str(DEMO), help="model folder (default: the demo model)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per reply at most")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = mnn_llm.create(Path(args.model) / "config.json")
    model.set_config({"thread_num": args.threads, "sampler_type": "greedy"})
    model.load()
    stop_ids = PromptCache(model).markup.stop_ids
    prompt_ids = model.tokenizer_encode(PROMPT)
    plain = RequestSampler(Sampler(model.config.raw), {}, 0.0, 0.0, None)
    decode(model, prompt_ids, plain, 4, ())   # warm up
    count, seconds = decode(model, prompt_ids, plain, args.tokens, ())
    per_token = seconds / count
    print(cpu_description())
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    print(f"model: {args.model}  logits: {model.embedding.vocab_size}  tokenizer ids: {model.tokenizer.vocab_size}")
    print(f"decode without a grammar: {per_token * 1e3:.2f} ms/token over {count} tokens\n")
    print("| grammar | tokens | grammar ms/token | decode ms/token with it | grammar / plain decode |")
    print("| --- | --- | --- | --- | --- |")
    for name, spec in grammars().items():
        grammar = spec.compile(model.tokenizer, stop_ids)
        clock = GrammarClock(grammar)
        sampler = RequestSampler(Sampler(model.config.raw), {}, 0.0, 0.0, None, grammar)
        count, seconds = decode(model, prompt_ids, sampler, args.tokens, stop_ids)
        cost = clock.seconds / max(count, 1)
        print(f"| {name} | {count} | {cost * 1e3:.3f} | {seconds / max(count, 1) * 1e3:.2f} | "
              f"{cost / per_token:.1%} |")
    print(f"\nload average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
