"""What a search is asked to do (``SearchOptions``) and the check that refuses what no search can run."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .. import search_spaces as spaces
from ..database import default_storage
from ..errors import UsageError
from ..trial.spec import TrialSettings


@dataclass(frozen=True)
class SearchOptions:
    budget_s: float | None = 1800.0
    trials: int | None = None
    storage: str = field(default_factory=default_storage)
    study: str | None = None
    settings: TrialSettings = field(default_factory=TrialSettings)
    max_loss_increase: float = 0.05  # relative to the baseline's loss
    global_batch: int | None = None
    lr_scaling: str = "sqrt"
    seed: int = 0
    compile: bool = True
    fixed: dict[str, Any] = field(default_factory=dict)  # knobs held at a value (--fix KNOB=VALUE)
    confirm_top: int = 3  # candidates re-run side by side with the baseline before one is declared best
    confirm_rounds: int = 3  # the confirmation's rounds, each in fresh worker processes (the calibration's pairs split)
    # fresh process pairs of the chosen recipe against the defaults, started as your training is, behind the stated
    # speedup (``measure.runs``); None: by the budget (``reserve.claim_pairs``), 0: none (the claim stays provisional)
    claim_pairs: int | None = None
    busy_limit: float = 1.5  # the widest A/A interval (high / low) recipes are ranked on (``measurer.too_busy``)
    seeded: bool = True  # False: the baseline alone is seeded, the sampler picks the rest (the benchmark's control)


def check_options(options: SearchOptions) -> None:
    """Refuse options no search can run with, before anything is probed or written: one line naming
    each bad option by its ``autotune search`` flag. ``search()`` and the CLI both call it."""
    s, problems = options.settings, []

    def need(ok: bool, text: str) -> None:
        if not ok:
            problems.append(text)

    need(options.budget_s is None or (math.isfinite(options.budget_s) and options.budget_s > 0),
         f"--budget must be more than zero (got {options.budget_s})")
    need(options.trials is None or options.trials >= 1, f"--trials must be at least 1 (got {options.trials})")
    need(options.budget_s is not None or options.trials is not None, "give a --budget, a --trials count, or both")
    need(not math.isnan(options.max_loss_increase) and options.max_loss_increase >= 0,
         f"--max-loss-increase must be 0 or more (got {options.max_loss_increase}): "
         "the baseline itself must pass the guard")
    need(options.global_batch is None or options.global_batch >= 1,
         f"--global-batch must be at least 1 (got {options.global_batch})")
    need(options.lr_scaling in spaces.batch.LR_RULES,
         f"--lr-scaling must be one of {', '.join(spaces.batch.LR_RULES)} (got {options.lr_scaling!r})")
    need(0 <= options.seed < 2**32 and 0 <= s.seed < 2**32, f"--seed must be 0 to {2**32 - 1} (got {options.seed})")
    need(options.confirm_top >= 0, f"--confirm must be 0 or more (got {options.confirm_top})")
    need(options.busy_limit > 1, f"--busy-limit must be more than 1 (got {options.busy_limit})")
    need(options.confirm_rounds >= 1, f"--confirm-rounds must be at least 1 (got {options.confirm_rounds})")
    need(options.claim_pairs is None or 0 <= options.claim_pairs <= 100,
         f"--claim-pairs must be 0 to 100 (got {options.claim_pairs})")
    need(s.warmup_steps >= 0, f"--warmup-steps must be 0 or more (got {s.warmup_steps})")
    need(s.windows >= 1 and s.measure_steps >= s.windows,
         f"--steps must be at least {max(1, s.windows)}, one per timed window (got {s.measure_steps})")
    need(s.train_steps >= 1,
         f"--train-steps must be at least 1 (got {s.train_steps}): compile time is amortised over it")
    need(s.eval_samples >= 1 and s.max_extra_windows >= 0 and s.max_spread >= 0,
         "TrialSettings: eval_samples must be at least 1, max_extra_windows and max_spread 0 or more")
    if problems:
        raise UsageError("; ".join(problems))


__all__ = ["SearchOptions", "check_options"]
