"""The package's shape, checked: every module imports alone, and the imports between autotune's modules
point one way.

The graph is built with ``ast`` from every import statement in ``autotune/``: module-level, inside
functions, and under ``TYPE_CHECKING`` alike, since an import inside a function still closes a circle
when it runs. An edge goes from a module to each autotune module it names (``from . import x`` names
the module ``x``, not the package; ``from .m import name`` names ``m``). Implicit imports of parent
packages are left out: every module imports ``autotune/__init__`` first, and counting that would make a
circle of any package that re-exports its modules.
"""
from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Set
from pathlib import Path
from types import MappingProxyType

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"autotune": REPO / "autotune"}


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name: ``autotune.trial.runner`` -> its file."""
    found = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The autotune modules that module ``name`` (at ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            out.update(submodules)
            if len(submodules) < len(node.names):  # a name defined in ``base`` itself: it runs base
                out.add(base)
    return {m for m in out if m in known and m != name}


@functools.cache  # the sources do not change during a run; 32 parametrised checks parsed them each (~0.6 s)
def graph() -> Mapping[str, frozenset[str]]:
    found = modules()
    return MappingProxyType({name: frozenset(imports(name, path, set(found))) for name, path in found.items()})


def cycle(edges: Mapping[str, Set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert cycle(graph()) is None


def test_the_check_finds_a_cycle_hidden_in_a_function() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle(edges) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def _reaches(edges: Mapping[str, Set[str]], source: str, target: str) -> list[str]:
    """The modules under ``source`` that import a module under ``target`` directly."""
    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{m} -> {t}" for m, ts in edges.items() if under(m, source) for t in ts if under(t, target))


@pytest.mark.parametrize("source, target", [
    ("autotune.study", "autotune.cli"),  # the search prints nothing: it sends events
    ("autotune.measure", "autotune.study"),  # the engine measures what it is given, for any caller
    ("autotune.measure", "autotune.cli"),
    ("autotune.trial", "autotune.measure"),  # one trial process knows nothing of the paired engine
    ("autotune.trial", "autotune.study"),  # a trial knows nothing of the search that asked for it
    ("autotune.trial", "autotune.cli"),
    ("autotune.search_spaces", "autotune.study"),
    ("autotune.search_spaces", "autotune.trial"),
    ("autotune.search_spaces", "autotune.measure"),
    # the user side, which the user's training imports: what a trial runs, never the search's machinery
    ("autotune.apply", "autotune.trial"),
    ("autotune.apply", "autotune.measure"),
    ("autotune.apply", "autotune.study"),
    ("autotune.distributed", "autotune.trial"),
    ("autotune.hardware_check", "autotune.trial"),
    ("autotune.hardware_check", "autotune.measure"),
    ("autotune.workloads", "autotune.trial"),
    ("autotune.workloads", "autotune.search_spaces"),  # the user's side: what the spaces read of a model, not back
    # a trainer's integration is the user's side too, and nothing of autotune's leans on one
    ("autotune.integrations", "autotune.trial"),
    ("autotune.integrations", "autotune.measure"),
    ("autotune.integrations", "autotune.study"),
    ("autotune.integrations", "autotune.cli"),
    ("autotune.study", "autotune.integrations"),
    ("autotune.measure", "autotune.integrations"),
    ("autotune.cli", "autotune.integrations"),
])
def test_imports_point_one_way(source: str, target: str) -> None:
    assert _reaches(graph(), source, target) == []


def test_the_test_doubles_are_imported_by_no_runtime_module() -> None:
    edges = graph()
    users = sorted(f"{m} -> {t}" for m, ts in edges.items() if not m.startswith("autotune.testing")
                   for t in ts if t.startswith("autotune.testing"))
    assert users == []


def private_imports(name: str, path: Path, known: set[str]) -> list[str]:
    """``from M import _x`` in module ``name`` where ``_x`` is a private name of another module, or an import of a
    private module (``_x.py``) of another package: what is private to a module or a package stays there."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        if not base.startswith("autotune"):
            continue
        for alias in node.names:
            module = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            parts = module.split(".")
            # the package that owns each private module on the way: the importer must be inside it
            owners = [".".join(parts[:i]) for i, part in enumerate(parts) if part.startswith("_") and i > 0]
            outside = [o for o in owners if package != o and not package.startswith(o + ".")]
            private_name = module == base and alias.name.startswith("_") and base != name
            if outside or private_name:
                found.append(f"{name}: from {base} import {alias.name}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    found = modules()
    assert [f for name, path in found.items() for f in private_imports(name, path, set(found))] == []


def test_the_check_finds_a_private_import() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.py"
        path.write_text("from ..trial.runner import _log_tail\nfrom ..probes import _nvml\nfrom . import _own\n")
        known = {"autotune.study.m", "autotune.probes._nvml", "autotune.study._own", "autotune.trial.runner"}
        assert private_imports("autotune.study.m", path, known) == [
            "autotune.study.m: from autotune.trial.runner import _log_tail",
            "autotune.study.m: from autotune.probes import _nvml"]


STUDY = REPO / "autotune" / "study"
# ``getattr``/``hasattr`` in the search, each on what it reads (module, the call's first argument): never a measurer,
# whose contract is a base class (``measure.PairedMeasurer``) that mypy checks.
GETATTR_ALLOWED = {
    ("choice", "r.result"),  # a sum over one of a result's timing fields, named by the caller
    ("confirm", "r"),  # the same over the rounds' results
    ("driver", "recipe"), ("driver", "stored"),  # the interval a store without its columns did not read back
    ("liveness", "storage"),  # an Optuna storage with or without heartbeats
}


def _study_modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in sorted(STUDY.glob("*.py"))}


def attribute_probes(trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """Every ``getattr``/``hasattr`` call in ``trees`` as (module, its first argument's source)."""
    return {(name, ast.unparse(node.args[0])) for name, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr") and node.args}


def test_the_search_probes_attributes_only_where_its_allowlist_says() -> None:
    assert attribute_probes(_study_modules()) <= GETATTR_ALLOWED


def test_the_check_finds_an_attribute_probe_of_a_measurer() -> None:
    tree = ast.parse("def f(loop):\n    return getattr(loop.measurer, 'noise', None)\n")
    assert attribute_probes({"loop": tree}) == {("loop", "loop.measurer")}


def measurer_types(trees: dict[str, ast.Module]) -> set[tuple[str, str, str]]:
    """Every parameter and annotated attribute named ``measurer`` in ``trees``: (module, its name, its type)."""
    found = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg == "measurer":
                found.add((name, node.arg, ast.unparse(node.annotation) if node.annotation else ""))
            elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target).split(".")[-1] == "measurer":
                found.add((name, ast.unparse(node.target), ast.unparse(node.annotation)))
    return found


def test_every_measurer_of_the_search_is_typed_as_the_base_class() -> None:
    found = measurer_types(_study_modules())
    assert found and {t for _, _, t in found} <= {"PairedMeasurer", "PairedMeasurer | None"}, found


def clock_reads(trees: dict[str, ast.Module]) -> set[str]:
    """The modules of ``trees`` that read a clock themselves (``monotonic``, ``perf_counter``, ``time``) or import
    ``time``, where only the search's ``Budget`` may: a replay's clock reaches the search through it alone."""
    found = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "time" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and node.module == "time" or \
                    isinstance(node, ast.Attribute) and node.attr in ("monotonic", "perf_counter", "monotonic_ns") or \
                    isinstance(node, ast.Name) and node.id in ("monotonic", "perf_counter"):
                found.add(name)
    return found


def test_only_the_budget_reads_the_clock_in_the_search() -> None:
    assert clock_reads(_study_modules()) == {"budget"}


def test_the_check_finds_a_clock_read_however_imported() -> None:
    for source in ("from time import monotonic\nx = monotonic()\n", "import time\n", "t = clock.perf_counter()\n"):
        assert clock_reads({"m": ast.parse(source)}) == {"m"}, source


def test_the_search_imports_the_engine_only_through_its_package() -> None:
    """``autotune.study`` imports ``autotune.measure``'s public names alone: no module of it (its workers' wire
    types, its private helpers), so the package's ``__all__`` is the seam."""
    import autotune.measure

    found = []
    for name, tree in _study_modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "measure" and node.level:
                if node.module != "measure":
                    found.append(f"{name}: from ..{node.module} import ...")
                found += [f"{name}: {a.name}" for a in node.names if a.name not in autotune.measure.__all__]
    assert found == []


def test_no_module_is_over_400_lines() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def classes(paths: dict[str, Path]) -> dict[str, list[str]]:
    """Each class name defined at a module's top level under ``paths``, with the modules that define it."""
    found: dict[str, list[str]] = {}
    for name, path in paths.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    return found


def test_no_two_classes_share_a_name() -> None:
    """One name, one thing: a reader who meets ``Candidate`` knows which (the glossary in docs/ARCHITECTURE.md)."""
    assert {k: v for k, v in classes(modules()).items() if len(v) > 1} == {}


def test_the_check_finds_two_classes_of_one_name(tmp_path: Path) -> None:
    for module in ("a", "b"):
        (tmp_path / f"{module}.py").write_text("class Rounds:\n    pass\n")
    assert classes({m: tmp_path / f"{m}.py" for m in ("a", "b")}) == {"Rounds": ["a", "b"]}


def untyped_host_attributes(paths: dict[str, Path]) -> list[str]:
    """``module.Class.name`` for each attribute a class declares as ``Any`` without a value, outside a dataclass or a
    ``Protocol`` (a contract of data of any type): a mixin's declaration of what its host holds, which no checker
    then reads."""
    found = []
    for name, path in paths.items():
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef) or any("dataclass" in ast.unparse(d) for d in node.decorator_list) \
                    or any(ast.unparse(b).endswith("Protocol") for b in node.bases):
                continue
            found += [f"{name}.{node.name}.{ast.unparse(a.target)}" for a in node.body
                      if isinstance(a, ast.AnnAssign) and a.value is None and ast.unparse(a.annotation) == "Any"]
    return found


def test_no_class_declares_its_hosts_attributes_as_any() -> None:
    """A base class half of another (a mixin) types what its host holds: ``facts: Any`` hid every use from mypy."""
    assert untyped_host_attributes(modules()) == []


def test_the_check_finds_an_attribute_declared_as_any(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("from dataclasses import dataclass\nfrom typing import Any\n\n\n"
                                   "class Half:\n    facts: Any\n    seed: int\n\n\n"
                                   "@dataclass\nclass Record:\n    model: Any\n\n\n"
                                   "class Host(Protocol):\n    train: Any\n")
    assert untyped_host_attributes({"m": tmp_path / "m.py"}) == ["m.Half.facts"]


def test_the_folders_are_the_import_tree() -> None:
    """No package is installed from a folder of another name, and no shim makes up for one."""
    pyproject = (REPO / "pyproject.toml").read_text()
    assert "package-dir" not in pyproject and not (REPO / ".mypy-shim").exists()
    assert not (REPO / "probes").exists() and not (REPO / "search_spaces").exists()


def test_probes_import_nothing_of_autotune_but_its_errors() -> None:
    edges = graph()
    outside = sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("autotune.probes")
                     for t in ts if not t.startswith("autotune.probes") and t != "autotune.errors")
    assert outside == []


# Imports each module in a fresh interpreter state (sys.modules emptied of autotune), one after another:
# a module that only imports when another was imported first fails here.
_ALONE = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m == "autotune" or m.startswith("autotune.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_each_imports_alone(tmp_path: Path) -> None:
    """Built as a user installs it (not the editable install): every module of the source tree is in the
    wheel, and each imports alone (with no autotune module loaded before it: no module relies on another
    having been imported first), from the wheel, away from the source tree."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("autotune-*.whl")
    with zipfile.ZipFile(wheel) as whl:  # a pure wheel installs as it unpacks (pip's --target, less a process)
        whl.extractall(target)
    names = [m for m in modules() if not m.endswith("__main__")]
    # -I: no user site, no PYTHONPATH, no current directory; the editable install's finder is not on the path
    # either, since site-packages is left out (-S) and only the target directory and the dependencies are added.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    code = f"import sys; sys.path[:0] = {[str(target), *deps]!r}\n" + _ALONE.replace(
        "print(json.dumps(failed))", "print(json.dumps([failed, sorted({sys.modules[n].__file__ for n in sys.modules "
        "if n.startswith('autotune')})]))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, json.dumps(names)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    failed, files = json.loads(done.stdout.splitlines()[-1])
    assert failed == {}
    assert all(f.startswith(str(target)) for f in files), [f for f in files if not f.startswith(str(target))]


def test_the_code_says_why_and_the_history_lives_in_docs() -> None:
    """No issue numbers in the code (the code outlives them; docs/measurement.md keeps the measurements), and the
    README stays a front door: at most 150 lines, the rest in docs/."""
    cited = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = [f"{path.relative_to(REPO)}:{n}" for path in modules().values()
             for n, line in enumerate(path.read_text().splitlines(), 1) if cited.search(line)]
    assert found == []
    assert len((REPO / "README.md").read_text().splitlines()) <= 150
    assert all((REPO / "docs" / name).is_file() for name in ("measurement.md", "knobs.md", "search.md",
                                                              "ARCHITECTURE.md"))
