"""`mnngpu inspect [--json] [MODEL]`: what a model folder holds (ops, shapes, quantization, files)."""

from __future__ import annotations

import json
import sys

from mnngpu.apps.commands.common import MODEL_HELP, model_path, parse_override
from mnngpu.apps.inspect import format_inspect_table, inspect_model, placement_on, placement_rows


def register(subparsers) -> None:
    parser = subparsers.add_parser("inspect", help="describe a model folder")
    parser.add_argument("model", nargs="?", help=MODEL_HELP)
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    parser.add_argument("--backend", help="load the model on this backend and list where every op runs")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key for the --backend load (repeatable)")
    parser.set_defaults(func=run)


def run(args) -> int:
    model = model_path(args)
    info = inspect_model(model)
    table = None
    if args.backend:
        overrides = {**dict(parse_override(item) for item in args.config), "backend_type": args.backend}
        info["device"], table = placement_on(model, overrides)
        info["placement"] = placement_rows(table)
    if args.json:
        json.dump(info, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_inspect_table(info))
        if table is not None:
            print(f"device: {info['device']}")
            print(table.format())
    return 0
