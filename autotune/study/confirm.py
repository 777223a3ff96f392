"""Confirmation: the top candidates re-measured with fresh pairs before one is declared best.

A search keeps its fastest measurement, and the fastest of many noisy measurements is biased upward (the winner's
curse). So the top ``confirm_top`` feasible recipes (by their search median; not those whose search interval lies
wholly below ``1 + margin``: they could not be offered; ranked as ``lineup`` says) are measured
again against the defaults with FRESH pairs, in ``confirm_rounds`` rounds: each round starts new worker processes (a
new seed for the windows' order) and measures every candidate in them, in an order drawn anew each round (the
ranking decides only who keeps time when it runs short), ``reserve.confirmation_pairs`` pairs each, and adds one
fresh process pair to every environment factor, which that round's factor is made of alone: no measurement of the
search takes part in the confirmed figure (the search's process pairs lend only their spread, the width of one
pair's ratio). An in-process ratio differs from one process to the next, so the rounds are the units: a candidate's
confirmed speedup is the geometric mean of its rounds' medians with a Student-t interval over them, no narrower than
the rounds' own intervals allow (``stats.rounds_interval``); one round is that round's own interval, and the recipe
says so. Only these measurements decide: a recipe is offered when its confirmed speedup's low bound is above ``1 +
margin`` (``Confirmation.best``; over two rounds or more the margin is ``MIN_MARGIN``, as their spread carries each
worker's arm difference: ``measure.span_margin``); otherwise the defaults are kept, and the report says why, unless
a candidate's rounds straddle its bar with their median above it: your runs' fresh pairs decide that one
(``Confirmation.undecided``, ``claim.UNDECIDED``), also before an offer whose median is lower (one round's; or
by ``confirmation.ALIKE`` an offer of two rounds or more, where the budget holds both claims). Each
round is a trial of the study with role ``confirm`` (user attributes ``confirms``: the trial it re-measures,
``round``), so a resumed search keeps them and measures only what is missing.

The search loop keeps time for them in the budget (``autotune.study.budget.reserve_s``, from the measured pair
times; fewer rounds where all and the claim would take more than 60% of the budget, ``reserve.kept_rounds``); when
the budget still runs short, the candidates ranked above keep the time of their later rounds up to those, as many
as the time left holds in rank order (``Rounds.fitting``), and a lower one that does not fit beside them is left
out of the rest (confirmed over the rounds it had), and the report says so. From its third round on, a candidate
whose interval over its rounds so far lies wholly below the leader's (the highest low bound) is left out of the
later rounds: it could not be chosen. Only intervals of two rounds or more take part (one round's interval does
not see the variation between processes), and each of these looks is taken at ``race.looks_confidence`` of the
rounds' looks, so by Bonferroni's inequality the chance that any look drops a candidate wrongly is at most
``1 - CONFIDENCE`` (``_race``).
"""
from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from ..measure import CONFIDENCE, MIN_MARGIN, Interval, environment_key, own_copies, rounds_interval
from ..recipe import format_speedup
from ..trial.lock import LockBusy, host_lock
from ..trial.spec import Status, TrialResult
from . import reserve
from .claim import decides, user_runs
from .confirmation import Candidate, Confirmation, confirm_bar, contenders, lineup, offer_bar
from .liveness import claim
from .loop import SearchLoop
from .race import looks_confidence
from .records import (
    CONFIRM,
    MEASURED,
    Attr,
    TrialRecord,
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
    baseline, top = lineup(loop.study, options.confirm_top, options.confirm_rounds)
    if baseline is None:
        return None  # the search checks for a baseline before it confirms
    started = loop.budget.now()
    rounds = Rounds(loop, top, _earlier(loop.study), max(1, options.confirm_rounds))
    note = None if top else "no feasible recipe besides the defaults could be faster by the margin: nothing to confirm"
    # A continued study whose trials were all measured before: this search's workers were never calibrated.
    if rounds.missing() and not loop.calibrated():
        note, rounds.count = f"not measured: {loop.baseline_error}", 0
    rounds.run()
    confirmed = sorted((rounds.candidate(r) for r in top),
                       key=lambda c: (c.failed is not None, c.confirmed is None, -c.median))
    margin = loop.noise.margin if loop.noise is not None else MIN_MARGIN
    confirmation = Confirmation(Candidate(baseline.number, baseline.role, baseline.params, 1.0, baseline.result),
                                tuple(confirmed), rounds.note(note), rounds.made, loop.budget.now() - started, margin)
    return user_runs(loop, confirmation)  # with what the recipe states, if it offers one


class Rounds:
    """The confirmation rounds of ``top`` (the candidates, best first): what each round measures, the time its
    later rounds need, and which candidates were left out and why. ``done``: the rounds measured so far, by
    recipe and round (an earlier search's among them)."""

    def __init__(self, loop: SearchLoop, top: list[TrialRecord], done: dict[tuple[str, int], TrialResult],
                 count: int) -> None:
        self.loop, self.top, self.done, self.count = loop, top, done, count
        # the claim's process pairs of your runs come after (``claim.user_runs``): their time is kept once a candidate
        # could be offered or go to your runs (``offers``), and from a round below another's later rounds where one of
        # them may make it so (``measure``); before, a round may use it (kept while nothing can be offered, it would
        # leave candidates out for time that then goes unused)
        self.claim_s = reserve.claim_s(loop.study, loop.options)
        self.decides = decides(loop)  # whether your runs can decide a candidate the rounds cannot
        self.margin = loop.noise.margin if loop.noise is not None else MIN_MARGIN
        self.floors = reserve.floors(loop.study)  # each environment's part of a round, at least as the search measured
        self.kept = min(count, reserve.kept_rounds(loop.study, loop.options))  # the rounds the search kept time for
        self.spent: set[tuple[str, int]] = set()  # (environment, round): its part of that round paid
        self.cut: list[str] = []  # candidates left out of their later rounds for time
        # the search keeps time for the rounds of its contenders only (``reserve.reserve_s``): with none, a candidate
        # left out was never kept time for, and "the budget was short" would blame the budget for a reading
        self.bar = confirm_bar(loop.study, loop.options.confirm_rounds)
        self.unkept = not contenders(top, self.bar)
        self.stopped: list[str] = []  # rounds the budget's end cut short: not used, and no failure of the candidate
        self.took: dict[str, float] = {}  # each candidate's longest completed round, its own part: the next one's price
        self.starts: dict[str, float] = {}  # each environment's longest worker start a round paid (once a round)
        self.left_out: set[str] = set()  # out of the later rounds: for time, or below the leader (``_race``)
        self.outpaced: list[str] = []  # candidates left out of their later rounds: below the leader with confidence
        self.made = 0

    def missing(self) -> bool:
        return any((params_key(e.params), r) not in self.done for e in self.top for r in range(self.count))

    def run(self) -> None:
        for round_ in range(self.count):
            # A candidate whose confirmation failed in an earlier round is out of the contest: not measured again.
            alive = [e for e in self.top if params_key(e.params) not in self.left_out
                     and all(self.done.get((params_key(e.params), r), _OK).status == Status.OK for r in range(round_))]
            raced = _race(alive, self.done, round_, self.count, self.outpaced)
            self.left_out.update(params_key(e.params) for e in alive if e not in raced)  # out of every later round
            missing = [e for e in raced if (params_key(e.params), round_) not in self.done]
            if missing:  # fresh workers, window orders, and one more fresh process pair a factor, each round
                self.loop.measurer.reseed(self.loop.options.seed + 7919 + round_)
            # in an order drawn again each round: a worker's speed drifts with its age (1.45x to 1.95x in a lab
            # note), and a fixed order would give the first-ranked the same moment of every round
            random.Random(self.loop.options.seed * 7919 + round_).shuffle(missing)
            for entry in missing:
                self.measure(entry, round_, raced)

    def measure(self, entry: TrialRecord, round_: int, alive: list[TrialRecord]) -> None:
        """``entry``'s round ``round_``, unless its time is the rounds still to come of the candidates ranked above
        it (``alive``, best first; their rounds of ``round_`` too where not measured yet; those the time left holds,
        ``fitting``), or the claim's beside them where this round or one of theirs may make a candidate your runs
        follow (``may_offer``)."""
        loop = self.loop
        ahead = [e for e in alive[:alive.index(entry)] if params_key(e.params) not in self.left_out]
        # theirs from this round on where the shuffled order has not measured them in it yet, up to the rounds the
        # search kept time for (``reserve.kept_rounds``): past those, a round confirms a lower one before a later
        # round of one above
        later = [(e, r) for e in ahead for r in range(
            round_ if (params_key(e.params), round_) not in self.done else round_ + 1, max(round_ + 1, self.kept))]
        # the claim's time is held once a candidate could be offered (``offers``), and beside the later rounds of those
        # above where this round or one of theirs may make it so: taken by this round, the claim's time, held from
        # then on, would take theirs
        waiting = [entry, *{e.number: e for e, _ in later}.values()] if later else []
        held = self.claim_s if self.offers() or any(map(self.may_offer, waiting)) else 0.0
        needed = self.needed_s([(entry, round_), *self.fitting(later, loop.budget.left() - held)])
        if loop.budget.left() - held < max(1.0, needed):
            self.left_out.add(params_key(entry.params))
            self.cut.append(f"trial {entry.number} from round {round_ + 1} of {self.count} on")
            return
        try:
            with host_lock(wait_s=max(1.0, loop.budget.left() - held)):
                trial = new_trial(loop, entry.number, round_)
                remaining = loop.budget.left() - held
                # its own limit, from its measured times: a round stopped there stopped answering; one the budget's end
                # stopped before it is cut (``limits.judged``), and the rounds that completed decide
                limit = max(60.0, 3 * reserve.round_s(entry.result, loop.noise, loop.options, round_),
                            3 * self.took.get(params_key(entry.params), 0.0))
                timeout = max(1.0, min(remaining, limit))
                result = loop.run_one(trial, CONFIRM, entry.params, timeout, own_s=limit)
                self.done[(params_key(entry.params), round_)] = result
        except LockBusy:  # another search holds the host's trial lock past the time this round had
            self.left_out.add(params_key(entry.params))
            self.cut.append(f"trial {entry.number} from round {round_ + 1} of {self.count} on (the host's trial "
                            "lock was held)")
            return
        if result.status == Status.CUT:
            self.stopped.append(f"trial {entry.number}'s round {round_ + 1} of {self.count}")
            self.left_out.add(params_key(entry.params))
        elif result.status == Status.OK:  # a worker's start it paid is its environment's part, paid once a round
            key, env = params_key(entry.params), environment_key(entry.params)
            start = 0.0 if own_copies(result) else result.startup_s or 0.0
            self.took[key] = max(self.took.get(key, 0.0), result.wall_s - start)
            self.starts[env] = max(self.starts.get(env, 0.0), start)
        self.spent.add((environment_key(entry.params), round_))
        self.made += 1

    def offers(self) -> bool:
        """Whether your runs would follow the rounds so far: a candidate could be offered (its interval's low bound
        above its bar, ``Confirmation.bar``) or, over two rounds or more, its median is above it (your runs decide
        it: ``Confirmation.undecided``)."""
        return any(c.low > offer_bar(self.margin, c.rounds) or (
            self.decides and c.rounds >= 2 and c.failed is None and c.median > offer_bar(self.margin, c.rounds))
                   for c in map(self.candidate, self.top))

    def may_offer(self, entry: TrialRecord) -> bool:
        """Whether ``entry``'s next round more likely than not makes it a candidate your runs follow (``offers``):
        over two rounds, where your runs decide, its median above their bar (its rounds' median so far the guess);
        else its low bound above its bar (its rounds' so far, before its first round its search low bound)."""
        mine = self.candidate(entry)
        if mine.rounds >= self.count:
            return False  # no round of it is left
        bar = offer_bar(self.margin, mine.rounds + 1)
        if mine.rounds and self.decides:
            return mine.median > bar
        return (mine.low if mine.rounds else entry.result.speedup_low or 0.0) > bar

    def fitting(self, rounds: list[tuple[TrialRecord, int]], room: float) -> list[tuple[TrialRecord, int]]:
        """Of ``rounds`` (those still to come of the candidates ranked above, best first, each by round), those
        ``room`` holds as ``measure`` gives way: each candidate's in turn while they fit beside those of the ones
        above it, none of its rounds after one that does not (it would be left out of the rest). A round that
        cannot fit keeps no time from a lower candidate's: kept for it, the time would be lost to both."""
        kept: list[tuple[TrialRecord, int]] = []
        for _, mine in itertools.groupby(rounds, key=lambda pair: pair[0].number):
            for pair in mine:
                if max(1.0, self.needed_s([*kept, pair])) > room:  # as ``measure`` asks
                    break
                kept.append(pair)
        return kept

    def needed_s(self, entries: list[tuple[TrialRecord, int]]) -> float:
        """The rounds ``(candidate, round)`` of ``entries`` (``reserve.rounds_s``), an environment's part none where
        it was paid already in that round; at least what their candidates' completed rounds took (a round is not
        started where its candidate's last one shows it cannot end in the time left; one of a candidate not
        measured yet, its own part as estimated), each its own part and each environment's start once a round where
        not paid yet: a candidate measured after another of its environment in a round starts no worker, and priced
        with the start its earlier round paid, the fastest was left out."""
        estimate = reserve.rounds_s([(e.result, environment_key(e.params), r) for e, r in entries], self.loop.noise,
                                   self.loop.options, paid=self.spent, floors=self.floors)
        unpaid = {(environment_key(e.params), r) for e, r in entries} - self.spent
        # summed whole, the estimates fall below one measured round, and a round not measured yet would count nothing
        own = sum(self.took.get(params_key(e.params))
                  or reserve.round_parts(e.result, self.loop.noise, self.loop.options, r)[0] for e, r in entries)
        return max(estimate, own + sum(self.starts.get(env, 0.0) for env, _ in unpaid))

    def note(self, note: str | None) -> str | None:
        """What the user reads of the rounds left out, after ``note``."""
        if self.cut and self.unkept:
            note = (f"no candidate read above {self.bar:.2f}x in the search, so no time was kept for its rounds: "
                    f"{', '.join(self.cut)} left out")
        elif self.cut:
            note = (f"the budget was short: {', '.join(self.cut)} left out (each round in fresh processes; the "
                    "candidates ranked above kept those of their later rounds the time left held)")
        if self.outpaced:
            note = "; ".join(filter(None, [note, f"{', '.join(self.outpaced)}: not measured further"]))
        if self.stopped:
            note = "; ".join(filter(None, [note, f"{', '.join(self.stopped)} cut by the budget's end (the search's "
                                                 "time, not the candidate's failure): not used, the completed rounds "
                                                 "decide"]))
        return note

    def candidate(self, record: TrialRecord) -> Candidate:
        """``record``'s confirmation over the rounds it completed (one skipped or cut for time is not a failure of
        the recipe)."""
        rounds = [self.done[k] for k in sorted(self.done) if k[0] == params_key(record.params)
                  and self.done[k].status not in (Status.SKIPPED, Status.CUT)]
        failed = next((f"{r.status}: {r.error}" for r in rounds if r.status != Status.OK), None)
        confirmed = combine_rounds(rounds) if rounds and failed is None else None
        return Candidate(record.number, record.role, record.params, record.result.objective or 0.0,
                         confirmed, failed, len(rounds))


def _race(alive: list[TrialRecord], done: dict[tuple[str, int], TrialResult], round_: int, count: int,
          outpaced: list[str]) -> list[TrialRecord]:
    """The candidates still in the contest before ``round_`` of ``count``: from the third round on, one whose
    interval over the rounds it had lies wholly below the leader's (the highest low bound) could not be chosen,
    and is left out of the later rounds (named in ``outpaced``). The looks are before rounds 3 to ``count``, each
    at ``looks_confidence`` of their number (``rounds_interval``: a Student-t interval over the rounds)."""
    if round_ < 2:
        return alive  # one round's interval is its in-process pairs' alone: it does not see another process
    confidence = looks_confidence(count - 2)
    so_far = {e.number: rounds_interval([_interval(done[(params_key(e.params), r)]) for r in range(round_)],
                                        confidence)
              for e in alive if all((params_key(e.params), r) in done for r in range(round_))}
    if not so_far:
        return alive
    leader = max(so_far, key=lambda n: so_far[n].low)
    floor = so_far[leader].low
    kept = []
    for entry in alive:
        mine = so_far.get(entry.number)
        if mine is None or entry.number == leader or mine.high >= floor:
            kept.append(entry)
            continue
        said = format_speedup(mine.median, mine.low, mine.high)
        outpaced.append(f"trial {entry.number} after round {round_} ({said} over {round_} rounds at "
                        f"{confidence:.1%}, below trial {leader}'s low bound {floor:.2f}x)")
    return kept


def _interval(result: TrialResult) -> Interval:
    """A round's interval at the coverage its method reached (a round stored before it was recorded: the 95% asked)."""
    return Interval(result.objective or 0.0, result.speedup_low or 0.0, result.speedup_high or 0.0,
                    result.confidence or CONFIDENCE, result.pairs or 0)


def combine_rounds(rounds: list[TrialResult]) -> TrialResult:
    """One confirmed measurement from a candidate's rounds (each in fresh processes, with pairs of its own): the
    speedup and its interval across them (``stats.rounds_interval``), the window pairs and times summed, the
    rest the last one's (the rates: the rounds' medians)."""
    combined = rounds_interval([_interval(r) for r in rounds])
    last = rounds[-1]

    def total(field: str) -> float:
        return sum(getattr(r, field) or 0.0 for r in rounds)

    def median(field: str) -> float | None:
        values = [getattr(r, field) for r in rounds if getattr(r, field) is not None]
        return statistics.median(values) if values else None

    return replace(last, objective=combined.median, samples_per_s=median("samples_per_s"),
                   baseline_samples_per_s=median("baseline_samples_per_s"), speedup_low=combined.low,
                   speedup_high=combined.high, confidence=combined.confidence,
                   pairs=sum(r.pairs or 0 for r in rounds), wall_s=total("wall_s"), timed_s=total("timed_s"),
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
    claim(trial, CONFIRM, frozen.user_attrs[Attr.PARAMS])
    return trial


__all__ = ["Rounds", "combine_rounds", "confirm", "new_trial"]
