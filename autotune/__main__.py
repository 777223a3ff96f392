"""``python -m autotune`` is the ``autotune`` command."""
import sys

from .cli import main

sys.exit(main())
