"""N replicas of `mnngpu serve` behind one OpenAI-compatible endpoint, on Ray Serve (needs
`pip install 'mnngpu[ray]'`).

    python -m mnngpu.apps.server.ray_serve [MODEL] --replicas 2 [--port 8000] [serve's flags...]

Each replica is a Ray actor that loads the model itself and runs the same Starlette app as
`mnngpu serve` (app.py), with its own engine and queue; Ray Serve's HTTP proxy on every node of the
cluster forwards each request to one of them, streaming included. Its router samples two replicas
and sends the request to the one with fewer requests in flight; a replica takes at most
`--max-ongoing-requests` at once (default: its slots plus one, so the next request already waits
inside it when a reply ends, and every other waits at the router for whichever replica frees
first; without `--parallel`, the slots are taken to be the server's default for a model that
batches). Beyond `--max-queue` per replica waiting at the router, a request gets 503.

Without `--address` it joins the Ray cluster this machine runs (`ray start --head`, or
`ray start --address=HEAD:6379` on another node), or starts a local one for itself. On a cluster
the model folder must be at the same path on every node. Every reply carries an
`x-mnngpu-replica` header naming the replica that wrote it. Ctrl-C stops the replicas and, if this
command started the cluster, the cluster.

It serves one model: several MODEL arguments or --models-dir are refused (run one application per
model, each on its own port, as docs/server.md says).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from mnngpu.apps.commands import serve as serve_command
from mnngpu.apps.commands.common import model_path
from mnngpu.errors import InputError, MnnGpuError

APP_NAME = "mnngpu"
REPLICA_HEADER = b"x-mnngpu-replica"


class ReplicaHeader:
    """ASGI middleware: names the replica in every HTTP response's headers."""

    def __init__(self, app, replica: str):
        self.app = app
        self.replica = replica.encode("latin-1")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, self.replica)]}
            await send(message)

        await self.app(scope, receive, send_named)


class _NoServer:
    """What ModelLoad stops when a load fails; here the failure is raised instead."""

    should_exit = False


def replica_app(args: argparse.Namespace, address: tuple[str, int], replica: str):
    """The app of `mnngpu serve` over the model `args` name, loaded the way `mnngpu serve` loads it."""
    from mnngpu.apps.server.app import create_app

    serve_command.configure_logs(args.quiet)
    models = serve_command.served_models(args)
    loading = serve_command.ModelLoad(models, _NoServer(), address)
    loading.run()   # here, not in a thread: Ray counts the replica as started once its app exists
    loading.raise_failure()
    return ReplicaHeader(create_app(models, args.max_body_bytes), replica)


def deployment(args: argparse.Namespace):
    """The Ray Serve application: `args.replicas` copies of the model behind one route."""
    from ray import serve

    from mnngpu.generation.batch import DEFAULT_SLOTS

    address = (args.host, args.port)
    slots = args.parallel or DEFAULT_SLOTS   # a model that cannot batch has 1 slot; it learns that as it loads

    @serve.deployment(
        name="mnngpu-model",
        num_replicas=args.replicas,
        max_ongoing_requests=args.max_ongoing_requests or slots + 1,
        max_queued_requests=args.max_queue * args.replicas,
        ray_actor_options={"num_cpus": args.cpus_per_replica},
        max_constructor_retry_count=1,   # a model that fails to load fails the same way again
    )
    @serve.ingress()
    class MnnGpuReplica:
        def __init__(self, args: argparse.Namespace):
            self.args = args

        def __serve_build_asgi_app__(self):
            return replica_app(self.args, address, serve.get_replica_context().replica_tag)

    return MnnGpuReplica.bind(args)


def start(args: argparse.Namespace) -> str:
    """Starts Ray Serve's proxy and the replicas on the connected cluster; the endpoint's URL."""
    from ray import serve

    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(deployment(args), name=APP_NAME, route_prefix="/")
    return f"http://{serve_command.url_host(args.host)}:{args.port}/v1"


def connect(address: str | None) -> None:
    import ray

    if address == "local":  # a cluster of this process's own, whatever else runs on the machine
        ray.init(address="local", include_dashboard=False)
    else:
        ray.init(address=address)


def build_parser() -> argparse.ArgumentParser:
    from mnngpu.apps.cli import ArgumentParser

    parser = ArgumentParser(prog="python -m mnngpu.apps.server.ray_serve",
                            description="Serve a model from N Ray Serve replicas behind one OpenAI endpoint.")
    serve_command.register(_OneCommand(parser))   # every flag of `mnngpu serve`, as it parses them
    parser.add_argument("--replicas", type=serve_command.positive("--replicas"), default=2,
                        help="copies of the model, each with its own engine (default: %(default)s)")
    parser.add_argument("--cpus-per-replica", type=_cpus, default=1.0,
                        help="Ray CPUs each replica reserves; set it to the replica's --threads so Ray places "
                             "no more replicas on a node than it has cores (default: %(default)s)")
    parser.add_argument("--max-ongoing-requests", type=serve_command.positive("--max-ongoing-requests"),
                        help="requests a replica takes at once (default: its slots, --parallel or the default for "
                             "a model that batches, plus one)")
    parser.add_argument("--address", help="the Ray cluster to join: HOST:PORT of its head, 'auto' (the one this "
                                          "machine runs), or 'local' (a new one for this command only); default: "
                                          "the running one, else a new one")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


class _OneCommand:
    """Stands in for argparse's subparsers, so that `serve.register` adds its flags to one parser."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.parser


def _cpus(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"expected a number, got '{text}'", field="--cpus-per-replica") from None
    if not value > 0:
        raise InputError(f"expected a number above 0, got {value}", field="--cpus-per-replica")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise MnnGpuError("Ray Serve is not installed: pip install 'mnngpu[ray]'", field="ray") from None
    if args.port == 0:
        raise InputError("Ray Serve's proxy needs a fixed port, not 0", field="--port")
    if args.more_models or args.models_dir:
        raise InputError("serves one model on Ray Serve; for several, run one application per model (each with "
                         "its own --port), or `mnngpu serve` with them all", field="model")
    if args.model is not None:  # every replica, on any node, reads the folder at this path
        args.model = str(model_path(args).resolve())
    check_settings(args)
    connect(args.address)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        url = start(args)
        print(f"serving {args.replicas} replicas on {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopping the replicas", file=sys.stderr, flush=True)
    except RuntimeError as exc:   # Ray Serve's word for a replica that failed to start; its log has the error
        raise MnnGpuError(f"the replicas did not start: {exc} (each replica's error is in the log above)",
                          field="--replicas") from None
    finally:
        serve.delete(APP_NAME)   # this application only: a cluster's other applications keep running
        ray.shutdown()           # and a cluster this command started stops with it
    print("stopped", file=sys.stderr)
    return 0


def check_settings(args: argparse.Namespace) -> None:
    """The model's config and the flags' settings, checked here before any replica loads them."""
    from mnngpu import llm as mnngpu_llm
    from mnngpu.apps.commands.common import flag_overrides, model_path

    model = mnngpu_llm.create(model_path(args))
    for source, values in flag_overrides(args).items():
        model.config.set_config(values, source=source)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(build_parser().parse_args(argv))
    except MnnGpuError as exc:
        if "--debug" in argv:
            raise
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
