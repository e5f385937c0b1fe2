"""How the server starts and stops: its socket bound before anything else, and two-step shutdown.

The first Ctrl-C (or SIGTERM) stops the model's queue, so replies being streamed end with
their final event, and uvicorn stops accepting and waits for open responses. A second one
ends the process at once (exit 130): the worker thread may be inside a forward that cannot be
cut. A graceful stop exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

import uvicorn

from mnngpu.errors import InputError

FORCED_EXIT = 130  # the exit status after a second Ctrl-C (or SIGTERM)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or one clear error naming them."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise InputError(f"cannot listen on {host}:{port}: {_reason(exc)}", field="--host") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        listener.close()
        raise InputError(f"cannot listen on {host}:{port}: {_reason(exc)}", field="--port") from None
    listener.set_inheritable(True)
    return listener


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, served):
        super().__init__(config)
        self.served = served

    def handle_exit(self, sig: int, frame) -> None:
        name = signal.Signals(sig).name
        if self.should_exit:
            print(f"error: stopped at once ({name} again)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(FORCED_EXIT)
        # should_exit first: a second signal that arrives while this one stops the queue (Python runs
        # it in the middle of the code below) is then the second, not another first
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # a graceful stop is a normal end: uvicorn need not raise it again
        print(f"stopping ({name}): no new requests; replies in progress end now", file=sys.stderr, flush=True)
        self.served.stop()
