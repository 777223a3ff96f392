"""``autotune run``: start a command with a recipe's environment-level knobs in effect.

Sets the thread variables, preloads (merged into your ``LD_PRELOAD``, the recipe's first), CPU affinity
and memory binding (``numactl --membind``, where permitted) as the trial runner did, before the command
starts; the script then calls ``autotune.apply()`` for the in-process knobs. A variable you already
set is kept, with a warning naming the recipe's value.

With ``--workload NAME`` (and no ``--recipe``) the recipe is the newest one in the storage for NAME
measured on this machine's hardware (``autotune.service``): a fleet of identical machines shares one
search through ``--storage postgresql+psycopg://…``. A recipe of other hardware is refused before the command
starts, as ``apply()`` in it would refuse it; ``--allow-other-hardware`` starts it with a warning instead.

A recipe with ``processes`` P > 1 starts ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) as
``python -m torch.distributed.run --standalone --nproc-per-node P SCRIPT ARGS``: P ranks, each pinned
to its own cores by ``autotune.apply()``, which also joins the process group; ``Tuned.prepare_model``
wraps the model in DDP and ``Tuned.sampler`` shards the data. Any other command is refused with the
way to start it (``torchrun`` after loading the env file); a command that runs torchrun itself is kept.

Ctrl-C and SIGTERM sent to ``autotune run`` reach the command as they reach it run plain, and ``autotune run``
waits for it to end. Whatever the command started ends with it, or with ``autotune run`` however it is stopped:
processes in sessions of their own too (torchrun's ranks; ``autotune.trial.lifeline``). A server the script means
to leave running (tensorboard, say) is better started outside it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from ..trial.signals import handled
from ._common import add_storage, command_after_dashes, find_recipe, foreign_preload, printable

if TYPE_CHECKING:
    from ..trial.launch import LaunchPlan


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", help="run a command (e.g. python train.py) with the recipe's environment-level knobs",
        description="Example: autotune run --recipe best.env -- python train.py --epochs 3. "
        "With --workload NAME (no --recipe): the newest recipe of NAME measured on this machine's hardware, "
        "e.g. from a shared store: autotune run --storage postgresql+psycopg://HOST/DB --workload cnn -- "
        "python train.py",
    )
    p.add_argument("--recipe", default=None, metavar="ID|FILE",
                   help="a recipe id or exported file (default: the latest)")
    p.add_argument("--study", default=None, metavar="NAME")
    p.add_argument("--workload", default=None, metavar="W",
                   help="the newest recipe of this workload measured on this machine's hardware")
    add_storage(p)
    p.add_argument("--allow-other-hardware", action="store_true",
                   help="start the command with a recipe measured on other hardware (warns, here and in apply()), "
                   "where it is refused before the command starts")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=run)


def _preload_checked(path: str | None, other: str | None) -> str | None:
    """The check the env file's header promises before it is loaded in bash: every library its ``LD_PRELOAD`` names
    lies where this machine's probe looks for libraries (``foreign_preload``), else a UsageError (``autotune run``
    itself preloads the probe's own either way); a warning instead for a recipe of other hardware that runs anyway
    (``other``: its paths are that machine's). None where the file passes."""
    from ..errors import UsageError

    said = foreign_preload(path)
    if said is None or other:
        return said
    raise UsageError(said)


def run(args: argparse.Namespace) -> int:
    from .. import probes
    from ..errors import UsageError
    from ..hardware_check import ALLOW_OTHER_HARDWARE, check_machine
    from ..trial import launch

    command = command_after_dashes(args)
    if not command:
        raise UsageError("no command: autotune run --recipe best.env -- python train.py")
    if args.workload and not args.recipe:
        from ..service import fetch

        facts = probes.probe(import_torch=False)  # as apply() in the command probes: the fingerprints compare
        recipe = fetch(args.storage, args.workload, facts.fingerprint, study=args.study)
    else:
        recipe = find_recipe(args)  # checked, and a storage error said, before the machine is probed
        facts = probes.probe(import_torch=False)  # torch's import is your command's, not a second one before it
    # refused here in one line, not after the command has started and loaded its data
    other = check_machine(recipe, facts, allow_other_hardware=args.allow_other_hardware,
                          way_out="pass --allow-other-hardware")
    plan = launch.for_recipe(recipe, command, os.environ)  # as 'autotune export --format env' writes it
    preload = _preload_checked(args.recipe, other)  # a file's; none for a stored recipe's id or the latest
    if args.allow_other_hardware:
        plan.env[ALLOW_OTHER_HARDWARE] = "1"
    for warning in [*filter(None, [other, preload]), *plan.warnings]:
        print(f"autotune run: warning: {printable(warning)}", file=sys.stderr)  # may quote a stored workload
    return _started(plan, command[0])


def _started(plan: LaunchPlan, name: str) -> int:
    """Start ``plan``'s command and wait for it; its exit status as a shell reports it (128 + N where signal N ended
    it). Ctrl-C and SIGTERM sent to ``autotune run`` go on to the command's process group (its own session: nothing
    else reaches it), as they reach the command run plain, and the wait goes on: the command ends as it does then (a
    checkpoint saved on SIGTERM). A second one stops its tree (SIGTERM, then SIGKILL after a grace): a command stuck
    in a C call never runs its handler. One that comes while it starts goes on once it has started."""
    from ..errors import UsageError
    from ..trial import launch

    started: list[subprocess.Popen[bytes]] = []
    sent: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        sent.append(signum)
        if started and len(sent) > 1:
            launch.stop_tree(started[0])
        elif started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(started[0].pid, signum)

    with handled({signal.SIGINT: forward, signal.SIGTERM: forward}):
        try:
            try:
                started.append(launch.start(plan))
            except FileNotFoundError as e:
                raise UsageError(f"command not found: {name}") from e
            if sent:  # while it started
                forward(sent.pop(), None)
            code = started[0].wait()
        except KeyboardInterrupt:  # off the main thread no handler forwards it: the command's tree is stopped
            if started:
                launch.stop_tree(started[0])
            return 130
    return 128 - code if code < 0 else code
