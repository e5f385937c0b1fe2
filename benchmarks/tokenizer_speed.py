"""Encode 1 MB of mixed text with mnngpu's tokenizer and with MNN's own (`MNN.llm`), per format.

    python -m benchmarks.tokenizer_speed [--megabytes 1] [--repeats 3] [--only NAME ...] [--text FILE]

The text mixes English prose, code, CJK, emoji and digits (or is the first megabytes of FILE).
Both sides get the same string in one encode call; each time is the best of `repeats`. Ours is
timed on a freshly loaded tokenizer each time, so its word cache starts empty, as MNN's process
does; "warm" is a second encode of the same text by that tokenizer. The ratio is MNN's time over
ours, cold (above 1: we are faster). MNN runs in a subprocess, timed inside it around
`tokenizer_encode` alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import time
from pathlib import Path

# Time the compiled kernels, never the library standing in for a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

from mnngpu.tokenizer import load_tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_NAMES, FIXTURE_ROOT, reference
from tools.mnn_tokenizer import run_mnn_tokenizer

SAMPLE = (
    "The quick brown fox jumps over the lazy dog. I'm sure they'll see it, don't worry!\n"
    "def tokenize(text):\n    return [ord(c) for c in text]  # 42 is the answer\n\t\tindented  twice\n"
    "你好，世界！这是一个用于测试分词器的小语料库。日本語のテキストも。한국어 텍스트.\n"
    "Emoji 👍🏽 😀 🎉 👨‍👩‍👧 and numbers 3.14159, 2024, 1,000,000; naïve café résumé.\n"
)


def sample_text(megabytes: float, source: Path | None = None) -> str:
    size = int(megabytes * 1_000_000)
    base = source.read_text(encoding="utf-8", errors="replace") if source else SAMPLE
    text = base * (size // len(base.encode()) + 1)
    return text.encode()[:size].decode("utf-8", errors="ignore")


def timed_encode(tok, text: str) -> tuple[float, int]:
    start = time.perf_counter()
    count = len(tok.encode(text))
    return time.perf_counter() - start, count


def our_seconds(name: str, text: str, repeats: int) -> tuple[float, float, int]:
    """(best cold seconds, best warm seconds, id count)."""
    cold, warm, count = float("inf"), float("inf"), 0
    for _ in range(repeats):
        tok = load_tokenizer(FIXTURE_ROOT / name, reference(name)["tokenizer_file"])
        seconds, count = timed_encode(tok, text)
        cold = min(cold, seconds)
        warm = min(warm, timed_encode(tok, text)[0])
    return cold, warm, count


def mnn_seconds(name: str, text: str, repeats: int, timeout: float) -> float | None:
    """MNN's best time, or None when one encode runs past `timeout` (MNN's BPE is quadratic in
    the length of a text it cannot split, and its type 3 reader uses std::regex)."""
    path = FIXTURE_ROOT / name / reference(name)["tokenizer_file"]
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
    parser.add_argument("--text", type=Path, help="a UTF-8 file to encode instead of the mixed sample")
    args = parser.parse_args()
    text = sample_text(args.megabytes, args.text)
    have_mnn = importlib.util.find_spec("MNN") is not None
    print(f"{len(text.encode()) / 1e6:.2f} MB, best of {args.repeats}", flush=True)
    print(f"{'fixture':15} {'ids':>8} {'mnngpu s':>9} {'warm s':>8} {'MNN s':>8} {'MNN/ours':>9}")
    for name in args.only:
        ours, warm, count = our_seconds(name, text, args.repeats)
        mine = f"{name:15} {count:8d} {ours:9.3f} {warm:8.3f}"
        theirs = mnn_seconds(name, text, args.repeats, args.mnn_timeout) if have_mnn else -1.0
        if theirs is None:
            limit = args.mnn_timeout
            print(f"{mine} {'>' + str(int(limit)):>8} {'>' + f'{limit / ours:.0f}':>9}", flush=True)
        elif theirs < 0:
            print(f"{mine} {'-':>8} {'-':>9}", flush=True)
        else:
            print(f"{mine} {theirs:8.3f} {theirs / ours:9.2f}", flush=True)


if __name__ == "__main__":
    main()
