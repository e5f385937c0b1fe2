"""`mnngpu chat [MODEL]`: an interactive, multi-turn chat through the model's chat template.

Lines are edited with the standard library's readline where it exists (arrow keys, history).
`/help` lists the commands; an unknown `/command` is refused, never sent to the model. Ctrl-C
stops the reply being written at once, even while kernels are still compiling; what was
written stays in the conversation, and the next turn prefills it afresh. The KV cache is
reused between turns (`reuse_kv`), so a turn prefills only its own tokens. A conversation
that outgrows `max_all_tokens` loses its oldest turns, with a note saying so; an error in one
turn is printed and the chat goes on. With a piped stdin (not a terminal) each line is a turn
and no `User: ` prompt is printed: stdout holds only the replies, each after `A: `. What a
command says (`/reset`, `/help`, a refused `/word`) goes to stderr, never under that label.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from mnngpu.apps.commands.common import add_model_arguments, load_model, overrides_from
from mnngpu.errors import MnnGpuError

USER_PROMPT = "\nUser: "   # before each line read from a terminal
COMMANDS = {
    "/help": "list these commands",
    "/reset": "forget the conversation and start over",
    "/exit": "quit (so does Ctrl-D)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, turn by turn")
    add_model_arguments(parser)
    parser.add_argument("--system", help="the system prompt (default: the config's system_prompt)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu.apps.chat import ChatSession
    from mnngpu.config import CommandLine

    own = {} if "reuse_kv" in overrides_from(args) else {CommandLine("mnngpu chat"): {"reuse_kv": True}}
    model = load_model(args, own)
    _enable_line_editing()
    print("type /help for the commands; Ctrl-C stops a reply", file=sys.stderr)
    prompt = USER_PROMPT if sys.stdin.isatty() else ""   # piped lines get no prompt among the replies
    return chat_loop(ChatSession(model, args.system, args.show_special), input, sys.stdout, prompt=prompt)


def _enable_line_editing() -> None:
    """Importing readline makes input() edit lines and keep a history, where the platform has it."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401
        except ImportError:
            pass


def chat_loop(session, read_line: Callable[[str], str], out: TextIO, err: TextIO | None = None,
              prompt: str = USER_PROMPT) -> int:
    """Read a line (after `prompt`), answer it, repeat, until /exit or the end of input."""
    err = err if err is not None else sys.stderr
    while True:
        try:
            line = read_line(prompt).strip()
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
            err.write("reset done.\n")
        elif line == "/help":
            err.write("".join(f"{name:8} {what}\n" for name, what in COMMANDS.items()))
        elif line.startswith("/") and line.split()[0] not in COMMANDS:
            err.write(f"error: unknown command {line.split()[0]}; /help lists the commands\n")
        elif line:
            answer(session, line, out, err)


def answer(session, text: str, out: TextIO, err: TextIO) -> None:
    """Stream the reply to `text`; a notice of kernels compiling comes after it, never inside."""
    from mnngpu import jit

    try:
        _stream_reply(session, text, out, err)
    finally:
        jit.announce()


def _stream_reply(session, text: str, out: TextIO, err: TextIO) -> None:
    shown: list[str] = []

    def show(piece: str) -> None:
        shown.append(piece)
        out.write(piece)
        out.flush()

    try:
        dropped = session.make_room(text)
        if dropped:
            err.write(f"note: the conversation outgrew max_all_tokens={session.llm.config.max_all_tokens}; "
                      f"dropped its {dropped} oldest turn(s)\n")
            err.flush()
        out.write("\nA: ")
        out.flush()
        session.ask(text, on_text=show)
    except KeyboardInterrupt:
        session.keep_interrupted(text, "".join(shown))
        out.write(" [stopped]\n")
        out.flush()
        return
    except MnnGpuError as exc:
        out.write("\n")
        out.flush()
        err.write("error: " + " ".join(str(exc).split()) + "\n")
        err.flush()
        return
    out.write("\n")
    out.flush()
