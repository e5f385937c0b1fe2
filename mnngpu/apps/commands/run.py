"""`mnngpu run [MODEL] -p PROMPT [--image FILE] [--audio FILE]`: stream one reply, then llm_demo's statistics.

Without -p the prompt is read from stdin when stdin is a pipe or a file (`echo hi | mnngpu run`);
on a terminal, or when stdin holds no text (/dev/null), it is DEFAULT_PROMPT, as --help says.
A thinking model's thinking is shown apart from its answer, as `mnngpu chat` shows it (hidden with
--no-think).
"""

from __future__ import annotations

import sys

from mnngpu.apps.commands.chat import add_think_argument, reply_printer
from mnngpu.apps.commands.common import add_model_arguments, add_speculative_argument, load_model, print_stats

DEFAULT_PROMPT = "Once upon a time"


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="generate a reply to one prompt")
    add_model_arguments(parser)
    parser.add_argument("-p", "--prompt", help="the prompt text (default: stdin when it is not a terminal and "
                                               f"holds text, else '{DEFAULT_PROMPT}')")
    parser.add_argument("--no-template", action="store_true", help="feed the prompt raw, without the chat template")
    parser.add_argument("--image", action="append", default=[], metavar="FILE",
                        help="an image the prompt starts with, for a vision model (repeatable; the same as "
                             "writing <img>FILE</img> in the prompt)")
    parser.add_argument("--audio", action="append", default=[], metavar="FILE",
                        help="a WAV file the prompt starts with, for an audio model (repeatable; the same as "
                             "writing <audio>FILE</audio> in the prompt)")
    add_speculative_argument(parser)
    add_think_argument(parser)
    parser.set_defaults(func=run)


def read_prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        return DEFAULT_PROMPT
    return sys.stdin.read().rstrip("\n") or DEFAULT_PROMPT


def media_prompt(model, args) -> str:
    """The <img>/<audio> tags for --image and --audio, checked against what the model reads."""
    from mnngpu.errors import InputError

    if args.audio and not model.config.get("is_audio"):
        raise InputError("this model has no audio module (is_audio is false)", path=args.audio[0], field="--audio")
    if args.image and not model.config.get("is_visual"):
        raise InputError("this model has no vision module (is_visual is false)", path=args.image[0], field="--image")
    images = "".join(f"<img>{path}</img>" for path in args.image)
    return images + "".join(f"<audio>{path}</audio>" for path in args.audio)


def run(args) -> int:
    from mnngpu import jit
    from mnngpu.apps.chat import PromptCache, generate_reply
    from mnngpu.apps.server.reasoning import detect_thinking
    from mnngpu.config import CommandLine

    extra = {CommandLine("--no-template"): {"use_template": False}} if args.no_template else {}
    if args.speculative:
        extra[CommandLine("--speculative")] = {"speculative_type": args.speculative}
    model = load_model(args, extra)
    prompt = media_prompt(model, args) + read_prompt(args)  # after the model: a bad folder is reported first
    started = []
    text = model.prompt.apply_chat_template(prompt)
    thinking = detect_thinking(model.prompt, model.tokenizer) if model.prompt.use_template else None
    printer = reply_printer(sys.stdout, thinking, thinking is not None and thinking.opens_block(text),
                            not args.no_think)

    def show(piece: str) -> None:
        if not started:   # the prefill's new kernels (an image's) are known now: say so before the reply
            jit.announce()
            started.append(True)
        if printer is not None:
            printer(piece)
        elif piece:   # a token inside an unfinished UTF-8 sequence or a hidden special token shows nothing
            sys.stdout.write(piece)
            sys.stdout.flush()

    shown = frozenset() if thinking is None else thinking.special_ids
    generate_reply(model, PromptCache(model), text, on_text=show, show_special=args.show_special, shown_ids=shown)
    if printer is not None:
        printer.finish()
    sys.stdout.write("\n")
    sys.stdout.flush()
    jit.announce()
    print_stats(model.context)
    if model.strategy.name != "ar":   # --speculative, or the folder's speculative_type
        stats = model.strategy.stats
        print(f"{model.strategy.name}: {100 * stats.acceptance_rate:.1f} % of drafts accepted, "
              f"{stats.tokens_per_forward:.2f} tokens per decode forward", file=sys.stderr)
    return 0
