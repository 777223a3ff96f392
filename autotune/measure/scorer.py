"""A candidate recipe's speedup over the defaults, measured paired, with its interval and its loss: ``PairedScorer``.

A ``PairedScorer`` holds one worker
in the defaults' environment, with the defaults as an arm, and calibrates it once (an A/A of the defaults
against an identical arm: window length, pairs, margin, and the machine's noise to tell the user). Then
each candidate is scored:
- same environment as the defaults (only in-process knobs differ): a candidate arm in that worker, pairs
  of windows against the defaults arm; the speedup is the median per-pair ratio with each arm's compile
  time amortised over ``train_steps`` (``stats.compare``), with its exact interval;
- another environment: (its environment's in-process defaults / the defaults, from process pairs,
  ``process_pair.across_processes``) x (its in-process ratio against that environment's defaults arm, in a
  worker of its own), as one Welch-Satterthwaite interval on the log scale (``candidate.combine``). A
  bootstrap was the other choice; with the 3-8 process pairs a comparison affords its resamples take a
  handful of values and under-cover, as for the median (``stats``), and it would depend on a seed.
Every arm's loss is taken after the study's fixed sample count, for the quality guard.

    >>> with PairedScorer("cnn", defaults, facts, settings) as scorer:                   # doctest: +SKIP
    ...     score = scorer.score("cl", {**defaults, "channels_last": True})
    ...     score.speedup.low > 1 + scorer.margin, scorer.noise_note()
    (True, 'identical arms in one process differed by up to 3.1% a window pair (16 A/A pairs); between fresh ...')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import stats
from .candidate import DEFAULTS, combine, same_environment
from .environment import ENVIRONMENT_KEYS
from .measurer import Noise
from .paired_worker import Calibration, PairedWorker, WorkerError
from .process_pair import PROCESS_PAIRS, AcrossProcesses, across_processes
from .protocol import ArmStatus

Method = Literal["in-process pairs", "process pairs x in-process pairs"]


@dataclass(frozen=True)
class Score:
    """A candidate against the defaults."""

    name: str
    method: Method
    speedup: stats.Interval  # amortised over train_steps, against the defaults
    verdict: stats.Verdict
    in_process: stats.Comparison  # against its environment's defaults arm
    environment: AcrossProcesses | None  # its environment's defaults against the defaults; None: the same
    loss: float | None
    baseline_loss: float | None
    loss_samples: int | None
    arm: ArmStatus


class PairedScorer:
    """The defaults' worker, calibrated once, and candidates scored against it (see the module docstring).

    A context manager: leaving it ends every worker it started."""

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Any, settings: Any, *,
                 calibration_pairs: int = 16, half_width: float = 0.03, window_s: float | None = None,
                 process_pairs: tuple[int, int] = PROCESS_PAIRS) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.worker = PairedWorker(workload, defaults, facts, settings)
        self.calibration_pairs, self.half_width, self.window_s = calibration_pairs, half_width, window_s
        self.process_pairs = process_pairs
        self.calibration: Calibration | None = None
        self.baseline: ArmStatus | None = None

    def __enter__(self) -> PairedScorer:
        try:
            self.worker.start()
            self.calibration = self.worker.calibrate(DEFAULTS, self.defaults, pairs=self.calibration_pairs,
                                                     half_width=self.half_width, window_s=self.window_s)
        except BaseException:
            self.worker.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.close()

    @property
    def cal(self) -> Calibration:
        if self.calibration is None:
            raise WorkerError("the scorer is not started: use it as a context manager")
        return self.calibration

    @property
    def margin(self) -> float:
        return self.cal.margin

    def noise_note(self) -> str:
        """What the calibration says of this machine, for the report."""
        return Noise.from_calibration(self.cal).note()

    def score(self, name: str, params: dict[str, Any], seed: int = 0) -> Score:
        """``params`` against the defaults; ``WorkerError`` when an arm failed (its state and error named)."""
        if same_environment(params, self.defaults):
            comparison, arm = self._in_process(self.worker, DEFAULTS, name, params, seed)
            base_loss = self.worker.evaluate(DEFAULTS)
            self.worker.drop_arm(name)
            return Score(name, "in-process pairs", comparison.amortised, comparison.verdict, comparison, None,
                         arm.loss, base_loss.loss, arm.loss_samples, arm)
        env_defaults = {**self.defaults, **{k: params.get(k) for k in ENVIRONMENT_KEYS}}
        least, most = self.process_pairs
        environment = across_processes(self.workload, self.defaults, env_defaults, self.facts, self.settings,
                                       pairs=max(4, self.cal.pairs // 2), window_s=self.cal.window_s, least=least,
                                       most=most, half_width=self.cal.half_width, margin=self.margin, seed=seed)
        with PairedWorker(self.workload, env_defaults, self.facts, self.settings) as worker:
            self._add(worker, DEFAULTS, env_defaults)
            comparison, arm = self._in_process(worker, DEFAULTS, name, params, seed)
        speedup = combine(environment.ratio, comparison.ratios)
        base_loss = self.worker.evaluate(DEFAULTS)
        return Score(name, "process pairs x in-process pairs", speedup, stats.verdict(speedup, self.margin),
                     comparison, environment, arm.loss, base_loss.loss, arm.loss_samples, arm)

    @staticmethod
    def _add(worker: PairedWorker, name: str, params: dict[str, Any]) -> ArmStatus:
        status = worker.add_arm(name, params)
        if status.state != "ok":
            raise WorkerError(f"arm {name!r} failed ({status.state}): {status.error}")
        return status

    def _in_process(self, worker: PairedWorker, base: str, name: str, params: dict[str, Any],
                    seed: int) -> tuple[stats.Comparison, ArmStatus]:
        self._add(worker, name, params)
        run = worker.run_pairs(base, name, self.cal.pairs, self.cal.window_s, seed=seed)
        if not run.pairs:
            raise WorkerError(f"arm {name!r} failed ({run.cand.state}): {run.cand.error}")
        comparison = stats.compare(run.pairs, run.base, run.cand, train_steps=self.settings.train_steps,
                                   margin=self.margin)
        return comparison, worker.evaluate(name)


# The live measurer of a search ----------------------------------------------------------------------------
