"""Record what MNN's own runtime (`MNN.llm`) does on a model folder, as a JSON file.

Run it as a subprocess (MNN.llm can segfault):
    python tests/mnn_oracle.py MODEL_DIR --prompts-json '["hello", ...]' --json-out ref.json --logits-out first.npy

For each prompt it records the prompt ids, a greedy continuation of `steps` tokens made by
`forward` with the KV cache kept, and (optionally) the first step's full logits.
With --replies it records instead the bytes `response()` streams for each prompt, which runs
MNN's generation strategy (speculative_type) as its own engine does.
Settings are the oracle's: precision high, memory high, thread_num 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

ORACLE_SETTINGS = {"precision": "high", "memory": "high", "thread_num": 2}


def last_row(logits) -> np.ndarray:
    values = np.array(logits.read(), dtype=np.float32)
    return values.reshape(-1, values.shape[-1])[-1]


def record(model_dir: str, prompts: list[str], steps: int, overrides: dict) -> tuple[dict, np.ndarray]:
    import MNN.llm as mnn_llm

    llm = mnn_llm.create(f"{model_dir}/config.json")
    llm.set_config({**ORACLE_SETTINGS, **overrides})  # MNN.llm json-encodes the dict itself
    llm.load()
    results, first_logits = [], []
    for text in prompts:
        llm.reset()
        ids = [int(i) for i in llm.tokenizer_encode(text)]
        logits = last_row(llm.forward(ids))
        first_logits.append(logits)
        greedy = [int(np.argmax(logits))]
        while len(greedy) < steps:
            greedy.append(int(np.argmax(last_row(llm.forward([greedy[-1]])))))
        results.append({"text": text, "ids": ids, "greedy": greedy})
    return {"settings": {**ORACLE_SETTINGS, **overrides}, "prompts": results}, np.stack(first_logits)


RESPONSE_LOG = b"[MNNLLM] response: "


def streamed_bytes(llm, text: str) -> bytes:
    """What response(text, stream=True) writes to the process's stdout, less the wheel's own
    log lines around it (the first line and the closing tag)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            llm.response(text, True)
        except UnicodeDecodeError:
            pass   # the wheel decodes the whole reply as UTF-8 after streaming it
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        data = sink.read()
    if not data.startswith(RESPONSE_LOG) or not data.endswith(RESPONSE_LOG + b"\n"):
        raise RuntimeError(f"unexpected response log from the MNN wheel: {data[:80]!r}")
    return data.partition(b"\n")[2][: -len(RESPONSE_LOG) - 1]


def record_replies(model_dir: str, prompts: list[str], overrides: dict) -> dict:
    import MNN.llm as mnn_llm

    llm = mnn_llm.create(f"{model_dir}/config.json")
    llm.set_config({**ORACLE_SETTINGS, **overrides})
    llm.load()
    replies = []
    for text in prompts:
        llm.reset()
        replies.append({"text": text, "reply_hex": streamed_bytes(llm, text).hex()})
    return {"settings": {**ORACLE_SETTINGS, **overrides}, "replies": replies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--prompts-json", required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--config-json", default="{}", help="extra set_config overrides")
    parser.add_argument("--json-out", required=True, help="where to write the JSON record (MNN prints to stdout)")
    parser.add_argument("--logits-out", help="save the first-step logits [n_prompts, vocab] as .npy")
    parser.add_argument("--replies", action="store_true", help="record response()'s streamed bytes instead")
    args = parser.parse_args()
    if args.replies:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(record_replies(args.model_dir, json.loads(args.prompts_json), json.loads(args.config_json)),
                      out, ensure_ascii=False)
        return
    result, logits = record(args.model_dir, json.loads(args.prompts_json), args.steps,
                            json.loads(args.config_json))
    if args.logits_out:
        np.save(args.logits_out, logits)
    with open(args.json_out, "w", encoding="utf-8") as out:
        json.dump(result, out, ensure_ascii=False)


if __name__ == "__main__":
    main()
