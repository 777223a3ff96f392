"""A recipe service for a fleet: many identical machines tune once and share the result.

One machine searches into a shared storage (``autotune search --storage postgresql+psycopg://…``); every
other machine asks that storage for the recipe of its workload *measured on its own hardware*:
``autotune run --storage URL --workload NAME -- python train.py`` (environment knobs included) or
``autotune.apply(workload=NAME, storage=URL)`` in the training script. The recipe is the newest one
stored for this hardware fingerprint and workload: the confirmed best of the newest study (a recipe is
stored when a search ends, after its side-by-side confirmation). One measured on other hardware is
refused with the reason; the storage is only read.

>>> recipe = fetch("postgresql+psycopg://tuner@db/autotune", "cnn", "v3-6df7a97e7c9c")   # doctest: +SKIP
"""
from __future__ import annotations

from .database import shown_url
from .errors import HardwareMismatchError, UsageError
from .recipe import Recipe, checked, search_command
from .store import RecipeStore


def fetch(storage: str, workload: str, fingerprint: str, *, study: str | None = None) -> Recipe:
    """The newest recipe in ``storage`` for ``workload`` measured on hardware ``fingerprint`` (and of
    ``study``, when given). Raises ``HardwareMismatchError`` when the storage holds recipes of the
    workload for other hardware only, ``UsageError`` when it holds none."""
    with RecipeStore.open(storage, readonly=True) as store:
        recipe = store.latest(workload=workload, fingerprint=fingerprint, study=study)
        if recipe is not None:
            return checked(recipe)
        elsewhere = store.latest(workload=workload, study=study)
        workloads = store.workloads()
    scope = f"workload {workload}" + (f" in study {study}" if study else "")
    if elsewhere is not None:
        raise HardwareMismatchError(
            f"no recipe for {scope} measured on this machine's hardware {fingerprint} in {shown_url(storage)}: the "
            f"newest, {elsewhere.label}, was measured on {elsewhere.fingerprint}; search on this hardware first: "
            f"{search_command(workload, '--storage URL')}"
        )
    held = f"; workloads with recipes: {', '.join(workloads)}" if workloads else ""
    again = search_command(workload, "--storage URL")
    raise UsageError(f"no recipe for {scope} in {shown_url(storage)}: run '{again}' first{held}")
