"""Studies and recipes written through the APIs a search uses (Optuna's ask/tell, the recipe store), in real SQLite."""
from __future__ import annotations

from typing import Any

from autotune.recipe import Recipe
from autotune.store import RecipeStore
from autotune.study.records import Attr, StudyAttr

DEFAULTS = {"threads": 2, "affinity": "none", "batch_size": 32, "compile_mode": "none", "device": "cpu",
            "reference_batch": 32, "lr_scaling": "sqrt", "global_batch": None}


def add_study(url: str, name: str, *, workload: str = "tiny", fingerprint: str = "v3-aaaaaaaaaaaa",
              trials: list[tuple[str, dict[str, Any], str, float | None]], running: int = 0) -> None:
    """A study as a search records it: its facts, then ``(role, params, status, samples/s)`` per trial."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name=name, direction="maximize")
    study.set_user_attr(StudyAttr.FINGERPRINT, fingerprint)
    study.set_user_attr(StudyAttr.WORKLOAD, workload)
    for role, params, status, speed in trials:
        trial = study.ask()
        for key, value in ((Attr.ROLE, role), (Attr.PARAMS, params), (Attr.STATUS, status),
                           ("samples_per_s", speed), ("objective", speed)):
            trial.set_user_attr(key, value)
        trial.set_constraint("quality", 0.0 if status == "ok" else 1.0)
        if status == "ok":
            study.tell(trial, speed)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    for _ in range(running):
        study.ask()


def add_recipe(url: str, params: dict[str, Any], *, study: str | None, workload: str = "tiny",
               fingerprint: str = "v3-aaaaaaaaaaaa", speed: float = 200.0, base: float = 100.0,
               interval: tuple[float, float] | None = None, claim: str | None = "confirmed") -> Recipe:
    """A stored recipe; ``interval``: its speedup's, as a paired measurement gives it; ``claim``: what it stands on
    (a search's confirmation by default; None: stored before autotune kept it)."""
    low, high = interval or (None, None)
    with RecipeStore.open(url) as store:
        return store.save(Recipe(params=params, workload=workload, fingerprint=fingerprint, study=study,
                                 samples_per_s=speed, baseline_samples_per_s=base, speedup=speed / base, loss=1.0,
                                 baseline_loss=1.0, speedup_low=low, speedup_high=high, claim=claim))
