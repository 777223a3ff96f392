"""A ``Recipe``: the chosen knob values plus where they were measured, and its checks (``checked``): what a
recipe from a file, a variable or a shared store must be before anything applies or starts it. Its files (the
env file and JSON) are ``autotune.recipe_file``'s.

Recipe formats (``Recipe.format``, in the JSON and in the env file's header): 2 holds the batch each
process loads (``batch_per_rank``); 1, every recipe without a ``format``, holds ``batch_size``, the batch
summed over the recipe's ``processes`` (each rank loads ``batch_size // processes``). Both apply as
measured: ``format_note`` says in one line what a format-1 recipe means.
"""
from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import UsageError, one_line, printable

FORMAT = 2  # the recipe format this autotune writes (see the module docstring)
# What a recipe's stated speedup stands on: confirmed (two confirmation rounds or more, then 6 fresh process pairs
# started as your training is, faster with confidence); provisional (fewer of either, each said); the search's own
# interval (confirmation off); the defaults kept (1.0 by definition).
CLAIMS = ("confirmed", "provisional", "search", "defaults")


@dataclass(frozen=True)
class Recipe:
    """The best knob values found for one workload on one machine (``fingerprint``)."""

    params: dict[str, Any]
    workload: str
    fingerprint: str | None = None
    study: str | None = None
    samples_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None  # the speedup's confidence interval (paired measurement)
    speedup_high: float | None = None
    confidence: float | None = None  # the interval's coverage as its method reached it
    claim: str | None = None  # what the stated speedup stands on (``CLAIMS``); None: stored before it was recorded
    # The fresh process pairs of your runs the stated speedup comes from (``measure.runs``; None: stored before, or
    # a search without them), where one run of yours against a plain one falls (90% prediction), and the seconds of
    # training timed in each process of those pairs (after its start and warm-up).
    process_pairs: int | None = None
    run_low: float | None = None
    run_high: float | None = None
    run_s: float | None = None
    loss: float | None = None
    baseline_loss: float | None = None
    peak_memory_bytes: int | None = None
    flop_per_sample: float | None = None  # the workload's training step per sample (``workloads.flop_per_sample``)
    matmul_gflops: dict[str, float] | None = None  # the searched machine's matmul peak per dtype (``probes.Limits``)
    id: int | None = None
    created: str | None = None
    notes: list[str] = field(default_factory=list)
    format: int | None = None  # None: from the params (``batch_size``: 1, else ``FORMAT``); a file without it: 1
    # where this copy was read from (a file, the AUTOTUNE_RECIPE variable), for messages; not part of its identity
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # a stored row has no format column: its params say which it is
        if self.format is None and isinstance(self.params, dict):
            object.__setattr__(self, "format", 1 if "batch_size" in self.params else FORMAT)

    @property
    def speedup_text(self) -> str:
        """``1.23x [1.15-1.31]`` (the interval when it was measured paired), ``1.23x``, or ``-``."""
        return format_speedup(self.speedup, self.speedup_low, self.speedup_high)

    @property
    def claim_text(self) -> str:
        """``confirmed, 95% interval``: what the stated speedup stands on and its interval's coverage, where they
        were recorded (a recipe stored before: the 95% its search asked); empty for the defaults kept."""
        pairs = self.process_pairs
        said = {"confirmed": "confirmed", "provisional": "provisional: one confirmation round",
                "search": "the search's own interval, not confirmed"}.get(self.claim or "")
        if pairs is not None and self.claim in ("confirmed", "provisional"):
            said = f"{self.claim}: " + (f"{pairs} fresh process pairs of your training" if self.run_low is not None
                                         else "not measured in processes of your training")
        coverage = f"{self.confidence * 100:.3g}%" if self.confidence else "95%"  # 95%, 99.2%, 87.5%
        return ", ".join(filter(None, [said, f"{coverage} interval" if self.speedup_low is not None else None]))

    @property
    def run_text(self) -> str | None:
        """``a run of yours: 1.02-1.31x the defaults' (90% prediction interval; 2.1 s of training timed a process)``,
        or None where no process pair of your runs measured it."""
        if self.run_low is None or self.run_high is None:
            return None
        timed = f"; {self.run_s:.1f} s of training timed a process" if self.run_s else ""
        return f"a run of yours: {self.run_low:.2f}-{self.run_high:.2f}x the defaults' (90% prediction interval{timed})"

    @property
    def place_text(self) -> str | None:
        """Where the recipe and the defaults stand against the machine's matmul peak (``format_place``), or None
        when the workload's FLOP were not counted."""
        dtype = matmul_dtype(self.params)
        place = format_place(self.samples_per_s, self.flop_per_sample, self.matmul_gflops, dtype)
        if place is None or self.baseline_samples_per_s in (None, self.samples_per_s) or self.flop_per_sample is None:
            return place
        defaults = self.baseline_samples_per_s * self.flop_per_sample / 1e9
        peak = (self.matmul_gflops or {}).get("float32")
        of = "" if dtype == "float32" else " of float32's"
        said = f"; the defaults {_number(defaults)} GFLOP/s"
        return place + said + (f" = {share(defaults / peak)}{of}" if peak else "")

    @property
    def label(self) -> str:
        """How messages name it: ``recipe 7``, ``recipe 7 from best.env``, ``recipe from r.json``."""
        return " ".join(filter(None, ("recipe", str(self.id) if self.id is not None else None,
                                      f"from {self.source}" if self.source else None)))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["source"] is None:  # a stored recipe: its id says where it is
            del data["source"]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Recipe:
        if not isinstance(data, dict):
            raise UsageError(f"not an autotune recipe: a JSON {type(data).__name__}, where a recipe is an object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "params" not in known or "workload" not in known:
            raise UsageError("not an autotune recipe: it has no 'params' or 'workload'")
        return cls(**{"format": 1, **known})  # written before recipes had a format: format 1


SCRIPT_WORKLOAD = "script:"  # a script-mode recipe's workload: "script:" and the script's path (study.script_mode)


def search_command(workload: str, *options: str) -> str:
    """The ``autotune search`` line that measures ``workload`` again: for a script's, the script after ``--``
    (its arguments are not recorded: the user adds them).

    >>> search_command("cnn", "--study NEW_NAME")
    'autotune search --workload cnn --study NEW_NAME'
    >>> search_command("script:train.py", "--storage URL")
    'autotune search --storage URL -- python train.py'
    """
    if workload.startswith(SCRIPT_WORKLOAD):
        script = shlex.quote(workload.removeprefix(SCRIPT_WORKLOAD))
        return " ".join(["autotune search", *options, "-- python", script])
    return " ".join(["autotune search --workload", shlex.quote(workload), *options])


def problems(recipe: Recipe) -> list[str]:
    """Everything in ``recipe`` that no search writes, ``[]`` for a recipe it could have: a format this autotune
    does not read, a header field of the wrong type (texts are texts, speeds finite numbers, notes a list of
    texts), no fingerprint on a recipe read from a file, a variable or a store (``source`` or ``id`` set), and
    every param that is not a known knob with a value the search space offers on some machine
    (``search_spaces.recipe_problems``). A listing shows such a recipe as refused; ``checked`` refuses it."""
    from . import search_spaces as spaces

    if not isinstance(recipe.params, dict):
        return spaces.recipe_problems(recipe.params)
    unread = _unread_format(recipe)
    if unread:
        return [unread]
    out = [f"{name}={getattr(recipe, name)!r}: not allowed ({what})" for name, (check, what) in _HEADER.items()
           if not check(getattr(recipe, name))]
    if not recipe.fingerprint and (recipe.source is not None or recipe.id is not None):
        out.append("fingerprint: missing (every stored or exported recipe names the hardware it was measured on)")
    return out + spaces.recipe_problems(recipe.params)


def checked(recipe: Recipe) -> Recipe:
    """``recipe``, if a search could have written it (``problems``); else UsageError naming each problem, before
    anything applies or starts it: a recipe file or a shared store's recipe sets the environment and the
    training of whoever runs it. Every way a recipe enters passes here (a file, ``AUTOTUNE_RECIPE``, a store by
    id, study or workload, the recipe service, ``apply()``), and so does every launch plan of a recipe
    (``trial.launch.for_recipe``)."""
    found = problems(recipe)
    if found == [_unread_format(recipe)]:  # a format it cannot read is the whole problem: the rest is not read
        raise UsageError(f"{recipe.label} {found[0]}")
    if found:
        raise UsageError(f"{recipe.label} holds what no search writes: {'; '.join(found)}")
    return recipe


def _unread_format(recipe: Recipe) -> str | None:
    """Why this autotune cannot read ``recipe``'s format, or None."""
    if isinstance(recipe.format, int) and not isinstance(recipe.format, bool) and 1 <= recipe.format <= FORMAT:
        return None
    return f"is format {recipe.format!r}, this autotune reads formats 1 to {FORMAT}: upgrade autotune, or search again"


def _text(optional: bool = True, most: int = 4096) -> tuple[Callable[[Any], bool], str]:
    what = f"{'null or ' if optional else ''}a text of at most {most} characters"
    return (lambda v: (optional and v is None) or (type(v) is str and len(v) <= most)), what


def _amount(least: float = 0.0, infinite: bool = False) -> tuple[Callable[[Any], bool], str]:
    def check(v: Any) -> bool:
        if v is None:
            return True
        if type(v) not in (int, float) or math.isnan(v) or (math.isinf(v) and not infinite):
            return False
        return bool(v >= least)
    return check, f"null or a {'' if infinite else 'finite '}number" + (f" of at least {least:g}" if least > -1 else "")


_TOKEN = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")  # what ``probes.fingerprint`` writes, of every scheme


def _iso(text: str) -> bool:
    from datetime import datetime

    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return len(text) <= 64


def _texts(v: Any) -> bool:
    return type(v) is list and all(type(n) is str for n in v)


def _peaks(v: Any) -> bool:
    return v is None or (type(v) is dict and all(type(k) is str and x is not None and _FINITE(x)
                                                  for k, x in v.items()))


_FINITE = _amount()[0]


# A recipe's fields besides its params and format, with what a search writes in each (the env header prints them).
_HEADER: dict[str, tuple[Callable[[Any], bool], str]] = {
    "workload": _text(optional=False), "study": _text(most=512),
    "fingerprint": ((lambda v: v is None or (type(v) is str and bool(_TOKEN.fullmatch(v)))),
                    "null or a hardware fingerprint such as v3-0123456789ab"),
    "created": ((lambda v: v is None or (type(v) is str and _iso(v))), "null or an ISO 8601 time"),
    "source": _text(), "samples_per_s": _amount(), "baseline_samples_per_s": _amount(), "speedup": _amount(),
    "speedup_low": _amount(), "speedup_high": _amount(infinite=True),  # one process pair: unbounded above
    "confidence": ((lambda v: v is None or (type(v) in (int, float) and 0 < v <= 1)),
                   "null or a number above 0 and at most 1"),
    "claim": ((lambda v: v is None or v in CLAIMS), f"null or one of {', '.join(CLAIMS)}"),
    "process_pairs": ((lambda v: v is None or (type(v) is int and 0 <= v <= 1000)), "null or an integer 0 to 1000"),
    "run_low": _amount(), "run_high": _amount(infinite=True), "run_s": _amount(),
    "loss": _amount(least=-math.inf), "baseline_loss": _amount(least=-math.inf), "flop_per_sample": _amount(),
    "peak_memory_bytes": ((lambda v: v is None or (type(v) is int and v >= 0)), "null or an integer of at least 0"),
    "id": ((lambda v: v is None or (type(v) is int and 1 <= v < 2**63)), "null or a positive integer"),
    "notes": (_texts, "a list of texts"), "matmul_gflops": (_peaks, "null or an object of finite numbers"),
}


def format_note(recipe: Recipe) -> str | None:
    """One line on what a format-1 recipe's batch means, or None for a current one.

    >>> format_note(Recipe(params={"batch_size": 64, "processes": 8}, workload="cnn", format=1))[:81]
    'recipe is format 1: its batch_size 64 is the batch of all 8 processes together (8'
    """
    if recipe.format != 1 or "batch_size" not in recipe.params:
        return None
    size, processes = int(recipe.params["batch_size"]), max(1, int(recipe.params.get("processes") or 1))
    share = (f"the batch of all {processes} processes together ({size // processes} per process)" if processes > 1
             else "the batch of its one process")
    # the label quotes a file's or the variable's own source: apply() warns with it, no view strips it there
    return (f"{one_line(printable(recipe.label))} is format 1: its batch_size {size} is {share}; recipes searched "
            "now hold batch_per_rank")


def format_speedup(speedup: float | None, low: float | None = None, high: float | None = None) -> str:
    """A speedup as autotune prints it: with its confidence interval when there is one. Every view prints
    speedups through this function. A single process pair (say, a trial raced for one round) has no spread to
    bound it: its interval is unbounded, and is said so rather than printed as ``[0.00-inf]``.

    >>> format_speedup(1.234, 1.15, 1.31), format_speedup(1.2), format_speedup(None)
    ('1.23x [1.15-1.31]', '1.20x', '-')
    >>> format_speedup(0.97, 0.0, float("inf"))
    '0.97x [no interval: one measurement]'
    """
    if speedup is None:
        return "-"
    if low is None or high is None:
        return f"{speedup:.2f}x"
    if low <= 0.0 or math.isinf(high):
        return f"{speedup:.2f}x [no interval: one measurement]"
    return f"{speedup:.2f}x [{low:.2f}-{high:.2f}]"


def matmul_dtype(params: dict[str, Any]) -> str:
    """The precision a recipe's matmuls run at, as the machine's peaks are named: its autocast dtype, else TF32
    where a CUDA recipe turns it on, else float32 (a CPU's bf16 matmul path, ``matmul_precision``, is its own
    measurement's and counts as float32 work).

    >>> matmul_dtype({"amp_dtype": "bfloat16"}), matmul_dtype({"device": "cuda", "tf32_matmul": True}), matmul_dtype({})
    ('bfloat16', 'tfloat32', 'float32')
    """
    dtype = str(params.get("amp_dtype") or "float32")
    if dtype == "float32" and params.get("device") == "cuda" and params.get("tf32_matmul"):
        return "tfloat32"
    return dtype


def format_place(samples_per_s: float | None, flop_per_sample: float | None, peaks: dict[str, float] | None,
                 dtype: str = "float32") -> str | None:
    """A speed as FLOP/s against the machine's matmul peak at its precision (and float32's beside a lower one):
    how far from the machine's limit it is. None when the FLOP or the speed are unknown.

    >>> format_place(1000.0, 41e6, {"float32": 205.0})
    '41 GFLOP/s = 20% of the float32 matmul peak (205 GFLOP/s)'
    >>> format_place(4000.0, 41e6, {"float32": 205.0, "bfloat16": 820.0}, "bfloat16")
    "164 GFLOP/s = 20% of the bfloat16 matmul peak (820 GFLOP/s), 80% of float32's (205)"
    >>> format_place(1000.0, 41e6, {"float32": 205.0}, "float16"), format_place(1000.0, 41e6, None)
    ("41 GFLOP/s = 20% of the float32 matmul peak (205 GFLOP/s; float16's not measured)", '41 GFLOP/s')
    >>> format_place(2000.0, 4e4, {"float32": 205.0})
    '0.08 GFLOP/s = 0.039% of the float32 matmul peak (205 GFLOP/s)'
    >>> format_place(9000.0, 41e6, {"float32": 205.0})[:77]
    '369 GFLOP/s = 180% of the float32 matmul peak (205 GFLOP/s): above the peak a'
    """
    if not samples_per_s or not flop_per_sample:
        return None
    gflops = samples_per_s * flop_per_sample / 1e9
    peaks = peaks or {}
    own, fp32 = peaks.get(dtype), peaks.get("float32")
    said = f"{_number(gflops)} GFLOP/s"
    if own:
        text = f"{said} = {share(gflops / own)} of the {dtype} matmul peak ({own:.0f} GFLOP/s)"
        if gflops > PEAK_SLACK * own:  # no recipe outruns the peak: it was measured on a busy machine
            text += (": above the peak as measured, which a busy machine lowers; measure it again with "
                     "autotune probe --measure")
        return text + (f", {share(gflops / fp32)} of float32's ({fp32:.0f})" if fp32 and dtype != "float32" else "")
    if fp32:
        return (f"{said} = {share(gflops / fp32)} of the float32 matmul peak ({fp32:.0f} GFLOP/s; {dtype}'s not "
                "measured)")
    return said


PEAK_SLACK = 1.05  # a speed this far above the measured peak says the peak was measured low


def share(fraction: float) -> str:
    """A share as a percentage with two significant digits below 10%: ``42%``, ``3.1%``, ``0.039%``."""
    percent = 100 * fraction
    return f"{percent:.0f}%" if percent >= 10 else f"{percent:.2g}%"


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"
