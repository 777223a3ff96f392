"""What a search measures of the machine before its trials: its kernels' speed at each precision (which orders and
drops the precision seeds) and its limits (the views' share of the peak), cached once measured, each a GPU's in a
child process, within the search's budget (``child_s``)."""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from .. import probes

if TYPE_CHECKING:
    from ..measure import PairedMeasurer
    from ..probes import Facts
    from .budget import Budget

log = logging.getLogger(__name__)

CHILD_SHARE = 0.2  # of the budget left, the most a probe's child may take in a search (``child_s``)
# the least: a child imports torch and starts CUDA before it measures (a worker's start took 10-13 s on an H100)
CHILD_LEAST_S = 45.0


def child_s(timing: Budget) -> float:
    """The longest a probe's child may measure within a search (a GPU's kernels, its limits): ``CHILD_SHARE`` of the
    budget left, at least ``CHILD_LEAST_S``; ``probes.CHILD_S`` without a budget. With the probes' own limit, a hung
    driver's two children could take twenty minutes of a 2-minute search."""
    left = timing.left()
    return min(probes.CHILD_S, max(CHILD_LEAST_S, CHILD_SHARE * left))


def kernel_speeds(facts: Facts, device: str, timing: Budget) -> probes.Measured | None:
    """This machine's kernel speeds, a GPU's measured in a child (this process holds no CUDA context) within
    ``child_s``; None where they could not be measured: every precision is then seeded, and the hopeless arm rule
    still stops a slow one."""
    try:
        return probes.measured(facts.fingerprint, device, in_child=device == "cuda", timeout_s=child_s(timing))
    except (RuntimeError, OSError, ValueError) as e:  # a child's timeout is a RuntimeError (``call_in_child``)
        log.warning("the kernels' speeds were not measured (%s): every precision is seeded", e)
        return None


def limits(measurer: PairedMeasurer | None, facts: Facts, device: str, timing: Budget) -> probes.Limits | None:
    """The searched machine's limits: none where its measurer's are not this machine's (``machine_limits``: a
    replayed grid's, a script's), else this machine's (its first GPU's on ``cuda``, within ``child_s``), measured
    once and cached, where ``facts`` are this process's CPUs (not a recorded tree's, nor facts made up for another
    machine)."""
    if measurer is not None and not measurer.machine_limits:
        return None
    here = facts.root is None and facts.cpu.allowed.threads == len(os.sched_getaffinity(0))
    if not here:
        return None
    try:
        return probes.limits(facts, device, in_child=device == "cuda", timeout_s=child_s(timing))
    except (RuntimeError, OSError, ValueError) as e:  # the limits are for the views
        log.warning("the machine's limits were not measured (%s): speeds are shown without a share of the peak", e)
        return None


__all__ = ["child_s", "kernel_speeds", "limits"]
