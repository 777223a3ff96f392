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
import json
import subprocess
import sys
from pathlib import Path

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


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
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


def _reaches(edges: dict[str, set[str]], source: str, target: str) -> list[str]:
    """The modules under ``source`` that import a module under ``target`` directly."""
    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{m} -> {t}" for m, ts in edges.items() if under(m, source) for t in ts if under(t, target))


@pytest.mark.parametrize("source, target", [
    ("autotune.study", "autotune.cli"),  # the search prints nothing: it sends events
    ("autotune.trial", "autotune.study"),  # a trial knows nothing of the search that asked for it
    ("autotune.trial", "autotune.cli"),
    ("autotune.search_spaces", "autotune.study"),
    ("autotune.search_spaces", "autotune.trial"),
])
def test_imports_point_one_way(source: str, target: str) -> None:
    assert _reaches(graph(), source, target) == []


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
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
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
