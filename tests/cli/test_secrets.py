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
    from autotune.database import shown_url

    assert shown_url("postgresql://u:pw@host:notaport/db") == "postgresql://u:***@host:notaport/db"
    assert shown_url("sqlite:////tmp/a:b@c.db") == "sqlite:////tmp/a:b@c.db"  # no password: as given


def test_the_storage_comes_from_the_environment_off_the_command_line(tmp_path: Path) -> None:
    """``AUTOTUNE_STORAGE`` names the storage when ``--storage`` does not: a command line is visible to every
    user of the machine (``ps``), the environment only to the user; ``--storage`` still wins."""
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    done = cli("studies", cwd=tmp_path, env={"AUTOTUNE_STORAGE": shared})
    assert f"no database {tmp_path / 'shared.db'}:" in done.stderr, done.stdout + done.stderr
    given = f"sqlite:///{tmp_path / 'given.db'}"
    done = cli("studies", "--storage", given, cwd=tmp_path, env={"AUTOTUNE_STORAGE": shared})
    assert f"no database {tmp_path / 'given.db'}:" in done.stderr, done.stdout + done.stderr
    from autotune.study import SearchOptions

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOTUNE_STORAGE", shared)
        assert SearchOptions().storage == shared  # the API's searches too


def test_a_trials_directory_is_private_to_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial's directory holds its recipe, logs and compile caches: 0700 whatever the umask (issue 31)."""
    import os
    import stat
    import tempfile

    from autotune.trial.runner import trial_directory

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = os.umask(0o002)  # a group-writable umask: the directory stays the user's alone
    try:
        with trial_directory() as work:
            assert stat.S_IMODE(work.stat().st_mode) == 0o700
    finally:
        os.umask(old)


@pytest.mark.parametrize("verb", VERBS, ids=[v[0] for v in VERBS])
def test_a_url_that_is_no_url_is_a_usage_error_in_every_verb(tmp_path: Path, verb: tuple[str, ...]) -> None:
    """A port that is no number made SQLAlchemy raise ValueError, which every verb reported as an internal error."""
    done = cli(verb[0], "--storage", "postgresql+psycopg://u:s3cr3t@host:notaport/db", *verb[1:], cwd=tmp_path)
    # the password on the command line is warned of in one line of its own (test_a_password_on_the_command_line...)
    lines = [line for line in done.stderr.strip().splitlines() if ": warning: the password in --storage" not in line]
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "error: bad storage URL 'postgresql+psycopg://u:***@host:notaport/db'" in lines[0], lines
