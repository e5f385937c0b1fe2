"""`mnngpu run [MODEL] -p PROMPT`: stream one reply, then llm_demo's statistics."""

from __future__ import annotations

import sys

from mnngpu.commands.common import add_model_arguments, add_speculative_argument, load_model, print_stats


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="generate a reply to one prompt")
    add_model_arguments(parser)
    parser.add_argument("-p", "--prompt", default="Once upon a time", help="the prompt text")
    parser.add_argument("--no-template", action="store_true", help="feed the prompt raw, without the chat template")
    add_speculative_argument(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    extra = {"use_template": False} if args.no_template else {}
    if args.speculative:
        extra["speculative_type"] = args.speculative
    model = load_model(args, extra)
    model.response(args.prompt, stream=True, out=sys.stdout)
    print_stats(model.context)
    if args.speculative:
        stats = model.strategy.stats
        print(f"{args.speculative}: {100 * stats.acceptance_rate:.1f} % of drafts accepted, "
              f"{stats.tokens_per_forward:.2f} tokens per decode forward", file=sys.stderr)
    return 0
