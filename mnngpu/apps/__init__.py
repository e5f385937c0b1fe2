"""The applications built on the engine: the `mnngpu` command line and what its commands do.

    cli.py             `mnngpu ...`: the parser, one error line per failure, exit codes
    commands/<name>.py  the flags of `mnngpu <name>` and the call into the app below
    chat.py            multi-turn chat over a model's KV cache (chat, run, server)
    bench.py           llm_bench's runs and table (bench)
    inspect.py         what a model folder holds and where each op runs (inspect);
                       families.py names the supported model families
    diff.py            where two backends part, op by op (diff)
    server/            the OpenAI-compatible HTTP server (serve)

The engine never imports from here.
"""
