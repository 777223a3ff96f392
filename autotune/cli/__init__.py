"""The ``autotune`` command: one module per verb, each with ``register(subparsers)``.

Usage errors become one line plus the verb's usage; ``--debug`` shows the traceback.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any, NoReturn

from ..database import default_storage, hide_secrets, secrets_of, shown_url
from ..errors import AutotuneError, Terminated, one_line
from ..statement_limit import lost
from ..trial.signals import handled
from ._common import printable

VERBS = ("probe", "search", "studies", "recipes", "best", "diff", "report", "export", "run", "dashboard", "completion")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "expected one argument" says how to give a value that starts with a dash:
    ``--budget -5m`` reads ``-5m`` as an option (only plain negative numbers are values), and rewriting the
    command line instead could change the command of ``autotune run`` given without ``--``. The verbs' parsers
    are of this class too (``add_subparsers`` makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument ") and message.endswith(": expected one argument"):
            option = message.removeprefix("argument ").split(":")[0].split("/")[-1]
            message += f" (if its value starts with '-', write {option}=VALUE)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = Parser(
        prog="autotune",
        description="Hardware-aware auto-tuner for PyTorch training: probe the machine, search the knobs "
        "that matter on it with real short training runs, export and apply the best recipe.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"autotune {version()}",
                        help="print autotune's version and exit")
    parser.set_defaults(root_parser=parser)  # for ``autotune completion``, which describes the whole command
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        importlib.import_module(f".{verb}", __name__).register(sub)
    return parser


def version() -> str:
    """The installed distribution's version (``pyproject.toml``'s, as pip recorded it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("autotune")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


def entry() -> None:
    """The ``autotune`` console script and ``python -m autotune``: ``main``, then the process ends without the
    interpreter's teardown once its output is flushed (``exit_now``: with torch loaded that teardown is slow)."""
    code = main()
    logging.shutdown()
    from ..trial.launch import exit_now

    exit_now(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_Printable("autotune: %(levelname)s: %(message)s"))  # a log line may quote stored text
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, handlers=[handler])
    storage = getattr(args, "storage", None)
    if storage and _storage_given(argv) and secrets_of(storage):
        print(f"autotune {args.verb}: warning: the password in --storage is visible to every user of this machine "
              "(the process list shows command lines): give the URL in AUTOTUNE_STORAGE, or the password in "
              "~/.pgpass (or PGPASSWORD)", file=sys.stderr)
    with handled({signal.SIGTERM: _terminated}):
        return _verb(args, storage)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM (``timeout``, a batch scheduler, ``docker stop``) ends a verb as Ctrl-C does: its trial recorded, its
    processes stopped, one line; Python's default would end it at once, leaving the trial running in the study."""
    raise Terminated


def _verb(args: argparse.Namespace, storage: str | None) -> int:
    """The verb's exit status: an error, a closed pipe, an interrupt or a bug each on one line."""
    try:
        return int(args.func(args) or 0)
    except AutotuneError as e:
        if args.debug:
            raise
        # one line, even when a driver's message spans several (psycopg's "Is the server running..."); no secret of
        # the storage URL, no control character of a stored or read text
        said = printable(hide_secrets(one_line(str(e)), storage or ""))
        print(f"autotune {args.verb}: error: {said}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `autotune recipes | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so Python's flush at exit is quiet
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended
    except KeyboardInterrupt as e:
        print(f"autotune {args.verb}: interrupted; everything recorded so far is kept", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130  # 128 + the signal, as a shell reports it
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback with --debug
        if args.debug:
            raise
        gone = lost(e, shown_url(storage or default_storage()))
        if gone is not None:  # the database stopped answering or went away midway: no bug of ours
            print(f"autotune {args.verb}: error: {printable(hide_secrets(str(gone), storage or ''))}", file=sys.stderr)
            return 2
        said = printable(hide_secrets(str(e), storage or ""))
        print(f"autotune {args.verb}: internal error: {type(e).__name__}: {said} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


class _Printable(logging.Formatter):
    """Log lines without control characters (``printable``): a warning may name a study or a workload of a store."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def _storage_given(argv: list[str]) -> bool:
    """``--storage`` is on the command line (not from ``AUTOTUNE_STORAGE``), before any ``--`` of a command."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return any(w == "--storage" or w.startswith("--storage=") for w in words)
