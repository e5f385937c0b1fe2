"""`mnngpu serve [MODEL]`: an OpenAI-compatible HTTP server (chat completions, completions, models).

It binds 127.0.0.1 unless told otherwise. The model holds `--parallel` slots (4 where the model
and backend batch, else 1), each generating one reply, their decode rows batched in one forward
(continuous batching); the other requests wait in a queue, in arrival order, for the first slot
freed. docs/server.md lists the endpoints and fields. The port is bound before the model loads;
while it loads the server answers GET /health with 503 (and every other request too), and
"serving ..." is printed once it is ready. The first Ctrl-C (or SIGTERM) stops taking requests
and ends the replies being streamed with their final event; a second one exits at once.
"""

from __future__ import annotations

import logging
import sys
import threading

from mnngpu.apps.commands.common import add_model_arguments, load_model
from mnngpu.errors import InputError, MnnGpuError
from mnngpu.model_label import model_label


def _port(text: str) -> int:
    port = _int(text, "--port")
    if not 0 <= port <= 65535:
        raise InputError(f"expected a port number from 0 to 65535, got {port}", field="--port")
    return port


def positive(field: str):
    def parse(text: str) -> int:
        value = _int(text, field)
        if value < 1:
            raise InputError(f"expected a positive integer, got {value}", field=field)
        return value
    return parse


def _int(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"expected an integer, got '{text}'", field=field) from None


def _budget(text: str) -> int:
    value = _int(text, "--reasoning-budget")
    if value < -1:
        raise InputError(f"expected -1 (no bound) or a number of tokens, got {value}", field="--reasoning-budget")
    return value


def register(subparsers) -> None:
    from mnngpu.generation.batch import DEFAULT_SLOTS

    try:
        from mnngpu.apps.server.engine import DEFAULT_MAX_QUEUE
        from mnngpu.apps.server.protocol import DEFAULT_MAX_BODY_BYTES
    except ImportError:   # without mnngpu[serve]: `mnngpu --help` still lists serve; run() says what to install
        DEFAULT_MAX_QUEUE = DEFAULT_MAX_BODY_BYTES = None

    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=8000, help="default: %(default)s; 0 picks a free port")
    parser.add_argument("--model-name", help="the model id clients see (default: the model folder's name)")
    parser.add_argument("--max-body-bytes", type=positive("--max-body-bytes"), default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted (default: %(default)s)")
    parser.add_argument("--max-queue", type=positive("--max-queue"), default=DEFAULT_MAX_QUEUE,
                        help="requests that may wait for a slot (see --parallel) before new ones get 503 "
                             "(default: %(default)s)")
    parser.add_argument("--parallel", "-np", type=positive("--parallel"), default=None,
                        help="slots: requests generated at once, their decode rows batched in one forward "
                             f"(default: {DEFAULT_SLOTS} where the model and backend batch, else 1)")
    parser.add_argument("--reasoning-format", choices=["auto", "none"], default="auto",
                        help="auto: a thinking model's reply comes back as reasoning_content and content; none: "
                             "all of it in content (default: %(default)s)")
    parser.add_argument("--reasoning-budget", type=_budget, default=-1, metavar="N",
                        help="tokens a thinking model may think before the server closes its think block; 0 "
                             "closes it at once, -1 is no bound; a request's thinking_budget_tokens overrides it "
                             "(default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no access or error lines")
    parser.set_defaults(func=run)


def run(args) -> int:
    try:
        import uvicorn

        from mnngpu.apps.server.app import create_app
        from mnngpu.apps.server.engine import ModelSlot
        from mnngpu.apps.server.lifecycle import GracefulServer, bind
    except ImportError as exc:
        raise MnnGpuError(f"the server needs starlette, uvicorn and prometheus_client ({exc.name} is missing), "
                          "and llguidance for structured output (response_format, tool_choice required): "
                          "pip install 'mnngpu[serve]' installs all four", field="serve") from None

    listener = bind(args.host, args.port)
    try:
        slot = ModelSlot()
        configure_logs(args.quiet)
        config = uvicorn.Config(create_app(slot, args.max_body_bytes), log_level="warning", access_log=False,
                                log_config=None)
        server = GracefulServer(config, slot)
        loading = ModelLoad(args, slot, server, listener.getsockname()[:2])
        loading.start()
        server.run(sockets=[listener])
        loading.raise_failure()
        print("stopped", file=sys.stderr)
    finally:
        listener.close()
    return 0


class ModelLoad(threading.Thread):
    """Loads the model while the server already answers (GET /health: 503, then 200); says
    "serving ..." once it is ready, or stops the server if the load fails."""

    def __init__(self, args, slot, server, address: tuple):
        super().__init__(name="mnngpu-load", daemon=True)
        self.args, self.slot, self.server, self.address = args, slot, server, address
        self.failure: BaseException | None = None

    def run(self) -> None:
        from mnngpu import jit
        from mnngpu.apps.server.engine import ServedModel
        from mnngpu.generation.batch import default_slots

        args = self.args
        try:
            model = load_model(args)
            jit.hold_notices(False)   # from now on a notice is a line of the server's log as it happens
            base_dir = model.config.base_dir
            served = ServedModel(model, args.model_name or model_label(base_dir), args.max_queue,
                                 created=int(base_dir.stat().st_mtime), show_special=args.show_special,
                                 parallel=args.parallel or default_slots(model),
                                 reasoning_format=args.reasoning_format, reasoning_budget=args.reasoning_budget)
        except BaseException as exc:  # noqa: BLE001 (raised again on the main thread, once the server stopped)
            self.failure = exc
            self.server.should_exit = True
            return
        self.slot.ready(served)
        host, port = self.address
        slots = f"{served.parallel} slot{'s' if served.parallel > 1 else ''}"
        print(f"serving {served.name} on http://{url_host(host)}:{port}/v1 with {slots} (Ctrl-C to stop)",
              file=sys.stderr, flush=True)

    def raise_failure(self) -> None:
        """The load's error, if it failed, raised on the calling thread."""
        if self.failure is not None:
            raise self.failure


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def configure_logs(quiet: bool) -> None:
    from uvicorn.logging import DefaultFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=None))
    for name in ("mnngpu.access", "mnngpu.server"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(logging.CRITICAL + 1 if quiet else logging.INFO)
        log.propagate = False
