"""`mnngpu inspect [--json] [MODEL]`: what a model folder holds (ops, shapes, quantization, files)."""

from __future__ import annotations

import json
import sys

from mnngpu.commands.common import model_path
from mnngpu.inspect import format_inspect_table, inspect_model


def register(subparsers) -> None:
    parser = subparsers.add_parser("inspect", help="describe a model folder")
    parser.add_argument("model", nargs="?", help="model folder or its config.json (default: the bundled demo model)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    parser.set_defaults(func=run)


def run(args) -> int:
    info = inspect_model(model_path(args))
    if args.json:
        json.dump(info, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_inspect_table(info))
    return 0
