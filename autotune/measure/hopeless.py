"""The hopeless-arm rule: an arm far slower than the defaults in its first steps stops there, measured slower, and is
never trained to the quality guard's samples (``Arm._warm_up`` judges its steps with ``Judge``; the live measurer's
warm-up limit stops a step that does not end)."""
from __future__ import annotations

from ..trial.spec import Status, TrialResult

# An arm whose normal steps take this many times the defaults' time per sample is far slower than any noise (a
# window on a busy VM reads up to 2-3x): it stops there, measured slower (the figures: docs/measurement.md's notes).
HOPELESS = 8.0
# An eager arm's first step on a CPU also builds its kernels (oneDNN primitives, allocations): judged at this many
# times ``HOPELESS``, so a 100x arm stops after one step that outlasts a window. Not judged: first steps that build
# for a time no multiple of a step bounds, a compiled arm's (its compilation) and on a GPU an eager arm's (a
# precision's first use loads its kernels); nor the steps of an arm with DataLoader workers until they have taken the
# batches the workers prefetch at their start (num_workers x prefetch_factor): its steps share the CPUs with that burst.
FIRST_STEP_HOPELESS = 4.0


class Judge:
    """Judges an arm's warm-up steps against a reference's seconds per sample: it gives up once its steps over
    the limit, in a row, have lasted ``floor_s`` (a window's floor: one such step, where it outlasts a window).
    A step of milliseconds that stalls once (a preemption on a busy VM, a kernel built late) is no verdict.

    >>> judge = Judge(8.0, 0.001, 0.3)  # the reference: 1 ms a sample; a CPU window's floor
    >>> judge.step(0.1, 1, first=False), judge.step(0.001, 1, first=False)  # a stall, then a normal step
    (None, None)
    >>> [judge.step(0.1, 1, first=False) for _ in range(3)]  # 100x, three times in a row: 0.3 s
    [None, None, 100.0]
    """

    def __init__(self, factor: float, reference_s: float, floor_s: float) -> None:
        self.factor, self.reference_s, self.floor_s = factor, reference_s, floor_s
        self.streak_s = 0.0  # the slow steps in a row so far
        self.least: float | None = None  # their least ratio to the reference; None: no slow step pending

    def step(self, spent: float, samples: int, first: bool) -> float | None:
        """Judge a step of ``spent`` seconds (``first``: it may hold the kernels' build): the least of the slow
        steps' ratios to the reference where the arm gives up (at least that many times slower), else None."""
        slower = spent / samples / self.reference_s
        if slower <= self.factor * (FIRST_STEP_HOPELESS if first else 1.0):
            self.streak_s, self.least = 0.0, None
            return None
        self.streak_s += spent
        self.least = slower if self.least is None else min(self.least, slower)
        return self.least if self.streak_s >= self.floor_s else None

    @property
    def pending(self) -> bool:
        """Slow steps not yet judged: the warm-up takes more steps until they are."""
        return self.least is not None


def judged_step(index: int, charged: int, builds: bool, workers: int, prefetch: int | None) -> bool:
    """Whether warm-up step ``index`` (from 0) is judged by the hopeless rule: the first ``charged`` steps may
    build (judged at ``FIRST_STEP_HOPELESS``, not at all where they ``builds`` for an unbounded time: a compile,
    or on a GPU the kernels loaded at their first use); with DataLoader workers, none of the steps that take the
    batches they prefetch at their start (``workers`` x ``prefetch``)."""
    if workers > 0:
        return index >= charged + workers * (prefetch or 2)
    return index >= charged or not builds


FAR_SLOWER = "its first steps (far slower: no pairs, no loss)"  # the method of a trial the hopeless rule stopped
# script mode's long-lived copy's: its start, charged to the trial that started it, started no process for it
FAR_SLOWER_IN_COPY = "its first steps in the long-lived copy (far slower: no pairs, no loss)"


def is_far_slower(method: str | None) -> bool:
    """Whether a result of ``method`` is a candidate the hopeless rule stopped in its first steps."""
    return method in (FAR_SLOWER, FAR_SLOWER_IN_COPY)


def far_slower_result(ratio: float | None, warnings: list[str], method: str = FAR_SLOWER) -> TrialResult:
    """A candidate stopped far slower than the defaults in its first steps, as a measured trial: its steps' ratio to
    the defaults' (None where no step ended: half the bound), at most ``1 / HOPELESS``, no pairs and no loss."""
    bound = 1 / HOPELESS
    return TrialResult(Status.OK, objective=ratio if ratio is not None else bound / 2, speedup_high=bound,
                       method=method, pairs=0, warnings=warnings)
