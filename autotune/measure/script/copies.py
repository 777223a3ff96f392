"""The user's own script as script mode runs it (``autotune search -- python train.py``): ``ScriptRun`` is one live
copy of it with a recipe, started as a trial process is (``trial.launch``: the recipe's environment before Python
starts, ``AUTOTUNE_RECIPE`` for its ``autotune.apply()``, its tree tied to this process's life), in a folder of its
own, told it is a trial (``AUTOTUNE_TRIAL``), its steps read from the pipe ``autotune.steps`` writes.

A copy is timed in windows and frozen between them (``freeze``), as a process pair's workers are: a window's
speed is taken between the ends of the first and the last step that ended in it, on the machine's monotonic
clock the script stamps them with, so neither the frozen time nor a step cut by the freeze counts.

    >>> run = ScriptRun(launch.for_recipe(recipe, ["python", "train.py"], os.environ), folder)  # doctest: +SKIP
    >>> run.start(); rate = run.window(1.0); run.stop()                                         # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...probes import Facts
from ...recipe import Recipe
from ...steps import (
    CONTROL,
    LOSS_SAMPLES,
    STEPS,
    TRIAL,
    Effect,
    Evaluation,
    Loss,
    Model,
    Step,
    Switched,
    decode,
    encode_switch,
    read_lines,
)
from ...trial import launch
from ...trial.spec import EVALUATED, EVALUATED_HIGHER, TRAINING_LOSS
from .. import freeze
from ..runs import WINDOW_PAIRS, PairFailed, RunPair, sequential

log = logging.getLogger(__name__)

POLL_S = 0.01
WARMUP_STEPS = 3  # untimed steps of each copy before its first window
LOSS_GRACE = 8  # steps past the loss's samples a copy may take to tell it (a trainer's step that returned none)
EXIT_WAIT_S = 3.0  # a copy whose steps stopped gets this long to end before it counts as hung


# multiprocessing (a DataLoader's workers) puts its AF_UNIX sockets in TMPDIR, and a socket's path holds at most
# 107 bytes: under a long temporary folder (a test run's) a copy's DataLoader failed "AF_UNIX path too long".
SHORT_TEMP = 60


def free_port() -> int:
    """A TCP port no one listens on now (the kernel's pick for a socket bound to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def short_temp() -> str:
    """The temporary folder, or /tmp where its path is too long for the sockets made in it."""
    temp = tempfile.gettempdir()
    return temp if len(temp) <= SHORT_TEMP else "/tmp"


def copy_plan(argv: list[str], params: dict[str, Any], facts: Facts, env: Mapping[str, str],
          workload: str) -> launch.LaunchPlan:
    """The copy's command and environment: the recipe's variables in place of the user's (as a trial's), the
    recipe itself in ``AUTOTUNE_RECIPE`` for the script's ``autotune.apply()``."""
    recipe = Recipe(params=params, workload=workload, fingerprint=facts.fingerprint)
    return launch.for_recipe(recipe, list(argv), env, facts=facts, keep_user_env=False)


class ScriptRun(freeze.Freezable):
    """One live copy of the user's script (see the module docstring)."""

    def __init__(self, plan: launch.LaunchPlan, folder: Path, loss_samples: int | None = None,
                 switching: bool = False) -> None:
        self.plan, self.folder, self.loss_samples, self.switching = plan, folder, loss_samples, switching
        self.proc: subprocess.Popen[bytes] | None = None
        self.steps: list[Step] = []
        self.loss: Loss | None = None
        self.model: Model | None = None  # what its prepare_model told
        self.temporary: Path | None = None
        self.timed_s = 0.0  # its windows' measured spans (between their first and last step ends)
        self.waited_s = 0.0  # of them, the time its steps waited for their batches (``steps.Step.waited``)
        self.effect: Effect | None = None  # what was in effect at its first step
        self.evaluation: Evaluation | None = None  # the script's own held-out figure, told with the loss
        self.paused: list[tuple[float, float]] = []  # (the step's end it followed, seconds): its evaluation's
        self.switched: dict[int, str] = {}  # recipe number -> why the copy refused it ("": it switched)
        self._read: int | None = None
        self._control: int | None = None  # with ``switching``: the pipe of recipes to switch to (``switch``)
        self._buffer = b""
        self.stray: bytes | None = None  # the first line on the step channel that was no message, skipped
        self.frozen: freeze.Frozen | None = None

    def start(self) -> None:
        """Start the copy in its folder (its working directory), with a temporary folder of its own (``TMPDIR``,
        removed when it stops), its output in ``script.log``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.temporary = temporary = Path(tempfile.mkdtemp(prefix="autotune-copy-", dir=short_temp()))
        steps = temporary / "autotune-steps"
        os.mkfifo(steps, 0o600)
        self._read = os.open(steps, os.O_RDONLY | os.O_NONBLOCK)  # open before the script starts: it finds a reader
        # Its own port for torch.distributed (a script's init_process_group, torchrun's rendezvous): two copies
        # run at once, and a port the script sets with os.environ.setdefault is left to this one.
        port = str(free_port())
        env = {**self.plan.env, STEPS: str(steps), TRIAL: "1", "TMPDIR": str(temporary), "MASTER_PORT": port,
               "PET_MASTER_PORT": port}
        if self.loss_samples is not None:
            env[LOSS_SAMPLES] = str(self.loss_samples)
        if self.switching:  # read and write here: a write never waits for a reader, nor finds none
            os.mkfifo(temporary / "autotune-control", 0o600)
            self._control = os.open(temporary / "autotune-control", os.O_RDWR | os.O_NONBLOCK)
            env[CONTROL] = str(temporary / "autotune-control")
        with open(self.folder / "script.log", "wb") as log:
            self.proc = launch.start(replace(self.plan, env=env), cwd=self.folder, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT)

    def processes(self) -> int:
        """The processes the copy started and that run now (its DataLoader workers, say)."""
        started = freeze.tree(self.proc.pid)[1:] if self.proc is not None else []
        return sum(1 for pid in started if freeze.proc_state(pid) not in ("Z", "?"))

    @property
    def exited(self) -> int | None:
        """The script's exit status once it has ended, else None."""
        return self.proc.poll() if self.proc is not None else None

    def read(self) -> None:
        """Take what the script has told so far."""
        if self._read is not None:
            lines, self._buffer = read_lines(self._read, self._buffer)
            for line in lines:
                try:
                    message = decode(line.decode())
                except ValueError:  # not autotune's (a process that inherited the channel wrote it): skipped
                    if self.stray is None:
                        log.warning("a line on the step channel of %s is no step message, skipped: %r", self.folder,
                                    line[:80])
                        self.stray = line[:80]
                    continue
                if isinstance(message, Step):
                    self.steps.append(message)
                elif isinstance(message, Model):
                    self.model = message
                elif isinstance(message, Effect):
                    self.effect = message
                elif isinstance(message, Switched):
                    self.switched[message.number] = message.refused
                elif isinstance(message, Evaluation):
                    self.evaluation = message
                    self.paused.append((self.steps[-1].ended if self.steps else 0.0, message.took_s))
                else:
                    self.loss = message

    def window(self, seconds: float, min_steps: int = 2, timeout_s: float = 60.0) -> float | None:
        """Run the copy at least ``seconds`` and until ``min_steps`` steps ended (at most ``timeout_s``), then
        freeze it: samples/s between the first and the last step end in the window; None with fewer than two."""
        self.read()  # what it told before it was frozen is not this window's
        started, first = time.monotonic(), len(self.steps)
        self.thaw()
        while True:
            time.sleep(POLL_S)
            self.read()
            elapsed = time.monotonic() - started
            ended = sum(1 for s in self.steps[first:] if s.ended >= started)
            if self.exited is not None or elapsed >= timeout_s or (elapsed >= seconds and ended >= min_steps):
                break
        self.freeze()
        self.read()
        inside = [s for s in self.steps[first:] if s.ended >= started]
        if len(inside) < 2 or inside[-1].ended <= inside[0].ended:
            return None
        span = self.span(inside[0], inside[-1])
        if span <= 0:
            return None
        self.timed_s += span
        self.waited_s += sum(s.waited for s in inside[1:])
        return (inside[-1].samples - inside[0].samples) / span

    def span(self, first: Step, last: Step) -> float:
        """The training time between two of its steps' ends: an evaluation between them (``Tuned.evaluate``) is
        none."""
        return last.ended - first.ended - sum(took for after, took in self.paused if first.ended <= after < last.ended)

    def switch(self, number: int, params: dict[str, Any]) -> None:
        """Ask the copy (started ``switching``) to train on with ``params`` from its next step; it answers
        ``switched[number]`` between two steps."""
        if self._control is None:
            raise RuntimeError("this copy was not started to switch recipes")
        os.write(self._control, encode_switch(number, params).encode())

    def loss_told(self, deadline: float, stall_s: float) -> tuple[int, float, str] | str:
        """The loss the copy told at the study's samples, trained on untimed until it does: (samples, value, what
        it is: ``TrialResult.loss_source``), its own held-out figure where the script gave one (``Tuned.evaluate``,
        waited for however long it takes), else its training loss. Else why not: it exited (``""``: its exit is
        the reason), told no step in ``stall_s`` before the loss was due, told none ``LOSS_GRACE`` steps past it,
        or ``deadline`` passed."""
        while self.loss is None:
            now, told = time.monotonic(), len(self.steps)
            due = self.loss_samples is not None and bool(self.steps) and self.steps[-1].samples >= self.loss_samples
            if self.exited is not None:
                return ""
            if now >= deadline:
                return f"the trial's time ran out: its copy had not told its loss at {self.loss_samples} samples"
            self.window(0.2, min_steps=1, timeout_s=max(0.2, deadline - now if due else min(stall_s, deadline - now)))
            if self.loss is None and self.exited is None and not due and len(self.steps) == told:
                return f"its copy told no step in {stall_s:.0f} s before its loss"
            past = [s for s in self.steps if self.loss_samples is not None and s.samples >= self.loss_samples]
            if self.loss is None and len(past) > LOSS_GRACE:
                return (f"its copy told no loss at {self.loss_samples} samples ({len(past)} steps past them): a "
                        f"step with no loss (a trainer's model given no labels?)")
        figure = self.evaluation
        if figure is not None:
            return figure.samples, figure.value, EVALUATED_HIGHER if figure.higher_is_better else EVALUATED
        return self.loss.samples, self.loss.value, TRAINING_LOSS

    def train_to(self, samples: int, deadline: float, stall_s: float) -> None:
        """Train on, untimed, until the copy has trained ``samples`` (a pair's two copies at the same point of
        training before their windows), it stops stepping for ``stall_s`` or ``deadline`` passes."""
        while self.steps and self.steps[-1].samples < samples and self.exited is None and time.monotonic() < deadline:
            told = len(self.steps)
            self.window(0.2, min_steps=1, timeout_s=max(0.2, min(stall_s, deadline - time.monotonic())))
            if len(self.steps) == told:
                return

    def s_per_sample(self) -> float | None:
        """Seconds per sample between its first and last step so far (its first step's start-up left out)."""
        steps = self.steps
        if len(steps) < 2 or steps[-1].samples <= steps[0].samples:
            return None
        return self.training_span() / (steps[-1].samples - steps[0].samples)

    def training_span(self) -> float:
        """Training seconds between its first and last step so far (what ``s_per_sample`` is judged over)."""
        return self.span(self.steps[0], self.steps[-1]) if len(self.steps) >= 2 else 0.0

    def stop(self) -> None:
        """End the copy and everything it started, frozen or not; what it told stays readable."""
        if self.proc is not None:
            launch.stop_tree(self.proc)
            self.frozen = None
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
            self.temporary = None
        self.read()
        for fd in (self._read, self._control):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read = self._control = None


def alone(run: ScriptRun, whose: str, windows: int, window_s: float, warmup_steps: int,
          timeout_s: float) -> float | str:
    """The copy ``run`` (``whose``: the defaults', the candidate's) started, warmed up (``warmup_steps`` steps,
    untimed) and timed alone, as you run your script: the median samples/s of its ``windows`` windows, or why it
    gave none (it failed, or ``timeout_s`` ran out first). Stopped whatever happens."""
    deadline = time.monotonic() + max(1.0, timeout_s)
    try:
        start_together([run], max(1.0, timeout_s))
        if run.exited is None and time.monotonic() < deadline:  # a start that took all the time gets no more
            run.window(0.0, min_steps=warmup_steps, timeout_s=max(1.0, deadline - time.monotonic()))
        rates: list[float] = []
        while len(rates) < windows and run.exited is None and time.monotonic() < deadline:
            rate = run.window(window_s, timeout_s=max(1.0, min(20 * window_s, deadline - time.monotonic())))
            if rate is None:
                break
            rates.append(rate)
        if len(rates) == windows:
            return statistics.median(rates)
        late = run.exited is None and time.monotonic() >= deadline
        return f"{whose} copy: the time ran out" if late else failure([run], (whose,))
    finally:
        run.stop()


def alone_pair(plans: dict[str, launch.LaunchPlan], folder: Path, window_s: float, warmup_steps: int, seed: int,
               timeout_s: float, live: list[ScriptRun]) -> RunPair:
    """A pair of your runs (``measure.runs``): the defaults' copy and the candidate's (``plans``: ``base`` and
    ``cand``), each alone (``alone``), one after the other in an order drawn from ``seed``, within ``timeout_s``;
    ``live`` holds the copy running (for a Ctrl-C's stop). ``PairFailed`` says why a copy gave no rate."""
    deadline = time.monotonic() + timeout_s

    def copy(side: str) -> tuple[float, float]:
        run = ScriptRun(plans[side], folder / side)
        live.append(run)
        try:
            rate = alone(run, "the defaults'" if side == "base" else "the candidate's", WINDOW_PAIRS, window_s,
                         warmup_steps, deadline - time.monotonic())
        finally:
            live.remove(run)
        if isinstance(rate, str):
            raise PairFailed(rate, side)
        return rate, WINDOW_PAIRS * window_s
    return sequential(seed, copy)


def start_together(runs: list[ScriptRun], timeout_s: float) -> None:
    """Start the copies side by side, each frozen once it has told its model (``prepare_model``, after its imports
    and data) or a step, until all have, one exited or ``timeout_s`` passed; then every copy is frozen. Their start-
    ups overlap; their steps do not: two copies of two OpenMP threads stepping at once on 2 vCPUs spun, and an
    input-bound script's three warm-up steps took 9 s where one copy alone took 0.05 s."""
    deadline = time.monotonic() + timeout_s
    for run in runs:
        run.start()
    waiting = list(runs)
    while waiting and time.monotonic() < deadline:
        time.sleep(POLL_S)
        for run in list(waiting):
            run.read()
            if run.model is not None or run.steps:
                run.freeze()
                waiting.remove(run)
        if any(run.exited is not None for run in runs):
            break
    for run in runs:
        run.freeze()  # a copy still starting, or one left running when another exited (an ended one is not)


def window_pairs(base: ScriptRun, cand: ScriptRun, pairs: int, window_s: float, rng: random.Random,
                 timeout_s: float = 60.0) -> list[tuple[float, float]]:
    """``pairs`` pairs of windows of two live copies, each pair's order drawn by ``rng`` (the other copy frozen):
    the defaults' and the candidate's rates of each pair where both were measured. The pairs of one pair of
    processes: their spread is within the pair, the processes' own factor is shared by all of them."""
    rates = []
    for _ in range(pairs):
        order = [base, cand] if rng.random() < 0.5 else [cand, base]
        rate = {id(run): run.window(window_s, timeout_s=timeout_s) for run in order}
        base_rate, cand_rate = rate[id(base)], rate[id(cand)]
        if not base_rate or not cand_rate or base.exited is not None or cand.exited is not None:
            break  # a copy that ended or told no steps in a window's time has no more: the caller says why
        rates.append((base_rate, cand_rate))
    return rates


def failure(runs: list[ScriptRun], whose: tuple[str, ...] = ("the defaults'", "the candidate's")) -> str:
    """Why copies gave fewer windows than asked: a copy's exit (its status and its output's last line), else the
    copy that told fewer steps told none in a window's time."""
    named = list(zip(runs, whose, strict=False))
    # A copy whose steps stopped may be exiting: a script's teardown after its last step (sys.exit with torch
    # loaded) took seconds under load, and a frozen copy never ends. Let it go on a moment before judging; not a
    # copy of another recipe than one that ended already (the healthy side of a crashed candidate: it would not end).
    ended = [run for run in runs if run.exited is not None]
    waiting = [run for run in runs if run.exited is None and run.proc is not None
               and all(other.plan == run.plan for other in ended)]
    for run in waiting:
        run.thaw()
    deadline = time.monotonic() + EXIT_WAIT_S
    while waiting and time.monotonic() < deadline and all(run.exited is None for run in waiting):
        time.sleep(POLL_S)
    exited = [(run, who) for run, who in named if run.exited is not None]
    if not exited:
        run, who = min(named, key=lambda n: len(n[0].steps))
        return f"{who} copy told no step in its window's time" + _last_line(run)
    run, who = exited[0]
    return f"{who} copy exited with status {run.exited}" + _last_line(run)


def _last_line(run: ScriptRun) -> str:
    """``: LINE``, the last line the copy printed, or nothing."""
    try:
        lines = (run.folder / "script.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][-200:]}" if lines else ""


def step_s(steps: list[Step]) -> float | None:
    """The mean time of an optimizer step over ``steps``."""
    return (steps[-1].ended - steps[0].ended) / (len(steps) - 1) if len(steps) >= 2 else None
