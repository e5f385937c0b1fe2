"""How long Ctrl-C takes to stop `mnngpu chat`'s first reply while its kernels still compile.

    python -m benchmarks.chat_interrupt [MODEL_DIR] [--wait 3] [-- chat flags...]

Starts `mnngpu chat` in a pseudo-terminal with NUMBA_CACHE_DIR set to an empty folder (so the
first reply compiles every kernel), asks one question, presses Ctrl-C `--wait` seconds after
the reply began, and prints how long the stop and the return to the prompt took; then how long
the next turn took to answer (it prefills the conversation afresh and finishes compiling).
Needs pexpect.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import pexpect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="model folder (default: the demo model)")
    parser.add_argument("--wait", type=float, default=3.0, help="seconds between the reply's start and Ctrl-C")
    parser.add_argument("--question", default="Tell me a long story")
    parser.add_argument("chat_flags", nargs="*", help="more `mnngpu chat` flags, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        command = ["-m", "mnngpu", "chat", *([args.model] if args.model else []), *args.chat_flags]
        chat = pexpect.spawn(sys.executable, command, env={**os.environ, "NUMBA_CACHE_DIR": cache},
                             encoding="utf-8", codec_errors="replace", timeout=900)
        try:
            chat.expect("User: ")
            chat.sendline(args.question)
            chat.expect("A: ")
            time.sleep(args.wait)
            pressed = time.perf_counter()
            chat.sendintr()
            chat.expect(r"\[stopped\]")
            stopped = time.perf_counter()
            chat.expect("User: ")
            prompt = time.perf_counter()
            chat.sendline(args.question)
            chat.expect("User: ")
            answered = time.perf_counter()
            chat.sendline("/exit")
            chat.expect(pexpect.EOF)
        finally:
            chat.close(force=True)
    print(f"Ctrl-C {args.wait:.1f} s into the first reply (cold numba cache):")
    print(f"  stopped after      {stopped - pressed:8.3f} s")
    print(f"  back at the prompt {prompt - pressed:8.3f} s")
    print(f"  next turn answered {answered - prompt:8.1f} s later (compiling the rest)")


if __name__ == "__main__":
    main()
