"""From a study's recorded trials to the recipe: feasible, and faster than the defaults with confidence.

Every value is a speedup over the defaults with its interval (``autotune.measure.live.measurer``). With a
confirmation, only its fresh pairs decide (``Confirmation.best``: the low bound above ``1 + margin``), also when it
confirmed nothing (no round completed: the defaults are kept, and the note says why); without one (``--confirm 0``),
the fastest feasible trial's own interval must clear the same bar. Otherwise the recipe keeps the defaults, and a
note says why ("best candidate 1.04x [0.98-1.10]: not faster with confidence"). The recipe's ``claim`` says which
of these its speedup stands on (``recipe.CLAIMS``): a winner of one confirmation round is ``provisional``, never
``confirmed``; a candidate the rounds could not decide (``Confirmation.undecided``) is offered where your runs read
it faster with confidence (or, where the budget's end left them too few and nothing else is offered, read it so over
those), provisional either way: those pairs decided it (``claim.stated``); where they do not, the offer is stated
from its own pairs, or where none ran, as its rounds read it, provisional.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..errors import TrialError
from ..recipe import Recipe, format_speedup
from ..trial.spec import EVALUATED, EVALUATED_HIGHER, TRAINING_LOSS, Status, TrialResult
from . import roofline
from .claim import UNDECIDED, stated
from .confirmation import ALIKE, Confirmation
from .guard import CANNOT_RESOLVE
from .records import (
    BASELINE,
    CONFIRM,
    NOT_RUN,
    Attr,
    StudyAttr,
    TrialRecord,
    records,
    study_margin,
)
from .verdict import loss_source

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts


def choose_recipe(
    study: optuna.Study, workload: str, facts: Facts, name: str, confirmation: Confirmation | None = None,
    searching: tuple[float, float] | None = None,
) -> tuple[Recipe, TrialRecord, TrialRecord, list[TrialRecord]]:
    """The recipe (with baseline and best records): the confirmed candidate whose speedup's low bound is above
    ``1 + margin``, else (no confirmation) the fastest feasible trial under the same rule, else the defaults; the
    confirmation's choice states what its process pairs of your training read (``claim.stated``), where they ran.
    ``searching``: this search's seconds from the calibration's end to the confirmation's start and the timed ones
    among them (``SearchLoop.searching``), for the time note."""
    all_records = records(study)
    searched = [r for r in all_records if r.role != CONFIRM]
    baselines = [r for r in searched if r.role == BASELINE and r.result.status == Status.OK]
    if not baselines:
        raise TrialError("the study has no completed baseline trial")
    baseline = baselines[0]
    notes: list[str] = []
    margin = confirmation.margin if confirmation is not None else study_margin(study)
    yours: dict[str, Any] = {}
    if confirmation is not None:  # only the confirmation decides: never the search's in-process interval
        best, measured, claim = _confirmed(confirmation, searched, baseline, notes)
        user, offer = confirmation.user, confirmation.best
        if user is not None and best is not baseline and best.number == user.number:
            # where your runs do not confirm the candidate its rounds could not decide, the offer stands
            instead = offer if claim == UNDECIDED and offer is not None else None
            otherwise = "the recipe keeps the defaults"
            if instead is not None:
                rounds = "one confirmation round" if instead.rounds == 1 else f"{instead.rounds} confirmation rounds"
                otherwise = f"the recipe offers trial {instead.number} on its {rounds}"
            said, claim, yours = stated(claim, measured, user, margin, notes, otherwise, beside_offer=bool(instead))
            if said is not None:
                measured = said
            elif instead is not None:
                best, measured, _ = _offered(confirmation, searched, notes)
                claim = "provisional"  # none of its own pairs ran: its rounds alone never state "confirmed"
                notes.append(f"not measured in processes of your training (your runs tested trial {user.number}): "
                             f"the stated interval is trial {best.number}'s confirmation in the search's workers; "
                             f"the recipe is {claim}")
            else:
                best, measured = baseline, baseline.result
    else:
        best, measured = _single(searched, baseline, margin, notes)
        claim = "defaults" if best is baseline else "search"
    rejected = [r for r in searched if r.result.status == Status.OK and not r.feasible]
    worse = sum(1 for r in rejected if "quality" in r.rejected_by)
    source = loss_source(baseline.result.loss_source, workload)
    if worse:
        after = f" after {baseline.result.loss_samples} samples" if baseline.result.loss_samples else ""
        unresolved = sum(1 for r in rejected if "quality" in r.rejected_by and CANNOT_RESOLVE in (r.reason or ""))
        of_them = f"; {unresolved} of them as it could not resolve its limit on this workload" if unresolved else ""
        notes.append(f"{worse} trial(s) rejected by the quality guard ({_guarded(source)}{after} beyond the "
                     f"limit{of_them})")
    if source == TRAINING_LOSS:
        notes.append("quality guard: the training loss the script told (it gives no held-out figure: "
                     "tuned.evaluate(fn) in a loop of yours, evaluation in a Trainer's arguments)")
    elif source in (EVALUATED, EVALUATED_HIGHER):
        higher = " (higher is better)" if source == EVALUATED_HIGHER else ""
        notes.append(f"quality guard: the held-out figure your evaluate() gave{higher}, shown as the loss")
    second = study.get_trials(deepcopy=False)[best.number].user_attrs.get(Attr.GUARD) if best is not baseline else None
    if second:
        notes.append(f"quality guard, near its limit: {second}")
    unapplied = sum(1 for r in rejected if "applied" in r.rejected_by)
    if unapplied:
        notes.append(f"{unapplied} trial(s) rejected: a knob they asked for was not in effect in the trial process")
    for knob, why in (study.user_attrs.get(StudyAttr.SCRIPT_OWNS) or {}).items():
        notes.append(f"{knob} left out of the search: {why}")
    for dtype, why in (study.user_attrs.get(StudyAttr.NOT_SEEDED) or {}).items():
        notes.append(f"{dtype} not seeded: {why}")
    notes.append(time_note(all_records, searching))
    notes += filter(None, [defaults_note(all_records)])
    peak = best.result.peak_memory_bytes  # CUDA: the 90% warning rides with the recipe
    notes += filter(None, [spaces.batch.memory_warning(peak, best.result.in_effect.get("device_memory_bytes"))])
    flop, matmul = roofline.of(study)
    recipe = Recipe(params=best.params, workload=workload, fingerprint=facts.fingerprint, study=name,
                    loss=best.result.loss, baseline_loss=baseline.result.loss, notes=notes, peak_memory_bytes=peak,
                    flop_per_sample=flop, matmul_gflops=matmul, claim=claim, **yours,
                    **_speeds(best is baseline, measured, baseline.result))
    return recipe, baseline, best, all_records


# Notes on how the stated figures were measured (each candidate's rounds and the race's, the chosen one's claim and
# your runs, where the time went, the defaults' speeds): the summary's claim and noise lines carry what a user acts
# on; ``autotune best`` prints them all.
_HOW = re.compile(r"^(trial \d+: .* in the search, |best \(trial \d+\) (confirmed|provisional) at |timed |"
                  r"your runs \(trial \d+, |your runs: (the defaults' processes ran at |their spread pooled )|"
                  r"trial \d+ chosen over trial \d+ |the defaults ran at |"
                  r"confirmation: (?!the budget was short|no candidate read above))")


def how_measured(note: str) -> bool:
    """Whether ``note`` tells how the stated figures were measured rather than a problem or a decision to act on.

    >>> how_measured("timed 61 s of 207 s in 3 trial(s) (30%)"), how_measured("confirmation: the budget was short")
    (True, False)
    """
    return bool(_HOW.match(note))


def _speeds(defaults: bool, measured: TrialResult, baseline: TrialResult) -> dict[str, Any]:
    """The recipe's speed fields from one measurement. The defaults' samples/s is measured, never derived from the
    speedup: their windows beside the recipe's, or else the baseline trial's (the calibration). The speedup, a
    median of per-pair ratios amortised, need not be the quotient of the two rates."""
    if defaults:
        rate = baseline.samples_per_s
        return dict(samples_per_s=rate, baseline_samples_per_s=rate, speedup=1.0)
    speedup = measured.objective or 1.0
    rate = measured.samples_per_s
    beside = measured.baseline_samples_per_s
    return dict(samples_per_s=rate, baseline_samples_per_s=beside if beside is not None else baseline.samples_per_s,
                speedup=speedup, speedup_low=measured.speedup_low, speedup_high=measured.speedup_high,
                confidence=measured.confidence)


def interval(result: TrialResult) -> str:
    """``1.23x [1.15-1.31]``"""
    return format_speedup(result.objective or 0.0, result.speedup_low, result.speedup_high)


def _confirmed(confirmation: Confirmation, searched: list[TrialRecord], baseline: TrialRecord,
               notes: list[str]) -> tuple[TrialRecord, TrialResult, str]:
    """The confirmation's choice, its measurement and its claim (``Candidate.claim``, ``UNDECIDED`` where your runs
    decide it, or ``defaults``)."""
    winner = confirmation.best
    if confirmation.note:
        notes.append(f"confirmation: {confirmation.note}")
    for c in confirmation.candidates:
        if c.failed:
            notes.append(f"trial {c.number} failed its confirmation ({c.failed}): not offered")
        elif c.confirmed is not None:  # "confirmed" is said of the choice alone: a candidate not offered was not
            notes.append(f"trial {c.number}: {c.first:.2f}x in the search, measured again at {c.interval()} "
                         + rounds_said(c.rounds, c.pairs))
    undecided, user, tested = confirmation.undecided, confirmation.user, confirmation.tested
    if undecided is not None and undecided.confirmed is not None and user is not None \
            and undecided.number in (user.number, tested.number if tested is not None else None):
        above = ""
        if winner is not None:
            of = "one round" if winner.rounds == 1 else f"{winner.rounds} rounds, by more than {ALIKE:.0%}"
            above = f", and above trial {winner.number}'s {winner.median:.2f}x of {of}"
        notes.append(f"trial {undecided.number}'s rounds could not decide it (its low bound not above "
                     f"{confirmation.bar(undecided):.2f}x, its median above{above}): your runs decide it")
        if tested is None:
            return next(r for r in searched if r.number == undecided.number), undecided.confirmed, UNDECIDED
        assert winner is not None  # your runs tested it first where there is an offer (``claim.user_runs``)
        stated(UNDECIDED, undecided.confirmed, tested, confirmation.margin, notes,
               f"the recipe offers trial {winner.number}, stated from its own pairs", beside_offer=True)
    if winner is None or winner.confirmed is None:
        contender = next((c for c in confirmation.candidates if c.confirmed is not None), None)
        if contender is not None:
            notes.append(f"best candidate (trial {contender.number}) {contender.interval()}: not faster with "
                         f"confidence (its low bound must be above {confirmation.bar(contender):.2f}x): "
                         "the recipe keeps the defaults")
        elif confirmation.candidates:
            notes.append("no candidate completed a confirmation round: the recipe keeps the defaults (the search's "
                         "own intervals are never offered where a confirmation was asked)")
        elif any(r.feasible and r.role != BASELINE for r in searched):
            notes.append("the recipe keeps the defaults")  # the confirmation's note says why nothing was confirmed
        else:
            notes.append("no feasible recipe besides the defaults: the recipe keeps the defaults")
        return baseline, baseline.result, "defaults"
    return _offered(confirmation, searched, notes)


def _offered(confirmation: Confirmation, searched: list[TrialRecord],
             notes: list[str]) -> tuple[TrialRecord, TrialResult, str]:
    """``Confirmation.best`` (not None), its measurement and its claim, with the notes that say how it was chosen."""
    winner = confirmation.best
    assert winner is not None and winner.confirmed is not None
    record = next(r for r in searched if r.number == winner.number)
    fastest = confirmation.fastest
    if fastest is not None and fastest.number != winner.number:
        notes.append(f"trial {winner.number} chosen over trial {fastest.number} ({fastest.interval()}): as fast "
                     f"(its median within {ALIKE:.0%} of the fastest's), with the higher low bound")
    if winner.claim == "confirmed":
        notes.append(f"best (trial {winner.number}) confirmed at {winner.interval()} over PyTorch defaults")
    else:
        notes.append(f"best (trial {winner.number}) provisional at {winner.interval()} over PyTorch defaults (one "
                     "confirmation round: not confirmed)")
    return record, winner.confirmed, winner.claim


def rounds_said(rounds: int, pairs: int) -> str:
    """How a confirmed interval was made, in the words its method allows."""
    if rounds == 1:
        return (f"in one round of fresh processes ({pairs} window pairs): that round's interval alone, which does "
                "not take in how a speedup varies from one process to the next")
    return (f"over {rounds} rounds of fresh processes ({pairs} window pairs): a Student-t interval over the "
            "rounds' medians")


def _single(searched: list[TrialRecord], baseline: TrialRecord, margin: float,
            notes: list[str]) -> tuple[TrialRecord, TrialResult]:
    feasible = [r for r in searched if r.feasible and r.role != BASELINE]
    notes.append("not confirmed with fresh pairs (confirmation off): the search's own intervals")
    best = max(feasible, key=lambda r: r.result.objective or 0.0, default=None)
    if best is None:
        notes.append("no feasible recipe besides the defaults: the recipe keeps the defaults")
        return baseline, baseline.result
    if (best.result.speedup_low or 0.0) <= 1 + margin:
        notes.append(f"best candidate (trial {best.number}) {interval(best.result)}: not faster with confidence "
                     f"(its low bound must be above {1 + margin:.2f}x): the recipe keeps the defaults")
        return baseline, baseline.result
    return best, best.result


def time_spent(all_records: list[TrialRecord], searching: tuple[float, float] | None = None) -> dict[str, float]:
    """Where the trials' time went, in seconds: ``timed`` (windows), ``calibration`` (the baseline trial's A/A
    outside its windows), ``startup`` (worker and process starts, environment factors outside their windows),
    ``warmup`` (building arms, compiling, warm-up steps), ``evaluation`` (the rest: losses, dropping arms); with
    ``searching``, this search's ``searching`` seconds from the calibration's end to the confirmation's start (the
    time between trials too) and the candidates' ``searching_timed`` windows among them."""
    def total(field: str, rows: list[TrialRecord]) -> float:
        return sum(getattr(r.result, field) or 0.0 for r in rows)

    base = [r for r in all_records if r.role == BASELINE]
    others = [r for r in all_records if r.role != BASELINE]
    wall, timed = total("wall_s", all_records), total("timed_s", all_records)
    startup, warmup = total("startup_s", others), total("warmup_s", others)
    calibration = max(0.0, total("wall_s", base) - total("timed_s", base))
    return {"wall": wall, "timed": timed, "calibration": calibration, "startup": startup, "warmup": warmup,
            "evaluation": max(0.0, wall - timed - calibration - startup - warmup),
            "confirmation": total("wall_s", [r for r in all_records if r.role == CONFIRM]),
            **({"searching": searching[0], "searching_timed": searching[1]} if searching is not None else {})}


def time_note(all_records: list[TrialRecord], searching: tuple[float, float] | None = None) -> str:
    """``timed X s of Y s (Z%)``, where the rest went, and with ``searching`` the search's share (``time_spent``)."""
    t = time_spent(all_records, searching)
    share = t["timed"] / t["wall"] if t["wall"] else 0.0
    ran = sum(1 for r in all_records if r.result.status not in NOT_RUN)
    return (f"timed {t['timed']:.0f} s of {t['wall']:.0f} s in {ran} trial(s) ({share:.0%}); "
            f"the rest: calibration {t['calibration']:.0f} s, start-up {t['startup']:.0f} s, "
            f"warm-up/compile {t['warmup']:.0f} s, evaluation {t['evaluation']:.0f} s; "
            f"confirmation {t['confirmation']:.0f} s of the whole"
            + (f"; from the calibration's end to the confirmation's start, {searching[1]:.0f} s of "
               f"{searching[0]:.0f} s timed ({searching[1] / searching[0]:.0%})"
               if searching is not None and searching[0] > 0 else ""))


def defaults_note(all_records: list[TrialRecord]) -> str | None:
    """How fast the defaults ran across the search's trials (each trial's median of the defaults' windows), or
    None with fewer than three: a speedup is the one of the machine's state while it was measured, and a shared
    VM's state moves (an input-bound script's defaults ran 1.42x apart within one search, its recipe's did not).

    >>> from types import SimpleNamespace as R
    >>> rows = [R(role="baseline", result=TrialResult(Status.OK, samples_per_s=6496.0))] + [
    ...     R(role="search", result=TrialResult(Status.OK, baseline_samples_per_s=v)) for v in (4571.0, 6086.0)]
    >>> defaults_note(rows)  # doctest: +NORMALIZE_WHITESPACE
    "the defaults ran at 4,571-6,496 samples/s across 3 trials (1.42x apart, each trial's median): a speedup here
    is the one of the machine as it was while it was measured"
    """
    told = [r.result.samples_per_s if r.role == BASELINE else r.result.baseline_samples_per_s
            for r in all_records if r.result.status == Status.OK]
    rates = [v for v in told if v]
    if len(rates) < 3:
        return None
    low, high = min(rates), max(rates)
    return (f"the defaults ran at {low:,.0f}-{high:,.0f} samples/s across {len(rates)} trials ({high / low:.2f}x "
            "apart, each trial's median): a speedup here is the one of the machine as it was while it was measured")


__all__ = ["choose_recipe", "defaults_note", "how_measured", "interval", "time_note", "time_spent"]


def _guarded(source: str | None) -> str:
    """What the quality guard compared: the workload's held-out loss, a script's training loss or its own figure."""
    if source == TRAINING_LOSS:
        return "training loss the script told"
    if source in (EVALUATED, EVALUATED_HIGHER):
        return "the held-out figure your evaluate() gave"
    return "held-out loss"
