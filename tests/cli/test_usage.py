"""argparse's usage errors: the verb's usage, then one line that says what to write."""
from __future__ import annotations

import pytest

from autotune.cli import main


@pytest.mark.parametrize(("args", "said"), [
    # argparse reads a value that starts with '-' and is no plain number as an option
    (["search", "--workload", "tiny", "--budget", "-5m"],
     "autotune search: error: argument --budget: expected one argument (if its value starts with '-', write "
     "--budget=VALUE)"),
    (["run", "--recipe"], "autotune run: error: argument --recipe: expected one argument (if its value starts with "
                          "'-', write --recipe=VALUE)"),
])
def test_a_usage_error_ends_in_one_line_that_says_what_to_write(capsys: pytest.CaptureFixture[str], args: list[str],
                                                                said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: autotune {args[0]} ") and err.strip().splitlines()[-1] == said, err
