"""Candidates a search records skipped instead of measuring: what it knows of them already says they cannot win.

A precision is not started where this machine's kernels measured it hopeless (``seeds.not_seeded``), or where a
trial of this search with that precision and memory format, in the defaults' environment, was stopped far slower
than the defaults in its first steps (``measure.is_far_slower``) and none measured otherwise: another batch size,
thread count or matmul precision does not make a step of a far slower kernel fast. The hopeless rule gives such a
candidate up in its first steps, but only after what comes before them: an environment's process pairs, a script's
copies starting (a pair of fresh copies of a script takes seconds before its first step). The batch sizes known to
run out of memory are ``oom_limits``'.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..measure import environment_differences, is_far_slower
from ..trial.spec import Status
from .records import BASELINE, CONFIRM, WARM_START, StudyAttr, records

if TYPE_CHECKING:
    import optuna

# the knobs that pick a precision's kernels: a trial far slower with them says nothing of other memory formats
KERNEL_KEYS = ("amp_dtype", "channels_last")


def not_started(study: optuna.Study, role: str, params: dict[str, Any], fixed: dict[str, Any],
                defaults: dict[str, Any]) -> str | None:
    """Why a candidate is recorded skipped instead of measured (see the module docstring); None where it is
    measured: the baseline, a confirmation, a precision the user fixed (``--fix``: measured as asked), a
    candidate of the defaults' precision, or one nothing rules out (a warm start's recipe: only the kernels'
    verdict)."""
    dtype = params.get("amp_dtype")
    if role in (BASELINE, CONFIRM) or "amp_dtype" in fixed or dtype in (None, "float32"):
        return None
    why = (study.user_attrs.get(StudyAttr.NOT_SEEDED) or {}).get(dtype)
    if why is not None:
        return f"not started: {why}"
    if role == WARM_START:  # measured on this machine before: measured again, whatever this search saw
        return None
    kernels = [params.get(k) for k in KERNEL_KEYS]
    alike = [r for r in records(study) if r.result.status == Status.OK and r.role != CONFIRM
             and [r.params.get(k) for k in KERNEL_KEYS] == kernels]
    # only a trial of the defaults' environment speaks for its precision: another's may have been far slower for
    # its environment (its process pairs' first steps, or a thread count), whatever its precision
    slow = [r for r in alike if is_far_slower(r.result.method) and not environment_differences(defaults, r.params)]
    if not slow or any(not is_far_slower(r.result.method) for r in alike):  # measured otherwise once: not hopeless
        return None
    return f"not started: {dtype} was far slower than the defaults in trial {slow[0].number}'s first steps"
