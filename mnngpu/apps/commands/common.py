"""What the model-running subcommands share: the model argument, config overrides, loading.

Each override is set with the flag that gave it (`--config`, `--precision`, ...) as its source, so
a warning about it names that flag. Loading binds every kernel a reply runs (`bind_kernels`), so
that a notice about kernels compiling for the first time comes before the "ready" line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mnngpu.config import CONFIG_FLAG, CommandLine
from mnngpu.errors import ConfigError, InputError

SAMPLER_FLAGS = {  # flag -> (config key, type)
    "sampler": ("sampler_type", str), "temperature": ("temperature", float), "top_k": ("top_k", int),
    "top_p": ("top_p", float), "min_p": ("min_p", float), "seed": ("seed", int),
    "repetition_penalty": ("repetition_penalty", float), "max_new_tokens": ("max_new_tokens", int),
}


MODEL_HELP = ("model folder or its config.json, or a Hugging Face Hub repo id ORG/NAME[@REVISION], fetched into "
              "huggingface_hub's cache (default: the bundled demo model)")


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """--backend, --threads, --precision and --config: what every command that loads a model takes
    (overrides_from reads them back)."""
    parser.add_argument("--backend", help="backend_type: cpu, opencl, vulkan or cuda")
    parser.add_argument("-t", "--threads", type=int, help="thread_num")
    parser.add_argument("--precision", choices=["low", "normal", "high"])
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="any config key; VALUE is JSON or a plain string (repeatable)")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help=MODEL_HELP)
    add_runtime_arguments(parser)
    parser.add_argument("--lora", metavar="LORA_MNN",
                        help="run this LoRA graph (the lora.mnn of llmexport --lora_split, relative to the model "
                             "folder) on the model's weights, as MNN's create_lora does")
    parser.add_argument("--show-special", action="store_true",
                        help="show the special tokens a reply holds (hidden by default)")
    group = parser.add_argument_group("sampling")
    group.add_argument("--sampler", help="sampler_type: greedy, temperature, topK, topP, minP, tfs, typical, "
                                         "penalty or mixed")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-k", type=int)
    group.add_argument("--top-p", type=float)
    group.add_argument("--min-p", type=float)
    group.add_argument("--repetition-penalty", type=float)
    group.add_argument("--seed", type=int)
    group.add_argument("-n", "--max-new-tokens", type=int)


# The speculative_type values mnngpu runs (mnngpu/generation/factory.py): the flag offers only these.
# "mtp" and "dflash" are MNN values mnngpu refuses at load; set through --config or a config file,
# they still get that one-line refusal.
SPECULATIVE_FLAG_CHOICES = ("lookahead", "eagle")


def add_speculative_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speculative", choices=SPECULATIVE_FLAG_CHOICES,
                        help="speculative_type: decode with this strategy instead of one token per forward "
                             "(eagle needs the draft head llmexport --eagle_path writes; mtp and dflash are not "
                             "run by mnngpu)")


def parse_override(item: str) -> tuple[str, object]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"expected KEY=VALUE, got '{item}'", field="--config")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


RUNTIME_FLAGS = {"backend": "backend_type", "threads": "thread_num", "precision": "precision"}  # flag -> key


def flag_overrides(args: argparse.Namespace) -> dict[CommandLine, dict]:
    """The config values the command line sets, by the flag that set them; --config comes first,
    so a named flag wins over it."""
    groups = {CONFIG_FLAG: dict(parse_override(item) for item in args.config)}
    named = {**RUNTIME_FLAGS, **{attr: key for attr, (key, _) in SAMPLER_FLAGS.items()}}
    for attr, key in named.items():
        if getattr(args, attr, None) is not None:
            groups[CommandLine("--" + attr.replace("_", "-"))] = {key: getattr(args, attr)}
    return groups


def overrides_from(args: argparse.Namespace) -> dict:
    """The config values the command line sets, merged."""
    return {key: value for values in flag_overrides(args).values() for key, value in values.items()}


def model_path(args: argparse.Namespace) -> Path:
    """The folder (or config.json) the model argument names: the demo model without one, and a Hub
    repo id's cached folder (mnngpu/hub.py), which `serve` names by the repo id."""
    if not args.model:
        from mnngpu.demo import demo_model_dir

        return demo_model_dir()
    path, repo_id = resolve_model(args.model)
    if repo_id and getattr(args, "model_name", False) is None:
        args.model_name = repo_id
    return path


def resolve_model(text: str) -> tuple[Path, str | None]:
    """An existing file or folder, else a Hub repo id ORG/NAME[@REVISION] fetched into the cache (with
    the id); a path that does not exist is left to the loader's error."""
    path = Path(text).expanduser()
    if path.exists():
        return path, None
    from mnngpu import hub

    name = hub.parse_model_name(text)
    if name is not None:
        return hub.model_folder(name), name.repo_id
    if "/" in text or "\\" in text or text.startswith((".", "~")) or path.suffix in (".json", ".mnn"):
        return path, None
    raise InputError(f"'{text}' is neither a file or folder here nor {hub.NAME_FORM}", field="model")


def load_model(args: argparse.Namespace, extra: dict[CommandLine, dict] | None = None):
    """Create, configure and load the Llm and its tokenizer, with a progress bar on a terminal; bind
    the kernels a reply runs; then one summary line. `extra`: the command's own settings, by flag."""
    from mnngpu import jit
    from mnngpu import llm as mnngpu_llm
    from mnngpu.progress import LoadProgress, ready_line

    jit.hold_notices()   # each command says them where they split no reply (jit.announce)
    start = time.perf_counter()
    model = mnngpu_llm.create(model_path(args))
    for source, values in {**flag_overrides(args), **(extra or {})}.items():
        model.config.set_config(values, source=source)
    progress = LoadProgress(sys.stderr)
    try:
        model.load(progress=progress)
    finally:
        progress.close()
    if getattr(args, "lora", None):
        model = model.create_lora(args.lora)
    model.tokenizer  # noqa: B018 (loaded now, so that "ready" means ready to answer)
    bind_kernels(model)
    jit.announce()
    print(ready_line(model, time.perf_counter() - start), file=sys.stderr)
    return model


def bind_kernels(model) -> None:
    """Run a forward of each size class a reply runs (a prefill of many rows, of a few, one decode
    row) and forget it: every CPU kernel those need is bound now, and any not yet compiled is queued
    for the background compile now, not in the middle of a reply. About three tokens' work at load."""
    from mnngpu.backends.cpu.ops.attention import ROWS_KERNEL_MAX
    from mnngpu.backends.cpu.ops.linear import PREFILL_ROWS

    sizes = (max(PREFILL_ROWS, ROWS_KERNEL_MAX + 1), 2, 1)
    if sum(sizes) > model.config.max_all_tokens:
        return
    if model.runtime.fixed_shape and not model.runtime.placements.fallbacks:
        return   # no CPU kernel runs in a reply: a device backend's forwards would only cost load time
    for size in sizes:
        model.forward([0] * size)
    model.reset()


def print_stats(context, out=None) -> None:
    """llm_demo's closing statistics (to stderr unless told otherwise): the prompt's prefill and the
    reply's decode steps, timed by the engine's context, load excluded."""
    out = out if out is not None else sys.stderr
    prefill_s = context.prefill_us / 1e6
    decode_s = context.decode_us / 1e6
    prefill_speed = context.prompt_len / prefill_s if prefill_s > 0 else 0.0
    decode_speed = context.gen_seq_len / decode_s if decode_s > 0 else 0.0
    print("\n#################################", file=out)
    print(f"prompt tokens num = {context.prompt_len}", file=out)
    print(f"decode tokens num = {context.gen_seq_len}", file=out)
    print(f"prefill time = {prefill_s:.2f} s", file=out)
    print(f"decode time = {decode_s:.2f} s", file=out)
    print(f"prefill speed = {prefill_speed:.2f} tok/s", file=out)
    print(f"decode speed = {decode_speed:.2f} tok/s", file=out)
    print("#################################", file=out)
    if context.gen_seq_len < STEADY_DECODE_TOKENS:
        print(f"(speeds of this one reply, load excluded; {context.gen_seq_len} tokens time too "
              f"little to be steady: `mnngpu bench` measures prefill and decode apart)", file=out)


STEADY_DECODE_TOKENS = 32   # fewer decode steps than this time the clock's and the first steps' noise
