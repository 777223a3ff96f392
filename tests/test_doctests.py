"""Every example in autotune's docstrings runs and holds.

A ``>>>`` line is a claim about the code; one that no test runs can drift from it unnoticed. The modules
are found by their source, so a module that gains an example is checked without being listed here. They
run in one fresh interpreter, apart from the suite's: an example such as ``apply({"threads": 1})`` sets
torch's process-wide thread pools, which later tests in this process would inherit.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.test_imports import modules

WITH_EXAMPLES = sorted(name for name, path in modules().items() if ">>>" in path.read_text())

_RUN = """
import doctest, importlib, io, json, sys, contextlib
out = {}
for name in json.loads(sys.argv[1]):
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    out[name] = [result.attempted, result.failed, report.getvalue()[-3000:]]
print(json.dumps(out))
"""


def test_the_examples_are_found() -> None:
    assert {"autotune.recipe", "autotune.study.budget", "autotune.probes._probe"} <= set(WITH_EXAMPLES)


def test_every_docstring_example_holds() -> None:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _RUN, json.dumps(WITH_EXAMPLES)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    failed = {name: report for name, (_, bad, report) in results.items() if bad}
    assert failed == {}, "\n".join(failed.values())
    assert sum(attempted for attempted, _, _ in results.values()) > 100  # the examples ran, not only parsed
