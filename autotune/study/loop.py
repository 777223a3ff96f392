"""The ask-run-tell loop of a search: budget, out-of-memory memory, quality guard, heartbeats, Ctrl-C.

Each trial is asked, measured and told while this host's trial lock is held
(``autotune.trial.lock.host_lock``): a worker waiting for the lock holds no RUNNING trial whose
heartbeat would go stale. Every trial records the host and search process that runs it, so a search
killed with ``kill -9`` leaves a RUNNING trial that the next search on the same host fails at once
(``fail_orphans``); other hosts' workers fail it when its heartbeat is older than the storage's grace
period. Measurements go through a ``Measurer`` (``autotune.trial.spec``): by default a trial
subprocess (``autotune.trial.runner.SubprocessMeasurer``).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..trial.lock import host_lock, owner, owner_gone
from ..trial.runner import SubprocessMeasurer
from ..trial.spec import Measurer, Status, TrialResult
from . import budget, memory
from .events import Progress, TrialFinished, TrialStarted
from .records import (
    BASELINE,
    CONFIRM,
    CONSTRAINTS,
    FULL_RUNS,
    MEASURED,
    SEARCH,
    Attr,
    StudyAttr,
    optuna_storage,
    trial_id,
)
from .seeds import Seed, enqueue_next_seed

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts
    from .options import SearchOptions

log = logging.getLogger(__name__)

PRUNE_BELOW = 0.7  # a trial whose throughput falls under 70% of the baseline's is clearly slower
MAX_SKIPS = 25  # consecutive samples that only propose batch sizes known to run out of memory


def fail_orphans(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials whose search process, on this host, is gone; returns their numbers."""
    import optuna

    failed = []
    storage, _ = optuna_storage(study)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        attrs = t.user_attrs
        if not owner_gone(attrs):
            continue  # its search still runs, or ran on another host (whose workers fail it by heartbeat)
        try:
            storage.set_trial_user_attr(trial_id(t), Attr.STATUS, Status.INTERRUPTED.value)
            storage.set_trial_user_attr(
                trial_id(t), Attr.ERROR, f"its search (pid {attrs['pid']}) died during the trial"
            )
            storage.set_trial_state_values(trial_id(t), state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        failed.append(t.number)
        log.warning("trial %d was left running by a search that died; recorded as failed", t.number)
    return failed


class SearchLoop:
    """Runs trials until the budget, the trial count or the space runs out; records each at once."""

    def __init__(
        self, study: optuna.Study, workload: str, facts: Facts, ctx: spaces.SpaceContext,
        run_settings: dict[str, Any], options: SearchOptions, deadline: float, notify: Progress,
        seeds: list[Seed] | None = None, measurer: Measurer | None = None,
    ) -> None:
        self.study, self.workload, self.facts, self.ctx = study, workload, facts, ctx
        self.run_settings, self.options, self.deadline, self.notify = run_settings, options, deadline, notify
        self.seeds = seeds or []  # (role, params) measured first, in order (``autotune.study.seeds``)
        self.measurer = measurer or SubprocessMeasurer(workload, facts, options.settings)
        self.baseline_error: str | None = None

    def estimate_s(self, compile_mode: str | None = None) -> float | None:
        """How long one full trial will likely take (``budget.estimate_s``)."""
        return budget.estimate_s(self.study, compile_mode)

    def timeout_s(self, params: dict[str, Any], remaining: float, estimate: float | None) -> float:
        """The trial's time limit (``budget.timeout_s``)."""
        return budget.timeout_s(self.study, self.options, params, remaining, estimate)

    def reserve_s(self, estimate: float | None) -> float:
        """Time kept for the confirmation runs (``budget.reserve_s``)."""
        return budget.reserve_s(self.study, self.options, estimate)

    def measured(self) -> int:
        """Trials of the study (every worker's, every run's) that count toward ``--trials``."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get(Attr.ROLE) != CONFIRM and t.user_attrs.get(Attr.STATUS) in MEASURED)

    def run(self) -> str:
        """Returns why it stopped: ``budget``, ``trials``, ``space`` or ``baseline failed``."""
        skips = 0
        while True:
            if self.options.trials is not None and self.measured() >= self.options.trials:
                return "trials"
            remaining = self.deadline - time.monotonic()
            estimate = self.estimate_s()
            if remaining <= 1 or (estimate is not None and remaining - self.reserve_s(estimate) < estimate):
                return "budget"
            with host_lock():
                if self.options.trials is not None and self.measured() >= self.options.trials:
                    return "trials"  # reached by another worker while this one waited for the lock
                stopped, skips, result, role = self._next(skips, estimate)
            if stopped:
                return stopped
            if role == BASELINE and result is not None and result.status != Status.OK:
                self.baseline_error = f"{result.status}: {result.error}"
                return "baseline failed"

    def _next(self, skips: int, estimate: float | None) -> tuple[str | None, int, TrialResult | None, str]:
        """Ask the next trial and measure it (the host lock held); a batch size known to run out of memory
        is skipped. Returns why to stop (or None), the consecutive skips, the result and the trial's role."""
        import optuna

        optuna.storages.fail_stale_trials(self.study)  # trials of a killed search elsewhere (heartbeat)
        fail_orphans(self.study)
        self._update_pruner()
        enqueue_next_seed(self.study, self.seeds)
        trial = self.study.ask()
        role = trial.user_attrs.get(Attr.ROLE, SEARCH)
        params = {**spaces.suggest(trial, self.facts, self.ctx), **self.run_settings}
        self.claim(trial, role, params)
        known_oom = self._known_oom(params)
        if known_oom:
            trial.set_user_attr(Attr.STATUS, "skipped")
            trial.set_user_attr(Attr.ERROR, known_oom)
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return ("space" if skips + 1 >= MAX_SKIPS else None), skips + 1, None, role
        remaining = self.deadline - time.monotonic()  # the lock may have been waited for
        timeout = max(1.0, min(remaining, self.timeout_s(params, remaining, estimate)))
        return None, 0, self.run_one(trial, role, params, timeout), role

    def claim(self, trial: optuna.Trial, role: str, params: dict[str, Any]) -> None:
        """Record who runs the trial, so a search that dies leaves a trial the next one can fail."""
        trial.set_user_attr(Attr.ROLE, role)
        trial.set_user_attr(Attr.PARAMS, params)
        for key, value in owner().items():  # host, pid, pid_started: read back by ``owner_gone``
            trial.set_user_attr(key, value)

    def _update_pruner(self) -> None:
        """Prune on intermediate throughput, from the second window on, against the baseline."""
        import optuna

        base = self.study.user_attrs.get(StudyAttr.BASELINE_SAMPLES_PER_S)
        if base and not isinstance(self.study.pruner, optuna.pruners.ThresholdPruner):
            self.study.pruner = optuna.pruners.ThresholdPruner(lower=PRUNE_BELOW * base, n_warmup_steps=1)

    def _known_oom(self, params: dict[str, Any]) -> str | None:
        return memory.known_oom(self.study.user_attrs.get(StudyAttr.OOM_LIMITS), params)

    def run_one(self, trial: optuna.Trial, role: str, params: dict[str, Any], timeout: float) -> TrialResult:
        """Measure a claimed trial (the host lock held) and record it; Ctrl-C records it interrupted."""
        storage, _ = optuna_storage(self.study)
        self.notify(TrialStarted(trial.number, role, params))

        def on_window(index: int, samples_per_s: float) -> bool:
            if hasattr(storage, "record_heartbeat"):
                storage.record_heartbeat(trial_id(trial))
            if role in FULL_RUNS:
                return False
            trial.report(samples_per_s, index)
            return trial.should_prune()

        trial.set_user_attr(Attr.RUN_STARTED, time.time())  # wall clock: comparable between workers
        try:
            result = self.measurer.measure(params, timeout, on_window)
        except KeyboardInterrupt:
            trial.set_user_attr(Attr.RUN_ENDED, time.time())
            self.record(trial, role, params, TrialResult(Status.INTERRUPTED, error="stopped by Ctrl-C"))
            raise
        trial.set_user_attr(Attr.RUN_ENDED, time.time())
        self.record(trial, role, params, result)
        return result

    def record(self, trial: optuna.Trial, role: str, params: dict[str, Any], result: TrialResult) -> None:
        """Store the trial's result and constraints and tell Optuna its value (or state)."""
        import optuna

        data = result.to_dict()
        for key in Attr.RESULT:
            if data.get(key) not in (None, [], {}):
                trial.set_user_attr(key, data[key])
        state = optuna.trial.TrialState
        if spaces.membind_off(spaces.memory_nodes(params, self.facts), result.in_effect):
            # numactl --membind refused or missing: the pinning was measured unbound, and the recipe says so
            params = {**params, "membind": False}
            trial.set_user_attr(Attr.PARAMS, params)
        if result.status == Status.OK:
            reason = self._feasibility(trial, role, params, result)
            self._constraints_list(trial)
            self.study.tell(trial, result.objective)
        elif result.status in (Status.OOM, Status.NAN):
            # FAIL, not a value: 0.0 would be a measurement (TPE's worst, the dashboard's history flattened);
            # the constraints and the status say why (``records`` reads them, not the state)
            reason = self._infeasible(trial, params, result)
            self._constraints_list(trial)
            self.study.tell(trial, state=state.FAIL)
        else:
            reason = result.error
            self.study.tell(trial, state=state.PRUNED if result.status == Status.PRUNED else state.FAIL)
        self.notify(TrialFinished(trial.number, role, params, result, reason))

    def _constraints_list(self, trial: optuna.Trial) -> None:
        """Also store the constraints as one list, in ``CONSTRAINTS`` order: optuna-dashboard 0.21 reads only
        that (older) form, Optuna 5's ``set_constraint`` writes ``constraints:<key>`` per key; without it the
        dashboard marks no trial infeasible. An unset constraint is 0 (not broken)."""
        named = trial.constraints
        values = [float(named.get(key, 0.0)) for key in CONSTRAINTS]
        storage, _ = optuna_storage(self.study)
        storage.set_trial_system_attr(trial_id(trial), "constraints", values)

    def _feasibility(self, trial: optuna.Trial, role: str, params: dict[str, Any], result: TrialResult) -> str | None:
        """The quality guard, and every knob in effect: why a trial that ran is not this recipe, or None."""
        reason = self._guard(trial, role, result)
        # A knob the trial process reports not in effect measured something else: not this recipe.
        missing = [] if role == BASELINE else spaces.not_in_effect(params, result.in_effect)
        trial.set_constraint("applied", float(len(missing)))
        if missing:
            reason = "; ".join(missing + ([reason] if reason else []))
            trial.set_user_attr(Attr.INFEASIBLE, reason)
        return reason

    def _infeasible(self, trial: optuna.Trial, params: dict[str, Any], result: TrialResult) -> str:
        """An out-of-memory or NaN trial: infeasible; an out-of-memory batch caps the later ones with the
        same memory-relevant settings (``memory``)."""
        oom = result.status == Status.OOM
        trial.set_constraint("quality", 0.0)
        trial.set_constraint("fits_memory", 1.0 if oom else 0.0)
        trial.set_constraint("finite_loss", 1.0 if result.status == Status.NAN else 0.0)
        reason = "out of memory" if oom else "the loss became NaN/inf"
        if oom:
            limits = self.study.user_attrs.get(StudyAttr.OOM_LIMITS)
            self.study.set_user_attr(StudyAttr.OOM_LIMITS, memory.record_oom(limits, params))
        trial.set_user_attr(Attr.INFEASIBLE, reason)
        return reason

    def _guard(self, trial: optuna.Trial, role: str, result: TrialResult) -> str | None:
        """The quality guard: a held-out loss above the baseline's by more than the tolerance is infeasible.
        Every trial's loss is taken after the same samples (``loss_samples``, recorded for the report)."""
        if result.loss_samples is not None:
            trial.set_user_attr(Attr.LOSS_SAMPLES, result.loss_samples)
        if role == BASELINE:
            self.study.set_user_attr(StudyAttr.BASELINE_LOSS, result.loss)
            self.study.set_user_attr(StudyAttr.BASELINE_SAMPLES_PER_S, result.samples_per_s)
        base = self.study.user_attrs.get(StudyAttr.BASELINE_LOSS)
        tolerance = self.options.max_loss_increase
        loss = result.loss if result.loss is not None else float("nan")
        increase = (loss - base) / abs(base) if base else 0.0
        trial.set_constraint("quality", increase - tolerance)
        trial.set_constraint("fits_memory", 0.0)
        trial.set_constraint("finite_loss", 0.0)
        if increase <= tolerance:
            return None
        reason = f"loss {loss:.4f} is {increase:+.1%} over the baseline's {base:.4f} (limit +{tolerance:.0%})"
        trial.set_user_attr(Attr.INFEASIBLE, reason)
        return reason


__all__ = ["MAX_SKIPS", "PRUNE_BELOW", "SearchLoop", "fail_orphans"]
