"""``autotune --version`` and ``autotune completion``: scripts the shells accept, listing every verb."""
from __future__ import annotations

import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from autotune.cli import VERBS

from ..conftest import cli, missing, run_cli


def test_version_is_the_installed_distributions(tmp_path: Path) -> None:
    out = run_cli("--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"autotune {version('autotune')}\n"
    import autotune

    assert autotune.__version__ == version("autotune")  # one source: pyproject.toml


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers after ``autotune WORDS`` (the last word being the one completed)."""
    line = " ".join(f"'{w}'" for w in ("autotune", *words))
    probe = (f"source {script}; complete -p autotune; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
             "_autotune; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    registered, *offered = out.stdout.splitlines()
    assert registered == "complete -o default -F _autotune autotune"
    return [w for w in offered if w]


@pytest.fixture
def bash_script(tmp_path: Path) -> Path:
    out = cli("completion", "bash", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    script = tmp_path / "autotune.bash"
    script.write_text(out.stdout)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    return script


def test_bash_completes_every_verb(bash_script: Path) -> None:
    assert _complete(bash_script, "") == list(VERBS)
    assert _complete(bash_script, "s") == ["search", "studies"]
    assert set(_complete(bash_script, "-")) == {"-h", "--help", "--debug", "--version"}


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (("search", "--lr-s"), ["--lr-scaling"]),
        (("search", "--lr-scaling", ""), ["sqrt", "linear", "none"]),
        (("export", "--format", "j"), ["json"]),
        (("--debug", "export", "--f"), ["--format"]),
        (("completion", ""), ["bash", "zsh"]),
        (("best", "-"), ["-h", "--help", "--recipe", "--study", "--workload", "--json", "--storage"]),
        (("run", "--", "--st"), []),  # the command's own arguments: left to the shell's default
    ],
)
def test_bash_completes_options_and_their_choices(bash_script: Path, words: tuple[str, ...],
                                                   offered: list[str]) -> None:
    assert _complete(bash_script, *words) == offered


def test_zsh_script_lists_every_verb_and_parses(tmp_path: Path) -> None:
    out = cli("completion", "zsh", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#compdef autotune\n")
    for verb in VERBS:
        assert f"'{verb}:" in out.stdout and f"({verb}) _arguments" in out.stdout
    assert "'--lr-scaling=[learning-rate rule when the batch size changes (default\\: sqrt)]:LR_SCALING:" \
           "(sqrt linear none)'" in out.stdout
    if shutil.which("zsh") is None:
        missing("zsh is not installed here (tests/system-deps.sh installs it): the script was not loaded in zsh")
    script = tmp_path / "_autotune"
    script.write_text(out.stdout)
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=30)
    load = f"autoload -U compinit; compinit -u -D; source {script}; print $_comps[autotune]"
    loaded = subprocess.run(["zsh", "-fc", load], capture_output=True, text=True, timeout=30, check=True)
    assert loaded.stdout.strip() == "_autotune" and loaded.stderr == ""


def test_an_unknown_shell_is_refused_with_the_choices(tmp_path: Path) -> None:
    out = cli("completion", "fish", cwd=tmp_path)
    assert out.returncode == 2
    assert "invalid choice: 'fish'" in out.stderr and "zsh" in out.stderr.splitlines()[-1]
