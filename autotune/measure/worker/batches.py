"""An arm's batches: its DataLoader epoch after epoch, and the worker processes serving them, which the arm stops
while it is idle (``autotune.measure.worker.arms``)."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ...trial.training import raise_if_a_worker_died


def signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Batches:
    """Endless batches of a DataLoader, epoch after epoch, with the pids of the workers serving them
    (as ``autotune.trial.training.batches``, which hides its iterator in a generator)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None
        self.wait_s = 0.0  # time spent in ``next``: loading the batch in this process, or waiting for a worker's

    def next(self) -> Any:
        start = time.perf_counter()
        try:
            return self._next()
        finally:
            self.wait_s += time.perf_counter() - start

    def _next(self) -> Any:
        while True:
            if self.iterator is None:
                self.iterator = iter(self.loader)
            try:
                return next(self.iterator)
            except StopIteration:
                self.iterator = None  # its workers shut down at the end of the epoch (unless persistent)
            except Exception as error:
                if self.loader.num_workers > 0:
                    raise_if_a_worker_died(error)
                raise

    def worker_pids(self) -> tuple[int, ...]:
        return tuple(w.pid for w in getattr(self.iterator, "_workers", ()) if w.pid is not None)

    def close(self) -> None:
        pids = self.worker_pids()
        signal_all(pids, signal.SIGCONT)  # a stopped worker could not exit
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.iterator = None
