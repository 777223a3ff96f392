"""The machine's measured limits (``probes.limits``): the matmul peaks against a matmul timed here and the
theoretical peak, the cache and ``--measure``, and ``autotune probe`` showing them."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pytest

from autotune import probes
from autotune.cli import probe as probe_cli
from autotune.probes import _limits


def _rate(n: int = 1024, seconds: float = 0.3) -> float:
    """GFLOP/s of a float32 torch.mm of n x n, timed here."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    runs, start = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - start < seconds:
        torch.mm(a, b)
        runs += 1
    return 2 * n ** 3 / ((time.perf_counter() - start) / runs) / 1e9


def test_the_fp32_peak_is_at_least_a_timed_matmul_and_at_most_the_theoretical_peak(
        facts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peak against a matmul of its size timed right after it, with as many threads. The other test process
    shares the 2 CPUs at times: once the peak read 100 GFLOP/s and the test's matmul, run alone a moment later,
    205. So up to three tries, each measured afresh; a peak computed wrong (half the FLOP of a matmul, say) fails
    all three. One size and short runs: the full measurement keeps both CPUs busy for seconds, and beside it two
    timing tests of the other process failed."""
    import torch

    monkeypatch.setattr(_limits, "SIZES", (512,))
    monkeypatch.setattr(_limits, "RUN_S", 0.1)
    threads, tries = torch.get_num_threads(), []
    for attempt in range(3):
        found = probes.limits(facts, directory=tmp_path, refresh=attempt > 0)
        torch.set_num_threads(found.cpus)  # as the peak ran: one thread a CPU this process may use
        try:
            here = _rate(512, 0.1)
        finally:
            torch.set_num_threads(threads)
        peak = found.peak("float32")
        assert peak is not None and dict(found.matmul).keys() == {"float32", "bfloat16"}
        if found.bound_gflops is not None:  # the ISA's lanes and the clock (a nominal one: BOOST times it)
            assert peak <= found.bound_gflops, found
        tries.append((peak, here))
        if peak >= 0.6 * here:
            break
    else:
        pytest.fail(f"the peak under a matmul timed beside it, three times: {tries}")
    assert found.bandwidth_gbs > 0.1 and found.cpus == (facts.cpu.allowed.threads or found.cpus)
    assert "GFLOP/s" in found.describe() and "GB/s" in found.describe()


def test_the_theoretical_peak_is_cpus_times_clock_times_the_isas_flop_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\ncpu MHz\t\t: 2596.098\nprocessor\t: 1\n"
                                           "cpu MHz\t\t: 2400.0\n")
    assert _limits.clock_mhz(str(tmp_path)) == (pytest.approx(2596.098), False)  # a VM: /proc/cpuinfo's, nominal
    freq = tmp_path / "sys/devices/system/cpu/cpu0/cpufreq"
    freq.mkdir(parents=True)
    (freq / "cpuinfo_max_freq").write_text("3700000\n")
    assert _limits.clock_mhz(str(tmp_path)) == (3700.0, True)  # bare metal: cpufreq's maximum, not today's clock
    assert _limits.theoretical_gflops(2, 3700.0, ("avx2", "avx512f")) == pytest.approx(2 * 3.7 * 64)
    assert _limits.theoretical_gflops(2, 3700.0, ("avx2",)) == pytest.approx(2 * 3.7 * 32)
    assert _limits.theoretical_gflops(2, None, ("avx2",)) is None and _limits.theoretical_gflops(2, 3e3, ()) is None


def test_limits_are_cached_and_measured_again_when_asked_or_unreadable(facts: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def measure(cpus: int, isa: tuple[str, ...], *args: Any) -> Any:
        calls.append(cpus)
        return (("float32", 100.0 + len(calls)), ("bfloat16", 300.0)), 20.0, 332.0, 2596.0, False

    monkeypatch.setattr(_limits, "measure_limits", measure)
    first = probes.limits(facts, directory=tmp_path)
    assert first.bound_gflops == 332.0 * _limits.BOOST and "boost may be faster" in first.describe()  # nominal
    assert probes.limits(facts, directory=tmp_path) == first and len(calls) == 1  # read back, not measured
    assert probes.limits(facts, directory=tmp_path, refresh=True).peak() == 102.0 and len(calls) == 2
    path = tmp_path / f"limits-{facts.fingerprint}-cpu.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "torch": "0.0.1"}))  # another torch: measured again
    assert probes.limits(facts, directory=tmp_path).peak() == 103.0
    path.write_text("{not json")
    assert probes.limits(facts, directory=tmp_path).peak() == 104.0 and len(calls) == 4
    unwritable = tmp_path / "file"
    unwritable.write_text("")  # a folder that cannot be made: measured around it, no error
    assert probes.limits(facts, directory=unwritable / "cache").peak() == 105.0


def _probe(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser(prog="autotune")
    probe_cli.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["probe", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_probe_shows_the_limits_and_its_json_carries_them(capsys: pytest.CaptureFixture[str], recorded_roots: Any,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))  # measured here, faked: what is checked is what it shows
    monkeypatch.setattr(_limits, "measure_limits",
                        lambda cpus, isa: ((("float32", 210.0), ("bfloat16", 945.0)), 48.0, 332.0, 2596.0, False))
    text = _probe(capsys, "--no-gpus")
    assert "\nLimits       matmul float32 210 GFLOP/s, bfloat16 945 GFLOP/s (fp32 theoretical 332: " in text
    assert "memory 48.0 GB/s" in text
    doc = json.loads(_probe(capsys, "--json", "--no-gpus"))
    assert doc["limits"]["format"] == _limits.FORMAT and doc["limits"]["matmul"][0][0] == "float32"
    assert probes.Facts.from_dict(doc).fingerprint == doc["fingerprint"]  # the facts read back as before
    recorded = _probe(capsys, "--root", str(recorded_roots["nvidiagpunumanodes"]))
    assert "Limits       not measured" in recorded
    assert "limits" not in json.loads(_probe(capsys, "--json", "--no-runtime", "--no-gpus"))


def test_a_gpus_limits_are_measured_in_a_child_and_a_failure_there_is_one_error(facts: Any, tmp_path: Path) -> None:
    """A search's process holds no CUDA context of its own: a GPU's limits are measured in a child. Here no GPU
    answers it, and the child's failure is one RuntimeError naming it (the search then goes on without limits:
    ``study.driver._limits``); nothing is cached."""
    import dataclasses

    from autotune.probes import Gpu

    with_gpu = dataclasses.replace(facts, gpus=(Gpu(0, "A100", "8.0", 80 * 2**30, "00000000:81:00.0"),))
    with pytest.raises(RuntimeError, match="measuring the GPU's limits failed: .*(CUDA|cuda)") as failed:
        probes.limits(with_gpu, "cuda", tmp_path, in_child=True)
    assert "\n" not in str(failed.value)  # one line: the child's error, not its traceback
    assert list(tmp_path.iterdir()) == []
