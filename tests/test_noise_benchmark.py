"""``benchmarks/noise.py`` judges what a user reads: on draws of known truth it passes, and on the same draws judged
with intervals that cover 80% while they say 95% it fails (a benchmark that cannot fail is no check)."""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import noise  # noqa: E402 - the benchmark under test


def _records(half: str, seed: int) -> list[dict]:
    """60 A/A and 40 effect comparisons of one half, drawn: window pairs (16, in one process) or process pairs
    (4, across) with a log spread of 3%, the effects at the gain the A/A's design tells apart 4 times in 5, and
    a long reference run of each kind at that gain."""
    rng = random.Random(seed)

    def ratios(truth: float, n: int) -> list[float]:
        return [truth * math.exp(rng.gauss(0.0, 0.03)) for _ in range(n)]

    def units() -> int:
        return 16 if half == "in" else 4

    aa = [{"half": half, "role": "aa", "kind": "compute", "share": 0.0, "ratios": ratios(1.0, units())}
          for _ in range(60)]
    share = noise.power_share(aa)
    references = [{"half": half, "role": "reference", "kind": kind, "share": share,
                   "ratios": ratios(1 + share, 400)} for kind in ("compute", "sleep", "alloc")]
    found = [{"half": half, "role": "effect", "kind": ("compute", "sleep", "alloc")[i % 3], "share": share,
              "ratios": ratios(1 + share, units())} for i in range(40)]
    return aa + references + found


@pytest.mark.parametrize("half", ["in", "across"])
def test_the_noise_benchmark_passes_true_intervals_and_fails_broken_ones(half: str) -> None:
    records = _records(half, seed=3)
    honest, broken = noise.summary(records)[half], noise.summary(records, broken=True)[half]
    assert honest["passed"], honest
    assert not broken["passed"] and broken["aa_coverage"] < 54, broken
