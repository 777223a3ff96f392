"""Where the shared test data of the probe tests lives (``../shared`` beside the repository)."""
from __future__ import annotations

import sys
import tarfile
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
TOPOLOGIES = SHARED / "topologies"
SYSFS = TOPOLOGIES / "hwloc-linux-sysfs"
NVIDIA_SMI = TOPOLOGIES / "nvidia-smi-query"
MACHINES = sorted(p.name.removesuffix(".tar.bz2") for p in SYSFS.glob("*.tar.bz2")) if SYSFS.is_dir() else []

# refuse links and paths that leave the destination (Python >= 3.10.12/3.11.4 has extraction filters)
SAFE_EXTRACT = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}

# tests/fakes is importable as ``fakes`` (tests/ is not a package)
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
