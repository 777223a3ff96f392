"""The ask-run-tell loop of a search: budget, out-of-memory memory, quality guard, heartbeats, Ctrl-C.

Each trial is asked, run and told while this host's trial lock is held (``study.host_lock``): a
worker waiting for the lock holds no RUNNING trial whose heartbeat would go stale. Every trial records
the host and search process that runs it, so a search killed with ``kill -9`` leaves a RUNNING trial
that the next search on the same host fails at once (``fail_orphans``); other hosts' workers fail it
when its heartbeat is older than the storage's grace period.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .. import search_spaces as spaces
from ..trial.lock import host_id, owner_gone
from ..trial.lock import process_started as _process_started
from ..trial.runner import TrialResult, run_trial

log = logging.getLogger(__name__)

PRUNE_BELOW = 0.7  # a trial whose throughput falls under 70% of the baseline's is clearly slower
MAX_SKIPS = 25  # consecutive samples that only propose batch sizes known to run out of memory
MEASURED = ("ok", "oom", "nan", "crash", "timeout", "pruned")  # outcomes that count toward --trials
FULL_RUNS = ("baseline", "heuristic", "confirm")  # never pruned: they anchor the comparison


def fail_orphans(study: Any) -> list[int]:
    """Fail the RUNNING trials whose search process, on this host, is gone; returns their numbers."""
    import optuna

    failed = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        attrs = t.user_attrs
        if not owner_gone(attrs):
            continue  # its search still runs, or ran on another host (whose workers fail it by heartbeat)
        storage = study._storage
        try:
            storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
            storage.set_trial_user_attr(t._trial_id, "error", f"its search (pid {attrs['pid']}) died during the trial")
            storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        failed.append(t.number)
        log.warning("trial %d was left running by a search that died; recorded as failed", t.number)
    return failed


class SearchLoop:
    """Runs trials until the budget, the trial count or the space runs out; records each at once."""

    def __init__(
        self, study: Any, workload: str, facts: Any, ctx: spaces.SpaceContext, run_settings: dict[str, Any],
        options: Any, deadline: float, notify: Callable[[str, Any], None],
        seeds: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.study, self.workload, self.facts, self.ctx = study, workload, facts, ctx
        self.run_settings, self.options, self.deadline, self.notify = run_settings, options, deadline, notify
        self.seeds = seeds or []  # (role, params) measured first, in order (``study._seeds``)
        self.baseline_error: str | None = None

    def estimate_s(self, compile_mode: str | None = None) -> float | None:
        """How long one full trial will likely take: 1.2x the median wall time (startup, compile and
        warm-up included) of the finished ones that were not pruned. With ``compile_mode``, of the trials
        compiled that way only (compiling takes far longer than the timed steps); None if there is none."""
        walls = sorted(t.user_attrs["wall_s"] for t in self.study.get_trials(deepcopy=False)
                       if "wall_s" in t.user_attrs and t.user_attrs.get("status") != "pruned"
                       and (compile_mode is None or t.user_attrs.get("params", {}).get("compile_mode") == compile_mode))
        return 1.2 * walls[len(walls) // 2] if walls else None

    def timeout_s(self, params: dict[str, Any], remaining: float, estimate: float | None) -> float:
        """The trial's time limit: 5x the estimate of its kind (at least 60 s), within the budget. A
        compile mode not measured yet may take what the budget leaves after the confirmation runs."""
        mode = params.get("compile_mode") or "none"
        if mode != "none":
            estimate = self.estimate_s(mode)
            if estimate is None:
                return max(60.0, remaining - self.reserve_s(self.estimate_s())) if remaining > 60 else remaining
        return remaining if estimate is None else min(remaining, max(60.0, 5 * estimate))

    def measured(self) -> int:
        """Trials of the study (every worker's, every run's) that count toward ``--trials``."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get("role") != "confirm" and t.user_attrs.get("status") in MEASURED)

    def reserve_s(self, estimate: float | None) -> float:
        """Time kept for the confirmation runs: (candidates + baseline) x rounds full trials."""
        from .confirm import candidate_count

        if estimate is None or self.options.budget_s is None:
            return 0.0
        candidates = candidate_count(self)
        return (candidates + 1) * self.options.confirm_rounds * estimate if candidates else 0.0

    def run(self) -> str:
        """Returns why it stopped: ``budget``, ``trials``, ``space`` or ``baseline failed``."""
        import optuna

        from .run import _enqueue_next_seed, host_lock

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
                optuna.storages.fail_stale_trials(self.study)  # trials of a killed search elsewhere (heartbeat)
                fail_orphans(self.study)
                self._update_pruner()
                _enqueue_next_seed(self.study, self.seeds)
                trial = self.study.ask()
                role = trial.user_attrs.get("role", "search")
                params = {**spaces.suggest(trial, self.facts, self.ctx), **self.run_settings}
                self.claim(trial, role, params)
                if self._known_oom(params):
                    skips += 1
                    trial.set_user_attr("status", "skipped")
                    trial.set_user_attr("error", f"batch_size {params['batch_size']} is at least one that ran out of memory")
                    self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    if skips >= MAX_SKIPS:
                        return "space"
                    continue
                skips = 0
                remaining = self.deadline - time.monotonic()  # the lock may have been waited for
                result = self.run_one(trial, role, params, max(1.0, min(remaining, self.timeout_s(params, remaining, estimate))))
            if role == "baseline" and result.status != "ok":
                self.baseline_error = f"{result.status}: {result.error}"
                return "baseline failed"

    def claim(self, trial: Any, role: str, params: dict[str, Any]) -> None:
        """Record who runs the trial, so a search that dies leaves a trial the next one can fail."""
        trial.set_user_attr("role", role)
        trial.set_user_attr("params", params)
        trial.set_user_attr("host", host_id())
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("pid_started", _process_started(os.getpid()))

    def _update_pruner(self) -> None:
        """Prune on intermediate throughput, from the second window on, against the baseline."""
        import optuna

        base = self.study.user_attrs.get("baseline_samples_per_s")
        if base and not isinstance(self.study.pruner, optuna.pruners.ThresholdPruner):
            self.study.pruner = optuna.pruners.ThresholdPruner(lower=PRUNE_BELOW * base, n_warmup_steps=1)

    def _known_oom(self, params: dict[str, Any]) -> bool:
        limit = self.study.user_attrs.get("oom_batch_size")
        return limit is not None and int(params["batch_size"]) >= int(limit)

    def run_one(self, trial: Any, role: str, params: dict[str, Any], timeout: float) -> TrialResult:
        """Run a claimed trial (the host lock held) and record it; Ctrl-C records it interrupted."""
        storage = self.study._storage
        self.notify("trial-start", {"number": trial.number, "role": role, "params": params})

        def on_window(index: int, samples_per_s: float) -> bool:
            if hasattr(storage, "record_heartbeat"):
                storage.record_heartbeat(trial._trial_id)
            if role in FULL_RUNS:
                return False
            trial.report(samples_per_s, index)
            return trial.should_prune()

        trial.set_user_attr("run_started", time.time())  # wall clock: comparable between workers
        try:
            result = run_trial(
                self.workload, params, self.facts, self.options.settings, timeout_s=timeout, on_window=on_window
            )
        except KeyboardInterrupt:
            trial.set_user_attr("run_ended", time.time())
            self._record(trial, role, params, TrialResult("interrupted", error="stopped by Ctrl-C"))
            raise
        trial.set_user_attr("run_ended", time.time())
        self._record(trial, role, params, result)
        return result

    def _record(self, trial: Any, role: str, params: dict[str, Any], result: TrialResult) -> None:
        import optuna

        data = result.to_dict()
        for key in ("status", "samples_per_s", "objective", "spread", "windows", "compile_s", "startup_s", "warmup_s",
                    "timed_s", "loss", "wall_s", "error", "in_effect", "warnings", "log_tail"):
            if data.get(key) not in (None, [], {}):
                trial.set_user_attr(key, data[key])
        state = optuna.trial.TrialState
        if spaces.membind_off(spaces.memory_nodes(params, self.facts), result.in_effect):
            # numactl --membind refused or missing: the pinning was measured unbound, and the recipe says so
            params = {**params, "membind": False}
            trial.set_user_attr("params", params)
        if result.status == "ok":
            reason = self._guard(trial, role, result)
            # A knob the trial process reports not in effect measured something else: not this recipe.
            missing = [] if role == "baseline" else spaces.not_in_effect(params, result.in_effect)
            trial.set_constraint("applied", float(len(missing)))
            if missing:
                reason = "; ".join(missing + ([reason] if reason else []))
                trial.set_user_attr("infeasible", reason)
            self.study.tell(trial, result.objective)
        elif result.status in ("oom", "nan"):
            trial.set_constraint("quality", 0.0)
            trial.set_constraint("fits_memory", 1.0 if result.status == "oom" else 0.0)
            trial.set_constraint("finite_loss", 1.0 if result.status == "nan" else 0.0)
            reason = "out of memory" if result.status == "oom" else "the loss became NaN/inf"
            if result.status == "oom":
                limit = self.study.user_attrs.get("oom_batch_size")
                size = int(params["batch_size"])
                self.study.set_user_attr("oom_batch_size", size if limit is None else min(size, int(limit)))
            trial.set_user_attr("infeasible", reason)
            self.study.tell(trial, 0.0)
        else:
            reason = result.error
            self.study.tell(trial, state=state.PRUNED if result.status == "pruned" else state.FAIL)
        self.notify("trial", {"number": trial.number, "role": role, "params": params, "result": result, "reason": reason})

    def _guard(self, trial: Any, role: str, result: TrialResult) -> str | None:
        """The quality guard: a held-out loss above the baseline's by more than the tolerance is infeasible.
        Every trial's loss is taken after the same samples (``loss_samples``, recorded for the report)."""
        if result.loss_samples is not None:
            trial.set_user_attr("loss_samples", result.loss_samples)
        if role == "baseline":
            self.study.set_user_attr("baseline_loss", result.loss)
            self.study.set_user_attr("baseline_samples_per_s", result.samples_per_s)
        base = self.study.user_attrs.get("baseline_loss")
        tolerance = self.options.max_loss_increase
        increase = (result.loss - base) / abs(base) if base else 0.0
        trial.set_constraint("quality", increase - tolerance)
        trial.set_constraint("fits_memory", 0.0)
        trial.set_constraint("finite_loss", 0.0)
        if increase <= tolerance:
            return None
        reason = f"loss {result.loss:.4f} is {increase:+.1%} over the baseline's {base:.4f} (limit +{tolerance:.0%})"
        trial.set_user_attr("infeasible", reason)
        return reason
