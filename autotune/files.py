"""Files the verbs write for the user (an exported recipe, a report): whole, never through a link, and named from
stored text only after it is made a plain file name.

>>> safe_name("x/../../escaped"), safe_name("..")
('x_.._.._escaped', '_.')
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .errors import UsageError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def safe_name(text: str, most: int = 120) -> str:
    """``text`` (a study's name, from a store) as one file name: every character but letters, digits and ``_.+-``
    replaced by ``_``, no leading dot, at most ``most`` characters, so it names a file in the folder it is joined
    to and nowhere else."""
    name = _UNSAFE.sub("_", text)[:most]
    return "_" + name[1:] if name.startswith(".") or not name else name


def write_whole(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in its folder and ``os.replace``: a reader sees the old
    file or the new one, and a symbolic link at ``path`` is replaced, not followed (its target is left as it
    was). UsageError, one line, where it cannot be written."""
    target = Path(path)
    folder = target.parent
    try:
        descriptor, partial = tempfile.mkstemp(dir=folder, prefix=f".{target.name[:60]}.", suffix=".tmp")
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror}") from e
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(partial, 0o666 & ~_umask())  # mkstemp makes it 0600; an exported file is as the user's others
        os.replace(partial, target)
    except OSError as e:
        Path(partial).unlink(missing_ok=True)
        raise UsageError(f"cannot write {target}: {e.strerror}") from e
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
