"""Script mode's first copy: one copy of the user's script with the defaults, run to its first steps before the
study opens, tells what the search space depends on in its model and which knobs the script owns."""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...probes import Facts
from ...steps import Model
from .copies import WARMUP_STEPS, ScriptRun, copy_plan, failure


@dataclass(frozen=True)
class ScriptContext:
    """What a first copy of the script told: its model (``steps.Model``), its start-up to its first step, and the
    knobs it owns, each with why: it sets them itself, so no recipe can change them."""

    model: Model
    startup_s: float
    owned: dict[str, str]  # knob -> why


PROBE_WORKERS = 2  # DataLoader workers the first copy is given: a script that takes tuned.dataloader_kwargs starts them


def script_context(argv: list[str], params: dict[str, Any], facts: Facts, folder: Path,
                   env: Mapping[str, str], timeout_s: float) -> ScriptContext:
    """One copy of the defaults, but ``PROBE_WORKERS`` DataLoader workers, to its ``WARMUP_STEPS``-th step: what
    its ``prepare_model`` and first step told, and whether it started the workers. A script that never prepares a
    model or never steps is a ``RuntimeError`` saying so."""
    probe = {**params, "num_workers": PROBE_WORKERS, "prefetch_factor": 2}
    run = ScriptRun(copy_plan(argv, probe, facts, env, "(script context)"), folder)
    started = time.monotonic()
    try:
        run.start()
        run.window(0.0, min_steps=WARMUP_STEPS, timeout_s=timeout_s)
        if run.model is not None and run.model.ranks > 1:
            raise RuntimeError(f"the script trains in {run.model.ranks} processes: script mode times copies of one "
                               f"(torchrun --nproc-per-node 1); the processes knob is searched in workload mode")
        if run.model is None or not run.steps:
            what = "call tuned.prepare_model(model)" if run.model is None else "call tuned.step(loss, optimizer)"
            raise RuntimeError(f"the script's copy did not {what} (as the README's apply() pattern does) within "
                               f"{timeout_s:.0f} s: {failure([run], ('its',))}")
        startup_s, owned = time.monotonic() - started, {}
        if run.effect is not None and run.effect.threads != params.get("threads"):
            owned["threads"] = (f"the script sets torch's threads itself ({run.effect.threads} where the recipe "
                                f"said {params.get('threads')})")
        if run.processes() == 0:
            owned["num_workers"] = (f"the script's DataLoader does not take tuned.dataloader_kwargs (no worker "
                                    f"process with num_workers={PROBE_WORKERS})")
        return ScriptContext(run.model, startup_s, owned)
    finally:
        run.stop()
