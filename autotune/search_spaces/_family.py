"""The knob-family protocol: what each module of ``autotune.search_spaces`` provides, in one shape per hook.

A family owns some recipe keys (``KEYS``). Its ``space`` is the define-by-run search space over them;
``defaults`` are PyTorch's (the baseline), ``heuristic`` what ``torch.backends.xeon.run_cpu`` would choose,
``promising`` single changes of the defaults worth measuring first. Before Python starts, ``environment``
gives the variables to set (every one it may set is in ``ENV_VARS``), and ``env_forms`` the variables it may
set for given params on any machine, each with its value's form (a regular expression: an env file is read
against them, and a line of another form refused); inside the process ``apply_process`` sets what can be set
there and ``check_environment`` says which environment-level settings are not in effect. ``prepare_model``
(before the optimizer exists) and ``prepare`` (with it) change the user's model.

Overrides are declared, not implied by order: ``OVERRIDES`` names the variables of *other* families that
this family's ``environment`` replaces when it sets them (``processes`` gives each rank its share of the
``threads`` family's ``OMP_NUM_THREADS``). Where it does, its value wins, its ``apply_process`` runs after
the overridden family's, and its ``check_environment`` replaces theirs (``search_spaces`` aggregates so).

A family owns its keys' facts too: ``SCHEMA``, what a recipe may hold under each key it reads (``_rules``); and
which of its keys decide a process (``ENVIRONMENT_KEYS``: one worker, one set of their values), change what a
process holds for a batch (``MEMORY_KEYS``) or can change in a running process (``IN_PLACE``). What reads these
facts folds them over ``FAMILIES`` (``_families``): adding a knob is its module, one line in that list and its
section in ``docs/knobs.md`` (and, for a key listed ``IN_PLACE``, its switch in ``Tuned.switch``).

A family module defines ``KEYS``, ``SCHEMA``, ``ENV_VARS``, ``OVERRIDES``, ``space``, ``defaults`` and ``heuristic``
(a family that ``run_cpu`` leaves alone binds ``heuristic = defaults``), and of the other hooks and key lists only
those it has work for: ``Family(module)`` is the module as a ``KnobFamily``, with the no-op ``Defaults`` for the
hooks it leaves out (and no keys for a list it leaves out).
``tests/search_spaces/test_knob_contract.py`` checks every family's hooks against the protocol's signatures and
its declarations against what its hooks do.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

if TYPE_CHECKING:
    import torch
    from optuna.distributions import CategoricalChoiceType

    from ..probes import Facts
    from ._context import SpaceContext
    from ._rules import Rule

# A recipe's knob values by key: JSON values (int, float, str, bool, None).
Params = dict[str, Any]


class SuggestingTrial(Protocol):
    """What a space asks of its trial: Optuna's ``Trial`` and ``FixedTrial`` have these."""

    def suggest_int(self, name: str, low: int, high: int) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None) -> float: ...

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType: ...


@dataclass(frozen=True)
class Prepared:
    """What ``prepare_model`` / ``prepare`` returns: the model (and optimizer, from ``prepare``) to use
    from now on, what was done (recorded in ``Tuned.in_effect`` under the knob; empty: nothing) and
    problems worth a warning."""

    model: torch.nn.Module
    done: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    optimizer: torch.optim.Optimizer | None = None


@runtime_checkable
class KnobFamily(Protocol):
    """One knob family (see the module docstring); ``Family(module)`` satisfies it, the module's hooks and lists
    or ``Defaults``' (``isinstance(Family(module), KnobFamily)`` checks the names are there, mypy their types)."""

    @property
    def KEYS(self) -> tuple[str, ...]:  # noqa: N802 - a module constant
        """The recipe keys ``space`` and ``defaults`` return, exactly."""

    @property
    def SCHEMA(self) -> Mapping[str, Rule]:  # noqa: N802
        """What a recipe may hold under each key the family reads: its ``KEYS``, and older recipes' keys it reads."""

    @property
    def ENVIRONMENT_KEYS(self) -> tuple[str, ...]:  # noqa: N802
        """Its keys that must be in effect before torch starts, or that decide the process itself."""

    @property
    def MEMORY_KEYS(self) -> tuple[str, ...]:  # noqa: N802
        """Its keys that change what one process holds in memory for a given batch (``study.oom_limits``)."""

    @property
    def IN_PLACE(self) -> tuple[str, ...]:  # noqa: N802
        """Its keys a running training process can change between two steps (``Tuned.switch``)."""

    @property
    def ENV_VARS(self) -> tuple[str, ...]:  # noqa: N802
        """Every environment variable ``environment`` may set."""

    @property
    def OVERRIDES(self) -> tuple[str, ...]:  # noqa: N802
        """Variables of other families' ``ENV_VARS`` that this family's value replaces when it sets them."""

    def space(self, trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params: ...

    def defaults(self, facts: Facts, ctx: SpaceContext) -> Params: ...

    def heuristic(self, facts: Facts, ctx: SpaceContext) -> Params: ...

    def promising(self, facts: Facts, ctx: SpaceContext) -> list[Params]: ...

    def interactions(self, facts: Facts, ctx: SpaceContext) -> list[Params]: ...

    def environment(self, params: Params, facts: Facts) -> dict[str, str]: ...

    def env_forms(self, params: Params) -> dict[str, str]: ...

    def apply_process(self, params: Params, facts: Facts | None) -> list[str]: ...

    def check_environment(self, params: Params, facts: Facts) -> list[str]: ...

    def prepare_model(self, params: Params, model: torch.nn.Module, device: str) -> Prepared: ...

    def prepare(self, params: Params, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared: ...


class Defaults:
    """The hooks of a family that has nothing to do there: what ``Family`` answers for a hook a module leaves out."""

    ENVIRONMENT_KEYS: tuple[str, ...] = ()
    MEMORY_KEYS: tuple[str, ...] = ()
    IN_PLACE: tuple[str, ...] = ()

    @staticmethod
    def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
        return []

    @staticmethod
    def interactions(facts: Facts, ctx: SpaceContext) -> list[Params]:
        return []

    @staticmethod
    def environment(params: Params, facts: Facts) -> dict[str, str]:
        return {}

    @staticmethod
    def env_forms(params: Params) -> dict[str, str]:
        return {}

    @staticmethod
    def apply_process(params: Params, facts: Facts | None) -> list[str]:
        return []

    @staticmethod
    def check_environment(params: Params, facts: Facts) -> list[str]:
        return []

    @staticmethod
    def prepare_model(params: Params, model: torch.nn.Module, device: str) -> Prepared:
        return Prepared(model)

    @staticmethod
    def prepare(params: Params, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared:
        return Prepared(model, optimizer=optimizer)


OPTIONAL_HOOKS = ("promising", "interactions", "environment", "env_forms", "apply_process", "check_environment",
                  "prepare_model", "prepare")
OPTIONAL_KEYS = ("ENVIRONMENT_KEYS", "MEMORY_KEYS", "IN_PLACE")


class Family:
    """A family module as a ``KnobFamily``: each name is looked up in the module when asked (so a patched hook is
    the one called), and a hook the module leaves out is ``Defaults``'."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self.module, name)
        except AttributeError:
            if name in OPTIONAL_HOOKS or name in OPTIONAL_KEYS:
                return getattr(Defaults, name)
            raise

    def __repr__(self) -> str:
        return f"Family({self.module.__name__})"


def as_family(module: ModuleType) -> KnobFamily:
    """``Family(module)``, typed as the protocol (its hooks' signatures are checked by the contract test)."""
    return cast(KnobFamily, Family(module))
