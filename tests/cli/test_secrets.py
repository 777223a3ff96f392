"""A storage URL's password is never printed: every verb that opens the storage shows it masked (issue 31)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import cli

URL = "postgresql+psycopg://u:s3cr3t@127.0.0.1:1/db"  # port 1: nothing listens, the connection fails at once
VERBS = [
    ("studies",), ("recipes",), ("best",), ("report",), ("export", "--format", "env"), ("dashboard",),
    ("run", "--workload", "tiny", "--", "true"), ("search", "--workload", "tiny", "--budget", "10s"),
]


@pytest.mark.parametrize("verb", VERBS, ids=[v[0] for v in VERBS])
def test_a_storage_password_is_masked_in_every_verbs_error(tmp_path: Path, verb: tuple[str, ...]) -> None:
    done = cli(verb[0], "--storage", URL, *verb[1:], cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "s3cr3t" not in said
    assert "postgresql+psycopg://u:***@127.0.0.1:1/db" in said, said


def test_a_url_sqlalchemy_cannot_parse_is_masked_too() -> None:
    from autotune.store import shown_url

    assert shown_url("postgresql://u:pw@host:notaport/db") == "postgresql://u:***@host:notaport/db"
    assert shown_url("sqlite:////tmp/a:b@c.db") == "sqlite:////tmp/a:b@c.db"  # no password: as given
