"""``autotune dashboard``: optuna-dashboard on this machine's loopback for the storage in use.

optuna-dashboard is an extra (``pip install 'autotune[dashboard]'``). It listens on 127.0.0.1 only: the
storage's trials name this machine's hardware and the user's workload, and the dashboard has no login.
Reach it from elsewhere through an SSH tunnel (``ssh -L 8080:127.0.0.1:8080 HOST``).
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ._common import add_storage, shown_url

HOST = "127.0.0.1"
INSTALL = "pip install 'autotune[dashboard]'"
SHUTDOWN_S = 2.0  # the most a stop waits for the request being served


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dashboard", help="start optuna-dashboard on 127.0.0.1 for the storage (needs autotune[dashboard])",
        description=f"Serve optuna-dashboard for the studies of the storage on http://{HOST}:PORT/ until Ctrl-C "
        f"(loopback only: use an SSH tunnel from another machine). Needs the extra: {INSTALL}.",
    )
    p.add_argument("--study", default=None, metavar="NAME", help="print the address of this study's page")
    p.add_argument("--port", type=int, default=8080, help="the port on 127.0.0.1, 1 to 65535 (default: 8080)")
    add_storage(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..study.summaries import open_storage, summaries

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: use a port from 1 to 65535")
    try:
        import optuna_dashboard
    except ModuleNotFoundError as e:
        raise UsageError(f"optuna-dashboard is not installed: {INSTALL}") from e
    storage = open_storage(args.storage)
    if storage is None:
        raise UsageError(f"no study in {shown_url(args.storage)}: run 'autotune search' first")
    address = f"http://{HOST}:{args.port}/dashboard/"
    if args.study is not None:
        try:
            address += f"studies/{storage.get_study_id_from_name(args.study)}"
        except KeyError:
            names = ", ".join(s.name for s in summaries(args.storage))
            raise UsageError(f"no study {args.study!r} in {shown_url(args.storage)}; its studies: {names}") from None
    try:
        server = make_server(HOST, args.port, optuna_dashboard.wsgi(storage), handler_class=_QuietHandler)
    except OSError as e:  # the port is taken, or not ours to bind
        raise UsageError(f"cannot listen on {HOST}:{args.port}: {e.strerror}; pick another --port") from e
    print(f"optuna-dashboard on {address} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    _serve_until_interrupted(server)
    print("optuna-dashboard stopped", file=sys.stderr)
    return 0


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """No line per request: the terminal shows the address and the stop, as ``autotune search`` does."""


def _serve_until_interrupted(server: WSGIServer) -> None:
    """Serve in a thread until SIGINT or SIGTERM. Raised in the serving thread, Ctrl-C can land inside a request,
    and wsgiref's handler catches it as a failed request and serves on."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    try:
        while not stop.wait(0.5) and serving.is_alive():
            pass
    finally:
        # A request still being sent to a reader that does not read would hold serve_forever's loop: bounded.
        closing = threading.Thread(target=server.shutdown, daemon=True)
        closing.start()
        closing.join(SHUTDOWN_S)
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
