"""A training script's steps, told to the search that runs it (script mode: ``autotune search -- python train.py``).

A trial of script mode starts the user's script with the path of a named pipe (a FIFO) in ``AUTOTUNE_STEPS``: a
path, not an inherited descriptor, because launchers close descriptors (torchrun starts its ranks with none but
0-2) while they pass the environment on. ``autotune.apply()`` opens it, and ``Tuned.step`` writes one line per
optimizer step: when the step ended
(``time.monotonic()``, one clock for every process of the machine) and the samples it trained over all ranks
(rank 0 writes). Where ``AUTOTUNE_LOSS_SAMPLES`` is set, the loss is written once, at the first step that reaches
that many samples: it is read from the device there and only there (a read every step would wait for a GPU every
step); where the script gave its own held-out figure (``Tuned.evaluate``), it is taken there too and written beside
the loss with the seconds it took, which no window counts. Outside a trial nothing is written; a search that closed
the pipe leaves the script training, silently. Where the search also gives a pipe of its own in
``AUTOTUNE_CONTROL``, it may send the copy recipes to switch to (``encode_switch``): between two steps the copy
switches to each in place where it can (``Tuned.switch``) and answers it (``Switched``), so that one long-lived copy
can measure several recipes. Both sides import the messages from here: the contract between the processes is
these types.

    >>> decode(encode(Step(12.5, 64))), decode(encode(Loss(2048, 0.4375)))
    (Step(ended=12.5, samples=64, waited=0.0), Loss(samples=2048, value=0.4375))
    >>> decode(encode(Model(conv=True, conv_nd=False))), decode(encode(Effect(threads=2)))
    (Model(conv=True, conv_nd=False, ranks=1, batch=0), Effect(threads=2))
    >>> decode(encode(Evaluation(2048, 0.91, True, 1.5)))
    Evaluation(samples=2048, value=0.91, higher_is_better=True, took_s=1.5)
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STEPS = "AUTOTUNE_STEPS"  # the path of the trial's named pipe, which the search reads
LOSS_SAMPLES = "AUTOTUNE_LOSS_SAMPLES"  # the samples after which the loss is written, once
TRIAL = "AUTOTUNE_TRIAL"  # "1" in a script-mode copy: the script may skip its own logging and checkpoints
CONTROL = "AUTOTUNE_CONTROL"  # the path of a named pipe the search writes: a recipe to switch to (``Switched``)


@dataclass(frozen=True)
class Step:
    ended: float  # time.monotonic() when the optimizer step returned
    samples: int  # trained in it, over all ranks and accumulated micro-batches
    waited: float = 0.0  # of the time since the last step, what passed before its batch came (``Tuned.to_device``)


@dataclass(frozen=True)
class Loss:
    samples: int  # trained when it was taken
    value: float


@dataclass(frozen=True)
class Model:
    """What the search's space depends on in the script's model, told once by ``Tuned.prepare_model``: whether it
    has convolutions, all 2-D (``conv``) or some not (``conv_nd``), the processes training it (``ranks``) and the
    batch a process trains with by the script's own arguments, where a framework integration knows it (``batch``;
    0: not told)."""

    conv: bool
    conv_nd: bool
    ranks: int = 1
    batch: int = 0


@dataclass(frozen=True)
class Effect:
    """What was in effect at the script's first optimizer step, told once by ``Tuned.step``: torch's intra-op
    threads (a script that sets its own shows here)."""

    threads: int


@dataclass(frozen=True)
class Evaluation:
    """The script's own held-out figure (``Tuned.evaluate``), taken once beside the loss: what the quality guard
    compares where a script gives one. ``took_s``: the seconds it took after the step that ended before it."""

    samples: int
    value: float
    higher_is_better: bool
    took_s: float


@dataclass(frozen=True)
class Switched:
    """The copy's answer to the search's ``switch`` (``encode_switch``), given between two optimizer steps: the
    steps after it trained with the recipe ``number``, or, where ``refused`` says why, with the one before."""

    number: int
    refused: str = ""


Message = Step | Loss | Model | Effect | Evaluation | Switched


def encode(message: Message) -> str:
    """One line, under the pipe's atomic write size: never torn by another write."""
    if isinstance(message, Step):
        return f"step {message.ended:.6f} {message.samples} {message.waited:.6f}\n"
    if isinstance(message, Effect):
        return f"effect {message.threads}\n"
    if isinstance(message, Model):
        return f"model {int(message.conv)} {int(message.conv_nd)} {message.ranks} {message.batch}\n"
    if isinstance(message, Switched):
        return f"switched {message.number} {' '.join(message.refused.split())}".rstrip() + "\n"
    if isinstance(message, Evaluation):
        return f"evaluation {message.samples} {message.value!r} {int(message.higher_is_better)} {message.took_s:.6f}\n"
    return f"loss {message.samples} {message.value!r}\n"


def decode(line: str) -> Message:
    """The message of one line; ValueError for a line that is not one."""
    kind, *fields = line.split()
    if kind == "step" and len(fields) in (2, 3):
        step = Step(float(fields[0]), int(fields[1]), float(fields[2]) if len(fields) == 3 else 0.0)
        if math.isfinite(step.ended) and math.isfinite(step.waited):  # a loss may be NaN, a step's time never
            return step
    if kind == "loss" and len(fields) == 2:
        return Loss(int(fields[0]), float(fields[1]))
    if kind == "effect" and len(fields) == 1:
        return Effect(int(fields[0]))
    if kind == "model" and len(fields) in (2, 3, 4):
        return Model(fields[0] == "1", fields[1] == "1", int(fields[2]) if len(fields) >= 3 else 1,
                     int(fields[3]) if len(fields) == 4 else 0)
    if kind == "switched" and fields:
        return Switched(int(fields[0]), " ".join(fields[1:]))
    if kind == "evaluation" and len(fields) == 4:
        return Evaluation(int(fields[0]), float(fields[1]), fields[2] == "1", float(fields[3]))
    raise ValueError(f"not a step message: {line[:80]!r}")


def encode_switch(number: int, params: dict[str, Any]) -> str:
    """The search's line asking a copy to train on with ``params`` from its next step (one line, under the pipe's
    atomic write size for any recipe).

    >>> decode_switch(encode_switch(3, {"amp_dtype": "bfloat16"}))
    (3, {'amp_dtype': 'bfloat16'})
    """
    return f"switch {number} {json.dumps(params, sort_keys=True)}\n"


def decode_switch(line: str) -> tuple[int, dict[str, Any]]:
    """The recipe number and params of a ``switch`` line; ValueError for a line that is not one."""
    kind, number, text = (line.split(" ", 2) + ["", ""])[:3]
    params = json.loads(text) if kind == "switch" and number.isdigit() and text else None
    if not isinstance(params, dict):
        raise ValueError(f"not a switch line: {line[:80]!r}")
    return int(number), params


def read_lines(fd: int, pending: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines readable now from the non-blocking pipe ``fd``, after ``pending`` (a line begun before), and
    what is left of a line not ended yet."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        pending += chunk
    *lines, rest = pending.split(b"\n")
    return lines, rest


class StepReporter:
    """What ``Tuned.step`` tells the search: each optimizer step's end and samples, the loss once."""

    def __init__(self, fd: int, loss_samples: int | None = None) -> None:
        self.fd: int | None = fd
        self.loss_samples = loss_samples
        self.samples = 0  # trained so far, over all ranks
        self._pending = 0  # of the micro-batches since the last optimizer step
        self._last: float | None = None  # when the last optimizer step ended
        self._waited = 0.0  # since then, before a batch came
        # the script's held-out figure and whether higher is better (``Tuned.evaluate``), taken beside the loss
        self.evaluator: tuple[Callable[[], float], bool] | None = None
        self.deferred = False  # a trainer evaluates after the step and tells its figure (``evaluated``) itself
        self._held: str | None = None  # the loss, held for the figure taken at its step
        self._stepped = 0.0  # when the step where the loss was due ended, its loss read: an evaluation's start
        self.control: int | None = None  # the search's pipe of recipes to switch to (``CONTROL``), where it has one
        self.switcher: Callable[[dict[str, Any]], str | None] | None = None  # ``Tuned.switch``: why not, or None
        self._orders = b""
        self.moves = False  # a batch led with the recipe's batch (``Tuned.to_device``): a batch switch shows in steps
        self._seen: int | None = None  # the last batch's samples, where they can be told (``batch``)

    @classmethod
    def from_environment(cls) -> StepReporter | None:
        """The reporter of a script-mode trial (``Tuned.step`` calls it on rank 0 only), or None outside one (or
        where the search has gone: no one reads the pipe)."""
        path = os.environ.get(STEPS)
        if not path:
            return None
        try:  # non-blocking to open: a pipe no one reads is ENXIO rather than a wait
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ENOENT):
                return None
            raise
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # never write step lines into a file of that name
            os.close(fd)
            raise RuntimeError(f"{STEPS}={path} is not a named pipe: it is set by autotune's script mode only")
        os.set_blocking(fd, True)  # a full pipe waits for the search's next read, as an inherited pipe did
        loss = os.environ.get(LOSS_SAMPLES)
        reporter = cls(fd, int(loss) if loss else None)
        control = os.environ.get(CONTROL)
        if control:
            reporter.control = os.open(control, os.O_RDONLY | os.O_NONBLOCK)
            if not stat.S_ISFIFO(os.fstat(reporter.control).st_mode):
                os.close(reporter.control)
                raise RuntimeError(f"{CONTROL}={control} is not a named pipe: it is set by autotune's script mode only")
        return reporter

    def model(self, message: Model) -> None:
        self._write(encode(message))

    def batch(self, leading: int | None = None, batch: int | None = None) -> None:
        """A batch came (``Tuned.to_device``: ``leading``, its first tensor's first dimension, and the recipe's
        ``batch``): the time since the last step ended, at the first batch after it, was the wait for data (a script
        that moves its batches itself tells none). The step's samples (``samples_of``) are ``leading``, at most the
        recipe's batch: batches that lead with time, or a whole data set moved at once, are never counted as more
        (a count too low reads a recipe slower, never faster). A batch switch is taken once a batch led with the
        recipe's (``moves``)."""
        if self._last is not None:
            self._waited += time.monotonic() - self._last
            self._last = None
        self.moves = self.moves or (leading is not None and leading == batch)
        self._seen = min(leading, batch) if leading and batch else leading or None

    def samples_of(self) -> int | None:
        """A micro-batch's samples: the last batch's where they can be told (``batch``), once; else None."""
        seen, self._seen = self._seen, None
        return seen

    def micro(self, samples: int) -> None:
        self._pending += samples

    def stepped(self, loss: Any) -> None:
        """The optimizer stepped; ``loss`` its last micro-batch's (a tensor), read only when the loss is due (None:
        a trainer's step that returned none, told at the next step that has one)."""
        first = self.samples == 0
        self.samples, self._pending = self.samples + self._pending, 0
        now = time.monotonic()
        message = [encode(Step(now, self.samples, self._waited))]
        self._last, self._waited = now, 0.0
        if first:
            import torch

            message.append(encode(Effect(torch.get_num_threads())))
        self._write("".join(message))  # before an evaluation: the search sees the step's end when it came
        if self.loss_due(0) and loss is not None:
            self._held, self.loss_samples = encode(Loss(self.samples, _finite(float(loss.detach())))), None
            self._stepped = time.monotonic()  # after the read, which waits for a GPU's queued steps: training time
            if self.evaluator is not None:
                evaluate, higher = self.evaluator
                self.evaluated(float(evaluate()), higher)
            elif not self.deferred:
                self.evaluated(None)
        self._obey()

    def _obey(self) -> None:
        """Between two steps: switch to each recipe the search sent since the last step, in order, and answer it."""
        if self.control is None:
            return
        lines, self._orders = read_lines(self.control, self._orders)
        for line in lines:
            number, params = decode_switch(line.decode())
            why = self.switcher(params) if self.switcher is not None else "this copy's trainer cannot switch"
            self._write(encode(Switched(number, why or "")))

    def loss_due(self, pending: int | None = None) -> bool:
        """Whether the loss is due at the step now ending (``pending``: its samples not yet counted; default: the
        micro-batches' since the last step)."""
        pending = self._pending if pending is None else pending
        return self.loss_samples is not None and self.samples + pending >= self.loss_samples

    def evaluated(self, value: float | None, higher_is_better: bool = False) -> None:
        """Write the loss held at the step where it was due, with the script's own figure (None: none), which took
        the time since that step ended: no wait for data, nor any window's training time."""
        if self._held is None:
            return
        told, self._held = self._held, None
        if value is not None:
            self._last, self._waited = time.monotonic(), 0.0  # its own batches were no wait for data either
            took = self._last - self._stepped
            told += encode(Evaluation(self.samples, _finite(float(value)), higher_is_better, took))
        self._write(told)

    def _write(self, text: str) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, text.encode())
        except OSError:  # the search closed its end: the script goes on untold
            self.fd = None


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.nan
