"""A script-mode trial as ``ScriptMeasurer`` measures it (``ScriptTrial``) and what its result says: how it was
measured (its method, which the budget reads, ``costs``), its loss and what that loss is, the status of a copy's
failure, a far slower candidate's."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from ...trial.spec import Status, TrialResult
from ..hopeless import FAR_SLOWER, FAR_SLOWER_IN_COPY, HOPELESS, far_slower_result

METHOD = "script process pairs"
COPY_METHOD = "script window pairs in one copy"
SAME_ARITHMETIC = ("channels_last",)  # in-place knobs whose loss is the defaults': the same sums, another layout


@dataclass
class ScriptTrial:
    """A candidate being measured: its process pairs' ratios and what its copies told."""

    params: dict[str, Any]
    baseline: bool
    deadline: float  # the race's looks narrow it to their limits
    loss_deadline: float = math.inf  # the trial's own, as begun: its fresh copy for the loss has it
    started: float = field(default_factory=time.monotonic)
    medians: list[float] = field(default_factory=list)  # one ratio per process pair
    windows: int = 0  # window pairs behind them
    cand_rates: list[float] = field(default_factory=list)
    base_rates: list[float] = field(default_factory=list)
    startup_s: float = 0.0  # its copies' start and warm-up (the share of the budget spent starting copies)
    timed_s: float = 0.0
    once_s: float = 0.0  # untimed time it spent once, not each process pair nor candidate (``TrialResult.once_s``)
    loss: tuple[int, float, str] | None = None  # (samples, value, source) its copy told (``ScriptRun.loss_told``)
    waited_s: float = 0.0  # the defaults' copies' windows: waiting for data, of ``spans_s``
    spans_s: float = 0.0
    failed: TrialResult | None = None
    in_copy: list[tuple[float, float]] | None = None  # its window pairs in the long-lived copy (None: process pairs)
    fallback: str | None = None  # why it was not measured in that copy after all
    skip_loss: bool = False


def copy_method(pairs: int) -> str:
    """A candidate's ``TrialResult.method`` measured in the long-lived copy, with its window pairs."""
    return f"{COPY_METHOD} ({pairs})"


def script_method(pairs: int) -> str:
    """A script-mode trial's ``TrialResult.method``, with the process pairs it ran (``costs`` reads it)."""
    return f"{METHOD} ({pairs})"


def loss_fields(loss: tuple[int, float, str] | None) -> dict[str, Any]:
    if loss is None:
        return {}
    return {"loss_samples": loss[0], "loss": loss[1], "loss_source": loss[2]}


def failure_status(why: str) -> Status:
    """A timeout where the copies stopped stepping or the trial's time ran out, else a crash; read from the reason's
    own words, before the script's last output line (``copies.failure``), which may say anything."""
    head = why.split(": ", 1)[0]
    return Status.TIMEOUT if head.startswith("the trial's time ran out") or " steps in " in head or "no step" in head \
        else Status.CRASH


def far_slower(mine: float | None, theirs: float | None) -> float | None:
    """A candidate's steps' time per sample over the defaults' (``mine`` over ``theirs``), where it is ``HOPELESS``
    or worse; else None."""
    if mine is None or theirs is None or mine < HOPELESS * theirs:
        return None
    return mine / theirs


def hopeless_result(slower: float, in_copy: bool = False) -> TrialResult:
    """A candidate whose steps took ``slower`` times the defaults' time per sample, stopped there; ``in_copy``: in
    the long-lived copy, which started no process for it (``costs.started_processes``)."""
    return far_slower_result(1 / slower, [f"stopped after its first steps, {1 / slower:.2f}x the defaults: its "
                                          f"steps took {slower:.0f}x the defaults' time per sample"],
                             FAR_SLOWER_IN_COPY if in_copy else FAR_SLOWER)
