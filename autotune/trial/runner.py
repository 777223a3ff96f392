"""The trial runner: one short, real training run of the workload in a fresh subprocess.

Environment and CPU affinity are set before the child's Python starts (``autotune.trial.launch``); the
child (``autotune.trial.child``) applies the rest with ``autotune.apply()``. The parent enforces the
time limit, forwards per-window throughput to the pruner, stops the whole process tree on a timeout,
a prune or Ctrl-C, and classifies the outcome from the child's result file and exit status.

Each trial works in a fresh ``autotune-trial-*`` directory under the temporary directory (spec, result,
events, log, compile caches), removed when the trial ends. A search killed with ``kill -9`` runs no
clean-up: the directory records its owner (``autotune.trial.lock``), and the next trial on this host removes
every trial directory whose owner is gone (``remove_abandoned``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import search_spaces as spaces
from ..probes import Facts
from . import launch, lock
from .spec import OnWindow, Status, TrialResult, TrialSettings, TrialSpec

log = logging.getLogger(__name__)

TRIAL_DIR_PREFIX = "autotune-trial-"
OWNER_FILE = "owner.json"  # in a trial directory: the search process that made it (``autotune.trial.lock``)


def loss_samples(settings: TrialSettings, params: dict[str, Any], facts: Facts) -> int:
    """The samples every trial of a study trains before its loss is taken: the reference batch's
    ``warmup_steps + measure_steps`` steps, rounded up to whole optimizer steps of every batch size and
    process count the study offers (a step's samples are summed over ranks and accumulated micro-batches).
    With a default batch of 64 (sizes 16 to 256) that is 1,792 samples: 112 steps of 16, 7 of 256.

    Depends only on the study's run settings and hardware, so it is the same for all its trials.
    """
    reference = int(params.get("reference_batch") or spaces.batch.global_size(params))
    global_batch = params.get("global_batch")
    ctx = spaces.SpaceContext(device=params.get("device") or "cpu", default_batch_size=reference,
                              global_batch=global_batch)

    def step(batch: int, processes: int) -> int:  # as ``Tuned.step_samples``: ``batch`` per rank
        shape = {"batch_per_rank": batch, "processes": processes, "global_batch": global_batch}
        return spaces.batch.global_size(shape) * spaces.batch.accumulation(shape)

    unit = math.lcm(*(step(b, p) for b in spaces.batch.sizes(ctx) for p in spaces.processes.choices(facts, ctx)))
    planned = reference * (settings.warmup_steps + settings.measure_steps)
    return max(1, -(-planned // unit)) * unit


def _log_tail(path: Path, limit: int = 1500) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return text[-limit:] or None


def run_trial(
    workload: str,
    params: dict[str, Any],
    facts: Facts,
    settings: TrialSettings,
    *,
    timeout_s: float,
    on_window: OnWindow | None = None,
    python: str = sys.executable,
) -> TrialResult:
    """Run one trial; ``on_window(index, samples_per_s)`` returning True prunes it.

    Raises KeyboardInterrupt after stopping the trial's process tree when interrupted.
    """
    with trial_directory() as work:
        spec = TrialSpec(
            workload=workload, params=params, facts=facts, settings=settings,
            reference_batch=int(params.get("reference_batch") or spaces.batch.global_size(params)),
            loss_samples=loss_samples(settings, params, facts),
            events=str(work / "events.jsonl"), result=str(work / "result.json"),
        )
        (work / "spec.json").write_text(spec.to_json())
        plan = trial_plan([python, "-m", "autotune.trial.child", str(work / "spec.json")], params, facts, work)
        started = time.monotonic()
        with open(work / "stderr.log", "wb") as stderr:
            proc = launch.start(plan, stdout=stderr, stderr=stderr, stdin=subprocess.DEVNULL)
            outcome = _watch(proc, work / "events.jsonl", started + timeout_s, on_window)
        wall = time.monotonic() - started
        result = _classify(outcome, proc.returncode, work, wall, timeout_s)
        return replace(result, warnings=[*plan.warnings, *result.warnings]) if plan.warnings else result


def remove_abandoned(root: Path | None = None) -> list[Path]:
    """Remove the trial directories under ``root`` (default: the temporary directory) whose owner, on this
    host, is gone; returns them. A directory without a readable owner is left alone: it is being created,
    or belongs to another host or user (one not this user's is never read: anyone may write one there)."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(TRIAL_DIR_PREFIX + "*"):
        try:
            if path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            owner = json.loads((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if lock.owner_gone(owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.info("removed %s, left by a search (pid %s) that died", path, owner.get("pid"))
    return removed


@contextlib.contextmanager
def trial_directory() -> Iterator[Path]:
    """A fresh directory for one trial, owned by this process and removed when the trial ends."""
    remove_abandoned()
    with tempfile.TemporaryDirectory(prefix=TRIAL_DIR_PREFIX) as tmp:
        work = Path(tmp)
        (work / OWNER_FILE).write_text(json.dumps(lock.owner()))
        yield work


# multiprocessing puts AF_UNIX sockets in the temporary directory (pymp-XXXXXXXX/listener-XXXXXXXX): their
# path must stay under the kernel's 108 bytes (unix(7)), with room for those 32 characters.
_SOCKET_PATH_ROOM = 107 - 32
SHORT_TMPDIR = "/tmp"  # where a socket's path fits whatever TMPDIR says (Linux's own temporary directory)


def trial_plan(cmd: list[str], params: dict[str, Any], facts: Facts, work: Path) -> launch.LaunchPlan:
    """How a trial process (a trial child or a paired worker) starts in its trial directory ``work``: the
    recipe's environment and affinity (``launch.plan``), a cold compile cache of its own (compile time is
    measured as the user's first run pays it, and a process stopped mid-compile cannot leave a truncated kernel
    behind for the next one) and its own temporary directory."""
    plan = launch.plan(cmd, params, facts, os.environ, keep_user_env=False)
    plan.env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    plan.env["TRITON_CACHE_DIR"] = str(work / "triton")
    _private_tmpdir(plan.env, work)
    return plan


def _private_tmpdir(env: dict[str, str], work: Path) -> None:
    """The trial's own temporary directory, inside its trial directory: what the trial leaves in TMPDIR when
    it is killed (multiprocessing's pymp-*, torchrun's torchelastic_*) goes with the trial directory.
    Where that path would be too long for a socket, the trial keeps the inherited one, or where that is too long
    as well (a DataLoader worker then failed to share its first batch and the trial waited for it until its
    time ran out), ``SHORT_TMPDIR``."""
    tmp = work / "t"
    if len(str(tmp)) < _SOCKET_PATH_ROOM:
        tmp.mkdir()
        env["TMPDIR"] = str(tmp)
    elif len(env.get("TMPDIR") or tempfile.gettempdir()) >= _SOCKET_PATH_ROOM:
        env["TMPDIR"] = SHORT_TMPDIR


def _watch(proc: subprocess.Popen[bytes], events: Path, deadline: float, on_window: OnWindow | None) -> str | None:
    """Wait for the child; returns why autotune stopped it (timeout, pruned) or None."""
    seen = 0

    def prune() -> bool:
        """Pass the windows written since the last look to ``on_window``; whether it asked to stop."""
        nonlocal seen
        if on_window is None or not events.exists():
            return False
        for line in events.read_text().splitlines()[seen:]:
            event = json.loads(line) if line.endswith("}") else None
            if event is None:
                break  # partially written line: read it next time
            seen += 1
            if on_window(event["window"], event["samples_per_s"]):
                return True
        return False

    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                launch.stop_tree(proc)
                return "timeout"
            if prune():
                launch.stop_tree(proc)
                return "pruned"
            if _failed(events.parent):
                # A rank failed: the others only wait on it, and torch.distributed.run takes seconds to
                # stop them. The earliest failure is on disk; stop the job now.
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        launch.stop_tree(proc)
        raise
    launch.stop_tree(proc, grace_s=0.5)  # DataLoader workers or other leftovers of a finished child
    prune()  # the windows written just before it ended: every one is seen, and the trial is whole
    return None


def _failed(work: Path) -> bool:
    """Whether some rank wrote a failure (rank 0's ``result.json`` is written once, atomically)."""
    if any(work.glob("result.rank*.json")):
        return True
    try:
        return TrialResult.from_json((work / "result.json").read_text()).status != Status.OK
    except (OSError, ValueError):
        return False


def _read_result(work: Path) -> TrialResult | None:
    """Rank 0's ``result.json`` when it succeeded; else the earliest failure any rank wrote
    (``result.rank<R>.json`` with several processes): the later ones are its consequences."""
    found = [TrialResult.from_json(path.read_text()) for path in sorted(work.glob("result*.json"))]
    ok = [result for result in found if result.status == Status.OK]
    if ok or not found:
        return ok[0] if ok else None
    return min(found, key=lambda result: result.failed_at or 0.0)


def _classify(stopped: str | None, returncode: int | None, work: Path, wall: float, timeout_s: float) -> TrialResult:
    tail = _log_tail(work / "stderr.log")
    if stopped == "timeout":
        return TrialResult(Status.TIMEOUT, wall_s=wall, error=f"no result within {timeout_s:.0f} s", log_tail=tail)
    if stopped == "pruned":
        return TrialResult(Status.PRUNED, wall_s=wall, error="slower than earlier trials at the same point")
    written = _read_result(work)
    if written is not None:
        return replace(written, wall_s=wall, log_tail=tail if written.status != Status.OK else None)
    # With several processes a rank killed by SIGKILL is seen here only as torch.distributed.run's
    # failure (status 1): it is recorded as a crash, the rank's exit code is in the log tail.
    if returncode == -signal.SIGKILL:
        # Nobody but the kernel's OOM killer sends SIGKILL to a trial autotune did not stop itself.
        return TrialResult(Status.OOM, wall_s=wall, error="killed by SIGKILL (the kernel's out-of-memory killer)",
                           log_tail=tail)
    return TrialResult(Status.CRASH, wall_s=wall, error=f"the trial process {ended(returncode)} and wrote no result",
                       log_tail=tail)


def ended(returncode: int | None) -> str:
    """How a process ended, from its exit status (Popen: minus the signal's number when a signal killed it)."""
    if returncode is None or returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"  # SIGSEGV, SIGABRT: a fault in native code
    except ValueError:
        return f"was killed by signal {-returncode}"


__all__ = ["OWNER_FILE", "TRIAL_DIR_PREFIX", "ended", "loss_samples", "remove_abandoned", "run_trial",
           "trial_directory", "trial_plan"]
