"""`mnngpu serve [MODEL ...] [--models-dir DIR]`: an OpenAI-compatible HTTP server (chat completions,
completions, models).

It binds 127.0.0.1 unless told otherwise. The model holds `--parallel` slots (4 where the model
and backend batch, else 1), each generating one reply, their decode rows batched in one forward
(continuous batching); the other requests wait in a queue, in arrival order, for the first slot
freed. docs/server.md lists the endpoints and fields. The port is bound before the model loads;
while it loads the server answers GET /health with 503 (and every other request too), and
"serving ..." is printed once it is ready. The first Ctrl-C (or SIGTERM) stops taking requests
and ends the replies being streamed with their final event; a second one exits at once.

Several models (the MODEL arguments, then each subfolder of --models-dir holding a config.json)
are served by one server: a request's `model` picks one by its id (the folder's label, or the Hub
repo id), the first loads at start and the others on first use, and --models-max caps how many
stay loaded (apps/server/models.py). Every model gets the same flags.
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
from pathlib import Path

from mnngpu.apps.commands.common import add_model_arguments, load_model, model_path, overrides_from
from mnngpu.errors import InputError, MnnGpuError
from mnngpu.model_label import model_label


def _port(text: str) -> int:
    port = _int(text, "--port")
    if not 0 <= port <= 65535:
        raise InputError(f"expected a port number from 0 to 65535, got {port}", field="--port")
    return port


def at_least(low: int, field: str, expected: str):
    """An argparse type: an integer of at least `low`, else one error naming `field` and `expected`."""
    def parse(text: str) -> int:
        value = _int(text, field)
        if value < low:
            raise InputError(f"expected {expected}, got {value}", field=field)
        return value
    return parse


def positive(field: str):
    return at_least(1, field, "a positive integer")


def _int(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"expected an integer, got '{text}'", field=field) from None


def register(subparsers) -> None:
    from mnngpu.generation.batch import DEFAULT_SLOTS

    try:
        from mnngpu.apps.server.engine import DEFAULT_MAX_QUEUE
        from mnngpu.apps.server.protocol import DEFAULT_MAX_BODY_BYTES
    except ImportError:   # without mnngpu[serve]: `mnngpu --help` still lists serve; run() says what to install
        DEFAULT_MAX_QUEUE = DEFAULT_MAX_BODY_BYTES = None

    parser = subparsers.add_parser("serve", help="serve a model (or several) over an OpenAI-compatible HTTP API")
    add_model_arguments(parser)
    parser.add_argument("more_models", nargs="*", metavar="MODEL",
                        help="more models to serve, each as MODEL is given; a request's `model` picks one")
    parser.add_argument("--models-dir", metavar="DIR",
                        help="serve every subfolder of DIR that holds a config.json (after the MODEL arguments)")
    parser.add_argument("--models-max", type=positive("--models-max"), metavar="N",
                        help="models loaded at once, at most: loading another unloads the least recently used "
                             "idle one (default: no bound)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=8000, help="default: %(default)s; 0 picks a free port")
    parser.add_argument("--model-name", help="the model id clients see, when one model is served (default: the "
                                             "model folder's name)")
    parser.add_argument("--max-body-bytes", type=positive("--max-body-bytes"), default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted (default: %(default)s)")
    parser.add_argument("--max-queue", type=positive("--max-queue"), default=DEFAULT_MAX_QUEUE,
                        help="requests that may wait for a slot (see --parallel) before new ones get 503 "
                             "(default: %(default)s)")
    parser.add_argument("--parallel", "-np", type=positive("--parallel"), default=None,
                        help="slots: requests generated at once, their decode rows batched in one forward "
                             f"(default: {DEFAULT_SLOTS} where the model and backend batch, else 1)")
    parser.add_argument("--cache-ram", type=at_least(0, "--cache-ram", "an integer >= 0"), default=None, metavar="MIB",
                        help="MiB of host memory for the prompt cache every request and slot shares (the "
                             "cache_ram config key; 0: off, the default)")
    parser.add_argument("--reasoning-format", choices=["auto", "none"], default="auto",
                        help="auto: a thinking model's reply comes back as reasoning_content and content; none: "
                             "all of it in content (default: %(default)s)")
    parser.add_argument("--reasoning-budget", default=-1, metavar="N",
                        type=at_least(-1, "--reasoning-budget", "-1 (no bound) or a number of tokens"),
                        help="tokens a thinking model may think before the server closes its think block; 0 "
                             "closes it at once, -1 is no bound; a request's thinking_budget_tokens overrides it "
                             "(default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no access or error lines")
    parser.set_defaults(func=run)


def run(args) -> int:
    try:
        import uvicorn

        from mnngpu.apps.server.app import create_app
        from mnngpu.apps.server.lifecycle import GracefulServer, bind
    except ImportError as exc:
        raise MnnGpuError(f"the server needs starlette, uvicorn and prometheus_client ({exc.name} is missing), "
                          "and llguidance for structured output (response_format, tool_choice required): "
                          "pip install 'mnngpu[serve]' installs all four", field="serve") from None

    models = served_models(args)
    listener = bind(args.host, args.port)
    try:
        configure_logs(args.quiet)
        config = uvicorn.Config(create_app(models, args.max_body_bytes), log_level="warning", access_log=False,
                                log_config=None)
        server = GracefulServer(config, models)
        loading = ModelLoad(models, server, listener.getsockname()[:2])
        loading.start()
        server.run(sockets=[listener])
        loading.raise_failure()
        print("stopped", file=sys.stderr)
    finally:
        listener.close()
    return 0


def served_models(args):
    """The models the arguments name (the bundled demo without any), each loaded when first used."""
    from mnngpu.apps.server.models import ModelEntry, ServedModels

    texts = [*([args.model] if args.model else []), *args.more_models, *_models_dir(args.models_dir)]
    if len(texts) > 1 and args.model_name:
        raise InputError(f"names the model when one is served, not {len(texts)}: each model's id is its folder's "
                         "name (or its Hub repo id)", field="--model-name")
    entries, seen = [], {}
    for text in texts or [None]:
        name = args.model_name or model_id(text)
        if name in seen:
            raise InputError(f"'{seen[name]}' and '{text}' are both named '{name}'; serve one of them",
                             field="model")
        seen[name] = text
        entries.append(ModelEntry(name, served_loader(args, text, name), created=_created(text)))
    return ServedModels(entries, max_loaded=args.models_max)


def _models_dir(folder: str | None) -> list[str]:
    if folder is None:
        return []
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise InputError(f"'{folder}' is not a folder", field="--models-dir")
    found = sorted(str(sub) for sub in root.iterdir() if (sub / "config.json").is_file())
    if not found:
        raise InputError(f"no subfolder of '{folder}' holds a config.json", field="--models-dir")
    return found


def model_id(text: str | None) -> str:
    """The id clients use for the model `text` names: its folder's label, or its Hub repo id."""
    from mnngpu import hub

    if text is None:
        from mnngpu.demo import demo_model_dir

        return model_label(demo_model_dir())
    path = Path(text).expanduser()
    if path.exists():
        return model_label(path.parent if path.is_file() else path)
    name = hub.parse_model_name(text)
    return name.repo_id if name is not None else text


def _created(text: str | None) -> int:
    path = Path(text).expanduser() if text else None
    return int(path.stat().st_mtime) if path is not None and path.exists() else 0


def served_loader(args, text: str | None, name: str):
    """What loads the model `text` names as a ServedModel called `name`, with the command's settings."""

    def load():
        from mnngpu import jit
        from mnngpu.apps.server.embeddings import served_if_embedding
        from mnngpu.apps.server.engine import ServedModel
        from mnngpu.generation.batch import default_slots

        own = copy.copy(args)
        own.model, own.model_name = text, name
        embedding = served_if_embedding(model_path(own), name, overrides_from(own))
        if embedding is not None:   # served on /v1/embeddings (an LLM's routes refuse it by its kind)
            jit.hold_notices(False)
            return embedding
        model = load_model(own)
        if args.cache_ram is not None:
            model.set_config({"cache_ram": args.cache_ram})
        jit.hold_notices(False)   # from now on a notice is a line of the server's log as it happens
        return ServedModel(model, name, args.max_queue, created=int(model.config.base_dir.stat().st_mtime),
                           show_special=args.show_special, parallel=args.parallel or default_slots(model),
                           reasoning_format=args.reasoning_format, reasoning_budget=args.reasoning_budget)

    return load


class ModelLoad(threading.Thread):
    """Loads the first model while the server already answers (GET /health: 503, then 200); says
    "serving ..." once it is ready, or stops the server if the load fails."""

    def __init__(self, models, server, address: tuple):
        super().__init__(name="mnngpu-load", daemon=True)
        self.models, self.server, self.address = models, server, address
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.models.load_first()
        except BaseException as exc:  # noqa: BLE001 (raised again on the main thread, once the server stopped)
            self.failure = exc
            self.server.should_exit = True
            return
        served = self.models.first.served
        host, port = self.address
        slots = f"{served.parallel} slot{'s' if served.parallel > 1 else ''}"
        others = (f"; {', '.join(self.models.names()[1:])} load on first use" if self.models.several else "")
        print(f"serving {served.name} on http://{url_host(host)}:{port}/v1 with {slots}{others} (Ctrl-C to stop)",
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
