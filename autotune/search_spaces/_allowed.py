"""What the search space allows here: each knob's values, read from the define-by-run space itself.

The families' ``space(trial, facts, ctx)`` functions are the only definition of the space (they
depend on the probed facts and on the run's options: ``--no-compile``, ``--global-batch``, the memory
cap). Rather than copy their lists, ``allowed_values`` replays ``search_spaces.suggest`` with a trial
that records every distribution asked for, once per branch (a choice of ``openmp`` or ``num_workers``
that opens other knobs), and every value the space returns without asking (``pin_memory`` on a CPU).
``outside(params, ...)`` replays it with a recipe's values, as Optuna's ``FixedTrial`` would, and says
which of them today's space cannot take, before Optuna's categorical check fails mid-search.

>>> from autotune import probes
>>> allowed = allowed_values(probes.probe(), SpaceContext(allow_compile=False))   # doctest: +SKIP
>>> str(allowed["compile_mode"]), "default" in allowed["compile_mode"]           # doctest: +SKIP
('none', False)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._families import suggest

if TYPE_CHECKING:
    from optuna.distributions import CategoricalChoiceType

    from ..probes import Facts


@dataclass(frozen=True)
class AllowedValues:
    """The values one knob may take: listed ``choices`` and ``(low, high, step)`` ranges (ints or floats)."""

    choices: tuple[Any, ...] = ()
    ranges: tuple[tuple[float, float, float | None], ...] = ()

    def __contains__(self, value: Any) -> bool:
        if any(_same(value, c) for c in self.choices):
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return any(_in_range(value, *r) for r in self.ranges)

    def __str__(self) -> str:
        parts = [_show(c) for c in self.choices]
        parts += [f"{_show(lo)}..{_show(hi)}" + (f" in steps of {_show(step)}" if step not in (None, 1) else "")
                  for lo, hi, step in self.ranges]
        return ", ".join(parts)

    def merge(self, other: AllowedValues) -> AllowedValues:
        choices = self.choices + tuple(c for c in other.choices if not any(_same(c, x) for x in self.choices))
        return AllowedValues(choices, self.ranges + tuple(r for r in other.ranges if r not in self.ranges))


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same kind: ``True`` is not ``1`` here, ``0`` and ``0.0`` are the same number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return type(a) is type(b) and a == b


def _in_range(value: float, low: float, high: float, step: float | None) -> bool:
    if isinstance(low, int) and isinstance(high, int) and not float(value).is_integer():
        return False  # an int knob
    if not low - 1e-9 <= value <= high + 1e-9:
        return False
    return step is None or abs((value - low) / step - round((value - low) / step)) < 1e-6


def _show(value: Any) -> str:
    """A value as ``--fix`` takes it: text as it is, anything else as JSON (``true``, ``null``, ``0.5``)."""
    import json

    return value if isinstance(value, str) else json.dumps(value)


class _Replay:
    """A trial for the define-by-run space: returns ``values[name]`` where the space allows it, else
    the first choice (or the low end); records what each name was asked for and what was refused."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.asked: dict[str, AllowedValues] = {}
        self.refused: dict[str, AllowedValues] = {}

    def _pick(self, name: str, allowed: AllowedValues, first: Any) -> Any:
        self.asked[name] = allowed
        if name not in self.values:
            return first
        if self.values[name] in allowed:
            return self.values[name]
        self.refused[name] = allowed
        return first

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType:
        return self._pick(name, AllowedValues(tuple(choices)), tuple(choices)[0])

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return int(self._pick(name, AllowedValues(ranges=((int(low), int(high), int(step)),)), int(low)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._pick(name, AllowedValues(ranges=((float(low), float(high), step),)), float(low)))


def _branches(allowed: AllowedValues) -> list[Any]:
    """The values to try of one knob so every branch it opens is seen: each choice, each range's ends."""
    ends = [v for lo, hi, _ in allowed.ranges for v in (lo, hi)]
    return [*allowed.choices, *ends]


def allowed_values(facts: Facts, ctx: SpaceContext) -> dict[str, AllowedValues]:
    """Every knob of the recipe's params -> the values today's space may give it (see the module doc)."""
    return _explore(facts, ctx)[0]


def suggested(facts: Facts, ctx: SpaceContext) -> dict[str, AllowedValues]:
    """The knobs the space asks the sampler for -> what it asks with (Optuna's distributions: a study
    must ask a categorical knob with the same choices in every trial)."""
    return _explore(facts, ctx)[1]


def _explore(facts: Facts, ctx: SpaceContext) -> tuple[dict[str, AllowedValues], dict[str, AllowedValues]]:
    seen: dict[str, AllowedValues] = {}
    asked: dict[str, AllowedValues] = {}
    tried: set[tuple[str, str]] = set()
    queue: list[dict[str, Any]] = [{}]
    while queue:
        values = queue.pop()
        trial = _Replay(values)
        params = suggest(trial, facts, ctx)
        for key, value in params.items():
            found = trial.asked.get(key, AllowedValues((value,)))
            seen[key] = seen[key].merge(found) if key in seen else found
        for name, allowed in trial.asked.items():
            asked[name] = asked[name].merge(allowed) if name in asked else allowed
            for value in _branches(allowed):
                if (name, repr(value)) not in tried:
                    tried.add((name, repr(value)))
                    queue.append({**values, name: value})
    return seen, asked


def outside(params: dict[str, Any], facts: Facts, ctx: SpaceContext,
            allowed: dict[str, AllowedValues] | None = None) -> list[str]:
    """The values of ``params`` (a full recipe) that today's space cannot take, one ``knob=value
    (allowed: ...)`` each; [] when the space can run it as it is. Knobs the space does not know are
    ignored (a recipe from an older autotune), and so is a value of a knob that another knob's value
    makes moot (``kmp_blocktime`` with ``openmp=gnu``) where the space allows it otherwise."""
    allowed = allowed if allowed is not None else allowed_values(facts, ctx)
    trial = _Replay(params)
    got = suggest(trial, facts, ctx)
    problems = [f"{name}={_show(params[name])} (allowed: {space})" for name, space in trial.refused.items()]
    for key, value in got.items():
        if key in trial.asked or key not in params or _same(params[key], value) or params[key] in allowed[key]:
            continue
        problems.append(f"{key}={_show(params[key])} (allowed: {allowed[key]})")
    return problems


def as_trial(params: dict[str, Any], facts: Facts, ctx: SpaceContext) -> dict[str, Any]:
    """``params`` as the trial that asks them records them: a knob that another knob's value makes moot, one the
    space does not ask then (``kmp_blocktime`` under ``openmp=gnu``), at the value the space gives it there, so a
    ``--fix`` of it does not read as another environment before the trial runs, nor a measured recipe as a new one.
    A value the space refuses is kept as given (``outside`` says which)."""
    trial = _Replay(params)
    got = suggest(trial, facts, ctx)
    return {**params, **{k: v for k, v in got.items() if k in params and k not in trial.asked}}
