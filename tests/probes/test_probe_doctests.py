"""The examples in the probe's docstrings run and hold."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["autotune.probes", "autotune.probes._cpulist", "autotune.probes._probe", "autotune.probes._summary",
           "autotune.probes._record", "autotune.probes._runtime", "autotune.probes._nvml",
           "autotune.probes._process"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
