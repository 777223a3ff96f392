"""Script mode: ``autotune search -- python train.py``, a search measured on the user's own script.

The script follows the README's ``apply()`` pattern and is otherwise unchanged. Before the study opens, one copy
of it runs with the defaults to its first step: its ``prepare_model`` tells what the space depends on in its model
(convolutions), and its start-up time bounds the copies' later ones. Every trial is then measured by
``measure.script.measurer.ScriptMeasurer`` (fresh pairs of live copies), and the rest is the search's: seeds,
race, quality guard (on the script's own held-out figure, ``Tuned.evaluate``, or else the training loss its
``step()`` told), confirmation in fresh processes, the recipe.

What script mode leaves out of its space, and why: several processes (a copy's ranks would not tell their steps
through torchrun), compile modes (a copy's first steps, which hold the compilation, are not timed, so its cost
would go uncounted) and pruning (its cost to the model shows only in a held-out figure, which a script need not
give).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .. import search_spaces as spaces
from ..errors import UsageError
from ..recipe import SCRIPT_WORKLOAD
from ..trial.runner import loss_samples
from .budget import Budget, parse_duration
from .driver import one_context_only, run_settings, search
from .events import Phase, Progress, ignore
from .options import SearchOptions, check_options
from .outcome import SearchOutcome
from .records import StudyAttr

if TYPE_CHECKING:
    from ..probes import Facts

log = logging.getLogger(__name__)

CONTEXT_TIMEOUT_S = 300.0  # the first copy's start-up to its first step (imports, data, model)
HELD = {"processes": 1}  # knobs script mode holds (the module docstring says why)


def workload_label(argv: list[str]) -> str:
    """The recipe's and the study's workload: ``script:`` and the script's path as given.

    >>> workload_label(["python", "examples/train_cnn.py", "--epochs", "3"])
    'script:examples/train_cnn.py'
    >>> workload_label(["torchrun", "--nproc-per-node", "1", "train.py", "--config", "my.yaml"])
    'script:train.py'
    """
    given = [a for a in argv[1:] if not a.startswith("-")]
    script = next((a for a in given if a.endswith(".py")), given[0] if given else argv[0] if argv else "")
    return f"{SCRIPT_WORKLOAD}{script}"


def absolute(argv: list[str]) -> list[str]:
    """The command with each argument that names an existing file or folder made absolute: every copy runs in a
    folder of its own. The program, where given as a path, keeps its links (a virtual environment's python is one)
    and is looked up as the shell would; UsageError where there is none."""
    program = argv[0]
    if os.sep in program:
        if not os.access(program, os.X_OK) or Path(program).is_dir():
            raise UsageError(f"{program}: no such program (or not executable), from {os.getcwd()}")
        program = os.path.abspath(program)
    elif shutil.which(program) is None:
        raise UsageError(f"{program}: no such program on PATH")
    return [program, *(str(Path(a).resolve()) if not a.startswith("-") and Path(a).exists() else a
                       for a in argv[1:])]


def search_script(argv: list[str], *, batch_size: int | None, options: SearchOptions | None = None,
                  progress: Progress | None = None, budget: str | float | None = None,
                  facts: Facts | None = None, folder: Path | None = None, **measuring: Any) -> SearchOutcome:
    """Search the knobs of the script ``argv`` (``python train.py ARGS``) that trains with ``batch_size`` a
    process (None: the batch the script's first copy tells, as a framework integration does), and store the best
    recipe (see the module docstring). ``folder``: where the copies run (default: a new temporary folder, removed
    at the end unless a copy failed: its log is kept and named); ``measuring``: ``ScriptMeasurer``'s options
    (``min_window_s``, ``start_limit_s``, ``stall_s``)."""
    from .. import probes

    if not argv:
        raise UsageError("script mode needs a command after --: autotune search -- python train.py")
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1 (got {batch_size}): the batch your script trains with")
    command = absolute(argv)  # a program that is not there: its one line before anything starts
    options = options or SearchOptions()
    if budget is not None:
        options = replace(options, budget_s=parse_duration(budget) if isinstance(budget, str) else float(budget))
    options = replace(options, compile=False, fixed={**options.fixed, **HELD})
    check_options(options)
    facts = facts or probes.probe()
    import torch

    device: Literal["cpu", "cuda"] = "cuda" if facts.gpus and torch.cuda.is_available() else "cpu"
    shared = one_context_only(facts) if device == "cuda" else None
    if shared:
        raise UsageError(shared)
    ctx = spaces.SpaceContext(device=device, default_batch_size=batch_size or 1, global_batch=options.global_batch,
                              allow_compile=False)
    own_folder, failed = folder is None, list[Path]()
    folder = folder or Path(tempfile.mkdtemp(prefix="autotune-script-"))
    try:
        return _search_copies(argv, command, batch_size, options, progress, facts, ctx, folder, measuring, failed)
    finally:
        if own_folder:
            _tidy(folder, failed)


def _tidy(folder: Path, failed: list[Path]) -> None:
    """Remove the search's folder of copies, but where a copy failed: its reason names its last line, its log holds
    the rest."""
    if not failed:
        shutil.rmtree(folder, ignore_errors=True)
        return
    kept = {path.resolve() for path in failed}
    for path in folder.iterdir():  # the other copies' folders go (a script may write much into its folder)
        if path.resolve() not in kept:
            shutil.rmtree(path, ignore_errors=True)
    logs = sorted({str(path / "script.log") for path in failed if (path / "script.log").exists()})
    log.warning("the output of the copies that failed is kept: %s", ", ".join(logs))


def _search_copies(argv: list[str], command: list[str], batch_size: int | None, options: SearchOptions,
                   progress: Progress | None, facts: Facts, ctx: spaces.SpaceContext, folder: Path,
                   measuring: dict[str, Any], failed: list[Path]) -> SearchOutcome:
    """``search_script``'s search of ``command`` (``argv`` made absolute, ``argv`` as the user gave it for the
    messages), its copies in ``folder``: the first copy, then the study; the folders of copies that failed are
    added to ``failed``."""
    from ..measure import ScriptMeasurer, script_context

    label, notify = workload_label(argv), progress or ignore
    defaults = {**spaces.defaults(facts, ctx), **run_settings(ctx, options)}
    if batch_size is None:  # the first copy trains with the script's own batch and tells it
        defaults = {k: v for k, v in defaults.items() if k not in ("batch_per_rank", "reference_batch")}
    notify(Phase("starting the script", None, "one copy with the defaults, to its first step"))
    timing = Budget.start(options.budget_s)  # the budget holds the first copy's run too
    try:
        told = script_context(command, defaults, facts, folder / "context", os.environ,
                              min(CONTEXT_TIMEOUT_S, options.budget_s or CONTEXT_TIMEOUT_S))
    except RuntimeError as e:
        raise UsageError(f"{' '.join(argv)}: {e}") from None
    if batch_size is None and not told.model.batch:
        raise UsageError(f"script mode needs --batch-size N: the batch your script trains with in one process (a "
                         f"framework integration's callback tells it; this script told none): autotune search "
                         f"--batch-size 64 -- {' '.join(argv)}")
    if batch_size is None and not 1 <= told.model.batch <= spaces.batch.MOST:  # the pipe's text is the script's
        raise UsageError(f"the script told a batch of {told.model.batch}, not one of 1 to {spaces.batch.MOST}: give "
                         f"--batch-size N, the batch it trains with in one process")
    ctx = replace(ctx, conv=told.model.conv, conv_nd=told.model.conv_nd,
                  default_batch_size=batch_size or told.model.batch)
    # What the script owns is held at the defaults' value, out of the search; the recipe's notes name it.
    held = {knob: defaults[knob] for knob in told.owned if knob not in options.fixed}
    options = replace(options, fixed={**options.fixed, **held})
    for knob, why in told.owned.items():
        log.warning("%s: %s; left out of the search", knob, why)
    if options.budget_s:
        options = replace(options, budget_s=max(1.0, options.budget_s - timing.spent()))
    defaults = {**spaces.defaults(facts, ctx), **run_settings(ctx, options)}
    measurer = ScriptMeasurer(
        command, defaults, facts, folder, workload=label,
        loss_samples=loss_samples(options.settings, defaults, facts), startup_s=told.startup_s, seed=options.seed,
        on_phase=lambda name, detail: notify(Phase(name, None, detail)), **measuring)
    measurer.failed_copies = failed
    stem = Path(label.removeprefix(SCRIPT_WORKLOAD)).stem
    return search(label, options=options, progress=progress, measurer=measurer, facts=facts, ctx=ctx, stem=stem,
                  attrs={StudyAttr.SCRIPT_OWNS: told.owned}, timing=timing)
