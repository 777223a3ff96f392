"""A recipe's files: the env file (``autotune export --format env``) and JSON, written and read.

The env file is both a shell file (``set -a; . ./best.env; set +a`` exports the environment-level knobs) and
the recipe's portable form: ``autotune.apply("best.env")`` and ``autotune run --recipe best.env`` read it (never
execute it) and take the recipe from ``AUTOTUNE_RECIPE``. So that both readings agree, the file holds nothing
bash could run: its header comments hold stored text only as JSON strings (one line each, whatever the text),
and on reading the only lines allowed are comments, blank lines and ``KEY='literal'`` assignments of the
variables the exporter writes for that recipe (``search_spaces.env_forms``), each once, each value of its
variable's form. Anything else is refused with its line number, before anything applies the recipe.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
from dataclasses import replace
from pathlib import Path

from .errors import UsageError
from .recipe import Recipe, checked

# ``LD_PRELOAD`` keeps what the shell already preloads, after the recipe's libraries (as ``autotune run`` does).
PRELOAD_SUFFIX = '"${LD_PRELOAD:+:$LD_PRELOAD}"'
RECIPE_VARIABLE = "AUTOTUNE_RECIPE"
# Written beside the knobs' variables for ``taskset``/``numactl`` (CPU affinity and memory binding are no variables).
_LISTS = {"AUTOTUNE_CPUS": re.compile(r"[0-9]+(?:,[0-9]+)*"), "AUTOTUNE_MEMBIND": re.compile(r"[0-9]+(?:,[0-9]+)*")}
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
# A shell literal as ``shlex.quote`` writes one: quoted parts, ``"'"`` for a quote, and the characters it leaves bare.
_LITERAL = re.compile(r"""(?:'[^']*'|"'"|[A-Za-z0-9_@%+=:,./-]+)*""")
_PART = re.compile(r"""'([^']*)'|"(')"|([A-Za-z0-9_@%+=:,./-]+)""")
# What no line may hold: control characters but the tab (bash splits lines only at a newline; Python at more).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def header_text(value: object) -> str:
    """A stored value as the env file's header comments show it: a JSON string on one line, so no text a study or
    workload is named can end the comment (``"s\\ntouch X"`` stays ``"s\\ntouch X"``)."""
    return json.dumps(value)


def to_env(
    recipe: Recipe, environment: dict[str, str], cpus: list[int] | None, nodes: tuple[int, ...] | None = None
) -> str:
    """The env-file text: comments, the recipe as JSON, and the environment-level knobs, all quoted.

    CPU affinity and memory binding cannot be variables: ``AUTOTUNE_CPUS`` and ``AUTOTUNE_MEMBIND`` hold them for
    ``taskset``/``numactl``, and ``autotune.apply()`` warns when unapplied.
    """
    lines = [
        f"# autotune recipe {recipe.id or ''} for workload {header_text(recipe.workload)} "
        f"(study {header_text(recipe.study)})",
        f"# hardware fingerprint {header_text(recipe.fingerprint)}; created {header_text(recipe.created)}",
        f"# recipe format {recipe.format}: " + ("batch_size is summed over the processes" if recipe.format == 1
                                                else "batch_per_rank is each process's batch"),
    ]
    if recipe.speedup is not None:
        lines.append(
            f"# {recipe.speedup_text} PyTorch defaults" + (
                f": {recipe.samples_per_s:.1f} vs {recipe.baseline_samples_per_s:.1f} samples/s"
                if recipe.samples_per_s is not None and recipe.baseline_samples_per_s is not None else "")
            + (f" ({recipe.claim_text})" if recipe.claim_text else "")
        )
    if recipe.run_text:
        lines.append(f"# {recipe.run_text}")
    lines.append("# Load in bash with: set -a; . ./THIS_FILE; set +a   (or, checked first: autotune run --recipe "
                 "THIS_FILE -- CMD)")
    values = {RECIPE_VARIABLE: json.dumps(recipe.to_dict(), sort_keys=True)}
    if cpus is not None:
        values["AUTOTUNE_CPUS"] = ",".join(map(str, cpus))  # for: taskset -c "$AUTOTUNE_CPUS" CMD
    if nodes:
        values["AUTOTUNE_MEMBIND"] = ",".join(map(str, nodes))  # for: numactl --membind="$AUTOTUNE_MEMBIND" CMD
    values.update(environment)
    lines += [f"{key}={shlex.quote(value)}" + (PRELOAD_SUFFIX if key == "LD_PRELOAD" else "")
              for key, value in values.items()]
    return "\n".join(lines) + "\n"


def parse_env(text: str, source: str = "env file") -> dict[str, tuple[int, str]]:
    """The ``KEY='literal'`` lines of an env file, by key: ``(line number, value)``. Nothing is executed; a line
    that is not a comment, a blank line or such an assignment (a command, ``$(...)``, a quote left open, a key
    given twice, a control character) is refused with its line number."""
    values: dict[str, tuple[int, str]] = {}
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{source}:{number}"
        if _CONTROL.search(line):
            raise UsageError(f"{where}: a control character, which no exported env file holds")
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith("#"):
            continue
        match = _ASSIGNMENT.fullmatch(stripped)
        value = match.group(2) if match else ""
        if match and match.group(1) == "LD_PRELOAD" and value.endswith(PRELOAD_SUFFIX):
            value = value.removesuffix(PRELOAD_SUFFIX)
        if not match or not _LITERAL.fullmatch(value):
            raise UsageError(f"{where}: not a KEY='VALUE' line autotune writes (only those, comments and blank lines "
                             f"may be in an env file): {stripped[:60]!r}")
        if match.group(1) in values:
            raise UsageError(f"{where}: {match.group(1)} is set a second time (line {values[match.group(1)][0]})")
        values[match.group(1)] = number, "".join(next(filter(None, part.groups()), "")
                                                 for part in _PART.finditer(value))
    return values


def read_env(text: str, source: str = "env file") -> Recipe:
    """The recipe of an env file (``AUTOTUNE_RECIPE``), checked, once every other line is one the exporter writes
    for it: a variable of a family the recipe sets (``search_spaces.env_forms``), or its CPU and node lists, each
    value of that variable's form."""
    from . import search_spaces as spaces

    values = parse_env(text, source)
    if RECIPE_VARIABLE not in values:
        raise UsageError(f"{source} has no AUTOTUNE_RECIPE line: export it with 'autotune export'")
    recipe = checked(replace(_from_json(values.pop(RECIPE_VARIABLE)[1], source), source=source))
    forms = {**spaces.env_forms(recipe.params), **_LISTS}
    for key, (number, value) in sorted(values.items(), key=lambda item: item[1][0]):
        if key not in forms:
            raise UsageError(f"{source}:{number}: {key} is not a variable autotune writes for this recipe")
        if not forms[key].fullmatch(value):
            raise UsageError(f"{source}:{number}: {key}={value[:60]!r} is not what autotune writes for this recipe")
    return recipe


def _from_json(text: str, source: str) -> Recipe:
    try:
        data = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise UsageError(f"{source}: the recipe is not valid JSON ({getattr(e, 'msg', e)})") from e
    return Recipe.from_dict(data)


def recipe_from_variable(text: str) -> Recipe:
    """The recipe ``AUTOTUNE_RECIPE`` holds (``autotune run`` and the env file set it), checked. Where ``autotune
    run`` read it from a file, the recipe says so in ``source``."""
    recipe = _from_json(text, "the AUTOTUNE_RECIPE variable")
    return checked(recipe if isinstance(recipe.source, str) else replace(recipe, source="the AUTOTUNE_RECIPE variable"))


def read_regular(path: Path, most: int = 16 << 20) -> bytes:
    """The bytes of ``path`` if it is a regular file (opened without waiting: a FIFO would hang the reader), at
    most ``most`` of them; UsageError for anything else."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as f:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise UsageError(f"recipe file {path} is not a regular file: give an exported .env or .json file")
        data = f.read(most + 1)
    if len(data) > most:
        raise UsageError(f"recipe file {path} is over {most >> 20} MiB: no exported recipe is")
    return data


def sourced_preload(path: str | Path) -> str | None:
    """The ``LD_PRELOAD`` an exported env file sets, what loading it in bash preloads; None for a JSON file or an env
    file without one (read as ``load_recipe_file`` reads it, which has checked the file)."""
    path = Path(path)
    if path.suffix == ".json":
        return None
    found = parse_env(read_regular(path).decode("utf-8"), str(path)).get("LD_PRELOAD")
    return found[1] if found else None


def load_recipe_file(path: str | Path) -> Recipe:
    """A recipe from an exported ``.env`` or ``.json`` file, checked (``recipe.checked``); one line naming the
    problem for anything else: a file that is not a regular file (a FIFO would hang the reader), not UTF-8, not
    an env file autotune writes, not a recipe."""
    path = Path(path)
    try:
        text = read_regular(path).decode("utf-8")
    except OSError as e:
        raise UsageError(f"cannot read recipe file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"recipe file {path} is not UTF-8 text (byte {e.start}): give an exported .env or .json "
                         "file") from e
    if path.suffix == ".json":
        return checked(replace(_from_json(text, str(path)), source=str(path)))
    return read_env(text, str(path))
