"""Signal handlers set for a block and put back after it: SIGTERM taken as Ctrl-C by the CLI, the signals
``autotune run`` passes on to its command, the timer that bounds a wait for the host's trial lock."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


@contextmanager
def handled(handlers: Mapping[int, Callable[[int, Any], None]]) -> Iterator[bool]:
    """``handlers`` (signal number -> handler) for the block, the ones they replaced put back after it (one not set
    from Python as the default); off the main thread, where Python sets none, nothing is set. Yields whether they
    are."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    kept = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield True
    finally:
        for sig, previous in kept.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)


__all__ = ["handled"]
