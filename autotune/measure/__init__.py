"""The paired measuring engine: recipes compared with the defaults side by side, with intervals.

On top, what every room reads: ``measurer`` (the contract the search drives, ``PairedMeasurer``, and the noise a
calibration found, ``Noise``), ``protocol`` (what a worker and its parent say), ``environment`` (the knobs that
decide a process), the statistics (``stats``: the median of per-pair ratios with its exact interval, the verdict;
``distributions``, ``serial``, ``sizing``), ``hopeless`` (the rule that stops a far slower arm), ``costs`` (what a
confirmation round of a measured recipe costs), ``runs`` (what a run of yours gets, from fresh process pairs) and
``freeze`` (an idle process tree stopped). The rooms:

- ``worker``: inside a worker process, ``python -m autotune.measure.worker SPEC.json``: ``arms`` (one set of
  in-process knobs with its own model, trained in windows), ``bench`` (a worker's arms, and pairs of their
  windows), ``phases``, ``batches``, ``footprint`` (an arm's device memory);
- ``live``: the search's measurer on this machine, ``LiveMeasurer`` (``live.measurer``), with ``paired_worker``
  (a worker's parent side), ``pool`` (its workers), ``process_pair`` (two live workers alternated, the idle one
  frozen; ``across_processes`` over several fresh pairs), ``factors`` (an environment's factor) and ``candidate``
  (one candidate being measured);
- ``script``: script mode's measurer, ``ScriptMeasurer`` (``script.measurer``), its copies of your script
  (``copies``, ``first_copy``, the long-lived ``resident``) and what its results say (``results``).
"""
from __future__ import annotations

from .costs import (
    IN_PROCESS_METHODS,
    STARTED_S,
    first_rounds_s,
    in_one_process,
    own_copies,
    round_parts,
    started_processes,
)
from .environment import FACTOR, environment_differences, environment_key, environment_keys, paired_method
from .hopeless import FAR_SLOWER, is_far_slower
from .live.candidate import combine
from .live.measurer import LiveMeasurer
from .live.paired_worker import PairedWorker
from .live.process_pair import PROCESS_PAIRS, across_processes
from .measurer import LossReading, Noise, PairedMeasurer, first_pairs, told_apart
from .runs import CLAIM_PAIRS, RUN_CONFIDENCE, PairFailed, RunPair, Runs
from .runs import LEAST_PAIRS as LEAST_CLAIM_PAIRS
from .runs import WINDOW_PAIRS as RUN_WINDOW_PAIRS
from .script.first_copy import script_context
from .script.measurer import ScriptMeasurer
from .sizing import race_round_s
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
