"""How a process is started with a recipe's environment-level knobs, as plain data ``(cmd, env, cpus)``.

Used by the trial runner (every trial) and by ``autotune run`` (the user's own script), so both start
processes the same way; ``autotune export --format env`` writes what ``autotune run`` would set (``for_recipe``).
Variables autotune sets (from the knob families in ``autotune.search_spaces``):

| variable | knob | value |
| --- | --- | --- |
| ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` | ``threads`` | intra-op threads |
| CPU affinity (``sched_setaffinity``, not a variable) | ``affinity`` | the CPUs of ``cpus_for()`` |
| ``LD_PRELOAD`` | ``openmp=intel``, ``allocator`` (jemalloc or tcmalloc) | the probed libiomp5, then the allocator |
| ``KMP_BLOCKTIME`` | ``kmp_blocktime`` (``openmp=intel`` only) | 0, 1 or 200 (ms a worker spins after a region) |
| ``KMP_AFFINITY`` | ``openmp=intel`` with ``affinity`` not ``none`` | ``granularity=fine,compact,1,0`` |
| ``MALLOC_CONF`` | ``allocator=jemalloc`` | ``search_spaces.preload.JEMALLOC_CONF`` (``run_cpu``'s, purging off) |
| ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` | ``allocator=glibc-kept`` | 32 MiB, 256 MiB |
| ``PYTORCH_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF`` | ``cuda_alloc=expandable_segments`` | ``expandable_segments`` |
| ``numactl --membind=NODES --`` (command prefix) | ``affinity`` not ``none`` | the NUMA nodes of the pinned CPUs |
| ``AUTOTUNE_RECIPE`` | (``autotune run``, the env file) | the recipe as JSON, for ``autotune.apply()`` |
| ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` | (trials only) | a fresh directory per trial |
| ``TMPDIR`` | (trials only) | in the trial's directory, removed with it (inherited where a socket path is too long) |

For a trial, every variable any knob may set is first removed from the inherited environment, so the
baseline really runs with PyTorch's defaults (and no inherited ``LD_PRELOAD``, nor glibc's heap tuned by
``MALLOC_*`` or ``GLIBC_TUNABLES``' ``glibc.malloc.*``). For ``autotune run``, a
variable the user already set is kept and a warning names the recipe's value (as
``torch.backends.xeon.run_cpu`` does); ``LD_PRELOAD`` is merged instead: the recipe's libraries first,
then the user's.

Memory is bound with ``numactl`` only where the probe found it and it is permitted: containers often
refuse set_mempolicy(2) (EPERM). That is tested once per process (``numactl --membind=N true``); when
refused, the process starts unbound and ``LaunchPlan.warnings`` says so.

Example (a plan is data; nothing starts until ``start(plan)``)::

    >>> p = plan(["python", "train.py"], {"threads": 4, "affinity": "compact", "openmp": "intel",
    ...           "kmp_blocktime": 1, "allocator": "tcmalloc"}, facts, os.environ, keep_user_env=True)
    ... # doctest: +SKIP
    >>> p.cmd[:2], p.env["KMP_AFFINITY"], p.cpus                      # doctest: +SKIP
    (['/usr/bin/numactl', '--membind=0'], 'granularity=fine,compact,1,0', [0, 1, 2, 3])
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn

from .. import distributed
from .. import search_spaces as spaces

if TYPE_CHECKING:
    import psutil

    from ..probes import Facts
    from ..recipe import Recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchPlan:
    cmd: list[str]  # [] for a plan without a command (the env file's)
    env: dict[str, str]
    cpus: list[int] | None
    warnings: tuple[str, ...] = ()
    membind: tuple[int, ...] = ()  # NUMA nodes the command's memory is bound to (numactl --membind), if any


def plan(
    cmd: list[str],
    params: dict[str, Any],
    facts: Facts,
    base_env: Mapping[str, str],
    *,
    keep_user_env: bool,
    membind_refused: Callable[[str, tuple[int, ...]], str | None] = spaces.threads.membind_refused,
) -> LaunchPlan:
    """Build the command, environment and CPU set for a process running ``params``.

    ``membind_refused(numactl, nodes)`` says why memory cannot be bound here (None: it can); tests
    pass a fake to plan for other machines. An empty ``cmd`` plans the environment alone (the env file).
    """
    wanted = spaces.environment(params, facts)
    env = dict(base_env)
    notes: list[str] = []
    if keep_user_env:
        for key, value in wanted.items():
            if key == "LD_PRELOAD":
                env[key] = _merge_preload(value, env.get(key, ""), notes)
                continue
            if key in env and env[key] != value:
                notes.append(f"{key} is set to {env[key]!r} in your environment, kept (the recipe says {value!r})")
            env.setdefault(key, value)
    else:
        for key in spaces.controlled_variables():
            env.pop(key, None)
        env = {**spaces.preload.without_heap_tuning(env), **wanted}
    prefix = _membind(params, facts, membind_refused, notes)
    processes = spaces.processes.count(params)
    if processes > 1 and distributed.is_torchrun(list(cmd)):
        notes.append(
            f"the command starts torch.distributed.run itself: kept (the recipe measured {processes} processes)"
        )
    if cmd:
        cmd = [*prefix, *distributed.torchrun_command(list(cmd), processes)]  # P > 1: P ranks under torchrun
    membind = spaces.memory_nodes(params, facts) if prefix else None
    return LaunchPlan(cmd=list(cmd), env=env, cpus=spaces.cpus_for(params, facts), warnings=tuple(notes),
                      membind=tuple(membind or ()))


def probe_for(params: dict[str, Any]) -> Facts:
    """The facts a recipe's environment is resolved against, probed the same way wherever it is resolved:
    with the GPUs when it trains on CUDA (their links decide ``NCCL_P2P_LEVEL``, their local CPUs the ranks'
    cores), without them otherwise (NVML costs time and decides nothing on CPU); without importing torch (a plan
    reads the runtime's library paths, never what only torch's import tells: ``Runtime.imported``)."""
    from .. import probes

    return probes.probe(gpus=params.get("device") == "cuda", import_torch=False)


def for_recipe(recipe: Recipe, cmd: list[str], base_env: Mapping[str, str], *,
               facts: Facts | None = None, keep_user_env: bool = True) -> LaunchPlan:
    """The one plan of a recipe for the user: what ``autotune run`` starts and ``autotune export --format env``
    writes (``cmd=[]``, ``base_env={}``), so the two carry the same variables, CPUs and memory binding.

    The user's variables in ``base_env`` are kept (warnings name the recipe's values) unless ``keep_user_env`` is
    False (a script-mode trial's copy: the recipe's values replace them, as in a trial); ``AUTOTUNE_RECIPE``
    holds the recipe for ``autotune.apply()``. ``facts`` default to ``probe_for(recipe.params)``. The recipe is
    checked first (``recipe.checked``); knobs above this machine's facts are warnings (``search_spaces.beyond``).
    """
    from ..recipe import checked

    checked(recipe)  # no start of a recipe's plan without the check, whatever the caller did
    facts = probe_for(recipe.params) if facts is None else facts
    launch = plan(cmd, recipe.params, facts, base_env, keep_user_env=keep_user_env)
    launch.env["AUTOTUNE_RECIPE"] = json.dumps(recipe.to_dict(), sort_keys=True)
    beyond = tuple(spaces.beyond(recipe.params, facts))
    return replace(launch, warnings=beyond + launch.warnings) if beyond else launch


# Libraries of which only one may serve a process: preloading two of a kind leaves the first in charge.
_ROLES = {
    "allocator": ("libjemalloc", "libtcmalloc", "libmimalloc"),
    "OpenMP runtime": ("libiomp5", "libgomp", "libomp."),
}


def _merge_preload(recipe: str, user: str, notes: list[str]) -> str:
    """The recipe's libraries, then the user's others (ld.so splits the list on colons and spaces)."""
    ours = recipe.split(":")
    theirs = [p for p in user.replace(" ", ":").split(":") if p and p not in ours]
    for role, prefixes in _ROLES.items():
        mine = [p for p in ours if os.path.basename(p).startswith(prefixes)]
        clash = [p for p in theirs if os.path.basename(p).startswith(prefixes)]
        if mine and clash:
            notes.append(f"LD_PRELOAD: your {role} {', '.join(clash)} is kept after the recipe's {mine[0]}, "
                         "which serves the process (the first one preloaded wins)")
    return ":".join(ours + theirs)


def _membind(params: dict[str, Any], facts: Facts, refused: Callable[[str, tuple[int, ...]], str | None],
             notes: list[str]) -> list[str]:
    """The ``numactl --membind`` command prefix for a pinned process, or [] (with a note why, if it matters)."""
    nodes = spaces.memory_nodes(params, facts)
    if not nodes:
        return []
    numactl = getattr(facts.runtime, "numactl_path", None)
    if numactl is None:
        if facts.runtime is not None and len(set(facts.cpu.allowed.numa_nodes)) > 1:  # None: not probed
            notes.append("numactl not found: memory is not bound to the pinned CPUs' NUMA nodes (install numactl)")
        return []
    listed = ",".join(map(str, nodes))
    why = refused(numactl, nodes)
    if why is not None:
        notes.append(f"numactl --membind={listed} is not permitted here ({why}): memory is not bound "
                     "(containers need CAP_SYS_NICE or a seccomp profile allowing set_mempolicy)")
        return []
    return [numactl, f"--membind={listed}", "--"]


def start(launch: LaunchPlan, **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Start the planned process in its own session (so its whole tree can be stopped), tied to this
    process's life: the tree is killed if this process dies, even by SIGKILL (``autotune.trial.lifeline``).

    Call it from the main thread: the kernel's parent-death signal follows the thread that forked.
    """
    from .lifeline import Lifeline, die_with_parent, load_libc, new_token

    cpus = launch.cpus
    parent, libc = os.getpid(), load_libc()
    env = dict(launch.env)
    token = new_token(env)  # marks the tree's processes, even those that leave its group

    def _prepare() -> None:  # runs in the child between fork and exec: before torch starts
        if cpus:
            os.sched_setaffinity(0, cpus)
        die_with_parent(libc, parent)

    proc = subprocess.Popen(launch.cmd, env=env, preexec_fn=_prepare, start_new_session=True, **popen_kwargs)
    try:
        # Kept on the Popen so it lives exactly as long as the process handle (stop_tree releases it);
        # Popen declares no such attribute.
        proc._autotune_lifeline = Lifeline(proc.pid, token)  # type: ignore[attr-defined]
    except OSError:
        stop_tree(proc)
        raise
    return proc


def exit_now(code: int) -> NoReturn:
    """End a trial process that has reported everything and closed what it started, skipping the
    interpreter's teardown: with torch (and torch._dynamo) loaded it costs noticeable CPU time per process,
    paid by every worker a search closes. Its parent stops what may be left of its tree."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more can be said on it
            pass
    os._exit(code)


KILLED_WAIT_S = 30.0  # the most a stop waits for killed processes to be gone


def stop_tree(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """Stop a started process and everything it started (DataLoader workers, torchrun children)."""
    try:
        _stop(proc, grace_s)
    finally:
        lifeline = getattr(proc, "_autotune_lifeline", None)
        if lifeline is not None:
            lifeline.release()  # its watchdog sweeps what is left of the group


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    # A dead leader's children are no longer its descendants: its group (the session it started) still holds them.
    descendants += [p for p in _group(proc.pid) if p not in descendants]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # SIGCONT after SIGTERM: a stopped process (a frozen worker, an idle arm's DataLoader worker) holds it until
        # continued; SIGKILL ends a stopped one as it is.
        for each in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
            try:
                os.killpg(proc.pid, each)
            except ProcessLookupError:
                pass
            for child in descendants:  # those that left the process group (setsid) too
                try:
                    child.send_signal(each)
                except psutil.NoSuchProcess:
                    pass
        # After SIGKILL nothing can delay the end but the kernel's own teardown, which a loaded machine slows
        # past a second: wait for it, so a caller told "stopped" finds none of them running.
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else max(grace_s, KILLED_WAIT_S))
        while time.monotonic() < deadline:
            if proc.poll() is not None and not any(_alive(c) for c in descendants):
                return
            time.sleep(0.05)


def _group(pgid: int) -> list[psutil.Process]:
    """The processes of the process group ``pgid`` but its leader."""
    import psutil

    members = []
    for p in psutil.process_iter():
        try:
            if p.pid != pgid and os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def _alive(process: psutil.Process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it ended between the two calls
        return False
