"""`mnngpu run | chat | serve | bench | inspect | diff | pull | list | rm`: the command line.

Each subcommand lives in mnngpu/apps/commands/<name>.py with `register(subparsers)`, which adds
its parser and sets `func`. Whatever goes wrong, stderr gets one `error: ...` line and no
traceback (`--debug` shows the traceback instead): exit 2 for bad input (an MnnGpuError, a
usage mistake), 130 for Ctrl-C, 1 for a bug in mnngpu. Warnings print as one `warning: ...` line
(a notice, whose category has `line_prefix = "note"`, as one `note: ...` line).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
import warnings

from mnngpu import __version__
from mnngpu.errors import InputError, MnnGpuError

COMMANDS = ("run", "chat", "serve", "bench", "inspect", "diff", "pull", "list", "rm", "embed", "rerank")
HUB_NOTE = ("A MODEL may be a Hugging Face Hub repo id ORG/NAME[@REVISION]: fetched into huggingface_hub's cache "
            "(HF_HOME), from HF_ENDPOINT, or used from the cache with no network under HF_HUB_OFFLINE=1.")

# At exit the collector would walk numba's hundreds of thousands of objects again and again as
# the modules go (up to a second of a short run); frozen, it skips them, and the process ends anyway.
atexit.register(gc.freeze)


class ArgumentParser(argparse.ArgumentParser):
    """A usage mistake becomes an InputError, so it prints as the same one line as any other."""

    def error(self, message: str):
        raise InputError(f"{message} (see {self.prog} --help)", field=self.prog)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of `only`: a run imports no other command's code."""
    parser = ArgumentParser(prog="mnngpu", description="Run MNN-exported LLMs on CPU, OpenCL, Vulkan and CUDA.",
                            epilog=HUB_NOTE)
    parser.add_argument("--version", action="version", version=f"mnngpu {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in (only,) if only in COMMANDS else COMMANDS:
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
            args = build_parser(_command_named(argv)).parse_args(argv)
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


def _command_named(argv: list[str]) -> str | None:
    """The command word in argv (the options before it take no values), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


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
