"""An out-of-memory batch rules out larger batches with the same memory-relevant settings only
(``autotune.study.oom_limits``), in the rule's table and through the real search loop."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.search_spaces import SpaceContext, defaults
from autotune.study import Budget, SearchOptions
from autotune.study.loop import SearchLoop
from autotune.study.oom_limits import known_oom, record_oom
from autotune.study.records import StudyAttr
from autotune.trial import TrialSettings

from ..faulty_workloads import OOM_FROM_BATCH

FAULTY = "tests.faulty_workloads"
RAN_OUT = {"batch_per_rank": 64, "amp_dtype": "float32", "compile_mode": "none", "sparsity_pattern": "none",
           "sparsity": 0.0, "channels_last": False, "processes": 1, "device": "cuda", "threads": 4,
           "cuda_alloc": "default", "cudnn_benchmark": False}


@pytest.mark.parametrize(
    ("later", "skipped"),
    [
        ({}, True),  # the same recipe
        ({"batch_per_rank": 128}, True),  # larger, the same settings
        ({"batch_per_rank": 128, "threads": 8, "interop_threads": 1}, True),  # knobs that hold no memory
        ({"batch_per_rank": 128, "cuda_alloc": "expandable_segments"}, False),  # less fragmentation
        ({"batch_per_rank": 128, "cudnn_benchmark": True}, False),  # cuDNN's workspaces may grow
        ({"batch_per_rank": 32}, False),  # smaller
        ({"batch_per_rank": 128, "amp_dtype": "bfloat16"}, False),  # half the activations
        ({"batch_per_rank": 128, "compile_mode": "default"}, False),
        ({"batch_per_rank": 128, "sparsity_pattern": "structured", "sparsity": 0.5}, False),
        ({"batch_per_rank": 128, "channels_last": True}, False),
        ({"batch_per_rank": 128, "processes": 8}, False),  # ranks on other GPUs, DDP's buckets
        ({"batch_per_rank": None, "batch_size": 128}, False),  # a format-1 recipe: another batch key
    ],
)
def test_an_oom_rules_out_larger_batches_with_the_same_memory_settings(later: dict[str, Any], skipped: bool) -> None:
    limits = record_oom(None, RAN_OUT)
    params = {k: v for k, v in {**RAN_OUT, **later}.items() if v is not None}
    assert (known_oom(limits, params) is not None) == skipped
    assert record_oom(limits, {**RAN_OUT, "batch_per_rank": 256}) == limits  # the smallest is kept


def test_through_the_search_loop_an_oom_skips_only_its_own_settings(facts, tmp_path: Path) -> None:
    """Real trials of a workload that runs out of memory from batch 64: after batch 64 ran out, batch 128 is
    skipped with the same settings and measured (out of memory again) with structured sparsity. The noise is
    not the subject: the A/A takes the fewest pairs (6; its default 16 took 6 s more)."""
    from autotune.measure.live.measurer import LiveMeasurer

    ctx = SpaceContext(default_batch_size=32, prunable=True)
    run = {"device": "cpu", "reference_batch": 32, "global_batch": None, "lr_scaling": "sqrt"}
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/studies.db", direction="maximize")
    options = SearchOptions(settings=TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0,
                                                   eval_samples=32), confirm_top=0)
    base = defaults(facts, ctx)  # the defaults' environment: every candidate is an arm of the defaults' worker
    measurer = LiveMeasurer(f"{FAULTY}:oom", {**base, **run}, facts, options.settings, calibration_pairs=6,
                            busy=math.inf, profile_s=0.0)  # the subject is the OOM record, not the noise
    loop = SearchLoop(study, f"{FAULTY}:oom", facts, ctx, run, options, Budget.start(300), lambda *a: None,
                      measurer=measurer)
    try:
        loop.calibrate(120)  # the search's A/A comes first
        pruned = {"sparsity_pattern": "structured", "sparsity": 0.5}
        for changes in ({"batch_per_rank": OOM_FROM_BATCH}, {"batch_per_rank": 128},
                        {"batch_per_rank": 128, **pruned}):
            study.enqueue_trial({**base, **changes})
            loop._next(0, None)
    finally:
        loop.measurer.close()  # its worker and the worker's watchdog end with the test
    got = [(t.params["batch_per_rank"], t.params.get("sparsity_pattern"), t.user_attrs["status"])
           for t in study.get_trials(deepcopy=False)]
    assert got == [(64, "none", "oom"), (128, "none", "skipped"), (128, "structured", "oom")]
    skipped = study.get_trials(deepcopy=False)[1].user_attrs["error"]
    assert skipped == ("batch_per_rank 128 is at least 64, which ran out of memory with the same memory-relevant "
                       "settings")
    assert len(study.user_attrs[StudyAttr.OOM_LIMITS]) == 2  # one limit per combination of settings
