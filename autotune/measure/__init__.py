"""The paired measuring engine: recipes compared with the defaults side by side, with intervals.

- ``stats``: the median of per-pair ratios with its exact interval, the verdict, the calibration's arithmetic;
- ``measurer``: the contract the search drives (``PairedMeasurer``, every measurer's base class) and the noise a
  calibration found (``Noise``);
- inside a worker process: ``arms`` (an arm: one set of in-process knobs with its own model, trained in windows),
  ``bench`` (a worker's arms, and pairs of their windows), ``footprint`` (an arm's device memory);
- ``worker``: the worker process, ``python -m autotune.measure.worker SPEC.json``; ``paired_worker``:
  ``PairedWorker``, its parent's side; ``protocol`` types what they say; ``freeze`` stops an idle worker;
- across processes: ``environment`` (the knobs that decide a process), ``process_pair`` (two live workers
  alternated, the idle one frozen; ``across_processes`` over several fresh pairs);
- the search's measurer: ``live`` (``LiveMeasurer``), with ``pool`` (its workers) and ``candidate`` (one
  candidate being measured); script mode's: ``script_pairs`` (``ScriptMeasurer``); what a confirmation round of
  a measured recipe costs: ``costs``; what a run of yours gets, from fresh process pairs: ``runs``.
"""
from __future__ import annotations

from .candidate import FACTOR, combine, paired_method
from .costs import (
    IN_PROCESS_METHODS,
    STARTED_S,
    first_rounds_s,
    in_one_process,
    own_copies,
    race_round_s,
    round_parts,
    started_processes,
)
from .environment import environment_differences, environment_key, environment_keys
from .first_copy import script_context
from .hopeless import FAR_SLOWER, is_far_slower
from .live import LiveMeasurer
from .measurer import LossReading, Noise, PairedMeasurer, first_pairs, told_apart
from .paired_worker import PairedWorker
from .process_pair import PROCESS_PAIRS, across_processes
from .runs import CLAIM_PAIRS, RUN_CONFIDENCE, PairFailed, RunPair, Runs
from .runs import LEAST_PAIRS as LEAST_CLAIM_PAIRS
from .runs import WINDOW_PAIRS as RUN_WINDOW_PAIRS
from .script_pairs import ScriptMeasurer
from .stats import CONFIDENCE, MIN_MARGIN, Interval, compare, rounds_interval, span_margin

__all__ = [
    "CLAIM_PAIRS",
    "CONFIDENCE",
    "FACTOR",
    "FAR_SLOWER",
    "IN_PROCESS_METHODS",
    "in_one_process",
    "is_far_slower",
    "LEAST_CLAIM_PAIRS",
    "MIN_MARGIN",
    "PROCESS_PAIRS",
    "STARTED_S",
    "started_processes",
    "ScriptMeasurer",
    "Interval",
    "LiveMeasurer",
    "LossReading",
    "Noise",
    "PairedMeasurer",
    "PairFailed",
    "PairedWorker",
    "RUN_CONFIDENCE",
    "RUN_WINDOW_PAIRS",
    "RunPair",
    "Runs",
    "across_processes",
    "combine",
    "compare",
    "environment_differences",
    "environment_key",
    "environment_keys",
    "first_pairs",
    "first_rounds_s",
    "own_copies",
    "race_round_s",
    "paired_method",
    "round_parts",
    "rounds_interval",
    "span_margin",
    "script_context",
    "told_apart",
]
