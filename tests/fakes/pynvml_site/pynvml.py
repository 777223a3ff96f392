"""``import pynvml`` in a subprocess answered by the fake NVML of ``tests/fakes/nvml.py``.

Put this directory first on ``PYTHONPATH`` and name the machine in ``AUTOTUNE_FAKE_NVML``
(``DUMPS_DIR/MACHINE``, e.g. ``../shared/topologies/nvidia-smi-query/H100SXMx8``): every process of a
real ``autotune run`` (torchrun's ranks included) then probes that machine's GPUs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fakes.nvml
from fakes.nvml import load_machine  # noqa: E402 - after the path it needs

_where = Path(os.environ["AUTOTUNE_FAKE_NVML"])
_fake = load_machine(_where.parent, _where.name)


def __getattr__(name: str) -> object:
    return getattr(_fake, name)
