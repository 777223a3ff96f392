"""Measured facts (``probes.measured``): the kernels' speeds at each precision, under a deadline, cached."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.probes import _measured
from autotune.probes import measured as measured_facts


class _SlowUnderAutocast(torch.nn.Linear):
    """A kernel whose reduced-precision path takes ``row_s`` a row of its input (as fp16 autocast's did on a CPU,
    its cost growing with the work); records the rows it ran under autocast."""

    row_s = 0.02

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.rows: list[int] = []

    def forward(self, x: Any) -> Any:
        if torch.is_autocast_enabled("cpu"):
            self.rows.append(len(x))
            time.sleep(self.row_s * len(x))
        return super().forward(x)


def test_a_precision_slower_than_its_deadline_reads_at_least_so_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eighth of the input takes 0.16 s: the whole would take 1.3 s, past the 0.1 s deadline, so it never runs:
    the faster of the eighth's second and third runs is the reading, a bound ("at least so slow")."""
    kernel = (_SlowUnderAutocast(16, 16), torch.randn(64, 16))
    monkeypatch.setattr(_measured, "_kernels", lambda device: {"matmul": kernel})
    started = time.perf_counter()
    (bf16,) = _measured.measure_precision(("bfloat16",), deadline_s=0.1)
    assert time.perf_counter() - started < 1.5  # three slow runs of an eighth, and float32's short loops
    assert kernel[0].rows == [8, 8, 8], kernel[0].rows
    assert bf16.bound and bf16.speed < 0.01 and bf16.hopeless(), bf16
    assert bf16.describe().startswith("bfloat16: at least ") and "slower than float32" in bf16.describe()


class _SlowFirstUnderAutocast(torch.nn.Linear):
    """A kernel whose reduced-precision path (or, ``in_float32``, its float32 path) pays ``first_s`` once, on its
    first use (as a GPU loads a precision's kernels on first use: an H100 read bf16 1466x slower than float32 from
    that run; its float32 conv paid cuDNN's set-up past the deadline and bf16 read 642x faster), then runs as the
    other."""

    first_s = 0.5

    def __init__(self, *args: Any, in_float32: bool = False, first_s: float = first_s) -> None:
        super().__init__(*args)
        self.paid, self.in_float32, self.first_s = False, in_float32, first_s

    def forward(self, x: Any) -> Any:
        if torch.is_autocast_enabled("cpu") != self.in_float32 and not self.paid:
            self.paid = True
            time.sleep(self.first_s)
        with torch.autocast("cpu", enabled=False):  # the same float32 kernel either way: only the one-off differs
            return super().forward(x)


def test_a_precisions_one_off_cost_is_not_read_as_slowness(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel of about a millisecond and a deadline of a second: a busy neighbour's preemption (milliseconds)
    # cannot make it read 4x slow, while the one-off cost, counted, would read it 0.0002x.
    kernel = (_SlowFirstUnderAutocast(512, 512), torch.randn(1024, 512))
    monkeypatch.setattr(_measured, "_kernels", lambda device: {"matmul": kernel})
    (bf16,) = _measured.measure_precision(("bfloat16",), deadline_s=1.0)
    assert kernel[0].paid
    assert not bf16.hopeless() and bf16.speed > 0.25, bf16  # the old reading: 0.0001x


def test_the_float32_references_one_off_cost_is_not_read_as_its_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    # float32's first run outlasts the deadline: read as the reference, bf16 read 500x faster (an H100's conv
    # 642x); the reference is a later run's. A deadline of a second, as above: beside another test run, 0.2 s of
    # the same kernel read 6.7x apart.
    kernel = (_SlowFirstUnderAutocast(512, 512, in_float32=True, first_s=1.5), torch.randn(1024, 512))
    monkeypatch.setattr(_measured, "_kernels", lambda device: {"matmul": kernel})
    (bf16,) = _measured.measure_precision(("bfloat16",), deadline_s=1.0)
    assert kernel[0].paid
    assert 0.25 < bf16.speed < 4.0, bf16


class _Burst(torch.nn.Linear):
    """The same float32 kernel at every precision, whose calls ``burst`` (a neighbour's stretch of load) take
    ``extra_s`` more, whichever precision runs then."""

    def __init__(self, *args: Any, burst: range, extra_s: float = 0.005) -> None:
        super().__init__(*args)
        self.calls, self.burst, self.extra_s = 0, burst, extra_s

    def forward(self, x: Any) -> Any:
        self.calls += 1
        if self.calls in self.burst:
            time.sleep(self.extra_s)
        with torch.autocast("cpu", enabled=False):
            return super().forward(x)


def test_a_burst_of_load_slows_both_precisions_of_a_pair_not_one_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Twenty calls slowed 5 ms (the kernel takes 1-3 ms): timed one precision after the other, they were all
    # float32's (2x-4x "faster" bf16); in pairs, both sides of eight of them (the first calls are left out)
    kernel = (_Burst(512, 512, burst=range(2, 22)), torch.randn(1024, 512))
    monkeypatch.setattr(_measured, "_kernels", lambda device: {"matmul": kernel})
    # A deadline the pairs past the burst fit in on a loaded machine too (1 s held 16 calls beside two test runs)
    (bf16,) = _measured.measure_precision(("bfloat16",), deadline_s=4.0)
    assert kernel[0].calls > 21  # pairs past the burst too
    assert 0.67 < bf16.speed < 1.5, bf16


def test_the_real_kernels_read_within_a_second_and_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = measured_facts("f1", directory=tmp_path)
    assert found.seconds < 2.0, found  # 0.4 s on a 2-vCPU VM, each precision's kernels under 0.2 s
    assert {k.dtype for k in found.precision} == {"bfloat16", "float16"}
    assert all(k.speed > 0 and len(k.kernels) == 2 for k in found.precision)
    stored = json.loads((tmp_path / "measured-f1-cpu.json").read_text())
    assert stored["format"] == _measured.FORMAT and stored["torch"] == torch.__version__

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("measured again")

    monkeypatch.setattr(_measured, "measure_precision", refuse)
    assert measured_facts("f1", directory=tmp_path) == found  # read back, not measured
    # another torch's kernels, or a cache that cannot be read: measured again (here: refused, so it raises)
    (tmp_path / "measured-f1-cpu.json").write_text(json.dumps({**stored, "torch": "2.3.0"}))
    with pytest.raises(AssertionError, match="measured again"):
        measured_facts("f1", directory=tmp_path)
    (tmp_path / "measured-f1-cpu.json").write_text("{not json")
    with pytest.raises(AssertionError, match="measured again"):
        measured_facts("f1", directory=tmp_path)


def test_a_cache_that_cannot_be_written_is_measured_around(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be
    assert measured_facts("f2", directory=blocked / "cache").precision


def test_measured_in_a_child_reads_as_in_this_process_and_names_a_failure(tmp_path: Path) -> None:
    """A search on a GPU measures the kernels in a child (its own process holds no CUDA context): the child's
    JSON reads back as ``Measured``, cached as one measured here; a child that fails is a one-line error."""
    found = measured_facts("f3", directory=tmp_path, in_child=True)
    assert found.device == "cpu" and found.torch == torch.__version__ and found.seconds > 0
    assert {k.dtype for k in found.precision} == {"bfloat16", "float16"} and all(k.kernels for k in found.precision)
    assert measured_facts("f3", directory=tmp_path) == found  # the cache a child's measurement wrote
    with pytest.raises(RuntimeError, match=r"^measuring the kernels' speeds failed: .*nonsense"):
        measured_facts("f4", "nonsense", tmp_path, in_child=True)
