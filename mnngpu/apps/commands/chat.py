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

A thinking model's thinking is shown apart from its answer: dimmed on a terminal, on a line of its
own otherwise (a blank line before the answer), and not at all with `--no-think`. `/think on` and `/think off`
switch the chat template's enable_thinking where it has one.
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
    "/think": "on or off: let a thinking model think before it answers (where its template can switch)",
    "/exit": "quit (so does Ctrl-D)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, turn by turn")
    add_model_arguments(parser)
    parser.add_argument("--system", help="the system prompt (default: the config's system_prompt)")
    add_think_argument(parser)
    parser.set_defaults(func=run)


def add_think_argument(parser) -> None:
    parser.add_argument("--no-think", action="store_true",
                        help="hide a thinking model's thinking (its <think> block); only the answer is shown")


DIM, UNDIM = "\x1b[2m", "\x1b[0m"


class ThinkingPrinter:
    """Writes a reply as it streams, a thinking model's thinking apart from its answer: dimmed
    when `dim` (a terminal), then a blank line before the answer; hidden unless `show`. A reply
    without a think block is written as it comes. `answer` is the answer written so far."""

    def __init__(self, out: TextIO, markers, inside: bool, show: bool = True, dim: bool = False):
        from mnngpu.apps.server.reasoning import ReasoningSplitter

        self.out, self.show, self.dim = out, show, dim
        self.splitter = ReasoningSplitter(markers, inside)
        self.thought = False   # some thinking was written
        self.answer = ""

    def __call__(self, piece: str) -> None:
        self._write(self.splitter.feed(piece))

    def finish(self) -> None:
        self._write(self.splitter.finish())
        if self.thought and not self.answer:
            self.out.write(UNDIM if self.dim else "")
            self.out.flush()

    def _write(self, delta) -> None:
        if delta.reasoning and self.show:
            self.out.write((DIM if self.dim and not self.thought else "") + delta.reasoning)
            self.thought = True
        if delta.content:
            if self.thought and not self.answer:
                self.out.write((UNDIM if self.dim else "") + "\n\n")
            self.answer += delta.content
            self.out.write(delta.content)
        self.out.flush()


def reply_printer(out: TextIO, thinking, inside: bool, show: bool) -> ThinkingPrinter | None:
    """The printer of a thinking model's reply (None for a model that does not think)."""
    if thinking is None:
        return None
    return ThinkingPrinter(out, thinking.markers, inside, show, dim=out.isatty())


def run(args) -> int:
    from mnngpu.apps.chat import ChatSession
    from mnngpu.config import CommandLine

    own = {} if "reuse_kv" in overrides_from(args) else {CommandLine("mnngpu chat"): {"reuse_kv": True}}
    model = load_model(args, own)
    _enable_line_editing()
    print("type /help for the commands; Ctrl-C stops a reply", file=sys.stderr)
    prompt = USER_PROMPT if sys.stdin.isatty() else ""   # piped lines get no prompt among the replies
    session = ChatSession(model, args.system, args.show_special)
    return chat_loop(session, input, sys.stdout, prompt=prompt, show_thinking=not args.no_think)


def _enable_line_editing() -> None:
    """Importing readline makes input() edit lines and keep a history, where the platform has it."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401
        except ImportError:
            pass


def chat_loop(session, read_line: Callable[[str], str], out: TextIO, err: TextIO | None = None,
              prompt: str = USER_PROMPT, show_thinking: bool = True) -> int:
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
        elif line.split()[0] == "/think":
            _switch_thinking(session, line.split()[1:], err)
        elif line.startswith("/") and line.split()[0] not in COMMANDS:
            err.write(f"error: unknown command {line.split()[0]}; /help lists the commands\n")
        elif line:
            answer(session, line, out, err, show_thinking)


def _switch_thinking(session, words: list[str], err: TextIO) -> None:
    if words not in (["on"], ["off"]):
        err.write("error: expected /think on or /think off\n")
        return
    try:
        session.set_thinking(words[0] == "on")
    except MnnGpuError as exc:
        err.write(f"error: {exc}\n")
        return
    err.write(f"thinking {words[0]}.\n")


def answer(session, text: str, out: TextIO, err: TextIO, show_thinking: bool = True) -> None:
    """Stream the reply to `text`; a notice of kernels compiling comes after it, never inside."""
    from mnngpu import jit

    try:
        _stream_reply(session, text, out, err, show_thinking)
    finally:
        jit.announce()


def _stream_reply(session, text: str, out: TextIO, err: TextIO, show_thinking: bool) -> None:
    shown: list[str] = []
    printer = None

    def show(piece: str) -> None:
        shown.append(piece)
        if printer is not None:
            printer(piece)
            return
        out.write(piece)
        out.flush()

    try:
        dropped = session.make_room(text)
        if dropped:
            err.write(f"note: the conversation outgrew max_all_tokens={session.llm.config.max_all_tokens}; "
                      f"dropped its {dropped} oldest turn(s)\n")
            err.flush()
        thinking = getattr(session, "thinking", None)
        printer = reply_printer(out, thinking, thinking is not None and session.opens_thinking(text), show_thinking)
        out.write("\nA: ")
        out.flush()
        session.ask(text, on_text=show)
        if printer is not None:
            printer.finish()
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
