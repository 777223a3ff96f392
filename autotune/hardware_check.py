"""Whether a recipe may run on this machine: measured on this hardware (its fingerprint), and where it trains on
CUDA, a torch that has CUDA and sees a GPU. ``autotune.apply()`` and ``autotune run`` check the same way."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import HardwareMismatchError
from .recipe import Recipe, search_command

if TYPE_CHECKING:
    from .probes import Facts


# Set by ``autotune run --allow-other-hardware`` for the command it starts: apply() there warns, as asked, where it
# would refuse.
ALLOW_OTHER_HARDWARE = "AUTOTUNE_ALLOW_OTHER_HARDWARE"


def _other_hardware(recipe: Recipe, here: str, way_out: str | None) -> str:
    """Why a recipe's fingerprint does not match this machine's, and what to do."""
    from .probes import outdated_fingerprint

    why = outdated_fingerprint(recipe.fingerprint)
    what = f"was {why}" if why else f"was measured on hardware {recipe.fingerprint}, this machine is {here}"
    return (f"{recipe.label} {what}: search again here ({search_command(recipe.workload)})"
            + (f", or {way_out}" if way_out else ""))


def check_machine(recipe: Recipe, facts: Facts, *, allow_other_hardware: bool = False,
                  way_out: str = "pass allow_other_hardware=True") -> str | None:
    """Raises ``HardwareMismatchError`` for a recipe of other hardware than ``facts`` (or of an older fingerprint
    scheme) unless ``allow_other_hardware``, which returns the reason as a warning instead; None for a recipe of
    this machine. ``apply()`` and ``autotune run`` (before it starts the command) check the same way;
    ``way_out`` names the caller's switch."""
    if not recipe.fingerprint or recipe.fingerprint == facts.fingerprint:
        return None
    if not allow_other_hardware:
        raise HardwareMismatchError(_other_hardware(recipe, facts.fingerprint, way_out))
    return _other_hardware(recipe, facts.fingerprint, None)


def cuda_missing(recipe: Recipe) -> str | None:
    """Why a CUDA recipe cannot train in this process (torch without CUDA, or no GPU it can see), or None."""
    import torch

    if recipe.params.get("device") != "cuda" or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        what = f"this torch {torch.__version__} is built without CUDA: install a CUDA build of torch"
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        what = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU{where}: check the driver and "
                "the variable")
    return f"{recipe.label} trains on CUDA (device=cuda), but {what}"
