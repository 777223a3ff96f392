"""Where a study's recipes stand against the machine's limits: the workload's FLOP per sample
(``workloads.flop_per_sample``) and the machine's matmul peaks (``probes.Limits``), recorded in the study once, so
that the search's summary, ``autotune best`` and the report turn any trial's samples/s into GFLOP/s and a share of
the peak at its precision, on whatever machine reads the study later.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..workloads import Workload, flop_per_sample
from .records import StudyAttr

if TYPE_CHECKING:
    import optuna

    from ..probes import Limits

log = logging.getLogger(__name__)


def record(study: optuna.Study, workload: Workload | None, limits: Limits | None) -> None:
    """Count the workload's FLOP per sample unless the study holds them (None: a script's, not counted), and record
    the machine's matmul peaks (``limits``: None where they are unknown, as a replayed grid's machine's)."""
    if workload is not None and StudyAttr.FLOP_PER_SAMPLE not in study.user_attrs:
        flop = flop_per_sample(workload)
        if flop is None:
            log.info("the workload's FLOP were not counted: its speeds are shown without GFLOP/s")
        study.set_user_attr(StudyAttr.FLOP_PER_SAMPLE, flop)
    if limits is not None:
        study.set_user_attr(StudyAttr.MATMUL_GFLOPS, dict(limits.matmul))


def of(study: optuna.Study) -> tuple[float | None, dict[str, float] | None]:
    """``(FLOP per sample, matmul GFLOP/s per dtype)`` as the study recorded them; None where it did not."""
    attrs = study.user_attrs
    peaks = attrs.get(StudyAttr.MATMUL_GFLOPS)
    return attrs.get(StudyAttr.FLOP_PER_SAMPLE), {str(k): float(v) for k, v in peaks.items()} if peaks else None
