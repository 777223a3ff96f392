"""What one recipe key may hold, as a family declares it in its ``SCHEMA``: a check and the words that say it.

The checks are type-exact: a recipe read from a file or a shared store is JSON, and ``True`` is not ``1`` nor
``"25"`` ``25`` (``_schema.problems`` reads every key against the families' rules).

>>> check, allowed = one_of((5, 25))
>>> check(25), check("25"), allowed
(True, False, 'one of 5, 25')
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
Rule = tuple[Check, str]  # the check, and what it allows in words (a refused value's message)


def integer(least: int, most: int) -> Rule:
    return (lambda v: type(v) is int and least <= v <= most), f"an integer from {least} to {most}"


def optional_integer(least: int, most: int) -> Rule:
    def check(v: Any) -> bool:
        return v is None or (type(v) is int and least <= v <= most)
    return check, f"null or an integer from {least} to {most}"


def number(least: float, most: float) -> Rule:
    return (lambda v: type(v) in (int, float) and least <= v <= most), f"a number from {least} to {most}"


def one_of(choices: tuple[Any, ...]) -> Rule:
    return (lambda v: any(type(v) is type(c) and v == c for c in choices)), "one of " + ", ".join(map(repr, choices))


BOOLEAN: Rule = ((lambda v: type(v) is bool), "true or false")
