"""``python -m autotune.measure.worker SPEC.json``: the paired worker process (``process.main``)."""
from __future__ import annotations

import sys

from ...trial import launch
from .process import main

if __name__ == "__main__":
    launch.exit_now(main(sys.argv[1:]))
