"""`mnngpu diff MODEL --backends cpu,vulkan [--prompt ...]`: where two backends part, op by op."""

from __future__ import annotations

from mnngpu.apps.commands.common import MODEL_HELP, model_path, parse_override
from mnngpu.apps.diff import DEFAULT_TOLERANCE, diff_backends, first_divergence, format_diffs
from mnngpu.config import CONFIG_FLAG


def register(subparsers) -> None:
    parser = subparsers.add_parser("diff", help="run one prompt on two backends and name the first op that differs")
    parser.add_argument("model", nargs="?", help=MODEL_HELP)
    parser.add_argument("--backends", default="cpu,vulkan", help="the two backends, comma-separated (default cpu,vulkan)")
    parser.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt text (fed raw, no template)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="largest error, relative to the first backend's max |value|, that still agrees")
    parser.add_argument("--precision", choices=["low", "normal", "high"], default="high")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key for both loads (repeatable)")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Exit 0 when every op output agrees within the tolerance, 1 when one does not."""
    overrides = {**dict(parse_override(item) for item in args.config), "precision": args.precision}
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    _, diffs = diff_backends(model_path(args), backends, prompt=args.prompt, overrides=overrides,
                             source=CONFIG_FLAG)
    print(format_diffs(diffs, args.tolerance))
    return 1 if first_divergence(diffs, args.tolerance) is not None else 0
