"""`mnngpu run | chat | serve | bench | inspect | diff`: the command line.

Each subcommand lives in mnngpu/apps/commands/<name>.py with `register(subparsers)`, which adds
its parser and sets `func`. Whatever goes wrong, stderr gets one `error: ...` line and no
traceback (`--debug` shows the traceback instead): exit 2 for bad input (an MnnGpuError, a
usage mistake), 130 for Ctrl-C, 1 for a bug in mnngpu. Warnings print as one `warning: ...` line
(a notice, whose category has `line_prefix = "note"`, as one `note: ...` line).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from mnngpu import __version__
from mnngpu.errors import InputError, MnnGpuError

COMMANDS = ("run", "chat", "serve", "bench", "inspect", "diff")


class ArgumentParser(argparse.ArgumentParser):
    """A usage mistake becomes an InputError, so it prints as the same one line as any other."""

    def error(self, message: str):
        raise InputError(f"{message} (see {self.prog} --help)", field=self.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="mnngpu", description="Run MNN-exported LLMs on CPU, OpenCL, Vulkan and CUDA.")
    parser.add_argument("--version", action="version", version=f"mnngpu {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"mnngpu.apps.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"mnngpu.apps.commands.{name}":
                raise
            continue
        module.register(subparsers)
    for command in subparsers.choices.values():  # `mnngpu run --debug` as well as `mnngpu --debug run`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _warning_line
        try:
            args = build_parser().parse_args(argv)
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # here, so that a reader gone away is handled below, not at exit
            return code
        except MnnGpuError as exc:
            if debug:
                raise
            return _fail(str(exc), 2)
        except KeyboardInterrupt:
            if debug:
                raise
            return _fail("interrupted", 130)
        except BrokenPipeError:
            return _stdout_closed()
        except Exception as exc:  # a bug, not bad input: still one line; --debug shows the traceback
            if debug:
                raise
            return _fail(f"internal error: {type(exc).__name__}: {exc} (a bug in mnngpu; rerun with --debug "
                         "for the traceback)", 1)


def _fail(message: str, code: int) -> int:
    print("error: " + " ".join(message.split()), file=sys.stderr)
    return code


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    prefix = getattr(category, "line_prefix", "warning")
    print(f"{prefix}: " + " ".join(str(message).split()), file=sys.stderr, flush=True)


def _stdout_closed() -> int:
    """The reader of stdout went away (`mnngpu inspect x | head -1`): stop quietly, as other tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
