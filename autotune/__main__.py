"""``python -m autotune`` is the ``autotune`` command."""
from .cli import entry

entry()
