"""The error tree. Every message says what is wrong and how to fix it; the CLI prints it on one line."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

# Control characters but the tab and the newline: ESC starts a terminal's sequences (an OSC retitles it), BEL,
# CR and the C1 controls rewrite what it shows; the bidirectional and zero-width marks reorder or hide what it shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    r"""Text from a store or a file as a terminal may get it: its control characters removed.

    >>> printable("a\x1b]0;owned\x07b\rc\u202ed")
    'a]0;ownedbcd'
    """
    return _CONTROL.sub("", text)


def one_line(text: str) -> str:
    """``text``'s words on one line: a stored text's newline would print a line of its own choosing."""
    return " ".join(text.split())


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps, each once: ``__cause__``, ``__context__`` and dynamo/inductor's
    ``inner_exception``."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        inner = getattr(e, "inner_exception", None)
        todo += [x for x in (e.__cause__, e.__context__, inner) if isinstance(x, BaseException)]


def seconds_variable(name: str, default: float, what: str, error: type[AutotuneError]) -> float:
    """A limit in seconds that the environment variable ``name`` gives (a positive, finite number), else ``default``
    (unset or empty); ``error`` naming the variable and ``what`` the seconds are for, for any other value.

    >>> seconds_variable("AUTOTUNE_NO_SUCH_LIMIT_S", 30.0, "a statement may take", UsageError)
    30.0
    """
    told = os.environ.get(name, "")
    if not told.strip():
        return default
    try:
        seconds = float(told)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise error(f"{name}={told[:40]!r}: give the seconds {what}, a positive number")
    return seconds


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose. Its message is ``printable``: it may quote a stored text, and
    Python prints it as it is (a traceback, ``str(e)``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(printable(a) if isinstance(a, str) else a for a in args))


class UsageError(AutotuneError):
    """Bad input from the user: a flag, a budget string, a workload spec, a recipe file."""


class ProbeError(AutotuneError):
    """The hardware could not be read (a corrupt recorded tree, an unreadable root)."""


class StorageError(AutotuneError):
    """The study/recipe database cannot be opened or is corrupt."""


class TrialError(AutotuneError):
    """A trial could not be launched at all (as opposed to a trial that ran and failed)."""


class HardwareMismatchError(AutotuneError):
    """A recipe or study belongs to different hardware than this machine."""


class DeviceMissingError(HardwareMismatchError):
    """A recipe trains on a device this process cannot use (a CUDA recipe where torch has no CUDA or sees no GPU)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C (a scheduler's, ``timeout``'s, ``docker stop``'s): the CLI exits 143 for it."""
