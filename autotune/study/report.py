"""From a study's recorded trials to the recipe: feasible, faster than the defaults beyond noise."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import search_spaces as spaces
from ..errors import TrialError
from ..recipe import Recipe
from ..trial.spec import Status
from .records import BASELINE, CONFIRM, Candidate, Confirmation, TrialRecord, records
from .significance import allowance

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts


def choose_recipe(
    study: optuna.Study, workload: str, facts: Facts, name: str, confirmation: Confirmation | None = None
) -> tuple[Recipe, TrialRecord, TrialRecord, list[TrialRecord]]:
    """The recipe (with baseline and best records). With a confirmation, its side-by-side runs decide
    (``autotune.study.confirm``); without one, the fastest feasible trial's single measurement, which must
    beat the defaults' by more than the noise. Otherwise the recipe keeps the defaults."""
    all_records = records(study)
    searched = [r for r in all_records if r.role != CONFIRM]
    baselines = [r for r in searched if r.role == BASELINE and r.result.status == Status.OK]
    if not baselines:
        raise TrialError("the study has no completed baseline trial")
    baseline = baselines[0]
    notes: list[str] = []
    if confirmation is not None and confirmation.baseline.runs and any(c.runs for c in confirmation.candidates):
        best, speed, base_speed = _confirmed(confirmation, searched, baseline, notes)
    else:
        best, speed, base_speed = _single(searched, baseline, notes, confirmation)
    rejected = [r for r in searched if r.result.status == Status.OK and not r.feasible]
    worse = sum(1 for r in rejected if "quality" in r.rejected_by)
    if worse:
        after = f" after {baseline.result.loss_samples} samples" if baseline.result.loss_samples else ""
        notes.append(f"{worse} trial(s) rejected by the quality guard (held-out loss{after} above the limit)")
    unapplied = sum(1 for r in rejected if "applied" in r.rejected_by)
    if unapplied:
        notes.append(f"{unapplied} trial(s) rejected: a knob they asked for was not in effect in the trial process")
    notes.append(time_note(all_records))
    peak = best.result.peak_memory_bytes  # CUDA: the 90% warning rides with the recipe
    notes += filter(None, [spaces.batch.memory_warning(peak, best.result.in_effect.get("device_memory_bytes"))])
    recipe = Recipe(
        params=best.params, workload=workload, fingerprint=facts.fingerprint, study=name,
        samples_per_s=speed, baseline_samples_per_s=base_speed, speedup=speed / base_speed, loss=best.result.loss,
        baseline_loss=baseline.result.loss, notes=notes, peak_memory_bytes=peak,
    )
    return recipe, baseline, best, all_records


def _range(c: Candidate) -> str:
    return f"median {c.median:.1f} samples/s, range {c.low:.1f}-{c.high:.1f} over {len(c.runs)} run(s)"


def _confirmed(confirmation: Confirmation, searched: list[TrialRecord], baseline: TrialRecord,
               notes: list[str]) -> tuple[TrialRecord, float, float]:
    base = confirmation.baseline
    winner = confirmation.best
    contender = next((c for c in confirmation.candidates if c.runs and c.failed is None), None)
    if confirmation.note:
        notes.append(f"confirmation: {confirmation.note}")
    notes.append(f"defaults (trial {base.number}) confirmed at {_range(base)}")
    for c in confirmation.candidates:
        if c.failed:
            notes.append(f"trial {c.number} failed its confirmation ({c.failed}): not offered")
    if winner is None:
        if contender is not None:
            notes.append(
                f"the best candidate (trial {contender.number}, {_range(contender)}) did not beat the defaults "
                f"beyond noise ({confirmation.noise:.0%}) side by side: the recipe keeps the defaults"
            )
        return baseline, base.median, base.median
    notes.append(f"best (trial {winner.number}) confirmed at {_range(winner)}, "
                 f"beating the defaults beyond noise ({confirmation.noise:.0%})")
    record = next(r for r in searched if r.number == winner.number)
    return record, winner.median, base.median


def _single(searched: list[TrialRecord], baseline: TrialRecord, notes: list[str],
            confirmation: Confirmation | None) -> tuple[TrialRecord, float, float]:
    feasible = [r for r in searched if r.feasible]
    best = max(feasible, key=lambda r: r.result.objective or 0.0)
    noise = allowance(baseline.result.spread, best.result.spread)  # of each one's timed windows
    if confirmation is None:
        notes.append("not confirmed side by side (confirmation off): single measurements")
    elif confirmation.note:
        notes.append(f"not confirmed side by side: {confirmation.note}")
    speed, base_speed = best.result.objective or 0.0, baseline.result.objective or 0.0
    if speed < base_speed * (1 + noise):
        notes.append(f"nothing beat PyTorch's defaults beyond noise ({noise:.0%}): the recipe keeps the defaults")
        best, speed = baseline, base_speed
    return best, speed, base_speed


def time_note(all_records: list[TrialRecord]) -> str:
    """Where the trials' time went: process startup, compile and warm-up, timed windows, the rest."""
    def total(field: str, rows: list[TrialRecord]) -> float:
        return sum(getattr(r.result, field) or 0.0 for r in rows)

    confirm = [r for r in all_records if r.role == CONFIRM]
    wall, startup, warmup, timed = (total(f, all_records) for f in ("wall_s", "startup_s", "warmup_s", "timed_s"))
    return (f"time in {len(all_records)} trial(s): {wall:.0f} s, of which startup {startup:.0f} s, "
            f"compile and warm-up {warmup:.0f} s, timed {timed:.0f} s, "
            f"evaluation and exit {max(0.0, wall - startup - warmup - timed):.0f} s; "
            f"confirmation runs {total('wall_s', confirm):.0f} s of it")


__all__ = ["choose_recipe", "time_note"]
