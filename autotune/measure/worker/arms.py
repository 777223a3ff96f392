"""Paired A/B measurement inside one process: arms trained in alternating windows, compared by ratio.

Two identical trial processes differ by a factor that lasts their whole life, while two identical models
trained alternately in ONE process agree far more closely. So knobs that apply inside a process are compared
here: an ``Arm`` is one set of in-process knobs (batch size, channels_last, AMP dtype, matmul precision,
compile mode, sparsity, DataLoader settings, ipex, TF32) with its own model, optimizer and DataLoader, set up
through ``autotune.apply()`` and ``Tuned`` exactly as a trial and the user's training are, seeded identically.
``pairs()`` runs two arms back to back in random order; each pair's ratio is candidate rate / baseline rate,
and ``stats.compare()`` gives their median with an exact interval.

Rules an arm keeps, so that its windows measure only itself:
- every arm of a process shares its environment-level knobs (``environment_keys``); ``Bench.add`` refuses
  another environment (those are compared across processes);
- process-global settings (the TF32 flags and the CPU's float32 matmul precision, set by ``set_flags``) and
  the torch RNG state are the arm's own from the start of each of its windows;
- its DataLoader workers are stopped (SIGSTOP) while it is idle and continued (SIGCONT) for its windows,
  and never left stopped: ``close()`` and a failure continue them before shutting them down;
- a window runs whole optimizer steps until at least ``window_s`` seconds have passed (CUDA synchronised);
- the process's first arm settles it before any window: it trains on, untimed, after its warm-up steps
  (``SETTLE_S``, ``SETTLE_STEPS``);
- on CUDA its peak memory is its own (``autotune.measure.worker.footprint``), and ``Bench.add`` adds a second model to
  the device only when both fit: otherwise the arm's state is ``no-room`` ("measure by process pairs");
- its quality-guard loss is taken once, when its trained samples reach the study's ``loss_samples``
  (evaluation time is excluded from the window); later windows only time;
- a NaN loss, an out-of-memory error or any other exception fails that arm alone (``ArmFailed``).

Example (in a worker process; see ``autotune.measure.live.paired_worker`` for the parent's side)::

    bench = Bench(spec)
    base, cand = bench.add("base", spec.params), bench.add("cl", {**spec.params, "channels_last": True})
    records = pairs(base, cand, 16, 0.3, random.Random(0))
    compare(records, base.status(), cand.status(), train_steps=5000).verdict     # 'faster'
"""
from __future__ import annotations

import math
import signal
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from ... import search_spaces as spaces
from ...trial.training import NonFiniteLoss, evaluate, failure, in_effect
from ..freeze import proc_state, wait_stopped
from ..hopeless import Judge, judged_step
from ..protocol import ArmState, ArmStatus, WindowRecord, WorkerSpec
from .batches import Batches, signal_all
from .footprint import Footprint
from .phases import Phases, profiled

if TYPE_CHECKING:
    from ...probes import Facts
    from ...workloads import Workload

WINDOW_FLOOR_S = {"cpu": 0.3, "cuda": 0.05}  # timer and scheduler noise stay well under 2% of this
MIN_WINDOW_STEPS = 4
# A process's first arm trains untimed after its warm-up steps until SETTLE_S seconds or SETTLE_STEPS steps,
# whichever comes first (``Arm._settle``): a fresh process trains slower at first, an arm added to a process that
# has trained already does not, so timing that ramp would count it against the first arm only and inflate the
# other's speedup. A step-count cap keeps tiny workloads (1 ms steps) from paying a second.
SETTLE_S = 1.2
SETTLE_STEPS = 100
class Host(Protocol):
    """What an arm reads of the worker that holds it (``autotune.measure.worker.bench.Bench``)."""

    spec: WorkerSpec
    facts: Facts
    workload: Workload
    train: Any  # the training samples
    held_out: Any  # the held-out samples, or None when the workload evaluates itself
    wide_held_out: Any  # the wide held-out set (``workloads.held_out_sets``), or None as ``held_out``
    settled: bool  # whether an arm has settled the process (``Arm._settle``)


class ArmFailed(Exception):
    """An arm's training failed (NaN loss, out of memory, crash); the process and other arms go on."""

    def __init__(self, arm: str, state: ArmState, error: str) -> None:
        super().__init__(f"arm {arm!r} failed ({state}): {error}")
        self.arm, self.state, self.error = arm, state, error


def choose_window_s(step_s: float, device: str = "cpu") -> float:
    """A window long enough to be timed well: ``MIN_WINDOW_STEPS`` steps and at least the device's floor.

    >>> choose_window_s(0.01), choose_window_s(0.2), choose_window_s(0.001, "cuda")
    (0.3, 0.8, 0.05)
    """
    return max(WINDOW_FLOOR_S.get(device, WINDOW_FLOOR_S["cpu"]), MIN_WINDOW_STEPS * step_s)


class Arm:
    """One set of in-process knobs with its own model, optimizer and DataLoader (see the module docstring).

    Built and warmed up by ``Bench.add``; ``window()`` times it; ``ensure_loss()`` takes its loss."""

    def __init__(self, name: str, params: dict[str, Any], bench: Host, seed: int | None = None,
                 wide: bool = False, give_up: tuple[float, float] | None = None) -> None:
        self.name, self.params, self.bench = name, params, bench
        self.seed = seed  # its training seed; None: the worker's
        self.wide = wide  # its loss also over the wide held-out set (``wide_loss``)
        self.wide_loss: float | None = None
        # (factor, the reference's seconds per sample): give up once warm-up steps are slower than their product
        self.give_up = give_up
        self.gave_up: float | None = None  # its slow steps' time per sample over the reference's (``Judge``)
        self.state: ArmState = "ok"
        self.error: str | None = None
        self.trained = 0
        self.loss: float | None = None
        self.loss_samples: int | None = None
        self.rates: list[float] = []
        self.windows_s = self.windows_wait_s = 0.0  # its windows' time, and the part of it spent waiting for data
        self._first_steps: list[float] = []  # the steps that may hold compile work (``compilation.charged_steps``)
        self._warm_steps: list[float] = []
        self.settle_s, self.settle_steps = 0.0, 0  # the process's settling, when this arm was its first
        self.in_effect: dict[str, Any] = {}
        self.tuned: Any = None
        self.model: Any = None
        self.optimizer: Any = None
        self.batches = Batches(None)
        self.phases = Phases()  # where its windows' steps go (CPU only: ``_build``)
        self._rng: Any = None
        self._cuda_rng: Any = None
        self._sync: Callable[[], None] = lambda: None
        self.memory = Footprint(params.get("device") == "cuda")

    def _build(self) -> None:
        """Model, optimizer and DataLoader through ``apply()`` and ``Tuned``, as a trial builds them. Runs
        guarded: a model that does not fit (a second model on one GPU) fails this arm with ``oom``."""
        import torch

        from ...apply import apply

        bench = self.bench
        seed = bench.spec.seed if self.seed is None else self.seed
        torch.manual_seed(seed)  # as a trial: every arm of a seed starts from the same weights and data order
        self.tuned = tuned = apply(self.params, facts=bench.facts, check_hardware=False)
        model = tuned.prepare_model(bench.workload.model())
        optimizer = tuned.scale_lr(bench.workload.optimizer(model.parameters()))
        self.model, self.optimizer = tuned.prepare(model, optimizer)
        self.batches = Batches(torch.utils.data.DataLoader(
            bench.train, batch_size=tuned.batch_size, shuffle=True, drop_last=True,
            generator=torch.Generator().manual_seed(seed), **tuned.dataloader_kwargs))
        self._rng = torch.get_rng_state()  # the arm's own: dropout draws the same whatever the other arms do
        self.phases = Phases(self.optimizer, enabled=tuned.device == "cpu")
        if tuned.device == "cuda":
            self._cuda_rng, self._sync = torch.cuda.get_rng_state(), torch.cuda.synchronize

    @property
    def step_samples(self) -> int:
        return self.tuned.step_samples if self.tuned is not None else 0

    @property
    def step_s(self) -> float | None:
        """A normal optimizer step: from the windows' median rate, before any window the warm-up's median."""
        if self.rates:
            return self.step_samples / statistics.median(self.rates)
        return statistics.median(self._warm_steps) if self._warm_steps else None

    def recent_s_per_sample(self, windows: int = 8) -> float | None:
        """Seconds per sample over its last ``windows`` windows (their median; before any, its warm-up steps': a new
        environment's worker): the reference a new arm's first steps are judged against (``HOPELESS``). The latest:
        on a shared VM a window's speed moves with the neighbours' load (calibration windows read 30x slower)."""
        recent = self.rates[-windows:]
        return 1 / statistics.median(recent) if recent else (self.step_s or 0.0) / max(1, self.step_samples) or None

    @property
    def data_wait(self) -> float | None:
        """The share of its windows' time spent waiting for the next batch (``Batches.wait_s``): the input
        pipeline's part of a step, against compute; None before a window."""
        return self.windows_wait_s / self.windows_s if self.windows_s > 0 else None

    @property
    def first_step_s(self) -> float | None:
        return self._first_steps[0] if self._first_steps else None

    @property
    def compiled(self) -> bool:
        return spaces.compilation.compiled(self.params)

    @property
    def compile_s(self) -> float | None:
        """The charged first steps' excess over a normal step, as a trial process charges it (``compile_cost``)."""
        if not self._first_steps or self.tuned is None:
            return None
        return spaces.compilation.compile_cost(self._first_steps, self.step_s or 0.0, self.params.get("compile_mode"),
                                               self.tuned.device)

    def status(self) -> ArmStatus:
        return ArmStatus(
            arm=self.name, state=self.state, error=self.error, step_samples=self.step_samples, trained=self.trained,
            first_step_s=self.first_step_s, step_s=self.step_s, compile_s=self.compile_s, loss=self.loss,
            loss_samples=self.loss_samples, wide_loss=self.wide_loss, held_out=self._held_out(),
            worker_pids=self.batches.worker_pids(), in_effect=self.in_effect,
            warnings=tuple(self.tuned.warnings if self.tuned is not None else ()), peak_memory_bytes=self.memory.peak,
            settle_steps=self.settle_steps, gave_up=self.gave_up, data_wait=self.data_wait,
            phases=self.phases.shares(self.windows_s))

    def _held_out(self) -> tuple[int, int] | None:
        held_out, wide = self.bench.held_out, self.bench.wide_held_out
        return (len(held_out), len(wide)) if self.wide and held_out is not None and wide is not None else None

    # Activation: what an arm owns of the process while its window runs ------------------------------------

    def _enter(self) -> None:
        import torch

        if self.state != "ok":
            raise ArmFailed(self.name, self.state, self.error or "failed earlier")
        spaces.cuda.set_flags(self.params)  # TF32: every model of the process reads the process's flags
        spaces.matmul.set_flags(self.params)  # oneDNN's float32 matmuls: as process-global
        if self._rng is not None:
            torch.set_rng_state(self._rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state(self._cuda_rng)
        self.memory.enter()
        signal_all(self.batches.worker_pids(), signal.SIGCONT)

    def _leave(self) -> None:
        import torch

        self._rng = torch.get_rng_state()
        if self._cuda_rng is not None:
            self._cuda_rng = torch.cuda.get_rng_state()
        self.memory.leave()
        pids = self.batches.worker_pids()
        signal_all(pids, signal.SIGSTOP)
        wait_stopped(pids)  # stopped before the next arm's window starts, not when they next get a core

    def _guarded(self, run: Callable[[], Any]) -> Any:
        """``run()`` with the arm active; its failure fails this arm alone (and releases what it holds)."""
        self._enter()
        try:
            return run()
        except Exception as e:  # noqa: BLE001 - any failure of the workload is this arm's, recorded
            failed = failure(e)  # classified as a trial process's (cuBLAS/cuDNN allocation failures: out of memory)
            state, message = cast(ArmState, str(failed.status)), failed.error or type(e).__name__
            # the failed step's tensors live on in the traceback's frames: freed before close() empties the cache
            traceback.clear_frames(e.__traceback__)
            self._fail(state, message, e)
        finally:
            if self.state == "ok":
                self._leave()
        raise AssertionError("unreachable")  # pragma: no cover - _fail raises

    def _fail(self, state: ArmState, message: str, error: BaseException) -> None:
        self.state, self.error = state, message
        self.close()
        raise ArmFailed(self.name, state, message) from error

    def close(self) -> None:
        """Continue and shut down its DataLoader workers; release the model (and GPU memory)."""
        self.batches.close()
        self.phases.close()
        self.model = self.optimizer = None
        if self.tuned is not None and self.tuned.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    # Training -------------------------------------------------------------------------------------------

    def _step(self) -> Any:
        tuned, workload, phases = self.tuned, self.bench.workload, self.phases
        stepped, loss = False, None
        while not stepped:
            started = time.perf_counter()
            batch = tuned.to_device(*self.batches.next())
            loaded = time.perf_counter()
            self.trained += len(batch[0])
            with tuned.autocast():
                loss = workload.loss(self.model(*workload.model_inputs(batch)), batch)
            forward_done = time.perf_counter()
            stepped = tuned.step(loss, self.optimizer)
            phases.add(started, loaded, forward_done, time.perf_counter(), stepped)
        return loss

    @staticmethod
    def _check(loss: Any) -> None:
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteLoss(f"the loss became {value}")

    def _loss_if_due(self, loss: Any) -> float:
        """Take the loss if this step reached ``loss_samples``; returns the seconds it took (0 if not due)."""
        if self.loss is not None or self.trained < self.bench.spec.loss_samples:
            return 0.0
        self._sync()
        start = time.perf_counter()
        self._check(loss)
        bench = self.bench
        self.loss, self.loss_samples = evaluate(bench.workload, self.tuned, self.model, bench.held_out), self.trained
        if self.wide:
            self.wide_loss = evaluate(bench.workload, self.tuned, self.model, bench.wide_held_out)
        self._sync()
        return time.perf_counter() - start

    def warm_up(self) -> None:
        """Build the arm, then the first step (compilation: timed alone) and the other warm-up steps."""
        def run() -> None:
            self._build()
            self._warm_up()

        self._guarded(run)

    def _warm_up(self) -> None:
        loss = None
        # the steps that may hold compile work (CUDA-graph capture: steps 2-3) are warm-up, never a window's
        charged = max(1, spaces.compilation.charged_steps(self.params.get("compile_mode"), self.tuned.device))
        floor_s = WINDOW_FLOOR_S.get(self.tuned.device, WINDOW_FLOOR_S["cpu"])
        judge = Judge(*self.give_up, floor_s) if self.give_up is not None and self.step_samples else None
        builds = self.compiled or self.tuned.device == "cuda"  # an unbounded build in its first steps: not judged
        steps, index = max(charged + (judge is not None and builds), self.bench.spec.warmup_steps), 0
        while index < steps or (judge is not None and judge.pending):
            self._sync()
            start = time.perf_counter()
            loss = self._step()
            self._sync()
            spent = time.perf_counter() - start
            (self._first_steps if index < charged else self._warm_steps).append(spent)
            self._loss_if_due(loss)
            loader = self.batches.loader
            if judge is not None and judged_step(index, charged, builds, loader.num_workers, loader.prefetch_factor):
                self.gave_up = judge.step(spent, self.step_samples, first=index < charged)
                if self.gave_up is not None:
                    break
            index += 1
        if not self.bench.settled and self.gave_up is None:  # a hopeless arm is ended: nothing to settle for
            settled = self._settle()
            loss = settled if settled is not None else loss
            self.bench.settled = True
        self._check(loss)
        self.in_effect = {**in_effect(), **self.tuned.in_effect}  # with this arm's process-global flags set

    def _settle(self) -> Any:
        """The process's first arm trains on, untimed, until ``SETTLE_S`` or ``SETTLE_STEPS`` (see there);
        returns the last loss (None when no step was needed)."""
        loss, steps, start = None, 0, time.perf_counter()
        while steps < SETTLE_STEPS and time.perf_counter() - start < SETTLE_S:
            loss = self._step()
            steps += 1
            self._loss_if_due(loss)
        self._sync()
        self.settle_s, self.settle_steps = time.perf_counter() - start, steps
        return loss

    def window(self, window_s: float, idle: Sequence[Arm] = ()) -> WindowRecord:
        """Whole steps until at least ``window_s`` seconds (evaluation excluded) have passed."""
        return self._guarded(lambda: self._window(window_s, idle))

    def _window(self, window_s: float, idle: Sequence[Arm]) -> WindowRecord:
        self._sync()
        start, excluded, steps, samples = time.perf_counter(), 0.0, 0, self.trained
        waited = self.batches.wait_s
        self.phases.start()
        while True:
            loss = self._step()
            steps += 1
            excluded += self._loss_if_due(loss)
            if time.perf_counter() - start - excluded >= window_s:
                self._sync()  # on a GPU the host runs ahead: the window ends when the device is done
                if time.perf_counter() - start - excluded >= window_s:
                    break
        elapsed = time.perf_counter() - start - excluded
        self.phases.stop()
        idle_workers = {str(pid): proc_state(pid) for arm in idle for pid in arm.batches.worker_pids()}
        if self.loss is None:
            # Until the guard's loss is taken. After it the arm is only timed: an arm trains far past the study's
            # sample count in a long race, and the tiny MLP's defaults diverged to NaN there, failing candidates
            # that had nothing wrong (the quality guard judges every arm at the one sample count).
            self._check(loss)
        samples = self.trained - samples
        self.rates.append(samples / elapsed)
        self.windows_s += elapsed
        self.windows_wait_s += min(elapsed, self.batches.wait_s - waited)
        return WindowRecord(self.name, samples / elapsed, steps, samples, elapsed, idle_workers)

    def profile(self, seconds: float) -> tuple[tuple[str, float], ...]:
        """Its top operators over ``seconds`` of untimed training (``phases.profiled``); none on a GPU (``phases``)."""
        return self._guarded(lambda: profiled(lambda: self._loss_if_due(self._step()), seconds)) \
            if self.phases.enabled else ()

    def recompile(self) -> None:
        """One untimed step: after the compiler's caches were cleared for another arm, this compiled arm compiles
        again now rather than in its next window."""
        def run() -> None:
            self._loss_if_due(self._step())
            self._sync()

        self._guarded(run)

    def ensure_loss(self) -> None:
        """Train (untimed) up to ``loss_samples`` if not there yet, and take the loss."""
        def run() -> None:
            while self.loss is None:
                self._loss_if_due(self._step())

        self._guarded(run)
