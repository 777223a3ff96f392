"""DDP's settings (``search_spaces._ddp``): searched where several processes are offered, unused parameters
detected once and set, constant buffers not broadcast, and no all-reduce on the accumulation micro-steps --
the last three in real ranks (gloo, 2 processes, the tiny MLP), counted with a DDP communication hook."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune import search_spaces as spaces
from autotune.probes import Runtime
from autotune.search_spaces import SpaceContext
from autotune.search_spaces.transforms.semisparse import SemiSparseLinear

from ..conftest import REPO
from ..fakes.machines import two_sockets

UNUSED = "tests.faulty_workloads:unused_parameter"


class _Asked:
    """A trial that takes each categorical's first choice and records the names asked."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.names.append(name)
        return list(choices)[0]


def _with_backends(facts, *backends: str):
    machine = two_sockets(facts)
    runtime = machine.runtime or Runtime("3.11", "2.13.0", "cpu", None, "gnu", *([None] * 6))
    return replace(machine, runtime=replace(runtime, distributed_backends=backends))


def test_searched_only_where_several_processes_are_offered(facts) -> None:
    ctx = SpaceContext()
    several, one = _with_backends(facts, "gloo"), _with_backends(facts)  # no gloo: one process only
    assert spaces.processes.choices(several, ctx) != (1,) and spaces.processes.choices(one, ctx) == (1,)
    asked = _Asked()
    spaces.ddp.space(asked, several, ctx)
    assert asked.names == ["gradient_as_bucket_view", "bucket_cap_mb", "static_graph"]
    alone = _Asked()
    assert spaces.ddp.space(alone, one, ctx) == spaces.ddp.defaults(one, ctx) and alone.names == []
    assert spaces.ddp.defaults(one, ctx) == {"gradient_as_bucket_view": False, "bucket_cap_mb": 25,
                                             "static_graph": False, "find_unused_parameters": False}


def test_a_static_graph_is_never_combined_with_gradient_accumulation(facts) -> None:
    """DDP's static graph asserts or stops all-reducing when the first forward runs with gradient sync off
    (pytorch/pytorch#143580), which accumulation does: not offered with ``--global-batch``, and not applied
    by a recipe that accumulates."""
    several = _with_backends(facts, "gloo")
    asked = _Asked()
    spaces.ddp.space(asked, several, SpaceContext(global_batch=512))
    assert asked.names == ["gradient_as_bucket_view", "bucket_cap_mb"]
    model = torch.nn.Linear(8, 8)
    recipe = {"static_graph": True, "processes": 2, "batch_per_rank": 64}
    assert spaces.ddp.ddp_options(recipe, model)["static_graph"] is True  # no accumulation: as measured
    assert spaces.ddp.ddp_options({**recipe, "global_batch": 512}, model)["static_graph"] is False  # 4 micro-steps


class _Drawn:
    """A trial that returns ``values[name]`` where given, else the first choice."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.values.get(name, list(choices)[0])

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return int(self.values.get(name, low))

    def suggest_float(self, name: str, low: float, high: float, *, step: Any = None, log: bool = False) -> float:
        return float(self.values.get(name, low))


def test_a_one_process_recipe_holds_pytorchs_ddp_settings_whatever_was_drawn(facts) -> None:
    several, ctx = _with_backends(facts, "gloo"), SpaceContext()
    drawn = {"gradient_as_bucket_view": True, "bucket_cap_mb": 5, "static_graph": True}
    one = spaces.suggest(_Drawn({**drawn, "processes": 1}), several, ctx)
    assert {k: one[k] for k in drawn} == {"gradient_as_bucket_view": False, "bucket_cap_mb": 25,
                                          "static_graph": False}
    two = spaces.suggest(_Drawn({**drawn, "processes": 2}), several, ctx)
    assert two["processes"] == 2 and {k: two[k] for k in drawn} == drawn


def test_buffers_are_broadcast_unless_every_one_is_a_constant() -> None:
    sparse = SemiSparseLinear.from_linear(torch.nn.Linear(8, 8))  # its 2:4 mask: chosen once
    batchnorm = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))  # running statistics
    plain = torch.nn.Linear(8, 8)
    options = {name: spaces.ddp.ddp_options({}, model)["broadcast_buffers"]
               for name, model in (("sparse", sparse), ("batchnorm", batchnorm), ("plain", plain),
                                   ("both", torch.nn.Sequential(sparse, torch.nn.BatchNorm1d(8))))}
    assert options == {"sparse": False, "batchnorm": True, "plain": False, "both": True}


def test_the_search_detects_an_unused_parameter_once_and_sets_it(facts) -> None:
    from autotune.study import SearchOptions, search_context

    _, ctx = search_context(UNUSED, facts, SearchOptions())
    assert ctx.unused_parameters and spaces.defaults(facts, ctx)["find_unused_parameters"] is True
    _, tiny = search_context("tiny", facts, SearchOptions())
    assert not tiny.unused_parameters and spaces.defaults(facts, tiny)["find_unused_parameters"] is False


SCRIPT = """
import json, sys, torch, autotune
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
sys.path.insert(0, {repo!r})
from tests.faulty_workloads import _with_spare_layer

tuned = autotune.apply()
model = tuned.prepare_model(_with_spare_layer())
calls = []
def counting(state, bucket):
    calls.append(1)
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
after = []
for step in range(3 * tuned.accumulation):
    x, y = torch.randn(tuned.batch_size, 64), torch.randint(0, 10, (tuned.batch_size,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    stepped = tuned.step(loss, optimizer)
    after.append([stepped, len(calls)])
with open(f"rank{{tuned.rank}}.json", "w") as f:
    json.dump({{"accumulation": tuned.accumulation, "after": after, "ddp": tuned.in_effect["ddp"],
               "bucket_view": model.gradient_as_bucket_view, "static": model.static_graph,
               "bucket_bytes": model.bucket_bytes_cap, "broadcast": model.broadcast_buffers,
               "weights": model.module.net[0].weight.sum().item()}}, f)
tuned.finish()
assert not torch.distributed.is_initialized()
"""


@pytest.fixture
def two_cores(facts):
    if "gloo" not in spaces.processes._backends(facts) or (facts.cpu.allowed.cores or 0) < 2:
        pytest.skip("needs 2 allowed cores and gloo")
    return facts


def test_two_ranks_all_reduce_once_per_optimizer_step_with_an_unused_parameter(two_cores, tmp_path: Path) -> None:
    """4 micro-batches a step (``--global-batch 32`` of 4 per rank x 2): one all-reduce per step, not four,
    and the model's unused layer neither hangs nor fails the second step."""
    params = {"batch_per_rank": 4, "processes": 2, "global_batch": 32, "threads": 2, "device": "cpu",
              "gradient_as_bucket_view": True, "bucket_cap_mb": 5, "static_graph": False,
              "find_unused_parameters": True}
    (tmp_path / "r.json").write_text(json.dumps({"params": params, "workload": "unused", "format": 2,
                                                "fingerprint": two_cores.fingerprint}))
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT.format(repo=str(REPO))))
    out = subprocess.run([sys.executable, "-m", "autotune", "run", "--recipe", "r.json", "--", sys.executable,
                          "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert rank["accumulation"] == 4
        stepped = [s for s, _ in rank["after"]]
        assert stepped == [False, False, False, True] * 3
        counts = [c for _, c in rank["after"]]
        per_step = counts[3]
        assert per_step >= 1 and counts == [0, 0, 0, per_step, per_step, per_step, per_step, 2 * per_step,
                                            2 * per_step, 2 * per_step, 2 * per_step, 3 * per_step]
        assert rank["ddp"] == {"gradient_as_bucket_view": True, "bucket_cap_mb": 5, "static_graph": False,
                               "find_unused_parameters": True, "broadcast_buffers": False}
        # what DDP itself was given, read back from it
        assert (rank["bucket_view"], rank["static"], rank["bucket_bytes"], rank["broadcast"]) == (True, False,
                                                                                                5 * 2**20, False)
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the gradients were averaged: the ranks agree
