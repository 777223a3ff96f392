"""``PairedWorker``: the parent's side of a paired worker process (``autotune.measure.worker``), which starts it,
sends it commands and reads its replies, freezes it while it is idle, and stops its whole process tree when it
does not answer in time.

Example::

    >>> with PairedWorker("cnn", params, facts, TrialSettings()) as worker:        # doctest: +SKIP
    ...     cal = worker.calibrate("defaults", params)
    ...     worker.add_arm("cl", {**params, "channels_last": True})
    ...     run = worker.run_pairs("defaults", "cl", cal.pairs, cal.window_s, seed=1)
    ...     stats.compare(run.pairs, run.base, run.cand, train_steps=5000, margin=cal.margin).verdict
    'faster'
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from ...errors import TrialError
from ...trial import launch
from ...trial.runner import loss_samples, trial_directory, trial_plan
from .. import freeze, stats
from ..protocol import (
    AddArm,
    ArmAdded,
    ArmStatus,
    CacheEmptied,
    Command,
    DropArm,
    Dropped,
    EmptyCache,
    Evaluate,
    Evaluated,
    HeapKept,
    KeepHeap,
    PairsRun,
    Profile,
    Profiled,
    Quit,
    Ready,
    Refused,
    Reply,
    RunPairs,
    RunWindows,
    WindowsRun,
    WorkerSpec,
    decode,
    encode,
)
from ..worker.arms import choose_window_s


class WorkerError(TrialError):
    """The paired worker died, did not answer in time, or refused a command."""


# The worker's side -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """This machine's in-process noise, from an A/A comparison of identical arms, and what it implies."""

    window_s: float  # long enough to be timed well (``paired.choose_window_s``)
    pairs: int  # pairs for an interval of about ``±half_width``
    half_width: float
    margin: float  # the verdicts' margin (``stats.margin_from_calibration``)
    spread: float  # max - min of the A/A per-pair ratios
    aa: stats.Comparison
    step_s: float
    s_per_sample: float | None = None  # the defaults' seconds per sample over the A/A's windows (the hopeless rule's)


def calibrated(cal: Calibration | None) -> Calibration:
    """``cal``; before the calibration (None), the error of a measurer asked to measure."""
    if cal is None:
        raise WorkerError("calibrate() first: the search starts with the defaults against themselves")
    return cal


class PairedWorker(freeze.Freezable):
    """A paired worker process and the commands it takes. Use as a context manager: leaving it quits the
    worker (or stops its whole process tree). Every command waits for its reply at most ``timeout_s``;
    on a timeout or Ctrl-C the worker's tree is stopped and ``WorkerError`` (or KeyboardInterrupt) raised."""

    def __init__(self, workload: str, params: dict[str, Any], facts: Any, settings: Any, *,
                 python: str = sys.executable, keep_heap: bool = True) -> None:
        self.spec = WorkerSpec(workload=workload, params=params, facts=facts.to_dict(),
                               loss_samples=loss_samples(settings, params, facts), warmup_steps=settings.warmup_steps,
                               eval_samples=settings.eval_samples, train_steps=settings.train_steps, seed=settings.seed,
                               keep_heap=keep_heap)
        self.facts, self.python = facts, python
        self.proc: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        self._buffer = b""
        self.ready: Ready | None = None
        self.arms: list[str] = []  # the worker's arms, as its replies said
        self.heap_fixed = False  # its heap thresholds fixed after its start (``fix_heap``)
        self.frozen: freeze.Frozen | None = None  # while its tree is stopped (``freeze()``)
        self._quitting = False  # Quit sent, its reply not yet read (``ask_to_quit``)

    def __enter__(self) -> PairedWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout_s: float = 120.0) -> Ready:
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the worker's process and return at once: several workers can import torch side by side
        (``wait_ready`` then waits for each)."""
        work = self.work = self._stack.enter_context(trial_directory())
        (work / "spec.json").write_text(json.dumps(asdict(self.spec)))
        plan = trial_plan([self.python, "-m", "autotune.measure.worker", str(work / "spec.json")], self.spec.params,
                          self.facts, work)
        log = self._stack.enter_context(open(work / "stderr.log", "wb"))
        self.proc = launch.start(plan, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)

    def wait_ready(self, timeout_s: float = 120.0) -> Ready:
        """Wait for the launched worker to say it is ready (it then waits for commands, using no CPU)."""
        reply = self._receive(timeout_s, "start")
        if not isinstance(reply, Ready):
            self._stop()
            raise WorkerError(f"the paired worker did not start: {getattr(reply, 'error', reply)}")
        self.ready = reply
        return reply

    def request(self, command: Command, timeout_s: float) -> Reply:
        """Send one command and wait for its reply."""
        if self.proc is None or self.proc.stdin is None:
            raise WorkerError("the paired worker is not running: start() it first")
        if self.frozen is not None:
            raise WorkerError("the paired worker is frozen: thaw() it first")
        try:
            self.proc.stdin.write((encode(command) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            self._stop()
            raise WorkerError(f"the paired worker is gone: {self.log_tail()}") from e
        return self._receive(timeout_s, type(command).__name__)

    def _expect(self, command: Command, kind: type[Any], timeout_s: float) -> Any:
        reply = self.request(command, timeout_s)
        if isinstance(reply, Refused):
            raise WorkerError(f"the paired worker refused {reply.command}: {reply.error}")
        if not isinstance(reply, kind):
            raise WorkerError(f"the paired worker answered {type(command).__name__} with {type(reply).__name__}")
        return reply

    def add_arm(self, arm: str, params: dict[str, Any], timeout_s: float = 300.0, *, seed: int | None = None,
                wide: bool = False, give_up: float | None = None, against: str | None = None,
                reference_s: float | None = None) -> ArmStatus:
        """Build and warm up an arm (``protocol.AddArm``); its status says whether it failed (``state``)."""
        reply: ArmAdded = self._expect(AddArm(arm, params, seed, wide, give_up, against, reference_s), ArmAdded,
                                       timeout_s)
        return reply.status

    def run_pairs(self, base: str, cand: str, n: int, window_s: float, seed: int = 0,
                  timeout_s: float | None = None) -> PairsRun:
        timeout = timeout_s if timeout_s is not None else 120.0 + 4 * n * window_s
        result: PairsRun = self._expect(RunPairs(base, cand, n, window_s, seed), PairsRun, timeout)
        return result

    def run_windows(self, arm: str, n: int, window_s: float, timeout_s: float | None = None) -> WindowsRun:
        timeout = timeout_s if timeout_s is not None else 120.0 + 2 * n * window_s
        result: WindowsRun = self._expect(RunWindows(arm, n, window_s), WindowsRun, timeout)
        return result

    def evaluate(self, arm: str, timeout_s: float = 300.0) -> ArmStatus:
        reply: Evaluated = self._expect(Evaluate(arm), Evaluated, timeout_s)
        return reply.status

    def profile(self, arm: str, seconds: float, step_s: float = 0.0) -> Profiled:
        """Its top operators over ``seconds`` of training under torch's profiler (``protocol.Profile``); a
        profile runs at least one step, of ``step_s`` where known, and its trace is summed after it."""
        reply: Profiled = self._expect(Profile(arm, seconds), Profiled, 60.0 + 4 * (seconds + step_s))
        return reply

    def drop_arm(self, arm: str, timeout_s: float = 60.0) -> None:
        self._expect(DropArm(arm), Dropped, timeout_s)

    def empty_cache(self, timeout_s: float = 30.0) -> int:
        """Have the worker return its allocator's unused CUDA memory to the device (``worker.process.empty_cache``)."""
        reply: CacheEmptied = self._expect(EmptyCache(), CacheEmptied, timeout_s)
        return reply.released

    def fix_heap(self, timeout_s: float = 30.0) -> bool:
        """Fix the worker's heap thresholds from now on (``keep_heap``), as a worker started with ``keep_heap``
        has them from its start: a process pair's worker that goes on to host in-process arms. Its arm built
        before measures as one built after, so the worker need not be started again."""
        reply: HeapKept = self._expect(KeepHeap(), HeapKept, timeout_s)
        self.heap_fixed = reply.kept
        return reply.kept

    def calibrate(self, base: str, params: dict[str, Any], *, pairs: int = 16, half_width: float = 0.03,
                  window_s: float | None = None, seed: int = 0) -> Calibration:
        """An A/A comparison of ``params`` against an identical arm (``base`` is added if missing and kept;
        the copy is dropped): the window length, the pairs for an interval of ``±half_width``, the margin."""
        status = self.add_arm(base, params) if base not in self.arms else None
        copy = self.add_arm(base + "~aa", params)
        status = status or copy
        if status.state != "ok" or copy.state != "ok":
            raise WorkerError(f"the A/A calibration's arm failed: {status.error or copy.error}")
        step_s = status.step_s or status.first_step_s or 0.0
        window = window_s if window_s is not None else choose_window_s(step_s, self.spec.params.get("device") or "cpu")
        run = self.run_pairs(base, base + "~aa", pairs, window, seed)
        self.drop_arm(base + "~aa")
        aa = stats.compare(run.pairs, run.base, run.cand, train_steps=self.spec.train_steps)
        ratios = [p.ratio for p in run.pairs]
        return Calibration(window, stats.pairs_for_width(ratios, half_width), half_width,
                           stats.margin_from_calibration(aa.ratio), max(ratios) - min(ratios), aa, step_s,
                           run.base.s_per_sample)

    def ask_to_quit(self) -> None:
        """Send ``Quit`` without waiting for the worker to end (``close`` then waits): several workers end side
        by side."""
        self.thaw()
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin is not None and not self._quitting:
            with contextlib.suppress(OSError):
                self.proc.stdin.write((encode(Quit()) + "\n").encode())
                self.proc.stdin.flush()
                self._quitting = True

    def close(self, timeout_s: float = 30.0) -> None:
        """Quit the worker (its arms' DataLoader workers end with it), then stop what is left of its tree."""
        try:
            self.thaw()
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(WorkerError, OSError):
                    if self._quitting:
                        self._receive(timeout_s, "Quit")
                    else:
                        self.request(Quit(), timeout_s)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout_s)
        finally:
            self._stop()
            self._stack.close()

    def _stop(self) -> None:
        if self.proc is not None:
            self.frozen = None  # stop_tree continues what it stops: a stopped process would hold SIGTERM
            launch.stop_tree(self.proc, grace_s=0.5)

    def log_tail(self, limit: int = 1500) -> str:
        try:
            return (self.work / "stderr.log").read_text(errors="replace")[-limit:]
        except (OSError, AttributeError):
            return ""

    def _receive(self, timeout_s: float, what: str) -> Reply:
        """The next reply, read whole lines at a time (a partial line waits for its end)."""
        if self.proc is None or self.proc.stdout is None:
            raise WorkerError("the paired worker is not running: start() it first")
        deadline, fd = time.monotonic() + timeout_s, self.proc.stdout.fileno()
        try:
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stop()
                    raise WorkerError(f"the paired worker did not answer {what} within {timeout_s:.0f} s; stopped")
                chunk = os.read(fd, 1 << 16) if select.select([fd], [], [], min(left, 1.0))[0] else None
                # Ended: end of file, or dead with nothing left to read (its forked DataLoader workers, stopped
                # while their arm was idle, hold the pipe open, so no end of file would come before the limit).
                if chunk == b"" or (chunk is None and self.proc.poll() is not None):
                    self._stop()
                    raise WorkerError(f"the paired worker ended during {what}: {self.log_tail()}")
                self._buffer += chunk or b""
        except KeyboardInterrupt:
            self._stop()
            raise
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply = decode(line.decode())
        self._note(reply)
        return reply

    def _note(self, reply: Reply) -> None:
        if isinstance(reply, ArmAdded) and reply.status.arm not in self.arms:
            self.arms.append(reply.status.arm)
        if isinstance(reply, Dropped) and reply.arm in self.arms:
            self.arms.remove(reply.arm)
