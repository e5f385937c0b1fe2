"""Encode 1 MB of mixed text with mnngpu's tokenizer and with MNN's own (`MNN.llm`), per format.

    python benchmarks/tokenizer_speed.py [--megabytes 1] [--repeats 3] [--only NAME ...]

The text mixes English prose, code, CJK, emoji and digits. Both sides get the same string in one
encode call; each time is the best of `repeats`. The ratio is MNN's time over ours (above 1: we
are faster). MNN runs in a subprocess, timed inside it around `tokenizer_encode` alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tokenizer"))

from mnn_tokenizer import run_mnn_tokenizer  # noqa: E402
from tokenizer_fixtures import FIXTURE_NAMES, reference, tokenizer  # noqa: E402

SAMPLE = (
    "The quick brown fox jumps over the lazy dog. I'm sure they'll see it, don't worry!\n"
    "def tokenize(text):\n    return [ord(c) for c in text]  # 42 is the answer\n\t\tindented  twice\n"
    "你好，世界！这是一个用于测试分词器的小语料库。日本語のテキストも。한국어 텍스트.\n"
    "Emoji 👍🏽 😀 🎉 👨‍👩‍👧 and numbers 3.14159, 2024, 1,000,000; naïve café résumé.\n"
)


def sample_text(megabytes: float) -> str:
    size = int(megabytes * 1_000_000)
    repeats = size // len(SAMPLE.encode()) + 1
    text = SAMPLE * repeats
    return text.encode()[:size].decode("utf-8", errors="ignore")


def our_seconds(name: str, text: str, repeats: int) -> tuple[float, int]:
    tok = tokenizer(name)
    best, count = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = len(tok.encode(text))
        best = min(best, time.perf_counter() - start)
    return best, count


def mnn_seconds(name: str, text: str, repeats: int, timeout: float) -> float | None:
    """MNN's best time, or None when one encode runs past `timeout` (MNN's BPE is quadratic in
    the length of a text it cannot split, and its type 3 reader uses std::regex)."""
    path = ROOT / "tests" / "fixtures" / "tokenizers" / name / reference(name)["tokenizer_file"]
    try:
        return min(run_mnn_tokenizer(path, [], timed_text=text, timeout=timeout)["encode_seconds"]
                   for _ in range(repeats))
    except subprocess.TimeoutExpired:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mnn-timeout", type=float, default=120.0, help="seconds for one MNN run")
    parser.add_argument("--only", nargs="*", choices=FIXTURE_NAMES, default=FIXTURE_NAMES)
    args = parser.parse_args()
    text = sample_text(args.megabytes)
    have_mnn = importlib.util.find_spec("MNN") is not None
    print(f"{len(text.encode()) / 1e6:.2f} MB, best of {args.repeats}", flush=True)
    print(f"{'fixture':15} {'ids':>8} {'mnngpu s':>9} {'MNN s':>8} {'MNN/ours':>9}")
    for name in args.only:
        ours, count = our_seconds(name, text, args.repeats)
        if not have_mnn:
            print(f"{name:15} {count:8d} {ours:9.3f} {'-':>8} {'-':>9}", flush=True)
            continue
        theirs = mnn_seconds(name, text, args.repeats, args.mnn_timeout)
        if theirs is None:
            limit = args.mnn_timeout
            print(f"{name:15} {count:8d} {ours:9.3f} {'>' + str(int(limit)):>8} {'>' + f'{limit / ours:.0f}':>9}",
                  flush=True)
        else:
            print(f"{name:15} {count:8d} {ours:9.3f} {theirs:8.3f} {theirs / ours:9.2f}", flush=True)


if __name__ == "__main__":
    main()
