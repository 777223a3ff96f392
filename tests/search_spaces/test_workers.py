"""DataLoader workers run on the CPUs compute threads leave free, read from inside real workers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from autotune import search_spaces as spaces
from autotune.trial import run_trial
from autotune.workloads import tiny

from ..fakes.machines import two_sockets


@pytest.mark.parametrize(
    ("params", "workers", "process"),
    [
        ({"threads": 4, "affinity": "none", "num_workers": 2}, None, None),  # compute may run anywhere
        ({"threads": 4, "affinity": "compact", "num_workers": 0}, None, [0, 1, 2, 3]),
        ({"threads": 4, "affinity": "compact", "num_workers": 2}, [4, 5, 6, 7, 12, 13, 14, 15],
         [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]),  # whole free cores: the compute cores' siblings stay idle
        ({"threads": 2, "affinity": "spread", "num_workers": 1}, [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15],
         [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 14, 15]),  # compute 0 and 4; their siblings 8 and 12 stay idle
        ({"threads": 8, "affinity": "compact", "num_workers": 2}, list(range(8, 16)), list(range(16))),  # siblings
        ({"threads": 16, "affinity": "compact", "num_workers": 2}, None, list(range(16))),  # nothing free
    ],
)
def test_worker_cpus_and_the_process_cpus(facts, params, workers, process) -> None:
    machine = two_sockets(facts)
    assert spaces.worker_cpus(params, machine) == workers
    assert spaces.cpus_for(params, machine) == process


def test_dataloader_kwargs_pin_workers_to_one_thread() -> None:
    kwargs = spaces.data.dataloader_kwargs({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}, [5, 6])
    init = kwargs.pop("worker_init_fn")
    assert kwargs == {"num_workers": 2, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4}
    assert init.func is spaces.data.pin_worker and init.keywords == {"cpus": (5, 6)}
    assert "worker_init_fn" not in spaces.data.dataloader_kwargs({"num_workers": 0})


class AffinityDataset:
    """tiny's data; every item read also records where the reading process runs (once per process)."""

    def __init__(self) -> None:
        self.data = tiny._dataset()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        import torch

        record = Path(os.environ["AFFINITY_RECORD"]) / str(os.getpid())
        if not record.exists():
            record.write_text(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}))
        return self.data[index]


def affinity_workload():
    return replace(tiny.workload(), dataset=AffinityDataset)


def _records(directory: Path, main_pid: int | None = None) -> list[dict]:
    return [json.loads(p.read_text()) for p in directory.iterdir() if main_pid is None or int(p.name) != main_pid]


@pytest.fixture
def two_cpus(facts):
    if len(facts.cpu.allowed.core_list) < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two allowed cores")
    return [facts.cpu.allowed.core_list[0].cpus[0], facts.cpu.allowed.core_list[1].cpus[0]]


PARAMS = {"threads": 1, "affinity": "compact", "num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}


@pytest.mark.slow
def test_trial_workers_run_apart_from_the_compute_thread(facts, fast_settings, tmp_path, monkeypatch, two_cpus) -> None:
    monkeypatch.setenv("AFFINITY_RECORD", str(tmp_path))
    params = {**spaces.defaults(facts, spaces.SpaceContext()), "device": "cpu", "reference_batch": 32, **PARAMS}
    result = run_trial(f"{__name__}:affinity_workload", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    compute, workers = spaces.threads.cpus_for(params, facts), spaces.worker_cpus(params, facts)
    assert compute == [two_cpus[0]] and workers and two_cpus[1] in workers
    assert result.in_effect["cpus"] == compute  # every thread of the trial process
    # The evaluation pass reads the data in the main process: that record is the compute CPU's.
    records = _records(tmp_path)
    assert {"cpus": workers, "threads": 1} in records
    assert all(r == {"cpus": workers, "threads": 1} or r["cpus"] == compute for r in records)


def test_apply_pins_compute_threads_and_workers_in_the_users_process(facts, tmp_path, two_cpus) -> None:
    script = textwrap.dedent(f"""
        import json, os, sys, warnings, torch, autotune
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.search_spaces.test_workers import AffinityDataset
        from autotune.probes import Facts
        facts = Facts.from_json({facts.to_json()!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tuned = autotune.apply({{"batch_size": 8, **{PARAMS!r}}}, facts=facts, check_hardware=False)
        loader = torch.utils.data.DataLoader(AffinityDataset(), batch_size=8, **tuned.dataloader_kwargs)
        next(iter(loader))
        print(json.dumps({{"main": sorted(os.sched_getaffinity(0)), "workers": tuned.worker_cpus,
                          "warnings": [str(w.message) for w in caught]}}))
    """)
    # Started by hand on the compute CPU only, not by the launcher on compute + worker CPUs.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AFFINITY_RECORD": str(tmp_path)},
                          preexec_fn=lambda: os.sched_setaffinity(0, two_cpus[:1]))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["main"] == [two_cpus[0]] and two_cpus[1] in out["workers"]
    assert _records(tmp_path) == [{"cpus": out["workers"], "threads": 1}]
    # Started without the launcher, the workers are pinned all the same, and the user is told how to start it.
    assert any("autotune run" in w and "CPU affinity" in w for w in out["warnings"])


@pytest.mark.parametrize(("cores", "expected"), [(2, [(1, 1), (2, 1)]), (16, [(1, 15), (2, 14), (4, 12)])])
def test_input_bound_seeds_leave_the_compute_threads_the_cores_the_workers_do_not_take(facts, cores, expected) -> None:
    """Workers are offered up to 8; the compute threads are the physical cores left, not 8 minus the workers (on 16
    cores that had left 4-7 threads where 12-15 were free). The last seed: one worker beside the default threads."""
    machine = replace(facts, cpu=replace(facts.cpu, allowed=replace(facts.cpu.allowed, cores=cores)))
    seeds = spaces.data.input_bound(machine, spaces.SpaceContext(default_batch_size=32))
    assert [(s["num_workers"], s["threads"]) for s in seeds[:-1]] == expected
    assert seeds[-1] == {"pin_memory": False, "persistent_workers": True, "prefetch_factor": 2, "num_workers": 1}
