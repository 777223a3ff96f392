"""Nothing from a file or a shared store runs, starts or prints what it should not (issue 54): every way a recipe
enters is checked, an exported env file is inert under bash, secrets are masked in every form a URL holds them,
stored text reaches no terminal as markup or control characters, files are written whole and never through a link,
and every bad input is one line with exit 2. The verbs run in this process (``cli.main``) where nothing can hang."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import autotune
from autotune import cli
from autotune import search_spaces as spaces
from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.recipe_file import load_recipe_file
from autotune.store import RecipeStore


def _main(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``autotune ARGV`` in this process: its exit code, standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _good(facts: Any, **changes: Any) -> Recipe:
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=32)), "device": "cpu",
              "reference_batch": 32, "global_batch": None, "lr_scaling": "sqrt"}
    return Recipe(params=params, workload="tiny", fingerprint=facts.fingerprint, study="s", samples_per_s=110.0,
                  baseline_samples_per_s=100.0, speedup=1.1, speedup_low=1.05, speedup_high=1.15, **changes)


def _store(folder: Path, *recipes: Recipe, **columns: Any) -> str:
    """A real SQLite store holding ``recipes`` (ids 1, 2, ...); ``columns`` then written raw into recipe 1's row, as
    a hostile writer of a shared store could, past every check of ``save``."""
    url = f"sqlite:///{folder / 'studies.db'}"
    with RecipeStore.open(url) as store:
        for recipe in recipes:
            store.save(recipe)
    with contextlib.closing(sqlite3.connect(folder / "studies.db")) as db, db:
        for column, value in columns.items():
            db.execute(f"UPDATE recipes SET {column} = ? WHERE id = 1",
                       (json.dumps(value) if column in ("params", "details", "notes") else value,))
    return url


# 1. An exported env file runs nothing when bash loads it, whatever a store's text holds.
def test_an_exported_env_file_loaded_by_bash_creates_nothing(facts: Any, tmp_path: Path) -> None:
    hostile = "s\ntouch PWNED\n#"
    url = _store(tmp_path, replace(_good(facts), study=hostile, workload="w\ntouch PWNED2\n", notes=["x\ntouch N"]))
    with contextlib.closing(sqlite3.connect(tmp_path / "studies.db")) as db, db:
        db.execute("UPDATE recipes SET fingerprint = ? WHERE id = 1", (facts.fingerprint + "\ntouch PWNED3",))
    code, _, err = _main("export", "--storage", url, "--recipe", "1", "-o", str(tmp_path / "best.env"))
    assert code == 2 and "fingerprint=" in err  # no fingerprint has a newline
    with contextlib.closing(sqlite3.connect(tmp_path / "studies.db")) as db, db:
        db.execute("UPDATE recipes SET fingerprint = ? WHERE id = 1", (facts.fingerprint,))
    assert _main("export", "--storage", url, "--recipe", "1", "-o", str(tmp_path / "best.env"))[0] == 0
    subprocess.run(["bash", "-c", "set -a; . ./best.env; set +a"], cwd=tmp_path, check=True, capture_output=True)
    assert not list(tmp_path.glob("PWNED*")) and not (tmp_path / "N").exists()
    header = (tmp_path / "best.env").read_text().splitlines()[0]
    assert header == '# autotune recipe 1 for workload "w\\ntouch PWNED2\\n" (study "s\\ntouch PWNED\\n#")', header
    assert load_recipe_file(tmp_path / "best.env").study == hostile


# 2. Every verb checks a stored recipe, by id, study or latest, before anything starts or is written.
@pytest.mark.parametrize(("columns", "said"), [
    ({"params": {"threads": "1; touch X"}}, "threads='1; touch X': not allowed"),
    ({"fingerprint": None}, "fingerprint: missing"),
    ({"speedup": "fast"}, "speedup='fast': not allowed"),
    ({"details": {"speedup_low": float("nan")}}, "speedup_low=nan: not allowed"),
    ({"details": {"claim": "\x1b[2Jconfirmed"}}, "claim='\\x1b[2Jconfirmed': not allowed"),
], ids=["threads", "fingerprint", "speedup", "nan", "claim"])
def test_a_hostile_stored_recipe_is_refused_by_every_verb_before_anything_starts(
        facts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: dict[str, Any], said: str) -> None:
    url = _store(tmp_path, _good(facts), _good(facts), **columns)
    if "params" in columns:
        with contextlib.closing(sqlite3.connect(tmp_path / "studies.db")) as db, db:  # the rest of a real recipe
            db.execute("UPDATE recipes SET params = json_patch((SELECT params FROM recipes WHERE id = 2), params) "
                       "WHERE id = 1")
    monkeypatch.chdir(tmp_path)
    ran = tmp_path / "ran"
    for verb in (("run", "--recipe", "1", "--", "touch", str(ran)), ("run", "--study", "s", "--", "touch", str(ran)),
                 ("export", "--recipe", "1", "-o", "out.env"), ("best", "--recipe", "1"), ("diff", "2", "1"),
                 ("report", "--recipe", "1")):
        if verb[1] == "--study":  # the study's latest recipe is the hostile one
            with contextlib.closing(sqlite3.connect(tmp_path / "studies.db")) as db, db:
                db.execute("UPDATE recipes SET study = 'other' WHERE id = 2")
        code, out, err = _main(verb[0], "--storage", url, *verb[1:])
        assert code == 2 and said in err and len(err.splitlines()) == 1, (verb, err)
        assert not ran.exists() and not (tmp_path / "out.env").exists() and not list(tmp_path.glob("report-*"))
    code, out, _ = _main("recipes", "--storage", url)  # listed, as refused, for every reader of the store
    assert code == 0 and re.search(r"│\s+1 │.*refused", out), out


# 3. Bounds: no value the search space offers on no machine; above this machine's facts, a warning at launch.
@pytest.mark.parametrize("change", [
    {"threads": 10**30}, {"processes": 100000}, {"num_workers": 10**6}, {"prefetch_factor": 10**12},
    {"prefetch_factor": 3}, {"interop_threads": 5}, {"batch_per_rank": 10**12}, {"reference_batch": 10**12},
], ids=lambda change: next(iter(change)) + "=" + str(next(iter(change.values()))))
def test_a_knob_value_no_search_offers_is_refused_by_apply(facts: Any, change: dict[str, Any]) -> None:
    params = {k: v for k, v in _good(facts).params.items() if k != "reference_batch"}  # capped without it too
    with pytest.raises(UsageError, match=f"{next(iter(change))}=.*not allowed"):
        autotune.apply({**params, **change}, facts=facts, check_hardware=False)


def test_a_recipe_above_this_machines_facts_is_launched_with_a_warning(facts: Any) -> None:
    from autotune.trial import launch

    most = spaces.threads.max_threads(facts)
    recipe = replace(_good(facts), params={**_good(facts).params, "threads": most + 1, "num_workers": 8})
    warnings = launch.for_recipe(recipe, [], {}, facts=facts).warnings
    assert f"threads={most + 1} is more than this machine offers ({most}: the CPUs this process may use)" in warnings
    assert any(w.startswith("num_workers=8 is more") for w in warnings) == (spaces.data.most_workers(facts) < 8)
    with pytest.raises(UsageError, match="threads=5000: not allowed"):  # and no plan of a recipe bypasses the check
        launch.for_recipe(replace(recipe, params={**recipe.params, "threads": 5000}), ["true"], {}, facts=facts)


# 4. An env file holds only the lines the exporter writes for its recipe.
@pytest.mark.parametrize(("line", "said"), [
    ("LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD is not a variable autotune writes for this recipe"),
    ("OMP_NUM_THREADS=\"$(touch X)\"", "not a KEY='VALUE' line"),
    ("PATH=/tmp", "PATH is not a variable autotune writes for this recipe"),
    ("OMP_NUM_THREADS='2'", "OMP_NUM_THREADS is set a second time"),
    ("OMP_NUM_THREADS=x", "OMP_NUM_THREADS is set a second time"),
    ("touch X", "not a KEY='VALUE' line"),
    ("export A=1", "not a KEY='VALUE' line"),
    ("A='open", "not a KEY='VALUE' line"),
    ("# fine\r touch X", "a control character"),
], ids=["preload", "subst", "path", "twice", "value", "command", "export", "open-quote", "cr"])
def test_an_env_file_line_the_exporter_does_not_write_is_refused_with_its_number(
        facts: Any, tmp_path: Path, line: str, said: str) -> None:
    from autotune.recipe_file import to_env

    exported = to_env(_good(facts), {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, None)
    number = len(exported.splitlines()) + 1
    (tmp_path / "best.env").write_text(exported + line + "\n")
    with pytest.raises(UsageError, match=re.escape(f"best.env:{number}: ") + ".*" + re.escape(said)):
        load_recipe_file(tmp_path / "best.env")
    ran = tmp_path / "ran"
    code, _, err = _main("run", "--recipe", str(tmp_path / "best.env"), "--", "touch", str(ran))
    assert code == 2 and not ran.exists() and len(err.splitlines()) == 1, err


def test_preloads_are_absolute_paths_of_the_libraries_the_recipe_chose(facts: Any, tmp_path: Path) -> None:
    from autotune.recipe_file import read_env, to_env

    recipe = replace(_good(facts), params={**_good(facts).params, "allocator": "jemalloc"})
    for preload, ok in (("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", True), ("/tmp/evil.so", False),
                        ("libjemalloc.so.2", False), ("/lib/../tmp/libjemalloc.so", False),
                        ("/lib/libtcmalloc.so.4", False), ("/lib/libjemalloc.so.2:/tmp/evil.so", False)):
        text = to_env(recipe, {"LD_PRELOAD": preload, "MALLOC_CONF": spaces.preload.JEMALLOC_CONF}, None)
        if ok:
            assert read_env(text).params["allocator"] == "jemalloc"
        else:
            with pytest.raises(UsageError, match="LD_PRELOAD=.* is not what autotune writes"):
                read_env(text)


def test_autotune_run_refuses_an_env_file_that_would_preload_another_library_of_the_name(facts: Any,
                                                                                         tmp_path: Path) -> None:
    """The env file's header promises a check before it is loaded in bash: a file whose ``LD_PRELOAD`` has the
    right form but names a library outside the folders where this machine's libraries lie is refused, its command
    not started, and the verbs that show a file (``best``, ``diff``) warn of it; the file autotune exports here
    passes."""
    from autotune.recipe_file import to_env
    from autotune.trial import launch

    recipe = replace(_good(facts), params={**_good(facts).params, "allocator": "jemalloc"})
    plan = launch.for_recipe(recipe, [], {}, facts=facts)  # as 'autotune export --format env' writes it
    ran = tmp_path / "ran"
    planted = tmp_path / "libjemalloc.so"
    planted.write_bytes(b"\x7fELF")
    for preload, ok in ((str(planted), False), (None, True)):
        env = {**plan.env, "LD_PRELOAD": preload} if preload else plan.env
        (tmp_path / "best.env").write_text(to_env(recipe, env, plan.cpus, plan.membind))
        done = subprocess.run([sys.executable, "-m", "autotune", "run", "--recipe", str(tmp_path / "best.env"), "--",
                               "touch", str(ran)], capture_output=True, text=True, timeout=120)
        assert (done.returncode == 0) == ok and ran.exists() == ok, (preload, done.stderr)
        for verb in (("best", "--recipe"), ("diff", str(tmp_path / "best.env"))):
            code, out, _ = _main(*verb, str(tmp_path / "best.env"))
            assert code == 0 and ("LD_PRELOAD names" not in out) == ok, out
        if not ok:
            assert f"LD_PRELOAD names '{planted}', not a library where this machine" in done.stderr, done.stderr


def test_a_link_of_ones_own_into_a_library_folder_is_not_preloadable(tmp_path: Path) -> None:
    """A link in a folder of one's own passes where the check reads only where it leads, and can be pointed at
    another file once checked: the file linked, and a linked folder, are refused; the library itself passes."""
    from autotune.probes import preloadable

    maps = Path("/proc/self/maps").read_text().split()
    libc = next(p for p in maps if p.startswith("/") and "/libc.so" in p)  # this process's C library
    (tmp_path / "libjemalloc.so.2").symlink_to(libc)
    (tmp_path / "lib").symlink_to(Path(libc).parent)
    assert preloadable(libc)
    assert not preloadable(str(tmp_path / "libjemalloc.so.2"))
    assert not preloadable(str(tmp_path / "lib" / Path(libc).name))


def test_jemallocs_conf_is_autotunes_own_today_or_before_purging_was_turned_off(facts: Any) -> None:
    from autotune.recipe_file import read_env, to_env

    recipe = replace(_good(facts), params={**_good(facts).params, "allocator": "jemalloc"})
    preload = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    # purging off: pages given back between steps faulted in again (benchmarks/heap_settings.py: 0.66-0.68x of glibc)
    assert "dirty_decay_ms:-1,muzzy_decay_ms:-1" in spaces.preload.JEMALLOC_CONF
    before = "oversize_threshold:1,background_thread:true,metadata_thp:auto"  # what files exported before hold
    for conf, ok in ((spaces.preload.JEMALLOC_CONF, True), (before, True), ("prof:true,prof_prefix:/tmp/x", False),
                     (before + ",prof:true,prof_prefix:/tmp/x", False), (spaces.preload.JEMALLOC_CONF + before, False),
                     (f"{spaces.preload.JEMALLOC_CONF}|{before}", False)):
        text = to_env(recipe, {"LD_PRELOAD": preload, "MALLOC_CONF": conf}, None)
        if ok:
            assert read_env(text).params["allocator"] == "jemalloc"
        else:
            with pytest.raises(UsageError, match="MALLOC_CONF=.* is not what autotune writes"):
                read_env(text)


# 5. Secrets, in every form a URL holds them, reach no output of any verb; on the command line, one warning.
SECRET = "S3CR#ET@pw"
URLS = ["postgresql+psycopg://u:S3CRETpw@127.0.0.1:1/db", "postgresql+psycopg://u:S3CR%40ETpw@127.0.0.1:1/db",
        "postgresql+psycopg://u:S3CR@ETpw@127.0.0.1:1/db", "postgresql+psycopg://127.0.0.1:1/db?password=S3CRETpw",
        "postgresql+psycopg://127.0.0.1:1/db?user=u&password=S3CRETpw", "u:S3CRETpw@127.0.0.1:1/db",
        "postgresql+psycopg://u:S3CR#ETpw@127.0.0.1:1/db", "postgresql+psycopg://127.0.0.1:1/db#password=S3CRETpw"]
VERBS = [("studies",), ("recipes",), ("best",), ("report",), ("export",), ("dashboard",), ("diff", "1", "2"),
         ("run", "--recipe", "1", "--", "true"), ("search", "--workload", "tiny", "--budget", "10s")]


def test_no_verb_prints_a_storage_secret_in_any_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in URLS:
        for verb in VERBS:
            for given in ("command line", "environment") if verb == VERBS[0] else ("command line",):
                argv, env = ((verb[0], "--storage", url, *verb[1:]), {}) if given == "command line" else (
                    verb, {"AUTOTUNE_STORAGE": url})
                code, out, err = _main(*argv, env=env)
                said = out + err
                assert code != 0 and not re.search("S3CR|ETpw", said), (url, verb, said)
                warned = [line for line in err.splitlines() if "password in --storage" in line]
                assert len(warned) == (given == "command line"), (url, verb, err)
                assert not warned or "AUTOTUNE_STORAGE" in warned[0] and "~/.pgpass" in warned[0]
    from autotune.database import hide_secrets

    hidden = "postgresql+psycopg://u:S3CR\u200bETpw@127.0.0.1:1/db"  # an error's message drops the mark when made
    assert "S3CR" not in hide_secrets(str(UsageError("cannot connect as u:S3CR\u200bETpw")), hidden)


# 6. Stored text reaches the terminal as text: no markup, no control character.
def test_a_recipe_variables_own_source_reaches_apply_s_warning_without_control_characters(
        facts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env file checks its lines' bytes, but ``AUTOTUNE_RECIPE``'s JSON decodes ``\u001b`` only when read: a
    format-1 recipe of two processes, whose note apply() warns with, quoted its source's escapes to the terminal."""
    import warnings

    hostile = r"\u001b]0;pwned\u0007\u001b[2J\nfake line"  # JSON escapes, decoded when the recipe is read
    monkeypatch.setenv("AUTOTUNE_RECIPE", '{"params": {"batch_size": 64, "processes": 2}, "workload": "tiny", '
                       f'"fingerprint": "{facts.fingerprint}", "source": "{hostile}"}}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autotune.apply(facts=facts, check_hardware=False)
    said = [str(w.message) for w in caught if "format 1" in str(w.message)]
    assert len(said) == 1 and "pwned" in said[0] and not re.search(r"[\x00-\x1f\x7f]", said[0]), said


def test_stored_text_is_printed_as_text_without_control_characters(facts: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna

    url = _store(tmp_path, replace(_good(facts), workload="[/bold]oops", study="\x1b]0;owned\x07s\r\nforged: x",
                                   notes=["\x1b[2J\x1b]0;retitled\x07 cleared\r", "\u202eshown\nforged: pip i x"]))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="\x1b]0;empty\x07[red]", storage=url)  # and an empty study: no trial, no time
    monkeypatch.chdir(tmp_path)
    for verb in (("recipes",), ("best",), ("best", "--recipe", "1"), ("studies",), ("diff", "1", "1"),
                 ("best", "--workload", "[/bold]oops"), ("export", "--format", "json")):
        code, out, err = _main(verb[0], "--storage", url, *verb[1:])
        assert code == 0, (verb, err)
        assert not re.search("[\x1b\x07\r\u202e]", out + err), (verb, out + err)
    assert "[/bold]oops" in _main("recipes", "--storage", url)[1]
    assert not re.search(r"^\s*forged", _main("best", "--storage", url)[1], re.M)  # a stored text is one line
    assert "\x1b" not in str(UsageError("a stored \x1b]0;retitled\x07 workload"))  # as Python prints an error


# 7. Files: named inside the working folder, written whole, never through a link; the lock and the cache too.
def test_files_are_written_inside_the_folder_and_never_through_a_link(facts: Any, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.cli.report import default_path

    monkeypatch.chdir(tmp_path)
    assert Path(default_path("x/../../escaped")).resolve().parent == tmp_path
    url = _store(tmp_path, _good(facts))
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "link.env").symlink_to(victim)
    assert _main("export", "--storage", url, "-o", "link.env")[0] == 0
    assert victim.read_text() == "mine" and not (tmp_path / "link.env").is_symlink()
    assert load_recipe_file(tmp_path / "link.env").id == 1


def test_the_kernel_cache_is_written_through_a_name_no_one_can_plant(tmp_path: Path) -> None:
    from autotune.probes._measured import write_cached

    victim = tmp_path / "victim"
    victim.write_text("mine")
    path = tmp_path / "cache" / "kernels.json"
    path.parent.mkdir()
    path.with_suffix(f".{os.getpid()}.tmp").symlink_to(victim)  # where a pid-named write would have gone
    write_cached(path, {"a": 1})
    assert victim.read_text() == "mine" and json.loads(path.read_text()) == {"a": 1}


def test_an_owner_record_no_search_writes_stops_no_search(tmp_path: Path) -> None:
    """Anyone may write a trial folder in the shared temporary folder, and a shared study's trial: an owner record
    that is a list, or names a pid no process can have, raised in every later trial's clean-up; now it is one whose
    owner cannot be told (left alone), and a folder of this user's whose owner is gone is still removed."""
    from autotune.trial import lock
    from autotune.trial.runner import OWNER_FILE, TRIAL_DIR_PREFIX, remove_abandoned

    host = lock.host_id()
    for i, record in enumerate(([], {"host": host, "pid": "1; x"}, {"host": host, "pid": -1},
                                {"host": host, "pid": 1 << 80}, {"host": host, "pid": True})):
        (tmp_path / f"{TRIAL_DIR_PREFIX}{i}").mkdir()
        (tmp_path / f"{TRIAL_DIR_PREFIX}{i}" / OWNER_FILE).write_text(json.dumps(record))
        assert not lock.owner_gone(record)  # left alone
    gone = tmp_path / f"{TRIAL_DIR_PREFIX}gone"
    gone.mkdir()
    (gone / OWNER_FILE).write_text(json.dumps({"host": host, "pid": os.getpid(), "pid_started": 1.0}))
    assert remove_abandoned(tmp_path) == [gone] and not gone.exists()


def test_the_host_lock_follows_no_link_and_a_long_wait_names_its_holder(tmp_path: Path, facts: Any,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    import fcntl
    import tempfile
    import threading

    from autotune.errors import TrialError
    from autotune.trial.lock import LOCK_NAME, host_lock

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TrialError, match="a symbolic link"), host_lock():
        pass
    assert not (tmp_path / "elsewhere").exists()
    (tmp_path / LOCK_NAME).unlink()
    holder = os.open(tmp_path / LOCK_NAME, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(0.6, lambda: os.close(holder)).start()
    with caplog.at_level("WARNING", logger="autotune.trial.lock"), host_lock(name_holder_after_s=0.2):
        pass
    assert f"held by user {__import__('getpass').getuser()}, process {os.getpid()}" in caplog.text, caplog.text
    # a search's wait ends with its budget (another search stopped with Ctrl-Z holds the lock as long as it is)
    from autotune.study import Budget, SearchOptions
    from autotune.study.loop import SearchLoop
    from autotune.trial.lock import LockBusy

    from .stubs import StubMeasurer

    holder = os.open(tmp_path / LOCK_NAME, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with pytest.raises(LockBusy, match="was not free within"), host_lock(wait_s=0.5):
            pass
        import optuna

        loop = SearchLoop(optuna.create_study(), "tiny", facts, spaces.SpaceContext(default_batch_size=32), {},
                          SearchOptions(budget_s=3, storage="sqlite://"), Budget.start(2.0), lambda event: None,
                          measurer=StubMeasurer())
        assert loop.run() == "budget" and time.monotonic() - started < 6.0
    finally:
        os.close(holder)


# 8. Every bad input is one line and exit 2: nothing hangs, nothing is an internal error.
def test_bad_inputs_are_one_line_with_exit_2(facts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = _store(tmp_path, _good(facts))
    (tmp_path / "latin.env").write_bytes(b"# caf\xe9\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "fast.json").write_text(json.dumps({**_good(facts).to_dict(), "speedup": "fast"}))
    (tmp_path / "huge.json").write_text('{"params": {}, "workload": "w", "id": ' + "9" * 5000 + "}")
    cases = [(("best", "--recipe", "latin.env"), "is not UTF-8 text"),
             (("best", "--recipe", "list.json"), "a JSON list"),
             (("export", "--recipe", "fast.json"), "speedup='fast': not allowed"),
             (("best", "--recipe", "fast.json"), "speedup='fast': not allowed"),
             (("best", "--recipe", "huge.json"), "not valid JSON"),
             (("best", "--storage", url, "--recipe", "99999999999999999999999"), "no recipe 99999999999999999999999"),
             (("run", "--storage", url, "--recipe", "99999999999999999999999", "--", "true"), "no recipe")]
    for argv, said in cases:
        code, _, err = _main(*argv)
        assert code == 2 and said in err and len(err.splitlines()) == 1, (argv, err)
    monkeypatch.setenv("AUTOTUNE_RECIPE", "not json")
    with pytest.raises(UsageError, match="the AUTOTUNE_RECIPE variable: the recipe is not valid JSON"):
        autotune.apply(facts=facts)


def test_a_fifo_as_the_recipe_file_or_the_database_is_one_line_not_a_hang(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.chdir(tmp_path)
    for name, argv in (("fifo.env", ["best", "--recipe", "fifo.env"]),
                       ("fifo.db", ["best", "--storage", "sqlite:///fifo.db"])):
        os.mkfifo(tmp_path / name)
        done: list[tuple[int, str, str]] = []
        verb = threading.Thread(target=lambda done=done, argv=argv: done.append(_main(*argv)), daemon=True)
        verb.start()
        verb.join(timeout=20)
        if verb.is_alive():  # it waits for a writer: be one, so that it ends, and fail
            os.close(os.open(tmp_path / name, os.O_WRONLY | os.O_NONBLOCK))
            verb.join(timeout=20)
            pytest.fail(f"autotune {' '.join(argv)} hung on a FIFO")
        code, _, err = done[0]
        assert code == 2 and "is not a regular file" in err and len(err.splitlines()) == 1, err
