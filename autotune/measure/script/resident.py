"""Script mode's long-lived copy: one copy of the user's script, started once with the defaults' recipe, that
switches recipes in place between windows (``Tuned.switch`` over ``steps.CONTROL``). A candidate that differs from
the defaults only in knobs a running process can change (``spaces.in_place``) is measured in it by window pairs,
the defaults' window and the candidate's in an order drawn each pair, as the workload engine's arms share one
worker: no copy is started for it, and both sides of a pair run in the same process, whose speed factor cancels.

Where the copy cannot switch (it refuses, naming the knob), or a batch switch does not show in its steps (a script
that builds its DataLoader once), the candidate is measured in fresh process pairs instead, and its result says why.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import search_spaces as spaces
from ...trial import launch
from .copies import WARMUP_STEPS, ScriptRun, failure, start_together

TIME_RAN_OUT = "the trial's time ran out in the long-lived copy"
LOSS_HEADROOM = 1.5  # fresh processes of one script ran 0.85-1.28x apart: a loss copy priced at the slow end


class ResidentCopy:
    """The long-lived copy (see the module docstring); ``plan_for`` makes a copy's launch plan from a recipe."""

    def __init__(self, plan_for: Callable[[dict[str, Any]], launch.LaunchPlan], defaults: dict[str, Any],
                 folder: Path, rng: random.Random) -> None:
        self.plan_for, self.defaults, self.folder, self.rng = plan_for, defaults, folder, rng
        self.run: ScriptRun | None = None
        self.current: dict[str, Any] = dict(defaults)  # the recipe the copy trains with now
        self.number = 0  # of the last recipe sent
        self.startup_s = 0.0  # its start and warm-up, once: charged to the trial that started it
        self.failed: str | None = None  # why it ended; no later candidate is measured in it
        self.batch_fixed = False  # a batch switch did not show in its steps: no batch is measured in it again
        self.unit = 0.0  # the samples a defaults' step tells per sample of its batch (ranks, accumulation)

    def can_measure(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` differ from the defaults only in knobs the running copy can change (and it has not
        ended, nor shown that its batch stays)."""
        changed = {k for k in {*params, *self.defaults} if params.get(k) != self.defaults.get(k)}
        return (self.failed is None and changed <= set(spaces.in_place())
                and not (self.batch_fixed and "batch_per_rank" in changed))

    def window_pairs(self, params: dict[str, Any], pairs: int, window_s: float, deadline: float,
                     stall_s: float) -> tuple[list[tuple[float, float]], str | None]:
        """Up to ``pairs`` window pairs of the defaults and ``params`` in the copy: (defaults' rate, candidate's
        rate) per pair, and why it stopped short (None: it did not): the trial's time (its pairs stand), or the
        copy could not measure the candidate (then none of the candidate's pairs is kept)."""
        why = self.failed or self._started(deadline)
        rates: list[tuple[float, float]] = []
        while why is None and len(rates) < pairs:
            if time.monotonic() >= deadline:
                return rates, TIME_RAN_OUT
            pair: dict[bool, float] = {}
            for candidate in self.rng.sample([False, True], 2):
                recipe = params if candidate else self.defaults
                why = self._switch(recipe, deadline)
                if why is not None:
                    break
                assert self.run is not None
                rate = self.run.window(window_s, timeout_s=max(stall_s, 20 * window_s))
                if rate is None:
                    why = self._ended(failure([self.run], ("the long-lived",)))
                    break
                why = self._batch_shown(recipe)
                if why is not None:
                    break
                pair[candidate] = rate
            if why is None:
                rates.append((pair[False], pair[True]))
        return ([], why) if why is not None and why != TIME_RAN_OUT else (rates, why)

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
            self.run = None

    def _started(self, deadline: float) -> str | None:
        if self.run is not None:
            return None
        started = time.monotonic()
        self.run = ScriptRun(self.plan_for(self.defaults), self.folder, switching=True)
        start_together([self.run], max(1.0, deadline - started))
        self.run.window(0.0, min_steps=WARMUP_STEPS, timeout_s=max(1.0, deadline - time.monotonic()))
        self.startup_s = time.monotonic() - started
        if self.run.exited is not None or len(self.run.steps) < WARMUP_STEPS:
            return self._ended(failure([self.run], ("the long-lived",)))
        steps, batch = self.run.steps, self.defaults.get("batch_per_rank")
        self.unit = (steps[-1].samples - steps[-2].samples) / batch if batch else 0.0  # a step's samples a sample
        return None

    def _switch(self, params: dict[str, Any], deadline: float) -> str | None:
        """Switch the copy to ``params`` (where it trains with another recipe) and wait for its answer."""
        assert self.run is not None
        if params == self.current:
            return None
        self.number += 1
        self.run.switch(self.number, params)
        while self.number not in self.run.switched and self.run.exited is None and time.monotonic() < deadline:
            self.run.window(0.0, min_steps=1, timeout_s=max(0.1, deadline - time.monotonic()))
        refused = self.run.switched.get(self.number)
        if refused is None:
            if self.run.exited is not None:
                return self._ended(failure([self.run], ("the long-lived",)))
            self.current = {}  # unknown until an answer: the next recipe is sent whatever it is
            return TIME_RAN_OUT
        if refused:  # it trains on with the recipe before: the defaults' side of a later pair switches back
            return f"the long-lived copy cannot switch to it: {refused}"
        self.current = dict(params)
        return None

    def _batch_shown(self, params: dict[str, Any]) -> str | None:
        """Why the copy's last steps do not train the recipe's batch (a DataLoader built once), or None; checked
        only where the batch differs from the defaults', against the samples a defaults' step told per sample of
        its batch (several ranks, accumulation); one of the last two steps may be an epoch's short last batch."""
        assert self.run is not None
        batch, base = params.get("batch_per_rank"), self.defaults.get("batch_per_rank")
        steps = self.run.steps
        if batch == base or not batch or not base or not self.unit or len(steps) < 3:
            return None
        told = [b.samples - a.samples for a, b in zip(steps[-3:], steps[-2:], strict=False)]
        if round(batch * self.unit) in told:
            return None
        self.batch_fixed = True
        return (f"the script's DataLoader kept its batch ({max(told)} samples a step where the recipe said "
                f"{round(batch * self.unit)}): it builds its loader once")

    def _ended(self, why: str) -> str:
        self.failed = why
        self.stop()
        return why


def loss_copy_s(startup_s: float, loss_samples: int, pairs: list[tuple[float, float]]) -> float:
    """What ``fresh_loss`` will take for a candidate of ``pairs`` (window pairs of the defaults' rate and its own
    in the long-lived copy, whose start took ``startup_s``): a start as the copy's, then ``loss_samples`` at its
    median rate, ``LOSS_HEADROOM`` over; nothing before a pair with a rate is seen.

    >>> loss_copy_s(4.0, 8192, [(2000.0, 2048.0), (2100.0, 0.0), (1900.0, 4096.0), (2000.0, 1024.0)])
    12.0
    >>> loss_copy_s(4.0, 8192, [])
    0.0
    """
    rates = sorted(c for _, c in pairs if c > 0)
    return LOSS_HEADROOM * (startup_s + loss_samples / rates[len(rates) // 2]) if rates else 0.0


def fresh_loss(plan: launch.LaunchPlan, folder: Path, loss_samples: int, start_limit_s: float, deadline: float,
               stall_s: float, live: list[ScriptRun],
               failed: list[Path]) -> tuple[tuple[int, float, str] | None, float]:
    """The loss of one fresh copy of a candidate measured in the long-lived copy, trained to the study's samples
    (never of a copy that trained through other recipes), and its start's seconds (to its model told); None for the
    loss where it told none (a copy that exited: its folder joins ``failed``). ``live`` holds it while it runs (a
    stopped search stops it)."""
    run = ScriptRun(plan, folder, loss_samples=loss_samples)
    live.append(run)
    started = time.monotonic()
    try:
        start_together([run], max(1.0, min(start_limit_s, deadline - time.monotonic())))
        start_s = time.monotonic() - started
        loss = run.loss_told(deadline, stall_s)
        if isinstance(loss, str) and not loss.startswith("the trial's"):
            failed.append(folder)
        return None if isinstance(loss, str) else loss, start_s
    finally:
        run.stop()
        live.remove(run)
