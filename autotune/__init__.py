"""autotune: a hardware-aware auto-tuner for PyTorch training.

    autotune probe                          # what this machine has
    autotune search --workload cnn --budget 30m
    autotune export --format env -o best.env

and in training code ``tuned = autotune.apply("best.env")``. Nothing is probed at import time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Imported eagerly: the function must shadow its module's name on the package for good.
from .apply import apply
from .errors import AutotuneError
from .recipe import Recipe
from .workloads import Workload

if TYPE_CHECKING:
    from .probes import Facts
    from .study import SearchOutcome

__all__ = ["AutotuneError", "Recipe", "Workload", "apply", "probe", "search"]


def __getattr__(name: str) -> str:
    """``autotune.__version__``: the installed distribution's, as ``autotune --version`` prints it (one source:
    pyproject.toml); looked up on use, so importing autotune stays light."""
    if name == "__version__":
        from .cli import version

        return version()
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def probe(root: str | None = None, **kwargs: Any) -> Facts:
    """The hardware facts of this machine (or of a recorded tree ``root``)."""
    from .probes import probe as _probe

    return _probe(root, **kwargs)


def search(workload: str, **kwargs: Any) -> SearchOutcome:
    """Run a search study; see ``autotune.study.driver``."""
    from .study import search as _search

    return _search(workload, **kwargs)
