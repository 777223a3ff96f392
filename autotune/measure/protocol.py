"""The paired worker's protocol: typed commands (parent -> worker) and replies (worker -> parent).

One message per line of JSON, ``{"type": CLASS_NAME, FIELD: VALUE, ...}``: the parent writes commands on
the worker's stdin, the worker answers each with exactly one reply on its protocol pipe (its original
stdout; what the workload prints goes to the worker's log instead). Both sides import these classes, so
the contract is a type, not a dict: ``decode(encode(message)) == message`` for every message.

    >>> line = encode(RunPairs(base="defaults", cand="cl", n=16, window_s=0.3, seed=1))
    >>> line
    '{"type": "RunPairs", "base": "defaults", "cand": "cl", "n": 16, "window_s": 0.3, "seed": 1}'
    >>> decode(line)
    RunPairs(base='defaults', cand='cl', n=16, window_s=0.3, seed=1)
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# As a trial's status (``runner.Status``) for what ran; "no-room": a second model would not fit on the GPU
# beside the first (``paired.no_room``): not measured in one process, measure it by process pairs.
ArmState = Literal["ok", "nan", "oom", "crash", "no-room"]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with (a JSON file named on its command line): the workload, the
    environment's baseline params (applied at start: every arm shares its environment-level knobs), the
    probed facts, and the study's settings that every arm shares."""

    workload: str
    params: dict[str, Any]
    facts: dict[str, Any]
    loss_samples: int  # every arm's quality-guard loss is taken after exactly this many samples
    warmup_steps: int = 4  # untimed steps after an arm is built; the first holds compilation
    eval_samples: int = 512
    train_steps: int = 5000  # the planned run compile time is amortised over
    seed: int = 0
    keep_heap: bool = False  # glibc's mmap and trim thresholds fixed before torch starts (the worker's ``keep_heap``)


# Commands ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddArm:
    """Build an arm (model, optimizer, DataLoader) with ``params`` and warm it up; refused when its
    environment-level knobs differ from the worker's. ``seed``: its training seed (weights, data order), the
    worker's when None; ``wide``: its loss is also taken over the wide held-out set (``workloads.held_out_sets``)."""

    arm: str
    params: dict[str, Any]
    seed: int | None = None
    wide: bool = False
    # Give up in its warm-up (``hopeless.Judge``): when its steps take more than ``give_up`` x the arm ``against``'s
    # time per sample for a window's floor, its warm-up ends there and its status says ``gave_up``. Where no arm of
    # this worker is the reference (another environment's process), ``reference_s``: seconds per sample measured
    # elsewhere (the defaults' in the search's calibration).
    give_up: float | None = None
    against: str | None = None
    reference_s: float | None = None


@dataclass(frozen=True)
class RunPairs:
    """``n`` pairs of windows of ``window_s`` seconds, each pair's two arms in random order (``seed``)."""

    base: str
    cand: str
    n: int
    window_s: float
    seed: int = 0


@dataclass(frozen=True)
class RunWindows:
    """``n`` windows of one arm (for pairs of worker processes, alternated by the parent)."""

    arm: str
    n: int
    window_s: float


@dataclass(frozen=True)
class Evaluate:
    """Take the arm's quality-guard loss now if not yet taken: trains it (untimed) up to ``loss_samples``."""

    arm: str


@dataclass(frozen=True)
class DropArm:
    arm: str


@dataclass(frozen=True)
class KeepHeap:
    """Fix glibc's heap thresholds from now on (``preload.keep_heap``): a process pair's worker, started with
    glibc's defaults, that goes on to host in-process arms (``process_pair.process_pair``'s ``keep``)."""


@dataclass(frozen=True)
class EmptyCache:
    """Return the CUDA memory this worker's allocator caches but does not use to the device, before the worker
    is frozen beside other processes on its GPU (``score``)."""


@dataclass(frozen=True)
class Profile:
    """Train the arm ``seconds`` (untimed) under torch's profiler: its operators' shares (``phases.top_operators``)."""

    arm: str
    seconds: float


@dataclass(frozen=True)
class Quit:
    pass


Command = AddArm | RunPairs | RunWindows | Evaluate | DropArm | KeepHeap | EmptyCache | Profile | Quit

# Records and replies -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowRecord:
    """One timed window of one arm: whole optimizer steps until ``window_s`` had passed."""

    arm: str
    rate: float  # samples / elapsed_s
    steps: int
    samples: int
    elapsed_s: float  # evaluation time excluded
    # State letter in /proc/PID/stat of every other arm's DataLoader worker, read during this window: "T" when
    # stopped as it should be. The tests check it; the search may ignore it.
    idle_workers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PairRecord:
    first: str  # the arm whose window ran first
    base: WindowRecord
    cand: WindowRecord

    @property
    def ratio(self) -> float:
        """Candidate rate / baseline rate."""
        return self.cand.rate / self.base.rate


@dataclass(frozen=True)
class ArmStatus:
    """An arm as it stands after a command."""

    arm: str
    state: ArmState
    error: str | None = None
    step_samples: int = 0
    trained: int = 0  # samples trained so far (warm-up, windows, training up to the loss)
    first_step_s: float | None = None
    step_s: float | None = None  # a normal optimizer step: the windows' median, before any window the warm-up's
    compile_s: float | None = None  # first step minus a normal step (from the windows' median once there are some)
    loss: float | None = None
    loss_samples: int | None = None  # samples trained when the loss was taken
    worker_pids: tuple[int, ...] = ()  # its DataLoader workers now (stopped unless its window runs)
    in_effect: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # CUDA: the most device memory the arm itself allocated (torch.cuda.max_memory_allocated over its build,
    # warm-up and windows, the other arms' resident memory taken off); None on CPU or before it ran
    peak_memory_bytes: int | None = None
    settle_steps: int = 0  # untimed steps it trained after its warm-up as its process's first arm (``arms.SETTLE_S``)
    wide_loss: float | None = None  # its loss over the wide held-out set then, when added ``wide``
    held_out: tuple[int, int] | None = None  # samples in the held-out and the wide set, when added ``wide``
    gave_up: float | None = None  # its slow steps' time per sample over ``against``'s, the least, where it gave up
    data_wait: float | None = None  # the share of its windows spent waiting for the next batch (``Arm.data_wait``)
    phases: tuple[tuple[str, float], ...] | None = None  # each part's share of its windows (``phases.Phases``)

    @property
    def s_per_sample(self) -> float | None:
        """Seconds per sample of a normal step (``step_s``); None before one."""
        return self.step_s / self.step_samples if self.step_s and self.step_samples else None


@dataclass(frozen=True)
class Ready:
    pid: int
    in_effect: dict[str, Any]


@dataclass(frozen=True)
class ArmAdded:
    status: ArmStatus


@dataclass(frozen=True)
class WindowsRun:
    status: ArmStatus
    windows: tuple[WindowRecord, ...]


@dataclass(frozen=True)
class PairsRun:
    """The pairs run; fewer than asked when an arm failed (its status says why)."""

    base: ArmStatus
    cand: ArmStatus
    pairs: tuple[PairRecord, ...]


@dataclass(frozen=True)
class Evaluated:
    status: ArmStatus


@dataclass(frozen=True)
class Profiled:
    status: ArmStatus
    operators: tuple[tuple[str, float], ...]  # the top operators by self time: name, share of all operators' time


@dataclass(frozen=True)
class Dropped:
    arm: str


@dataclass(frozen=True)
class HeapKept:
    kept: bool  # False where malloc is not glibc's


@dataclass(frozen=True)
class CacheEmptied:
    released: int  # bytes returned to the device (0 off CUDA)


@dataclass(frozen=True)
class Refused:
    """A command the worker could not carry out (unknown arm, another environment, a failed arm); the
    worker goes on."""

    command: str
    error: str


@dataclass(frozen=True)
class Bye:
    pass


Reply = (Ready | ArmAdded | WindowsRun | PairsRun | Evaluated | Profiled | Dropped | HeapKept | CacheEmptied | Refused
         | Bye)

_TYPES: dict[str, type[Any]] = {cls.__name__: cls for cls in typing.get_args(Command) + typing.get_args(Reply)}


def encode(message: Command | Reply) -> str:
    """One JSON line (without its newline)."""
    return json.dumps({"type": type(message).__name__, **asdict(message)})


def decode(line: str) -> Any:
    """The message of one JSON line; ValueError for a line that is not one."""
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("type") not in _TYPES:
        raise ValueError(f"not a paired-worker message: {line[:200]!r}")
    kind = _TYPES[data.pop("type")]
    return _build(kind, data)


def _build(cls: type[Any], data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name])
    return cls(**values)


def _value(hint: Any, value: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and value is not None:  # X | None: as X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _build(hint, value)  # type: ignore[arg-type]
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        item = typing.get_args(hint)[0]
        return tuple(_value(item, v) for v in value)
    return value
