"""The claim about your runs: after the confirmation chose a recipe, it runs against the defaults in fresh process
pairs started as ``autotune run`` starts your training (``PairedMeasurer.user_pair``, ``measure.runs``), and the
stated speedup, its interval and where one run of yours falls come from these pairs alone: none of them took part
in choosing the recipe, but where the rounds could not decide it (then they decide it, and it is provisional). The
confirmation's rounds (the search's workers, which hold several models and fix their heap) choose; these pairs
state.

What the recipe claims (``recipe.CLAIMS``): ``confirmed`` where two confirmation rounds or more chose it and
``CLAIM_PAIRS`` process pairs or more, none of which chose it, read it faster than the defaults with confidence (the
interval's low bound above ``1 + MIN_MARGIN``: fresh processes, ``measure.span_margin``); ``provisional`` with fewer
of either, each said in a note; the defaults kept where the pairs' mean is not above 1.00x, or where the recipe's
own process of your training failed (at any count of pairs). Without three pairs (a budget too short, a failed pair)
the recipe is provisional and states the confirmation's interval, said as of the search's workers; not where two
pairs or more each read it no faster: then the defaults. Where the rounds offer nothing, or a recipe of a lower
median (one round's; two rounds' or more, by ``confirmation.ALIKE``, where the budget holds both claims:
``_holds_both``), but could not decide a candidate (``Confirmation.undecided``: its interval straddles its bar, its
median above), it runs in your pairs first and is offered only where they read it faster with confidence
(``UNDECIDED``): the one test of fresh pairs, at the claim's confidence, with ``CLAIM_PAIRS`` of them, or fewer
where the budget's end cut them and no offer of the rounds stands beside it; provisional either way (the pairs that
decided it state it); else the defaults, or that recipe, stated from its own pairs where the budget's end holds them
(``Confirmation.tested`` keeps the test's), else as its rounds read it, provisional (``choice.choose_recipe``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..measure import CLAIM_PAIRS, CONFIDENCE, LEAST_CLAIM_PAIRS, PairFailed, RunPair, Runs, span_margin, told_apart
from ..recipe import format_speedup
from . import reserve
from .confirmation import Candidate, Confirmation, UserRuns
from .records import BASELINE, StudyAttr, TrialRecord, finite

if TYPE_CHECKING:
    import optuna

    from ..trial.spec import TrialResult
    from .loop import SearchLoop


UNDECIDED = "undecided"  # the claim passed to ``stated`` for ``Confirmation.undecided``: your runs decide it
CUT = "the budget's end"  # how a ``UserRuns.why`` begins where the budget ended the pairs (``UserRuns.cut``)
EXTRA = 1.2  # a pair past those asked starts where the time left is this many times the longest pair so far


def user_runs(loop: SearchLoop, confirmation: Confirmation) -> Confirmation:
    """``confirmation`` with its claim's process pairs of your training (``Confirmation.user``): its choice's, or
    first the candidate its rounds could not decide (``Confirmation.undecided``), where your runs can decide it;
    where they do not confirm that one and there is a choice, the choice's own pairs follow where the budget's end
    holds ``LEAST_CLAIM_PAIRS`` of them (the first pairs kept as ``Confirmation.tested``); before a choice of two
    rounds or more, the test runs only where the budget holds both claims (``_holds_both``). Unchanged where there
    is no such claim: nothing it would offer, or a measurer that runs no process of yours."""
    best = confirmation.best
    undecided = confirmation.undecided if decides(loop) else None
    if undecided is not None and best is not None and best.rounds >= 2 and not _holds_both(loop):
        undecided = None  # an offer its rounds confirmed is not put at risk of fewer pairs of its own
    winner = undecided or best
    if winner is None or winner.confirmed is None or not loop.measurer.user_processes:
        return confirmation
    found = _pairs(loop, winner, tested=winner is not best)
    if winner is best or best is None or loop.interrupted is not None \
            or stated(UNDECIDED, winner.confirmed, found, confirmation.margin, [], beside_offer=True)[0] is not None:
        return replace(confirmation, user=found)
    price = max(reserve.claim_pair_s(loop.noise) or 0.0, found.runs.wall_s / max(1, len(found.runs.ratios)))
    if loop.budget.left() < LEAST_CLAIM_PAIRS * price:
        return replace(confirmation, user=found)  # the choice is stated as its round read it (``choose_recipe``)
    loop.study.set_user_attr(StudyAttr.TESTED_RUNS, found.to_dict())  # the test stands in a study searched again
    return replace(confirmation, user=_pairs(loop, best, tested=False, first=CLAIM_PAIRS), tested=found)


def _holds_both(loop: SearchLoop) -> bool:
    """Whether the budget left holds a test's pairs and then the offer's own, as many each as the claim may run
    (``reserve.most_claim_pairs``) at a pair's price (``reserve.claim_pair_s``), ``reserve.OVER`` them as the claim's
    time is kept: where a test does not confirm, the offer is stated from as many pairs as it would have had."""
    pair_s = reserve.claim_pair_s(loop.noise)
    if not pair_s:
        return False
    most = reserve.most_claim_pairs(loop.options, reserve.claim_pairs(loop.options, pair_s))
    return loop.budget.left() >= 2 * reserve.OVER * most * pair_s


def _pairs(loop: SearchLoop, winner: Candidate, tested: bool, first: int = 0) -> UserRuns:
    """``winner`` run in ``reserve.claim_pairs`` fresh process pairs of your training, while the budget holds the next
    one (priced from the calibration, then from the pairs so far), and without ``--claim-pairs`` in more, up to
    ``CLAIM_PAIRS``, while the budget's end holds them (``EXTRA``); recorded in the study (``StudyAttr.USER_RUNS``).
    ``tested``: a test of a candidate the rounds could not decide, whose pairs an earlier search stored stand;
    ``first``: its pairs' seeds start there."""
    options, pair_s = loop.options, reserve.claim_pair_s(loop.noise)
    asked = reserve.claim_pairs(options, pair_s)
    why = None if asked else ("--claim-pairs 0" if options.claim_pairs == 0 else
                              f"a budget of {options.budget_s:.0f} s holds no {LEAST_CLAIM_PAIRS} process pairs of "
                              f"about {pair_s:.0f} s in {reserve.CLAIM_SHARE:.0%} of it; give --budget 5m"
                              if pair_s else
                              "a pair's price is unknown: its study was calibrated by an earlier autotune")
    # a test an earlier search of this study made stands: drawing fresh pairs again would be a second chance
    most, cut, failed = reserve.most_claim_pairs(options, asked), False, False
    pairs = _tested(loop.study, winner.number)[:most] if tested else []
    if pairs:
        why = f"{len(pairs)} pair(s) from an earlier search of this study, which tested it"
    try:
        for i in range(len(pairs), most):
            if i < asked:
                need, of = max([pair_s or 0.0, *(p.wall_s for p in pairs)]), f"{i + 1} of {asked}"
                if loop.budget.left() < need:
                    why, cut = f"{CUT}: {i} of {asked} process pairs ran (each about {need:.0f} s)", True
                    break
            # past the pairs asked, another only where the budget's end holds it with the estimates' 20% to spare,
            # at the pairs' own time: what the search kept and did not spend narrows your runs' interval
            elif loop.budget.left() < EXTRA * max((p.wall_s for p in pairs if p.wall_s), default=pair_s or 0.0):
                break  # the pairs' own time; pairs an earlier search stored have none here: the price stands in
            else:
                of = f"{i + 1} (past the {asked} asked: the budget's end holds it)"
            loop.current = winner.number  # the phase line names the recipe's trial
            loop.phase("your runs", f"fresh process pair {of} against the defaults, started as your training is")
            try:
                seed, left = options.seed * 7919 + 104729 + first + i, max(1.0, loop.budget.left())
                pairs.append(loop.measurer.user_pair(winner.params, seed, left))
            except PairFailed as e:
                cut = loop.budget.left() <= 1.0
                failed = not cut and e.side == "cand"  # the recipe broke a run of yours: not offered
                why = f"{CUT}: process pair {i + 1} was cut ({e})" if cut else f"process pair {i + 1} failed: {e}"
                break
            except OSError as e:  # a pair that could not start (no memory to fork, no disk): a failed pair
                cut = loop.budget.left() <= 1.0
                why = f"process pair {i + 1} failed: {type(e).__name__}: {e}"
                break
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the pairs that ran state the claim, the recipe is stored,
        why, loop.interrupted = f"stopped after {len(pairs)} process pairs ({asked} asked)", e  # then it is raised
    finally:
        lent = tuple(tuple(g) for g in loop.measurer.factor_ratios.values())
        found = UserRuns(winner.number, Runs.of(pairs), asked, why, lent, cut, failed)
        loop.study.set_user_attr(StudyAttr.USER_RUNS, found.to_dict())
    return found


def decides(loop: SearchLoop) -> bool:
    """Whether your runs can decide a candidate its rounds could not (``Confirmation.undecided``): the pairs may
    reach ``CLAIM_PAIRS``, the fewest that confirm (asked fewer, they could never confirm it)."""
    return loop.measurer.user_processes and reserve.claim_decides(loop.options, reserve.claim_pair_s(loop.noise))


def _tested(study: optuna.Study, number: int) -> list[RunPair]:
    """The pairs of your runs of trial ``number`` an earlier search of ``study`` stored (``UserRuns.to_dict``);
    none where it stored another trial's or a value that is not one (a store is not trusted to hold numbers)."""
    told = next((t for t in map(study.user_attrs.get, (StudyAttr.USER_RUNS, StudyAttr.TESTED_RUNS))
                 if isinstance(t, dict) and type(t.get("trial")) is int and t["trial"] == number), None)
    if told is None:
        return []
    ratios, run_s = told.get("ratios"), told.get("run_s")
    if not isinstance(ratios, list) or not isinstance(run_s, (int, float)) or not math.isfinite(run_s) or run_s < 0:
        return []
    if not all(finite(r) and r > 0 for r in ratios):
        return []
    return [RunPair(float(r), float(run_s), 0.0) for r in ratios]


def stated(claim: str, measured: TrialResult, user: UserRuns, margin: float, notes: list[str],
           otherwise: str = "the recipe keeps the defaults",
           beside_offer: bool = False) -> tuple[TrialResult | None, str, dict[str, Any]]:
    """What the recipe states of trial ``user.number`` whose confirmation (``measured``, claiming ``claim``) chose
    it: the result with the pairs' speedup and interval, its claim (confirmed: their low bound above
    ``1 + measure.span_margin``, as every offer's) and the recipe's fields of your runs (``Recipe.process_pairs``,
    ``run_low``, ``run_high``, ``run_s``); None for the result where the pairs' mean is not above 1.00x: not faster
    in your runs, where the recipe's own process of your training failed (at any count of pairs), where fewer than
    three ran and two or more each read it no faster, and where ``claim`` is ``UNDECIDED`` unless they read it faster
    with confidence (over six pairs, or over the pairs the budget's end left where no offer stands beside it,
    ``beside_offer``: one the rounds chose), then provisional; the notes then end in ``otherwise``
    (what the recipe does instead). Its notes join ``notes``."""
    runs, n = user.runs, len(user.runs.ratios)
    of_workers = format_speedup(measured.objective, measured.speedup_low, measured.speedup_high)
    slower = n >= 2 and max(runs.ratios) <= 1.0  # two pairs or more, each read the defaults as fast or faster
    if user.failed or (n < LEAST_CLAIM_PAIRS and slower):
        ran = ", ".join(f"{r:.2f}x" for r in runs.ratios)
        notes.append(f"trial {user.number} in fresh processes of your training: " + (
            f"its own process failed ({user.why})" if user.failed else f"slower than the defaults in each of its "
            f"{n} process pairs ({ran})") + f", where the search's workers read {of_workers}: {otherwise}")
        return None, "defaults", {}
    if n < LEAST_CLAIM_PAIRS:
        ran = f"; {n} pair(s) ran: {', '.join(f'{r:.2f}x' for r in runs.ratios)}" if n else ""
        if claim == UNDECIDED:
            notes.append(f"your runs could not decide trial {user.number} ({user.why or 'too few pairs'}{ran}): "
                         f"{otherwise}")
            return None, "defaults", {}
        notes.append(f"not measured in processes of your training ({user.why or 'too few pairs'}{ran}): the stated "
                     f"interval is the confirmation's in the search's workers, {of_workers}; the recipe is provisional")
        return measured, "provisional", {"process_pairs": n}
    mean, borrowed = runs.mean(lent=user.lent), runs.borrowed(user.lent)
    low, high = runs.one_run(lent=user.lent)
    said = format_speedup(mean.median, mean.low, mean.high)
    if mean.median <= 1.0:
        notes.append(f"trial {user.number} in {n} fresh process pairs of your training: {said}, not faster than the "
                     f"defaults there (the search's workers read {of_workers}): {otherwise}")
        return None, "defaults", {}
    bar = 1 + span_margin(margin, n)  # fresh processes each: no placement of arms in one worker to allow for
    short = [why for ok, why in ((claim != "provisional", "one confirmation round chose it"),
                                 (n >= CLAIM_PAIRS, f"{n} process pairs, where confirmed takes {CLAIM_PAIRS}"),
                                 (mean.low > bar, f"its interval in your processes reaches {bar:.2f}x"))
             if not ok]
    chose = "which decide it" if claim == UNDECIDED else "none of which chose it"
    notes.append(f"your runs (trial {user.number}, {n} fresh process pairs as 'autotune run' starts your training, "
                 f"{user.runs.wall_s:.0f} s, {chose}): {said}, a run of yours {low:.2f}-{high:.2f}x "
                 f"(90% prediction interval); the search's workers read {of_workers}")
    if borrowed is not None:
        lent = [g for g in user.lent if len(g) >= 2]
        notes.append(f"your runs: their spread pooled with that of the {sum(map(len, lent))} fresh process pairs the "
                     f"search ran ({len(lent)} setting(s); yours no larger than theirs at even odds; {borrowed[1]} "
                     f"degrees of freedom): a plain process that falls slow now and then may be missing from {n} pairs")
    if spans := runs.spans_text():
        notes.append(f"your runs: {spans}")
    if user.why:
        notes.append(f"your runs: {user.why}")
    # an interval above the bar decides it at the claim's confidence however few pairs ran: where the budget's end
    # left too few to say confirmed and nothing else is offered, it is offered provisional (a gain is not thrown away
    # for time); beside an offer the rounds chose, or after a failed pair, only a confirmation displaces the defaults
    cut = mean.low > bar and not beside_offer and user.cut
    if claim == UNDECIDED and short and not cut:
        notes.append(f"your runs did not confirm trial {user.number} ({'; '.join(short)}), nor could its rounds: "
                     f"{otherwise}")
        return None, "defaults", {}
    if claim == UNDECIDED:  # offered because these pairs' interval cleared the bar: near it, that interval leans high
        short.append("the pairs that decided it state it (where its gain lies near the bar, their interval leans "
                     "high: none of its own followed)")
    if short:
        notes.append(f"the recipe is provisional: {'; '.join(short)}")
    result = replace(measured, objective=mean.median, speedup_low=mean.low, speedup_high=mean.high,
                     confidence=mean.confidence, samples_per_s=runs.samples_per_s or measured.samples_per_s,
                     baseline_samples_per_s=runs.baseline_samples_per_s or measured.baseline_samples_per_s)
    fields = {"process_pairs": n, "run_low": low, "run_high": high, "run_s": runs.run_s}
    return result, "provisional" if short else "confirmed", fields


def searched_noise(noise: dict[str, Any] | None, loop: SearchLoop, confirmation: Confirmation | None,
                   best: TrialRecord) -> dict[str, Any] | None:
    """The calibration's noise with what the search measured besides: the spread of a process pair's ratio
    between fresh processes (every environment factor's pairs), and the smallest gain the search tells apart 4
    times in 5 (``measure.told_apart`` at its degrees of freedom): from the design that states the recipe, its
    process pairs of your runs where three or more ran, else the narrowest interval over rounds, else the
    chosen trial's search interval."""
    if noise is None:
        return None
    between = loop.measurer.between()
    if between is not None:
        noise = {**noise, "between": between[0], "between_pairs": between[1]}
    user = confirmation.user if confirmation is not None else None
    if user is not None and len(user.runs.ratios) >= LEAST_CLAIM_PAIRS:
        mean, n, borrowed = user.runs.mean(lent=user.lent), len(user.runs.ratios), user.runs.borrowed(user.lent)
        widths = [(mean.low, mean.high, float(borrowed[1] if borrowed else n - 1), mean.confidence, n,
                   f"trial {user.number}'s {n} process pairs of your runs")]
    else:
        widths = [(c.low, c.high, c.rounds - 1.0 if c.rounds >= 2 else math.inf, c.confirmed.confidence or CONFIDENCE,
                   c.rounds, f"trial {c.number}'s " + ("interval over its rounds" if c.rounds >= 2 else
                                                        "one-round interval"))
                  for c in (confirmation.candidates if confirmation else ())
                  if c.confirmed is not None and not c.failed]
    if not widths and best.result.speedup_low and best.result.speedup_high and best.role != BASELINE:
        widths = [(best.result.speedup_low, best.result.speedup_high, math.inf, best.result.confidence or CONFIDENCE,
                   1, f"trial {best.number}'s search interval")]
    told = [(told_apart(span_margin(noise["margin"], workers), low, high, df, confidence), by)
            for low, high, df, confidence, workers, by in widths]
    if told:
        gain, by = min(told)
        noise = {**noise, "told_apart": gain, "told_by": by}
    return noise


__all__ = ["UNDECIDED", "decides", "searched_noise", "stated", "user_runs"]
