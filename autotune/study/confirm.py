"""Confirmation: the top candidates re-measured with fresh pairs before one is declared best.

A search keeps its fastest measurement, and the fastest of many noisy measurements is biased upward (the
winner's curse). So the top ``confirm_top`` feasible recipes (by their search median; not those whose search
interval lies wholly below ``1 + margin``: they could not be offered) are measured again against the defaults
with FRESH pairs, in ``confirm_rounds`` rounds: each round starts new worker processes (a new seed for the
windows' order) and measures every candidate in them, ``budget.confirmation_pairs`` pairs each, and adds one
fresh process pair to every environment factor (pooled with the search's: a process pair is always two new
processes). An in-process ratio differs from one process to the next (bf16 + channels_last on the CNN:
1.56-2.02x; one process's ratio missed the user's own, from fresh processes, by up to 18%), so a candidate's
confirmed speedup is the geometric mean of its rounds, its interval the wider of theirs and the spread between
them (``stats.across_processes_interval``). Only these measurements decide: a recipe is offered when its
confirmed speedup's low bound is above ``1 + margin`` (``Confirmation.best``); otherwise the defaults are
kept, and the report says why. Each round is a trial of the study with role ``confirm`` (user attributes
``confirms``: the trial it re-measures, ``round``), so a resumed search keeps them and measures only what is
missing.

The search loop keeps time for them in the budget (``autotune.study.budget.reserve_s``, from the measured pair
times); when the budget still runs short, the candidates ranked above keep the time of their later rounds, a
lower one that does not fit beside them is left out of the rest (confirmed over the rounds it had), and the
report says so. A candidate whose interval over its rounds so far lies wholly below the leader's (the highest
low bound) is left out of the later rounds too: it could not be chosen; and one whose search interval lies
wholly below the low bound a candidate ranked above it was confirmed at in round 1 is not measured at all
(``_below_confirmed``).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..measure import CONFIDENCE, MIN_MARGIN, Interval, across_processes_interval, environment_key
from ..recipe import format_speedup
from ..trial.lock import host_lock
from ..trial.spec import Status, TrialResult
from . import budget
from .loop import SearchLoop
from .records import (
    CONFIRM,
    MEASURED,
    Attr,
    Candidate,
    Confirmation,
    TrialRecord,
    lineup,
    optuna_storage,
    params_key,
    records,
)

if TYPE_CHECKING:
    import optuna


_OK = TrialResult(Status.OK)


def _earlier(study: optuna.Study) -> dict[tuple[str, int], TrialResult]:
    """Confirmation rounds already in the study (an earlier, perhaps interrupted, search): by recipe and round."""
    return {(params_key(r.params), r.round): r.result for r in records(study)
            if r.role == CONFIRM and r.result.status in MEASURED}  # an interrupted one is simply made again


def confirm(loop: SearchLoop) -> Confirmation | None:
    """Run the confirmation for ``loop``'s study (None when ``confirm_top`` is 0 or there is no baseline)."""
    options = loop.options
    if options.confirm_top <= 0:
        return None
    baseline, top = lineup(loop.study, options.confirm_top)
    if baseline is None:
        return None  # the search checks for a baseline before it confirms
    done = _earlier(loop.study)
    note, made, started = None, 0, time.monotonic()
    if not top:
        note = "no feasible recipe besides the defaults could be faster by the margin: nothing to confirm"
    reseed = getattr(loop.measurer, "reseed", None)  # fresh workers, window orders (and environment factors)
    rounds = max(1, options.confirm_rounds)
    missing_any = any((params_key(e.params), r) not in done for e in top for r in range(rounds))
    # A continued study that had its trials already: this search's workers were never calibrated (seen: every
    # confirmation round then failed, "no calibration").
    if missing_any and not loop.calibrated():
        note, rounds = f"not measured: {loop.baseline_error}", 0

    def round_s(entry: TrialRecord, round_: int) -> float:
        return budget.round_s(entry.result, loop.noise, options, round_)

    def needed_s(entries: list[tuple[TrialRecord, int]], spent: set[tuple[str, int]]) -> float:
        """The rounds ``(candidate, round)`` of ``entries`` (``budget.rounds_s``), an environment's part none where
        ``spent`` says it was paid already: a candidate of the environment measured before it in the round took
        4.3 s where 20 s were counted, and the best recipe lost its later rounds for time while 17 s were left."""
        return budget.rounds_s([(e.result, environment_key(e.params), r) for e, r in entries], loop.noise, options,
                               paid=spent, floors=floors)

    floors = budget.floors(loop.study)  # each environment's part of a round, at least as the search measured it
    spent: set[tuple[str, int]] = set()  # (environment, round): its part of that round paid

    cut: list[str] = []  # candidates left out of their later rounds for time
    left_out: set[str] = set()  # out of the later rounds: for time, or below the leader (``_race``)
    outpaced: list[str] = []  # candidates left out of their later rounds: below the leader with confidence
    for round_ in range(rounds):
        # A candidate whose confirmation failed in an earlier round is out of the contest: not measured again.
        alive = [e for e in top if params_key(e.params) not in left_out
                 and all(done.get((params_key(e.params), r), _OK).status == Status.OK for r in range(round_))]
        raced = _race(alive, done, round_, outpaced)
        left_out.update(params_key(e.params) for e in alive if e not in raced)  # out of every later round
        alive = raced
        missing = [e for e in alive if (params_key(e.params), round_) not in done]
        if reseed is not None and missing:
            reseed(options.seed + 7919 + round_)  # one more fresh process pair a factor, each round
        for entry in missing:
            below = _below_confirmed(entry, alive, done, round_)
            if below is not None:
                left_out.add(params_key(entry.params))
                outpaced.append(below)
                continue
            # The candidates ranked above this one keep the time their later rounds need: one that does not
            # fit beside them is left out (seen: the heuristic's 34 s round, its workers' start, ended a
            # 2-minute demo's confirmation after its first round, the two fastest unconfirmed in the others).
            ahead = alive[:alive.index(entry)]
            needed = needed_s([(entry, round_), *((e, r) for e in ahead for r in range(round_ + 1, rounds))], spent)
            if loop.deadline - time.monotonic() < max(1.0, needed):
                left_out.add(params_key(entry.params))
                cut.append(f"trial {entry.number} from round {round_ + 1} of {rounds} on")
                continue
            with host_lock():
                trial = new_trial(loop, entry.number, round_)
                remaining = loop.deadline - time.monotonic()
                timeout = max(1.0, min(remaining, max(60.0, 3 * round_s(entry, round_))))
                done[(params_key(entry.params), round_)] = loop.run_one(trial, CONFIRM, entry.params, timeout)
            spent.add((environment_key(entry.params), round_))
            made += 1
    if cut:
        note = (f"the budget was short: {', '.join(cut)} left out (each round in fresh processes; the "
                "candidates ranked above kept their rounds)")
    if outpaced:
        note = "; ".join(filter(None, [note, f"{', '.join(outpaced)}: not measured further"]))

    def candidate(record: TrialRecord) -> Candidate:
        rounds = [done[k] for k in sorted(done) if k[0] == params_key(record.params)]
        failed = next((f"{r.status}: {r.error}" for r in rounds if r.status != Status.OK), None)
        confirmed = combine_rounds(rounds) if rounds and failed is None else None
        return Candidate(record.number, record.role, record.params, record.result.objective or 0.0,
                         confirmed, failed, len(rounds))

    confirmed = sorted((candidate(r) for r in top),
                       key=lambda c: (c.failed is not None, c.confirmed is None, -c.median))
    margin = loop.noise.margin if loop.noise is not None else MIN_MARGIN
    return Confirmation(Candidate(baseline.number, baseline.role, baseline.params, 1.0, baseline.result),
                        tuple(confirmed), note, made, time.monotonic() - started, margin)


def _race(alive: list[TrialRecord], done: dict[tuple[str, int], TrialResult], round_: int,
          outpaced: list[str]) -> list[TrialRecord]:
    """The candidates still in the contest before ``round_``: one whose interval over the rounds it had lies
    wholly below the leader's (the highest low bound) could not be chosen, and is left out of the later rounds
    (named in ``outpaced``). In a 5-minute CNN search, rounds 2 and 3 of the heuristic (1.03x [1.01-1.06]) and
    of a 0.89x TPE candidate took 54 s of 284 after round 1 had confirmed channels_last at 1.19x [1.18-1.22]."""
    so_far = {e.number: combine_rounds([done[(params_key(e.params), r)] for r in range(round_)]) for e in alive
              if round_ and all((params_key(e.params), r) in done for r in range(round_))}
    if not so_far:
        return alive
    leader = max(so_far, key=lambda n: so_far[n].speedup_low or 0.0)
    floor = so_far[leader].speedup_low or 0.0
    kept = []
    for entry in alive:
        mine = so_far.get(entry.number)
        if mine is None or entry.number == leader or (mine.speedup_high or 0.0) >= floor:
            kept.append(entry)
            continue
        said = format_speedup(mine.objective or 0.0, mine.speedup_low, mine.speedup_high)
        outpaced.append(f"trial {entry.number} after round {round_} ({said}, below trial {leader}'s "
                        f"low bound {floor:.2f}x)")
    return kept


def _below_confirmed(entry: TrialRecord, alive: list[TrialRecord], done: dict[tuple[str, int], TrialResult],
                     round_: int) -> str | None:
    """Before its first round: whether ``entry``'s search interval lies wholly below the low bound that a
    candidate ranked above it was just confirmed at in this round (fresh processes: not the search's
    winner's-curse figure), with why. The first candidate's confirmation decides whether the others could
    still be chosen; should it fall, they are measured. In a 5-minute CNN search the heuristic's round
    (1.03x [1.00-1.06] in the search) took 97 s, 73 s of it starting process pairs, after channels_last's
    had confirmed 1.19x [1.17-1.25]."""
    if round_ != 0:
        return None  # later rounds: ``_race`` compares the rounds so far
    confirmed = [(done[(params_key(e.params), 0)], e.number) for e in alive[:alive.index(entry)]
                 if (params_key(e.params), 0) in done and done[(params_key(e.params), 0)].status == Status.OK]
    if not confirmed or entry.result.speedup_high is None:
        return None
    leader, number = max(confirmed, key=lambda c: c[0].speedup_low or 0.0)
    floor = leader.speedup_low or 0.0
    if entry.result.speedup_high >= floor:
        return None
    said = format_speedup(entry.result.objective or 0.0, entry.result.speedup_low, entry.result.speedup_high)
    return (f"trial {entry.number} before round 1 (its search: {said}, below trial {number}'s "
            f"low bound {floor:.2f}x in round 1)")


def combine_rounds(rounds: list[TrialResult]) -> TrialResult:
    """One confirmed measurement from a candidate's rounds (each in fresh processes): the speedup and its
    interval across them (``stats.across_processes_interval``), their times summed, the rest the last one's."""
    combined = across_processes_interval([Interval(r.objective or 0.0, r.speedup_low or 0.0, r.speedup_high or 0.0,
                                                   CONFIDENCE, r.pairs or 0) for r in rounds])
    last = rounds[-1]

    def total(field: str) -> float:
        return sum(getattr(r, field) or 0.0 for r in rounds)

    return replace(last, objective=combined.median, speedup_low=combined.low, speedup_high=combined.high,
                   pairs=combined.count, wall_s=total("wall_s"), timed_s=total("timed_s"),
                   startup_s=total("startup_s"), warmup_s=total("warmup_s"),
                   method=f"{last.method}, {len(rounds)} fresh process(es)" if last.method else last.method)


def new_trial(loop: SearchLoop, source: int, round_: int = 0) -> optuna.Trial:
    """A RUNNING trial of the study with the params (and distributions) of trial ``source``, claimed by
    this search. Not asked from the sampler: another worker cannot pop it as an enqueued trial can be."""
    import optuna

    storage, study_id = optuna_storage(loop.study)
    frozen = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, source))
    template = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=frozen.params, distributions=frozen.distributions,
        user_attrs={Attr.ROLE: CONFIRM, Attr.CONFIRMS: source, Attr.ROUND: round_},
    )
    trial = optuna.Trial(loop.study, storage.create_new_trial(study_id, template_trial=template))
    loop.claim(trial, CONFIRM, frozen.user_attrs[Attr.PARAMS])
    return trial


__all__ = ["combine_rounds", "confirm", "new_trial"]
