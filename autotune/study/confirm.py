"""Confirmation: the top candidates and the baseline, re-run side by side before one is declared best.

A search keeps its fastest measurement, and the fastest of many noisy measurements is biased upward
(the winner's curse). So the top ``confirm_top`` feasible recipes and the defaults are run again,
``confirm_rounds`` times each, interleaved (round r starts at the r-th entry, so no candidate is
always first after a quiet pause), every run a fresh subprocess like any trial. Only these runs decide:
a recipe is better than the defaults if its median beats theirs by more than the noise (half the
larger relative range, at least ``MIN_NOISE``) *and*, with two runs or more, its slowest run beats
the defaults' fastest. The runs are trials of the study with role ``confirm`` (user attribute
``confirms``: the trial they re-measure), so a resumed search keeps them and runs only what is missing.

The search loop keeps time for them in the budget (``SearchLoop.reserve_s``); when the budget still
runs out, the confirmation is shortened and the report says so.
"""
from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

MIN_NOISE = 0.03  # a gain under 3% is not told apart from run-to-run noise on a shared machine


@dataclass(frozen=True)
class Candidate:
    """One recipe in the confirmation: its first (search) measurement and its confirmation runs."""

    number: int  # the trial that measured it first
    role: str
    params: dict[str, Any]
    first: float
    runs: tuple[float, ...] = ()
    failed: str | None = None  # why a confirmation run of it failed: it is out of the contest

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    @property
    def spread(self) -> float:
        """The runs' range relative to their median."""
        return (self.high - self.low) / self.median if len(self.runs) > 1 else 0.0


@dataclass(frozen=True)
class Confirmation:
    baseline: Candidate
    candidates: tuple[Candidate, ...]  # fastest confirmed median first; failed ones last
    note: str | None = None  # why it was shortened or not run
    runs: int = 0  # confirmation runs made by this search (not earlier ones)
    wall_s: float = 0.0
    noise: float = field(default=MIN_NOISE)

    @property
    def best(self) -> Candidate | None:
        """The candidate that beats the baseline beyond noise, or None: keep the defaults."""
        valid = [c for c in self.candidates if c.runs and c.failed is None]
        if not valid or not self.baseline.runs:
            return None
        top = valid[0]
        return top if beats(self.baseline.runs, top.runs) else None


def noise(baseline: tuple[float, ...] | list[float], candidate: tuple[float, ...] | list[float]) -> float:
    """Relative run-to-run noise of a comparison: half the larger relative range, at least MIN_NOISE."""
    def half_range(runs: Any) -> float:
        return (max(runs) - min(runs)) / statistics.median(runs) / 2 if len(runs) > 1 else 0.0

    return max(MIN_NOISE, half_range(baseline), half_range(candidate))


def beats(baseline: tuple[float, ...] | list[float], candidate: tuple[float, ...] | list[float]) -> bool:
    """Whether ``candidate``'s runs beat ``baseline``'s beyond noise.

    >>> beats([100, 101, 99], [110, 112, 109])
    True
    >>> beats([100, 101, 99], [102, 103, 102.5])   # +2.5%: within noise
    False
    """
    if not baseline or not candidate:
        return False
    gain = statistics.median(candidate) / statistics.median(baseline) - 1
    separated = len(baseline) < 2 or len(candidate) < 2 or min(candidate) > max(baseline)
    return gain > noise(baseline, candidate) and separated


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _lineup(study: Any, top: int) -> tuple[Any, list[Any]]:
    """The baseline's record and the ``top`` fastest feasible distinct recipes' records."""
    from .report import records

    searched = [r for r in records(study) if r.role != "confirm"]
    baseline = next((r for r in searched if r.role == "baseline" and r.result.status == "ok"), None)
    if baseline is None:
        return None, []
    seen, picked = {_key(baseline.params)}, []
    for r in sorted((r for r in searched if r.feasible), key=lambda r: -r.result.objective):
        if _key(r.params) not in seen and len(picked) < top:
            seen.add(_key(r.params))
            picked.append(r)
    return baseline, picked


def candidate_count(loop: Any) -> int:
    """How many candidates a confirmation would re-run now (for the budget's reserve)."""
    if loop.options.confirm_top <= 0 or loop.options.confirm_rounds <= 0:
        return 0
    return len(_lineup(loop.study, loop.options.confirm_top)[1])


def _earlier_runs(study: Any) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Confirmation runs already in the study (an earlier, perhaps interrupted, search): by recipe."""
    from .loop import MEASURED
    from .report import records

    runs: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, str] = {}
    for r in records(study):
        if r.role != "confirm" or r.result.status not in MEASURED:
            continue  # an interrupted run is simply made again
        if r.result.status == "ok":
            runs[_key(r.params)].append(r.result.objective)
        else:
            failed[_key(r.params)] = f"{r.result.status}: {r.result.error}"
    return runs, failed


def confirm(loop: Any) -> Confirmation | None:
    """Run the confirmation for ``loop``'s study (None when ``confirm_top`` or ``confirm_rounds`` is 0)."""
    from .run import host_lock

    options = loop.options
    if options.confirm_top <= 0 or options.confirm_rounds <= 0:
        return None
    baseline, top = _lineup(loop.study, options.confirm_top)
    lineup = [baseline, *top]
    runs, failed = _earlier_runs(loop.study)
    note, made, started = None, 0, time.monotonic()
    if not top:
        note = "no feasible recipe besides the defaults to confirm"
    rounds = options.confirm_rounds if top else 0
    # Round r runs the lineup from its r-th entry on; a recipe that already has its r-th run is skipped.
    queue = [(r, e) for r in range(rounds) for e in lineup[r % len(lineup):] + lineup[: r % len(lineup)]]
    for round_, entry in queue:
        key = _key(entry.params)
        if key in failed or len(runs[key]) > round_:
            continue
        remaining, estimate = loop.deadline - time.monotonic(), loop.estimate_s()
        if remaining < max(1.0, estimate or 0.0):
            note = f"the budget ran out after {made} confirmation run(s): the ranges are from fewer runs"
            break
        with host_lock():
            trial = new_trial(loop, entry.number, round_)
            remaining = loop.deadline - time.monotonic()
            timeout = loop.timeout_s(entry.params, remaining, estimate)
            result = loop.run_one(trial, "confirm", entry.params, max(1.0, timeout))
        made += 1
        if result.status == "ok":
            runs[key].append(result.objective)
        else:
            failed[key] = f"{result.status}: {result.error}"

    def candidate(record: Any) -> Candidate:
        key = _key(record.params)
        return Candidate(record.number, record.role, record.params, record.result.objective,
                         tuple(runs[key]), failed.get(key))

    confirmed = sorted((candidate(r) for r in top), key=lambda c: (c.failed is not None, -(c.median if c.runs else 0)))
    base = candidate(baseline)
    best = next((c for c in confirmed if c.runs and c.failed is None), None)
    return Confirmation(base, tuple(confirmed), note, made, time.monotonic() - started,
                        noise(base.runs, best.runs) if best and base.runs else MIN_NOISE)


def new_trial(loop: Any, source: int, round_: int) -> Any:
    """A RUNNING trial of the study with the params (and distributions) of trial ``source``, claimed by
    this search. Not asked from the sampler: another worker cannot pop it as an enqueued trial can be."""
    import optuna

    storage, study_id = loop.study._storage, loop.study._study_id
    frozen = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, source))
    template = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=frozen.params, distributions=frozen.distributions,
        user_attrs={"role": "confirm", "confirms": source, "round": round_},
    )
    trial = optuna.Trial(loop.study, storage.create_new_trial(study_id, template_trial=template))
    loop.claim(trial, "confirm", frozen.user_attrs["params"])
    return trial
