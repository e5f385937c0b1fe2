"""`mnngpu chat [MODEL]`: an interactive, multi-turn chat through the model's chat template.

`/reset` forgets the conversation, `/exit` (or the end of input) quits. Ctrl-C stops the reply
being written and returns to the prompt; a second Ctrl-C during the same reply breaks off at
once and resets the conversation. The KV cache is reused between turns (`reuse_kv`), so a
turn prefills only its own tokens; `--config reuse_kv=false` re-prefills the whole
conversation every turn.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TextIO

from mnngpu.commands.common import add_model_arguments, load_model, overrides_from


def register(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, turn by turn")
    add_model_arguments(parser)
    parser.add_argument("--system", help="the system prompt (default: the config's system_prompt)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu.chat import ChatSession

    model = load_model(args, {"reuse_kv": overrides_from(args).get("reuse_kv", True)})
    print("type /reset to start over, /exit to quit; Ctrl-C stops a reply", file=sys.stderr)
    return chat_loop(ChatSession(model, args.system), input, sys.stdout)


class ReplyInterrupt:
    """Ctrl-C while a reply is written: the first asks it to stop, a second raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    @contextmanager
    def armed(self):
        self.requested = False
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread; there Ctrl-C keeps its usual meaning
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def chat_loop(session, read_line: Callable[[str], str], out: TextIO) -> int:
    """Read a line, answer it, repeat, until /exit or the end of input."""
    interrupt = ReplyInterrupt()
    while True:
        try:
            line = read_line("\nUser: ").strip()
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:  # at the prompt: start a fresh line
            out.write("\n")
            continue
        if line == "/exit":
            return 0
        if line == "/reset":
            session.reset()
            out.write("\nA: reset done.\n")
            continue
        if line:
            answer(session, line, interrupt, out)


def answer(session, text: str, interrupt: ReplyInterrupt, out: TextIO) -> None:
    def show(piece: str) -> bool:
        out.write(piece)
        out.flush()
        return interrupt.requested

    with interrupt.armed():
        out.write("\nA: ")
        out.flush()
        try:
            reply = session.ask(text, on_text=show)
        except KeyboardInterrupt:
            session.reset()
            out.write("\n[interrupted: the conversation was reset]\n")
            return
    out.write(" [stopped]\n" if reply.finish_reason == "cancelled" else "\n")
    out.flush()
