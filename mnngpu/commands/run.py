"""`mnngpu run [MODEL] -p PROMPT`: stream one reply, then llm_demo's statistics."""

from __future__ import annotations

import sys

from mnngpu.commands.common import add_model_arguments, load_model, print_stats


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="generate a reply to one prompt")
    add_model_arguments(parser)
    parser.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt text")
    parser.add_argument("--no-template", action="store_true", help="feed the prompt raw, without the chat template")
    parser.set_defaults(func=run)


def run(args) -> int:
    extra = {"use_template": False} if args.no_template else {}
    model = load_model(args, extra)
    model.response(args.prompt, stream=True, out=sys.stdout)
    print_stats(model.context)
    return 0
