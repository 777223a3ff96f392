"""The knob-family contract (``autotune.search_spaces._family``), checked over every family.

As psutil's tests walk every platform module, these walk ``FAMILIES`` and hold each family's declarations
against what its hooks really do, on the live machine and on fake ones (two sockets; every runtime
library and IPEX present; eight NVLinked GPUs; a recorded tree without a runtime), for a CPU run, a CPU
run of a conv model with ``--global-batch``, and a CUDA run:

- ``KEYS`` are exactly the keys of ``defaults``, ``heuristic`` and of every path through ``space`` (a
  recording trial takes every branch: each categorical choice, each range's ends), and the names the
  space asks the trial for; ``promising`` changes only ``KEYS``; no two families share a key.
- every variable ``environment`` returns, for recipes made of every family's paths, is in ``ENV_VARS``;
  a variable two families may set is in exactly one's ``OVERRIDES``.
- the aggregator (``search_spaces.defaults``, ``heuristic``, ``suggest``, ``environment``,
  ``controlled_variables``) gives each family's result, with the overriding family's value where one
  overrides.
- a family's facts are about its own keys: a rule (``SCHEMA``) for each that holds every value its space,
  defaults and heuristic give; its environment-level, memory and in-place keys among them; each documented.
- a family added to ``FAMILIES`` (a module and one line) is offered, bounded, applied, classified and held to
  its documentation by what folds the families, with nothing else edited.
"""
from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from autotune import search_spaces as spaces
from autotune.probes import Facts, Gpu, Runtime
from autotune.search_spaces import FAMILIES, KnobFamily, SpaceContext, _families
from autotune.search_spaces._family import OPTIONAL_HOOKS, Family, as_family
from autotune.search_spaces._rules import integer

from ..fakes.machines import two_sockets

CONTEXTS = {
    "cpu": SpaceContext(),
    "cpu-conv": SpaceContext(default_batch_size=64, conv=True, prunable=True, global_batch=128),
    "cuda": SpaceContext(device="cuda", conv=True, prunable=True, semi_structured=True, unused_parameters=True),
}


def _name(family: KnobFamily) -> str:
    return getattr(family, "__name__", repr(family)).rsplit(".", 1)[-1].lstrip("_")


def _rich(facts: Facts) -> Facts:
    """Two sockets with every library, backend and IPEX the families can offer."""
    machine = two_sockets(facts)
    runtime = machine.runtime or Runtime("3.11", "2.13.0", "cpu", None, "gnu", *([None] * 6))
    runtime = replace(runtime, openmp="gnu", iomp5_path="/lib/libiomp5.so", jemalloc_path="/lib/libjemalloc.so.2",
                      tcmalloc_path="/lib/libtcmalloc.so.4", numactl_path="/usr/bin/numactl",
                      distributed_backends=("gloo", "nccl"), compile_cpu_ok=True, ipex_version="2.13.0",
                      ipex_compatible=True)
    return replace(machine, runtime=runtime)


def _gpus(facts: Facts) -> Facts:
    """The rich machine with eight A100s, every pair NVLinked, four local to each socket."""
    gpus = tuple(Gpu(index=i, name="A100", compute_capability="8.0", memory_bytes=80 * 2**30,
                     pci_bus_id=f"00000000:{i:02x}:00.0", numa_node=i // 4,
                     cpu_affinity="0-3,8-11" if i < 4 else "4-7,12-15",
                     links={str(j): "NV12" for j in range(8) if j != i})
                 for i in range(8))
    return replace(_rich(facts), gpus=gpus)


MACHINES: dict[str, Callable[[Facts], Facts]] = {
    "live": lambda facts: facts,
    "two-sockets": two_sockets,
    "rich": _rich,
    "gpus": _gpus,
    "recorded": lambda facts: replace(two_sockets(facts), runtime=None),
}


class _Path:
    """A trial that takes one path through a define-by-run space: the i-th suggestion takes option
    ``path[i]`` (0 beyond it) of its choices (an int or float range: its low and high end), and records
    the names asked and how many options each had."""

    def __init__(self, path: Sequence[int]) -> None:
        self.path = list(path)
        self.options: list[int] = []
        self.names: list[str] = []

    def _pick(self, name: str, options: list[Any]) -> Any:
        assert name not in self.names, f"{name} is asked twice in one trial"
        i = len(self.options)
        self.names.append(name)
        self.options.append(len(options))
        return options[self.path[i] if i < len(self.path) else 0]

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._pick(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return int(self._pick(name, [low, high]))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._pick(name, [low, high]))


def paths(family: KnobFamily, facts: Facts, ctx: SpaceContext) -> Iterator[tuple[_Path, dict[str, Any]]]:
    """Every path through the family's ``space`` (depth first): each trial and the params it returned."""
    stack: list[list[int]] = [[]]
    while stack:
        path = stack.pop()
        trial = _Path(path)
        params = family.space(trial, facts, ctx)
        yield trial, params
        taken = path + [0] * (len(trial.options) - len(path))
        for i in range(len(path), len(trial.options)):
            stack += [taken[:i] + [k] for k in range(1, trial.options[i])]


@dataclass(frozen=True)
class Case:
    """One machine and run: its facts, context, and whole recipes built from every family's paths."""

    name: str
    facts: Facts
    ctx: SpaceContext
    recipes: tuple[dict[str, Any], ...]


@pytest.fixture(scope="module")
def cases(facts: Facts) -> list[Case]:
    out = []
    for machine, build in MACHINES.items():
        for run, ctx in CONTEXTS.items():
            fake = build(facts)
            base = spaces.defaults(fake, ctx)
            bases = (base, {**base, **spaces.heuristic(fake, ctx)})
            recipes = [{**b, **params, "device": ctx.device}
                       for family in FAMILIES for _, params in paths(family, fake, ctx)
                       for b in bases]
            out.append(Case(f"{machine}/{run}", fake, ctx, tuple(recipes)))
    return out


FAMILY = pytest.mark.parametrize("family", FAMILIES, ids=_name)


@FAMILY
def test_family_satisfies_the_protocol(family: KnobFamily) -> None:
    assert isinstance(family, KnobFamily)
    for declared in (family.KEYS, family.ENV_VARS, family.OVERRIDES):
        assert isinstance(declared, tuple) and all(isinstance(x, str) for x in declared)
    # Each hook the module defines (the others are ``Defaults``') takes the protocol's parameters, in order:
    # the module is wrapped by ``Family``, so this is where its hooks' shapes are held to the protocol.
    for hook in ("space", "defaults", "heuristic", *OPTIONAL_HOOKS):
        wanted = list(inspect.signature(getattr(KnobFamily, hook)).parameters)[1:]  # without self
        assert list(inspect.signature(getattr(family, hook)).parameters) == wanted, (_name(family), hook)


def test_a_family_leaves_out_the_hooks_it_has_no_work_for() -> None:
    module = types.ModuleType("bare")
    bare = Family(module)
    assert bare.environment({}, None) == {} and bare.promising(None, None) == []
    module.environment = lambda params, facts: {"X": "1"}  # a hook the module defines (or a test patches) wins
    assert bare.environment({}, None) == {"X": "1"}
    with pytest.raises(AttributeError):
        bare.space  # noqa: B018 - a required hook has no default


@FAMILY
def test_keys_are_what_the_space_and_the_defaults_give(family: KnobFamily, cases: list[Case]) -> None:
    keys = set(family.KEYS)
    for case in cases:
        seen = 0
        for trial, params in paths(family, case.facts, case.ctx):
            seen += 1
            assert set(params) == keys, (case.name, trial.path)
            assert set(trial.names) <= keys, (case.name, trial.path)
        assert seen >= 1
        assert set(family.defaults(case.facts, case.ctx)) == keys, case.name
        assert set(family.heuristic(case.facts, case.ctx)) == keys, case.name
        for change in family.promising(case.facts, case.ctx):
            assert set(change) <= keys, (case.name, change)


def test_no_two_families_share_a_key() -> None:
    keys = [key for family in FAMILIES for key in family.KEYS]
    assert len(keys) == len(set(keys))
    assert not set(keys) & set(spaces.RUN_KEYS)


def check_environment_declared(family: KnobFamily, cases: list[Case]) -> None:
    """Every variable ``family.environment`` sets for any recipe of ``cases`` is in its ``ENV_VARS``, and
    every one declared is set by some recipe (a stale declaration would clear a variable for nothing)."""
    seen: set[str] = set()
    for case in cases:
        for params in case.recipes:
            env = family.environment(params, case.facts)
            undeclared = set(env) - set(family.ENV_VARS)
            assert not undeclared, f"{_name(family)} sets {sorted(undeclared)}, not in its ENV_VARS ({case.name})"
            seen |= set(env)
    assert seen == set(family.ENV_VARS), f"{_name(family)} never sets {sorted(set(family.ENV_VARS) - seen)}"


@FAMILY
def test_every_variable_set_is_declared(family: KnobFamily, cases: list[Case]) -> None:
    check_environment_declared(family, cases)


def test_the_contract_catches_an_undeclared_variable(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    threads = spaces.threads
    declared = threads.environment
    monkeypatch.setattr(threads, "environment", lambda params, facts: {**declared(params, facts), "OMP_PROC_BIND": "1"})
    with pytest.raises(AssertionError, match=r"threads sets \['OMP_PROC_BIND'\], not in its ENV_VARS"):
        check_environment_declared(threads, cases)


@FAMILY
def test_shared_variables_have_one_declared_winner(family: KnobFamily) -> None:
    assert set(family.OVERRIDES) <= set(family.ENV_VARS), "a family overrides only variables it sets"
    others = [other for other in FAMILIES if other is not family]
    for var in family.OVERRIDES:
        assert any(var in other.ENV_VARS for other in others), f"{var}: no other family sets it"
    for other in others:
        for var in set(family.ENV_VARS) & set(other.ENV_VARS):
            assert (var in family.OVERRIDES) != (var in other.OVERRIDES), \
                f"{var} is set by {_name(family)} and {_name(other)}: exactly one must declare it in OVERRIDES"


@FAMILY
def test_the_aggregator_gives_each_familys_result(family: KnobFamily, cases: list[Case]) -> None:
    assert set(family.ENV_VARS) <= set(spaces.controlled_variables())
    for case in cases:
        facts, ctx = case.facts, case.ctx
        suggested, drawn = spaces.suggest(_Path([]), facts, ctx), family.space(_Path([]), facts, ctx)
        if _name(family) == "ddp" and spaces.processes.count(suggested) == 1:
            drawn = family.defaults(facts, ctx)  # one process starts no DDP: PyTorch's settings (``suggest``)
        for merged, own in ((spaces.defaults(facts, ctx), family.defaults(facts, ctx)),
                            (spaces.heuristic(facts, ctx), family.heuristic(facts, ctx)), (suggested, drawn)):
            assert {key: merged[key] for key in family.KEYS} == own, case.name
        for params in case.recipes:
            env = spaces.environment(params, facts)
            winners = {var: value for other in FAMILIES if other is not family
                       for var, value in other.environment(params, facts).items() if var in other.OVERRIDES}
            for var, value in family.environment(params, facts).items():
                assert env[var] == winners.get(var, value), (case.name, var)


def test_the_aggregate_is_the_union_of_the_families(cases: list[Case]) -> None:
    for case in cases:
        params = spaces.suggest(_Path([]), case.facts, case.ctx)
        assert set(params) == {key for family in FAMILIES for key in family.KEYS}
        for recipe in case.recipes:
            env = spaces.environment(recipe, case.facts)
            assert set(env) == {var for f in FAMILIES for var in f.environment(recipe, case.facts)}, case.name


@FAMILY
def test_every_variable_set_has_a_form_the_env_file_is_read_against(family: KnobFamily, cases: list[Case]) -> None:
    """What ``environment`` sets for a recipe on any of these machines is a variable ``env_forms`` names for the
    recipe's params alone, with a value of its form: an exported env file's reader (``recipe_file``) refuses any
    other line, so a family whose forms lag behind its variables would make its own exports unreadable."""
    for case in cases:
        for params in case.recipes:
            forms = {key: re.compile(form) for key, form in family.env_forms(params).items()}
            for key, value in family.environment(params, case.facts).items():
                assert key in forms and forms[key].fullmatch(value), (_name(family), case.name, key, value, params)


def test_every_recipe_the_spaces_make_is_exported_and_read_back(cases: list[Case]) -> None:
    """The whole exporter against the whole reader: each case's recipes written as env files (with their CPUs and
    nodes) read back as the same recipe; the first refusal of a recipe the search could write fails here."""
    from autotune.recipe import Recipe
    from autotune.recipe_file import read_env, to_env

    for case in cases:
        for params in case.recipes[::7]:  # every 7th: the paths overlap, and this runs in a fraction of a second
            recipe = Recipe(params={**params, "reference_batch": 64}, workload="w", fingerprint="v3-0123456789ab")
            text = to_env(recipe, spaces.environment(params, case.facts), spaces.cpus_for(params, case.facts),
                          spaces.memory_nodes(params, case.facts))
            assert read_env(text) == recipe, case.name


KNOBS_MD = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"


def undocumented(families: Sequence[KnobFamily], text: str) -> list[str]:
    """The keys of ``families`` that ``docs/knobs.md``'s text never names (as `key`)."""
    return [key for family in families for key in family.KEYS if f"`{key}`" not in text]


@FAMILY
def test_a_familys_facts_are_about_its_own_keys(family: KnobFamily, cases: list[Case]) -> None:
    keys = set(family.KEYS)
    assert keys <= set(family.SCHEMA), f"{_name(family)}: no rule for {sorted(keys - set(family.SCHEMA))}"
    for listed in (family.ENVIRONMENT_KEYS, family.MEMORY_KEYS, family.IN_PLACE):
        assert set(listed) <= keys, (_name(family), listed)
    assert not set(family.ENVIRONMENT_KEYS) & set(family.IN_PLACE), "a key that decides a process is not in place"
    for case in cases:
        given = [params for _, params in paths(family, case.facts, case.ctx)]
        for params in [*given, family.defaults(case.facts, case.ctx), family.heuristic(case.facts, case.ctx)]:
            for key, value in params.items():
                check, allowed = family.SCHEMA[key]
                assert check(value), f"{_name(family)} gives {key}={value!r}, its rule allows {allowed} ({case.name})"
    assert undocumented([family], KNOBS_MD.read_text()) == []


def test_every_in_place_key_has_its_switch() -> None:
    """``Tuned.switch`` changes each in-place key of a running process by name: a key a family lists ``IN_PLACE``
    without its switch there would be taken and never applied (a copy would time the recipe before it)."""
    from autotune.apply import Tuned

    source = inspect.getsource(Tuned.switch)
    assert [key for key in spaces.in_place() if f'"{key}"' not in source] == []


def _fixture_family() -> types.ModuleType:
    """A new knob's module: one key, set through a variable before the process starts, that changes its memory."""
    module = types.ModuleType("autotune.search_spaces._fixture")
    module.KEYS = ("fixture_level",)
    module.SCHEMA = {"fixture_level": integer(0, 3)}
    module.ENVIRONMENT_KEYS = module.MEMORY_KEYS = module.KEYS
    module.ENV_VARS, module.OVERRIDES = ("FIXTURE_LEVEL",), ()
    module.space = lambda trial, facts, ctx: {"fixture_level": trial.suggest_int("fixture_level", 0, 3)}
    module.defaults = module.heuristic = lambda facts, ctx: {"fixture_level": 0}
    module.environment = lambda params, facts: ({"FIXTURE_LEVEL": str(params["fixture_level"])}
                                                if params.get("fixture_level") else {})
    module.env_forms = lambda params: {"FIXTURE_LEVEL": "[0-3]"}
    return module


def test_a_family_added_to_the_list_is_offered_bounded_applied_classified_and_documented(
        facts: Facts, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.measure import environment_key
    from autotune.recipe import Recipe
    from autotune.recipe_file import read_env, to_env
    from autotune.study.oom_limits import memory_settings

    monkeypatch.setattr(_families, "FAMILIES", (*_families.FAMILIES, as_family(_fixture_family())))  # the line
    ctx = SpaceContext()
    base = spaces.defaults(facts, ctx)
    assert base["fixture_level"] == 0 and spaces.suggest(_Path([]), facts, ctx)["fixture_level"] == 0  # offered
    offered = spaces.allowed_values(facts, ctx)["fixture_level"]
    assert 0 in offered and 3 in offered and 4 not in offered, offered
    assert spaces.recipe_problems({"fixture_level": 2}) == []  # bounded
    assert spaces.recipe_problems({"fixture_level": 7}) == ["fixture_level=7: not allowed (an integer from 0 to 3)"]
    params = {**base, "fixture_level": 2, "device": "cpu"}
    env = spaces.environment(params, facts)  # applied: the variable set before the process starts, and exported
    assert env["FIXTURE_LEVEL"] == "2" and "FIXTURE_LEVEL" in spaces.controlled_variables()
    recipe = Recipe(params={**params, "reference_batch": 32}, workload="w", fingerprint="v3-0123456789ab")
    text = to_env(recipe, env, spaces.cpus_for(params, facts), spaces.memory_nodes(params, facts))
    assert "FIXTURE_LEVEL=2" in text and read_env(text) == recipe
    assert "fixture_level" in spaces.environment_keys() and "fixture_level" not in spaces.in_place()  # classified
    assert environment_key(params) != environment_key({**params, "fixture_level": 0})
    assert "fixture_level" in spaces.memory_keys()
    assert json.loads(memory_settings(params))["fixture_level"] == 2
    text = KNOBS_MD.read_text()
    assert undocumented(_families.FAMILIES, text) == ["fixture_level"]  # documented: its section is asked for
    assert undocumented(_families.FAMILIES, text + "\n- `fixture_level`: a fixture's level.\n") == []
