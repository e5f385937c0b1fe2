"""`mnngpu run | chat | serve | bench | inspect`: the command line.

Each subcommand lives in mnngpu/commands/<name>.py with `register(subparsers)`, which adds
its parser and sets `func`. A user error prints one `error: ...` line and exits 2;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mnngpu import __version__
from mnngpu.errors import MnnGpuError

COMMANDS = ("run", "chat", "serve", "bench", "inspect")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnngpu", description="Run MNN-exported LLMs on CPU, OpenCL, Vulkan and CUDA.")
    parser.add_argument("--version", action="version", version=f"mnngpu {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"mnngpu.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"mnngpu.commands.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MnnGpuError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
