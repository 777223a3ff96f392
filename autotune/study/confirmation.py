"""The confirmation's rules: who is confirmed (``lineup``, of them the ``contenders`` the budget keeps time for),
the bar a candidate's low bound must clear (``offer_bar``, ``confirm_bar``), what a candidate's rounds say
(``Candidate``), and which candidate wins (``Confirmation``: ``best``, ``fastest``, the ``undecided`` one your runs
decide). ``confirm`` runs the rounds by these rules, ``choice`` makes the recipe from them and ``claim`` states
it from your runs (``UserRuns``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..measure import MIN_MARGIN, Runs, span_margin
from ..recipe import format_speedup
from ..trial.spec import Status, TrialResult
from .records import BASELINE, CONFIRM, TrialRecord, params_key, records, study_margin

if TYPE_CHECKING:
    import optuna


def lineup(study: optuna.Study, top: int, rounds: int = 1) -> tuple[TrialRecord | None, list[TrialRecord]]:
    """The baseline's record and the ``top`` fastest feasible distinct recipes' records: what a
    confirmation of ``rounds`` rounds re-runs (and the budget keeps time for). A recipe whose search interval lies
    wholly below what those rounds must clear (``confirm_bar``) is left out: its confirmation could not make it
    the recipe, so the time to confirm it would be lost. They come in the order in which the confirmation keeps
    their rounds' time (``_rank``): those the search reads above the bar, the highest low bound first (a narrow
    1.15x [1.12-1.17] before a wide 1.25x [0.77-2.00], whose rounds, another environment's process pairs, had left
    the first one round), then the rest, the fastest first (a wide 1.13x [0.99-1.28] before a narrow 1.06x
    [1.01-1.13]: given the rounds, the narrow one went to your runs, which did not confirm it)."""
    searched = [r for r in records(study) if r.role != CONFIRM]
    baseline = next((r for r in searched if r.role == BASELINE and r.result.status == Status.OK), None)
    if baseline is None:
        return None, []
    bar = confirm_bar(study, rounds)
    seen = {params_key(baseline.params)}
    picked: list[TrialRecord] = []
    for r in sorted((r for r in searched if r.feasible), key=lambda r: -(r.result.objective or 0.0)):
        if r.result.speedup_high is not None and r.result.speedup_high < bar:
            continue
        if params_key(r.params) not in seen and len(picked) < top:
            seen.add(params_key(r.params))
            picked.append(r)
    return baseline, sorted(picked, key=lambda r: _rank(r, bar))


def _rank(record: TrialRecord, bar: float) -> tuple[bool, float]:
    """Who keeps the rounds' time first (``lineup``'s order): those whose search interval lies above ``bar``, the
    highest low bound first; then the others, the fastest median first."""
    low, median = record.result.speedup_low, record.result.objective or 0.0
    return (False, -low) if low is not None and low > bar else (True, -median)


# Confirmed medians this close are as fast for a user (the search benchmark's near-optimal tolerance): the surer wins
ALIKE = 0.03
DECIDING_ROUNDS = 2  # rounds after which your runs' pairs may decide a candidate its rounds could not (``undecided``)


def offer_bar(margin: float, rounds: int) -> float:
    """What a confirmation of ``rounds`` rounds asks of a candidate's low bound: ``1 + margin`` (the calibration's)
    over one round, 1 + the 2% floor over more (``measure.span_margin``)."""
    return 1 + span_margin(margin, rounds)


def confirm_bar(study: optuna.Study, rounds: int) -> float:
    """``offer_bar`` with the study's calibrated margin."""
    return offer_bar(study_margin(study), rounds)


def contenders(top: list[TrialRecord], bar: float) -> list[TrialRecord]:
    """Of ``lineup``'s candidates, those likely to become the recipe: not one whose search interval lies wholly
    below the first's search low bound, nor one whose search median is below ``bar`` (``confirm_bar``: more likely
    than not, fresh pairs read it there too, and the defaults are kept). The time kept for the confirmation counts
    these only: the others are confirmed in the time left, or left out for time (``confirm.Rounds``), and time
    kept for them would stop the search early."""
    if not top:
        return []
    floor = top[0].result.speedup_low or 0.0
    return [r for r in top if (r is top[0] or (r.result.speedup_high or 0.0) >= floor)
            and (r.result.objective or 0.0) >= bar]


@dataclass(frozen=True)
class Candidate:
    """One recipe in the confirmation: its search trial's speedup and its confirmation's (fresh pairs)."""

    number: int  # the trial that measured it first
    role: str
    params: dict[str, Any]
    first: float  # the search's median speedup
    confirmed: TrialResult | None = None  # the confirmation's measurement (its rounds combined): only it decides
    failed: str | None = None  # why its confirmation failed: it is out of the contest
    rounds: int = 0  # confirmation rounds behind ``confirmed``, each in fresh processes

    @property
    def median(self) -> float:
        return (self.confirmed.objective or 0.0) if self.confirmed else 0.0

    @property
    def low(self) -> float:
        return (self.confirmed.speedup_low or 0.0) if self.confirmed else 0.0

    @property
    def high(self) -> float:
        return (self.confirmed.speedup_high or 0.0) if self.confirmed else 0.0

    @property
    def pairs(self) -> int:
        return (self.confirmed.pairs or 0) if self.confirmed else 0

    def interval(self) -> str:
        """``1.23x [1.15-1.31]``"""
        return format_speedup(self.median, self.low, self.high)

    @property
    def claim(self) -> str:
        """What its confirmation claims (``recipe.CLAIMS``): ``confirmed`` over two rounds or more, else
        ``provisional`` (one round's interval does not see how a speedup varies between processes)."""
        return "confirmed" if self.rounds >= 2 else "provisional"


@dataclass(frozen=True)
class UserRuns:
    """The claim's process pairs of the recipe of trial ``number``: ``runs`` (their ratios; empty: none ran), the
    pairs asked, why fewer ran (or none was asked), the search's process pairs by environment, whose spread the
    claim may borrow (``Runs.mean``), and whether the budget's end cut them (``cut``: not a failure)."""

    number: int
    runs: Runs
    asked: int
    why: str | None = None
    lent: tuple[tuple[float, ...], ...] = ()
    cut: bool = False  # the budget's end stopped the pairs (``why`` says so in words), not a failure
    failed: bool = False  # the recipe's own process of your training failed (``why`` says how): never offered

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.number, "ratios": list(self.runs.ratios), "run_s": self.runs.run_s,
                "asked": self.asked, "why": self.why, "lent": [list(g) for g in self.lent], "cut": self.cut,
                "failed": self.failed}


@dataclass(frozen=True)
class Confirmation:
    baseline: Candidate  # the defaults: their A/A (the calibration) is their measurement
    candidates: tuple[Candidate, ...]  # highest confirmed median first; failed ones last
    note: str | None = None  # why it was shortened or not run
    runs: int = 0  # confirmation measurements made by this search (not earlier ones)
    wall_s: float = 0.0
    margin: float = field(default=MIN_MARGIN)  # the calibration's: one round's speedup counts above 1 + margin
    user: UserRuns | None = None  # its choice's process pairs of your training (``claim.user_runs``)
    tested: UserRuns | None = None  # those that tested ``undecided`` before ``user`` and did not confirm it

    def bar(self, candidate: Candidate) -> float:
        """What ``candidate``'s low bound must clear (``offer_bar`` over its rounds)."""
        return offer_bar(self.margin, candidate.rounds)

    def _faster(self) -> list[Candidate]:
        """The confirmed candidates whose speedup's LOW bound is above their ``bar``, of those the most rounds
        confirmed: an interval over fewer rounds has not seen how a speedup varies between processes as theirs
        has."""
        faster = [c for c in self.candidates if c.confirmed is not None and c.failed is None
                  and c.low > self.bar(c)]
        most = max((c.rounds for c in faster), default=0)
        return [c for c in faster if c.rounds == most]

    @property
    def fastest(self) -> Candidate | None:
        """Of ``_faster``, the one with the highest median."""
        return max(self._faster(), key=lambda c: c.median, default=None)

    @property
    def best(self) -> Candidate | None:
        """The recipe's candidate, or None: keep the defaults. Of ``_faster``, those alike the fastest one (a median
        within ``ALIKE`` of its: as fast, for a user), the one surest to be fast (the highest low bound): of two alike
        medians, the one whose fresh-process rounds disagreed less. A median further below is not alike, however wide
        the fastest's interval: over two rounds a Student-t interval is 12.7 standard errors each side, and which of
        two intervals has the higher low bound says which one's rounds happened to agree (docs/measurement.md)."""
        return _surest_alike(self._faster())

    @property
    def undecided(self) -> Candidate | None:
        """The candidate its rounds could not decide: over two rounds or more, its median above its bar and its low
        bound not (a Student-t interval over three rounds reaches 4.3 standard errors each side; over two, 12.7),
        where none is offered (``best`` is None), where only one round chose
        the offer and this one's median is above the offer's (the budget's end left a faster recipe's deciding
        round for a lower one's first), or where its median is above the fastest's by more than ``ALIKE`` (a faster
        recipe's interval over two rounds can reach below its bar). Your runs'
        fresh process pairs, none of which chose it, decide it: offered where they confirm it (provisional where the
        budget's end left them too few and nothing else is offered), else the offer stands, stated from its own pairs
        where they ran after (``claim.user_runs``, ``claim.stated``). One candidate is tested, so no other look shares
        the pairs' confidence: of several (two rounds or three alike), as ``best`` chooses among its own, of those
        alike the fastest straddling median the highest low bound (by the low bound alone, a slow recipe whose rounds
        agreed would be tested before a fast one whose rounds did not)."""
        best, fastest = self.best, self.fastest
        floor = 0.0 if best is None or fastest is None else \
            fastest.median * (1 + ALIKE) if best.rounds >= 2 else best.median  # the median it must be above
        straddling = [c for c in self.candidates if c.confirmed is not None and c.failed is None
                      and c.rounds >= DECIDING_ROUNDS
                      and c.median > self.bar(c) and c.low <= self.bar(c) and c.median > floor]
        return _surest_alike(straddling)


def _surest_alike(candidates: list[Candidate]) -> Candidate | None:
    """Of ``candidates``, those alike the fastest (a median within ``ALIKE`` of its), the one surest to be fast: the
    highest low bound; None of none."""
    top = max((c.median for c in candidates), default=0.0)
    return max((c for c in candidates if c.median * (1 + ALIKE) >= top), key=lambda c: (c.low, c.median), default=None)


__all__ = ["ALIKE", "Candidate", "Confirmation", "UserRuns", "confirm_bar", "contenders", "lineup", "offer_bar"]
