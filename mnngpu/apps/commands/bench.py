"""`mnngpu bench -m MODEL_DIR[,...] -a cpu,opencl -t 2 -c low -p 512 -n 128 -pg 512,128 -rep 3`.

llm_bench's flags and markdown table (mnngpu/apps/bench.py); comma-separated values make one row
per combination. Each row is printed as soon as it is measured, the header with the first.
"""

from __future__ import annotations

import os
import sys

from mnngpu.apps import bench
from mnngpu.apps.commands.common import add_speculative_argument, resolve_model


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="llm_bench: prefill and decode speed", allow_abbrev=False,
                                   description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", type=_list, default=[],
                        help="model folder(s), config.json or Hub repo ids ORG/NAME[@REVISION], comma-separated "
                             "(default: the bundled demo model)")
    parser.add_argument("-a", "--backends", type=_list, default=["cpu"], help="cpu, opencl, vulkan, cuda")
    cores = _cores()
    parser.add_argument("-t", "--threads", type=_ints, default=[cores],
                        help=f"thread counts (default: the {cores} cores this process may use)")
    parser.add_argument("-c", "--precision", type=_list, default=["2"],
                        help="low|normal|high, or llm_bench's 0 (normal), 1 (high), 2 (low); default 2")
    parser.add_argument("--memory", default="low", choices=["low", "normal", "high"], help="default low")
    parser.add_argument("-p", "--n-prompt", type=_ints, default=[512], help="prefill-only tests (default 512)")
    parser.add_argument("-n", "--n-gen", type=_ints, default=[128], help="decode-only tests (default 128)")
    parser.add_argument("-pg", action="append", default=[], metavar="PROMPT,GEN",
                        help="prefill PROMPT tokens, then decode GEN from that KV cache (repeatable)")
    parser.add_argument("-rep", "--n-repeat", type=int, default=5, help="measured repeats (default 5)")
    parser.add_argument("-load", "--loading-time", choices=["true", "false"], default="false",
                        help="also load each model 3 times and report the load time")
    add_speculative_argument(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    models = [resolve_model(m)[0] for group in args.model for m in group]   # a folder, or a Hub repo id
    if not models:
        from mnngpu.demo import demo_model_dir

        models = [demo_model_dir()]
    precisions = [bench.parse_precision(p) for p in args.precision]
    runtimes = bench.runtime_cases(models, args.backends, precisions, args.memory, args.threads,
                                   args.speculative or "")
    tests = bench.test_cases(args.n_prompt, args.n_gen, bench.parse_pairs(args.pg))
    loading = args.loading_time == "true"
    table = bench.MarkdownTable(tests, loading, speculative=bool(args.speculative))
    header = [table.header()]  # printed with the first row, after any load warnings

    def print_row(result) -> None:
        if header:
            print(header.pop(), flush=True)
        print(table.row(result), flush=True)

    bench.run(runtimes, tests, max(1, args.n_repeat), loading, on_result=print_row)
    print(file=sys.stdout)
    return 0
