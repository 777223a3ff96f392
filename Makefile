# The two set-up commands of the README: `make demo` and `make test`. Both create the virtualenv on first use.
PYTHON ?= python3
VENV ?= .venv
# torch first, pinned to the CPU build that lies on this kind of machine (an unpinned install pulls a
# multi-GB CUDA build); override e.g. `make demo TORCH_SPEC='torch==2.8.0'`.
TORCH_SPEC ?= torch==2.13.0
WORKLOAD ?= cnn
BUDGET ?= 3m
TEST_WORKERS ?= 3
BIN := $(VENV)/bin

.PHONY: demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# The Debian packages some tests use (idempotent: installs only what is missing), before the timed target runs.
$(VENV)/.system-deps: tests/system-deps.sh $(VENV)/.installed
	@tests/system-deps.sh
	touch $@

demo: $(VENV)/.installed
	$(BIN)/autotune probe
	$(BIN)/autotune search --workload $(WORKLOAD) --budget $(BUDGET)
	$(BIN)/autotune export --format env -o best.env

# Lint first, then pytest with mypy beside it (configured in pyproject.toml; either failing fails the target:
# mypy's lines come after pytest's, and a fresh clone's mypy without its cache takes 30-50 s of one CPU that
# pytest's first minute leaves idle). pytest lists the 15 slowest tests and every skip with its reason, in
# TEST_WORKERS pytest-xdist processes (each file's tests in one, the longest files first: tests/conftest.py's
# order, which --no-loadscope-reorder keeps: xdist otherwise hands out the files with the most tests first, and
# the longest, with few tests, ran last; each process with its own TMPDIR and host lock). Three on a 2-vCPU
# machine: with two, a fifth of the CPU time went idle while tests waited on sleeping workloads and process
# starts (Xeon: 517-546 s; three: 461-486 s; four: 460 s and A/A tests failing beside the load; TEST_WORKERS=0:
# one process, no xdist). The system packages some tests need
# (tests/system-deps.sh) are installed by a prerequisite, once, not in the timed part.
# pytest exits 5 when it collected no test: that is reported, not treated as a failure. Bytecode is written
# (PYTHONDONTWRITEBYTECODE, set on some CI machines, unset): the suite starts hundreds of Python processes, and each
# compiled autotune's modules again (1.45 s to import the worker, the study and the CLI without their bytecode,
# 1.03 s with it, on the 2-vCPU Zen 3).
test: $(VENV)/.installed $(VENV)/.system-deps
	$(BIN)/ruff check .
	@types=$$(mktemp); $(BIN)/mypy > $$types 2>&1 & mypy=$$!; \
	rc=0; env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 -rs \
		$(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; \
	wait $$mypy || rc=1; echo "mypy:"; cat $$types; rm -f $$types; exit $$rc

clean:
	rm -rf $(VENV) *.egg-info studies.db best.env report-*.html
