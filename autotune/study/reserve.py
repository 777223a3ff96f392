"""The time a search keeps for its end: the confirmation's rounds and the claim's pairs of your runs.

The policy: the rounds of each candidate the confirmation would likely confirm now (its contenders), per candidate
and round its pairs at the calibration's window length and its arm's warm-up, and per environment and round its
worker's start and process pair, once however many candidates share them (``round_parts``), as measured; the
claim's pairs of your runs at a pair's price (``claim_pair_s``); both kept ``OVER`` their estimates (``reserve_s``),
so that the search (``budget``'s clock, ``loop``) stops early enough to confirm its candidates and state its claim.
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..measure import (
    CLAIM_PAIRS,
    FACTOR,
    LEAST_CLAIM_PAIRS,
    RUN_WINDOW_PAIRS,
    Noise,
    environment_key,
    own_copies,
)
from ..measure import round_parts as measured_round_parts
from ..trial.spec import Status, TrialResult
from .budget import recorded_noise
from .confirmation import DECIDING_ROUNDS, confirm_bar, contenders, lineup
from .records import BASELINE, CONFIRM, records

if TYPE_CHECKING:
    import optuna

    from .options import SearchOptions


MIN_ROUND_PAIRS = 6  # the fewest pairs whose order-statistic interval reaches 95% (min to max: 96.9%)


def confirmation_pairs(noise: Noise, options: SearchOptions) -> int:
    """Pairs of one round of a confirmation: the calibration's pairs split over ``confirm_rounds`` rounds, at
    least ``MIN_ROUND_PAIRS`` a round; or the round the measurer sized (``Noise.round_pairs``)."""
    if noise.round_pairs:  # the measurer sized its rounds itself (script mode's process pairs)
        return noise.round_pairs
    rounds = max(1, options.confirm_rounds)
    return max(MIN_ROUND_PAIRS, -(-max(4, noise.pairs) // rounds))


def confirm_s(result: TrialResult, noise: Noise | None, options: SearchOptions) -> float:
    """How long confirming the recipe measured by ``result`` will take, all its rounds (``round_s``)."""
    return sum(round_s(result, noise, options, r) for r in range(max(1, options.confirm_rounds)))


def round_s(result: TrialResult, noise: Noise | None, options: SearchOptions, round_: int) -> float:
    """How long round ``round_`` of confirming the recipe measured by ``result`` will take (``round_parts``: its
    own part and its environment's process pairs)."""
    own, pairs = round_parts(result, noise, options, round_)
    return own + pairs


def round_parts(result: TrialResult, noise: Noise | None, options: SearchOptions, round_: int) -> tuple[float, float]:
    """Round ``round_`` of confirming the recipe measured by ``result``: (its own time, the time its environment
    spends on the round whichever candidates of it are confirmed), at ``confirmation_pairs`` window pairs a round
    (``measure.round_parts``, which reads the result as its measurer wrote it)."""
    pairs = confirmation_pairs(noise, options) if noise is not None else 0
    return measured_round_parts(result, noise, pairs, round_)


# Of a budget, the most kept for the confirmation and the claim while more than one round a candidate is kept: past
# it the reserve keeps fewer rounds (at least one; the confirmation still runs later ones where the budget's end
# holds them): a reserve of every round a candidate and the claim could end a short search after its first candidate.
RESERVE_SHARE = 0.6
OVER = 1.1  # kept over the rounds' and the claim's estimates: a fresh process's time varies with its speed


def reserve_s(study: optuna.Study, options: SearchOptions, estimate: float | None, *,
              racing: Sequence[tuple[TrialResult, dict[str, Any]]] = (), left: float | None = None) -> float:
    """Time kept for the confirmation: the rounds of each candidate it would likely confirm now (its
    ``contenders``: not one whose search interval lies wholly below the first's, nor one whose median is below
    1 + margin), each environment's part once a
    round however many of them share it (``round_parts``: kept once per candidate, shared process pairs would
    stop the search early), 10% over. The defaults' worker is started in a round only for a candidate of the
    defaults' environment: as the calibration's was, at least the baseline's start (the baseline's start alone
    is less than such a round takes, and a candidate whose last round no longer fits is left unconfirmed). Time
    kept for a defaults' worker no candidate needs, or for windows a recipe that IS its environment does not run,
    would stop the search early. Rounds are kept while the whole reserve stays within ``RESERVE_SHARE`` of the
    budget, at least one a candidate. ``racing``: the candidates being raced or about to be (each its result so far,
    its params), counted as more while the confirmation has room for them, so that a candidate's later race rounds
    never take the time its own confirmation needs (a short budget's first candidate raced to its cap, then was not
    confirmed). ``left``: the time left, where a contender's round it cannot hold beside the claim and the rounds
    of those ranked above, at its estimate as the confirmation judges it (``confirm.Rounds``), is not kept, nor its
    later ones; the first's first round and the racing's rounds always are. Kept for rounds that never run, the time
    went unused where a trial more would have fitted."""
    if (estimate is None and not racing) or options.budget_s is None or options.confirm_top <= 0:
        return 0.0
    return _reserve(study, options, racing, left)[1]


def kept_rounds(study: optuna.Study, options: SearchOptions) -> int:
    """The rounds a candidate the reserve keeps time for (``reserve_s``): all of ``confirm_rounds`` without a
    budget. The confirmation's candidates ranked above keep their time for at most as many (``confirm.Rounds``)."""
    if options.budget_s is None or options.confirm_top <= 0:
        return max(1, options.confirm_rounds)
    return _reserve(study, options, ())[0]


def _reserve(study: optuna.Study, options: SearchOptions, racing: Sequence[tuple[TrialResult, dict[str, Any]]],
             left: float | None = None) -> tuple[int, float]:
    """``reserve_s``'s (rounds kept a candidate, seconds kept)."""
    assert options.budget_s is not None
    noise = recorded_noise(study)
    baseline, top = lineup(study, options.confirm_top, options.confirm_rounds)
    entries = [(r.result, environment_key(r.params))
               for r in contenders(top, confirm_bar(study, options.confirm_rounds))]
    measured, room = len(entries), max(0, options.confirm_top - len(entries)) if baseline is not None else 0
    entries += [(result, environment_key(params)) for result, params in racing[:room]]
    kept = max(1, options.confirm_rounds)
    if not entries:
        return kept, 0.0
    pair_s = claim_pair_s(noise)
    claim, least = _claim_s(options, pair_s), floors(study)

    def priced(rounds: list[tuple[TrialResult, str, int]]) -> float:
        return rounds_s(rounds, noise, options, floors=least)

    if len(entries) == 1 and options.budget_s < SHORT_BUDGET_S and claim and claim_decides(options, pair_s):
        # a lone contender's rounds past those after which your runs decide it choose nothing: their time goes to
        # more candidates (the confirmation still runs them where the budget's end holds them)
        kept = min(kept, DECIDING_ROUNDS)
    while True:
        reserve = OVER * priced([(result, env, n) for result, env in entries for n in range(kept)]) + claim
        if kept == 1 or reserve <= RESERVE_SHARE * options.budget_s:
            break
        kept -= 1
    if left is None or reserve <= left:
        return kept, reserve
    held = [(result, env, n) for i, (result, env) in enumerate(entries) for n in range(kept)
            if i >= measured or i == n == 0]
    # best first, each round while it fits beside those above as the confirmation judges it (``confirm.Rounds``:
    # at its estimate, the claim's time held); what is kept for those that fit is ``OVER`` them, as above
    for i, (result, env) in enumerate(entries[:measured]):
        for n in range(1 if i == 0 else 0, kept):
            if priced([*held, (result, env, n)]) + claim > left:
                break
            held.append((result, env, n))
    return kept, OVER * priced(held) + claim


CLAIM_SHARE = 0.4  # of a budget, the most its claim's pairs take at their price (kept ``OVER`` that)
# Under it a lone contender's reserve keeps the rounds after which your runs' pairs decide it (``DECIDING_ROUNDS``),
# not every round: its later ones choose nothing
SHORT_BUDGET_S = 300.0


def claim_pair_s(noise: Noise | None) -> float | None:
    """One pair of your runs for the claim (``measure.runs``): two fresh processes one after the other. Where the
    measurer knows a process's own shape (``Noise.run_s``: a trial process of the defaults, its start, warm-up, timed
    steps and loss; script mode's copy alone, ``Spread.alone_s``), twice that: the recipe's process is as long or
    shorter where it is a gain. Else each started as the calibration's worker was, its model built and settled
    (``Noise.start_s``), and trained for twice a pair's windows (its warm-up and the loss besides). From the first
    pair on, the pairs' own time is the price. None where the start was not recorded."""
    if noise is None or noise.start_s is None:
        return None
    return 2 * (noise.run_s or noise.start_s + 2 * RUN_WINDOW_PAIRS * noise.window_s)


def claim_pairs(options: SearchOptions, pair_s: float | None) -> int:
    """How many process pairs the claim about your runs asks: ``--claim-pairs``; else ``CLAIM_PAIRS`` without a
    budget, and with one as many, up to ``CLAIM_PAIRS``, as ``CLAIM_SHARE`` of it holds at ``pair_s`` each: none
    where fewer than ``LEAST_CLAIM_PAIRS`` fit (two pairs' interval is 12.7 standard errors wide) or where a pair's
    price is unknown (a study calibrated before ``Noise.start_s`` was recorded).

    >>> from .options import SearchOptions
    >>> [claim_pairs(SearchOptions(budget_s=b), 16.0) for b in (90, 120, 180, 300, 1800)]
    [0, 3, 4, 6, 6]
    """
    if options.claim_pairs is not None:
        return options.claim_pairs
    if options.budget_s is None:
        return CLAIM_PAIRS
    if not pair_s:
        return 0
    fits = int(options.budget_s * CLAIM_SHARE // pair_s)
    return min(CLAIM_PAIRS, fits) if fits >= LEAST_CLAIM_PAIRS else 0


def most_claim_pairs(options: SearchOptions, asked: int) -> int:
    """The most pairs of your runs: those asked, and without ``--claim-pairs`` up to ``CLAIM_PAIRS`` as time holds."""
    return CLAIM_PAIRS if asked and options.claim_pairs is None else asked


def claim_decides(options: SearchOptions, pair_s: float | None) -> bool:
    """Whether the claim's pairs may reach ``CLAIM_PAIRS`` (``most_claim_pairs``), the fewest that decide a candidate
    its rounds could not (asked fewer, they could never decide it). Its measurer's part is ``claim.decides``'."""
    return most_claim_pairs(options, claim_pairs(options, pair_s)) >= CLAIM_PAIRS


def claim_s(study: optuna.Study, options: SearchOptions) -> float:
    """Time kept for the claim about your runs: its pairs (``claim_pairs``) at ``claim_pair_s`` each, ``OVER`` them
    as for the rounds: its last pair starts only where the longest so far still fits (``claim._pairs``)."""
    return _claim_s(options, claim_pair_s(recorded_noise(study)))


def _claim_s(options: SearchOptions, pair_s: float | None) -> float:
    """``claim_s`` at a pair's price ``pair_s`` (the reserve reads the study's calibration once for both)."""
    return OVER * claim_pairs(options, pair_s) * (pair_s or 0.0)


def racing_reserve_s(study: optuna.Study, options: SearchOptions, params: dict[str, Any], method: str, *,
                     wall_s: float, timed_s: float, pairs: int = 0, measured: TrialResult | None = None,
                     then: Sequence[tuple[TrialResult, dict[str, Any]]] = (), left: float | None = None) -> float:
    """``reserve_s`` with the candidate being raced counted (``racing``): its time so far, ``wall_s`` of which
    ``timed_s`` in windows, and its ``method`` as its result will say it (the measurer's ``method``; ``round_parts``
    reads it); all its time outside windows so far is counted as its arm's warm-up (its build and compile are in it,
    its loss may be), and for an environment measured by its process pairs alone, shared by the ``pairs`` it ran
    (a round runs one); ``measured``: its figures as the measurer keeps them (``PairedMeasurer.so_far``: script
    mode's), in their place. ``then``: candidates that follow it, counted too (``racing``'s). ``left``: as
    ``reserve_s``'s."""
    so_far = measured or TrialResult(Status.OK, wall_s=wall_s, timed_s=timed_s, warmup_s=max(0.0, wall_s - timed_s),
                                     method=method, pairs=pairs or None)
    return reserve_s(study, options, None, racing=[(so_far, params), *then], left=left)


def floors(study: optuna.Study) -> dict[str, float]:
    """The least an environment's part of a confirmation round takes, as measured in the study: the defaults', the
    baseline's start; another's, one of its process pairs, from the trial that is that environment's defaults (its
    wall time / its process pairs: method ``FACTOR``). Counted from the calibration instead (a worker's
    start and the pair's windows), a process pair's round is underestimated (two processes started side by side,
    two arms settled, both ended), and a round kept too short times out. Script mode has none: a round is its own
    fresh pairs of copies, no environment's worker is started beside them (its baseline's start counted as one
    would keep time no round takes)."""
    found: dict[str, float] = {}
    for r in records(study):
        if r.role == CONFIRM or r.result.status != Status.OK or own_copies(r.result):
            continue
        key = environment_key(r.params)
        if r.role == BASELINE:
            found[key] = max(found.get(key, 0.0), r.result.startup_s or 0.0)
        elif r.result.method == FACTOR and r.result.pairs:
            found[key] = max(found.get(key, 0.0), r.result.wall_s / r.result.pairs)
    return found


def rounds_s(rounds: Iterable[tuple[TrialResult, str, int]], noise: Noise | None, options: SearchOptions, *,
             paid: Container[tuple[str, int]] = (), floors: Mapping[str, float] | None = None) -> float:
    """How long the confirmation rounds ``(result, environment, round)`` take: each one's own part, and each
    environment's part once a round however many of its candidates share it (``round_parts``), none where
    ``paid`` holds ``(environment, round)`` (paid already), at least ``floors[environment]``. What the search
    keeps (``reserve_s``) and what the confirmation asks before each round (``confirm.confirm``) are counted here."""
    total, shared = 0.0, dict[tuple[str, int], float]()
    for result, env, round_ in rounds:
        own, part = round_parts(result, noise, options, round_)
        total += own
        if (env, round_) not in paid:
            shared[(env, round_)] = max(shared.get((env, round_), 0.0), part, (floors or {}).get(env, 0.0))
    return total + sum(shared.values())


__all__ = ["CLAIM_SHARE", "MIN_ROUND_PAIRS", "OVER", "RESERVE_SHARE", "SHORT_BUDGET_S", "claim_decides",
           "claim_pair_s", "claim_pairs", "claim_s", "confirm_s", "confirmation_pairs", "floors", "kept_rounds",
           "most_claim_pairs", "racing_reserve_s", "reserve_s", "round_parts", "round_s", "rounds_s"]
