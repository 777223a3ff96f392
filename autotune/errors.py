"""The error tree. Every message says what is wrong and how to fix it; the CLI prints it on one line."""
from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""


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
