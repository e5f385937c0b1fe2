"""`mnngpu serve [MODEL]`: an OpenAI-compatible HTTP server (chat completions, completions, models).

It binds 127.0.0.1 unless told otherwise, answers one request at a time in arrival order and
queues the rest. docs/server.md lists the endpoints and fields.
"""

from __future__ import annotations

import sys

from mnngpu.commands.common import add_model_arguments, load_model
from mnngpu.errors import MnnGpuError


def register(subparsers) -> None:
    from mnngpu.server.engine import DEFAULT_MAX_QUEUE
    from mnngpu.server.protocol import DEFAULT_MAX_BODY_BYTES

    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", help="the model id clients see (default: the model folder's name)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted (default: %(default)s)")
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                        help="requests that may wait for the model before new ones get 503 (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args) -> int:
    try:
        import uvicorn

        from mnngpu.server.app import create_app
        from mnngpu.server.engine import ServedModel
    except ImportError as exc:
        raise MnnGpuError(f"the server needs starlette and uvicorn ({exc.name} is missing): "
                          "pip install 'mnngpu[serve]'", field="serve") from None
    model = load_model(args)
    served = ServedModel(model, args.model_name or model.config.base_dir.name, args.max_queue)
    app = create_app(served, args.max_body_bytes)
    print(f"serving {served.name} on http://{args.host}:{args.port}/v1 (Ctrl-C to stop)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
