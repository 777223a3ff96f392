"""``autotune search``: run an Optuna study of real short training runs and store the best recipe."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AutotuneError, UsageError
from ..measure import Noise
from ..recipe import format_speedup
from ..study import SearchOptions, SearchOutcome, check_options, how_measured, parse_duration, search, search_script
from ..study.events import Event, SearchStarted
from ..study.records import CONFIRM, NOT_RUN
from ..trial import TrialSettings
from ._common import add_storage, command_after_dashes, console
from ._progress import JsonLines, LiveView, PlainLines

if TYPE_CHECKING:
    from rich.console import Console

    from ..probes import Facts

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "search", help="search the knobs that matter on this hardware for a workload",
        description="Each trial measures a recipe's speedup over PyTorch's defaults, with its interval: the two "
        "train in one worker process in alternating time windows (knobs of another environment: x its factor "
        "from pairs of processes). Trial 0 is the defaults against themselves: this machine's noise. A "
        "candidate gets more window pairs while it may beat the best so far, and stops early when it is slower "
        "with confidence, its loss is over the quality guard's limit or its process reports a knob not in "
        "effect (it measured another recipe). Trials that start no process (the "
        "in-process knobs in a live worker) get twice the time of those that start processes, and fill "
        "the budget's end. A recipe stored earlier for this workload and hardware is tried next (warm start); "
        "where the defaults wait for data half a step or more, DataLoader workers come first; a precision this "
        "machine's kernels run 4x slower than float32 is not seeded nor started when sampled, nor a precision a trial "
        "of this search stopped far slower; sampled trials take turns with the seeds, at "
        "least a third of the trials after the first. At "
        "the end the fastest feasible recipes (not those the search found below 1 + the noise margin) are "
        "measured again with fresh pairs, in --confirm-rounds rounds of fresh worker processes (--confirm); a "
        "recipe is kept "
        "only if its confirmed speedup's low bound clears 1 by the noise margin over one round, by 2% over more "
        "(no round completed: the defaults "
        "are kept); the recipe chosen then runs against the defaults in fresh process pairs of your training "
        "(--claim-pairs), whose speedup, interval and range of one run are what it states (their mean not above "
        "1.00x: the defaults are kept), said with its GFLOP/s as a "
        "share of this machine's measured matmul peak (the workload's FLOP counted once; the defaults profiled "
        "for 2 s after the calibration and each fastest-yet candidate for 1 s, for the report's breakdown of a "
        "step). Ctrl-C stops the "
        "running trial and keeps every result: the same command (or --study NAME) continues the study. "
        "A stored recipe outside this search's space (e.g. compile_mode=default under --no-compile) is skipped "
        "with a warning; a default study searched with other knob choices goes on as a study of its own "
        "(NAME-XXXXXX), a study named with --study is refused.",
    )
    p.add_argument("--workload", default=None, metavar="W",
                   help="cnn | transformer | tiny | MODULE:FUNCTION | FILE.py:FUNCTION (default: cnn, or the "
                   "script after --)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="script mode: the batch your script trains with in one process, what tuned.batch_size "
                   "gives the defaults (required with a script, but one that tells its own through a framework "
                   "integration)")
    p.add_argument("--budget", default="30m", help="wall-clock budget: 90s, 30m, 1h30m (default: 30m)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="stop when the study holds N measured trials, counting earlier runs and other workers "
                   "(with --budget: whichever comes first; confirmation runs are not counted)")
    p.add_argument("--study", default=None, metavar="NAME",
                   help="study name (default: WORKLOAD-FINGERPRINT); an existing study continues")
    add_storage(p)
    p.add_argument("--max-loss-increase", type=float, default=0.05, metavar="F",
                   help="quality guard: a trial whose loss is more than F (relative, 0 or more) above the baseline's "
                   "is infeasible (default: 0.05)")
    p.add_argument("--busy-limit", type=float, default=1.5, metavar="R",
                   help="the widest A/A calibration (its interval's high over its low, more than 1) recipes are "
                   "ranked on: wider twice, the machine is too busy and the search ends saying so (default: 1.5; "
                   "inf ranks on any, for gains larger than the noise)")
    p.add_argument("--global-batch", type=int, default=None, metavar="N",
                   help="keep N (at least 1) samples per optimizer step by gradient accumulation; a step of several "
                   "processes takes at least batch_per_rank x processes (otherwise the lr follows --lr-scaling)")
    p.add_argument("--lr-scaling", choices=("sqrt", "linear", "none"), default="sqrt",
                   help="learning-rate rule when the batch size changes (default: sqrt)")
    p.add_argument("--train-steps", type=int, default=5000, metavar="N",
                   help="optimizer steps of the planned training run (at least 1); compile time is amortised over them "
                   "(default: 5000)")
    p.add_argument("--steps", type=int, default=24, metavar="N",
                   help="steps at the default batch size, after the warm-up, before every trial's quality-guard "
                   "loss is taken (the same sample count for all), at least 3 (default: 24); the windows are timed by "
                   "length, not steps")
    p.add_argument("--warmup-steps", type=int, default=4, metavar="N",
                   help="untimed warm-up steps per trial, 0 or more (default: 4)")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the search")
    p.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                   help="hold a knob at a value in every trial but the baseline, e.g. --fix affinity=none "
                   "--fix num_workers=0 (repeatable; values are JSON: 2, true, null, or text). A knob this search does "
                   "not have, or a value its space cannot take here, is refused with the allowed values")
    p.add_argument("--confirm", type=int, default=3, metavar="K",
                   help="measure the K fastest feasible recipes again with fresh pairs before choosing (fewer when "
                   "the search found some below 1 + the noise margin: they could not be offered); only these "
                   "decide, and time for them is kept in the budget (default: 3; 0: choose from the search's own "
                   "intervals)")
    p.add_argument("--confirm-rounds", type=int, default=3, metavar="R",
                   help="a confirmation measures each candidate in R rounds, each in fresh worker processes, the "
                   "calibration's window pairs split over them (at least 6 a round); its speedup is the rounds' "
                   "geometric mean, its interval includes the spread between them; one whose interval so far lies "
                   "below the leading candidate's low bound is left out of the later rounds, and one whose search "
                   "interval lies below the low bound of one confirmed before it gets no round; a recipe of one "
                   "round is offered as provisional, not confirmed (it does not see how a speedup varies between "
                   "processes); R at least 1 (default: 3)")
    p.add_argument("--claim-pairs", type=int, default=None, metavar="N",
                   help="the chosen recipe is then run against the defaults in N fresh process pairs, each process "
                   "started as 'autotune run' starts your training; the stated speedup, its 95%% interval and the "
                   "range of one run of yours (a 90%% prediction interval) come from these pairs alone; confirmed "
                   "takes 6 or more; where their mean is not above 1.00x the defaults are kept (default: as many, "
                   "up to 6, as 40%% of the budget holds at the calibration's price of a pair, none below 3, and "
                   "more, up to 6, while the budget's end holds 1.2x the longest pair; 6 without a budget; 0: none, "
                   "and the recipe is provisional)")
    p.add_argument("--seed", type=int, default=0, help="sampler and training seed, 0 to 2**32-1 (default: 0)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per event (JSON lines, each with \"event\": its name) and the "
                   "result as the last line, for scripts; the summary and logs go to stderr")
    p.add_argument("--report", default=None, metavar="FILE",
                   help="write the HTML report there at the end (default: report-STUDY.html; see autotune report)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="script mode: your own training script after --, e.g. -- python train.py ARGS (it calls "
                   "autotune.apply() as the README shows); each trial runs copies of it, measured against the "
                   "defaults' copies in fresh process pairs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = SearchOptions(
        budget_s=parse_duration(args.budget), trials=args.trials, storage=args.storage, study=args.study,
        settings=TrialSettings(warmup_steps=args.warmup_steps, measure_steps=args.steps,
                               train_steps=args.train_steps, seed=args.seed),
        max_loss_increase=args.max_loss_increase, global_batch=args.global_batch, lr_scaling=args.lr_scaling,
        busy_limit=args.busy_limit, seed=args.seed, compile=not args.no_compile, fixed=parse_fixes(args.fix),
        confirm_top=args.confirm, confirm_rounds=args.confirm_rounds, claim_pairs=args.claim_pairs,
    )
    check_options(options)  # before anything is probed or written (search() checks again, for library callers)
    command = command_after_dashes(args)
    _check_mode(args, command)
    out = console(stderr=args.json)  # under --json, stdout holds JSON lines only
    view: JsonLines | LiveView | PlainLines
    view = JsonLines(sys.stdout) if args.json else LiveView(out) if out.is_terminal else PlainLines(out)
    seen: list[Facts] = []

    def progress(event: Event) -> None:
        if isinstance(event, SearchStarted):
            seen.append(event.facts)  # the report's probe summary: the machine as this search probed it
        view(event)

    try:
        if command:
            outcome = search_script(command, batch_size=args.batch_size, options=options, progress=progress)
        else:
            outcome = search(args.workload or "cnn", options=options, progress=progress)
    finally:
        view.close()
    _print_outcome(out, outcome)
    report = _write_report(args, outcome.study, seen[0] if seen else None)
    if report is not None:
        out.print(f"report: {report}", markup=False, soft_wrap=True)
    if isinstance(view, JsonLines):
        view.emit({"event": "result", "study": outcome.study, "stopped": outcome.stopped,
                   "elapsed_s": outcome.elapsed_s, "baseline": outcome.baseline.number, "best": outcome.best.number,
                   "recipe": outcome.recipe.to_dict(), "report": str(report) if report else None})
    return 0


def _check_mode(args: argparse.Namespace, command: list[str]) -> None:
    """A workload or a script (``command``), not both; ``--batch-size`` only with a script (which may tell its own
    through a framework integration)."""
    if command and args.workload is not None:
        raise UsageError(f"--workload {args.workload} and a script after --: search one or the other")
    if not command and args.batch_size is not None:
        raise UsageError("--batch-size is for script mode: autotune search --batch-size N -- python train.py")


def _write_report(args: argparse.Namespace, study: str, facts: Facts | None) -> Path | None:
    """The HTML report of the search; a report that cannot be written is a warning: the results are stored,
    and the search's exit status and ``--json`` result line stand."""
    from ..report import write_report
    from .report import default_path

    try:
        return write_report(args.storage, study, args.report or default_path(study), facts).resolve()
    except Exception as e:  # noqa: BLE001 - even a bug in the report must not turn a stored search into a failure
        why = str(e) if isinstance(e, (OSError, AutotuneError)) else f"{type(e).__name__}: {e}"
        log.warning("the report was not written (%s); the study is stored: autotune report --study %s", why, study,
                    exc_info=args.debug)
        return None


def parse_fixes(items: list[str]) -> dict[str, Any]:
    """``["threads=2", "channels_last=true"]`` -> ``{"threads": 2, "channels_last": True}``."""
    fixed: dict[str, Any] = {}
    for item in items:
        knob, sep, text = item.partition("=")
        if not sep or not knob.strip():
            raise UsageError(f"--fix {item!r}: use KNOB=VALUE, e.g. --fix affinity=none")
        try:
            fixed[knob.strip()] = json.loads(text)
        except json.JSONDecodeError:
            fixed[knob.strip()] = text
    return fixed


def _print_outcome(out: Console, outcome: SearchOutcome) -> None:
    from rich.table import Table

    r, base, best = outcome.recipe, outcome.baseline, outcome.best
    confirmed = sum(1 for rec in outcome.records if rec.role == CONFIRM)
    measured = sum(1 for rec in outcome.records if rec.role != CONFIRM
                   and rec.result.status not in NOT_RUN)
    table = Table(title=f"study {outcome.study}: {measured} trials + {confirmed} confirmations, "
                        f"{outcome.elapsed_s:.0f} s, stopped by {outcome.stopped}")
    for column in ("", "samples/s", "loss", "speedup over PyTorch defaults"):
        table.add_column(column, justify="right" if column else "left", no_wrap=not column)
    table.add_row(f"PyTorch defaults (trial {base.number})", _rate(r.baseline_samples_per_s), f"{base.result.loss:.4f}",
                  "1.00x")
    label = "best: the defaults" if best.number == base.number else f"best (trial {best.number})"
    speedup = format_speedup(r.speedup, r.speedup_low, r.speedup_high)
    table.add_row(label, _rate(r.samples_per_s), f"{r.loss:.4f}", speedup)
    out.print(table)
    if best.number != base.number:
        out.print(f"{speedup} over PyTorch defaults" + (f" ({r.claim_text})" if r.claim_text else ""), markup=False)
        if r.run_text:
            out.print(r.run_text, markup=False, soft_wrap=True)
    if r.place_text:
        out.print(f"{'best' if best.number != base.number else 'the defaults'}: {r.place_text}", markup=False,
                  soft_wrap=True)
    noise = Noise.stored(outcome.noise) if outcome.noise else None  # a study's: another version's reads as none
    if noise is not None:
        out.print(f"noise: {noise.note()}", markup=False, soft_wrap=True)  # one line, as the notes: grep finds it
    how = [how_measured(note) for note in r.notes]
    for note in (note for note, measured in zip(r.notes, how, strict=True) if not measured):
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    if any(how):
        out.print(f"{sum(how)} note(s) on how these figures were measured: autotune best", markup=False)
    out.print(f"recipe {r.id} stored; export it with: autotune export --format env -o best.env")


def _rate(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


