"""A recorded paired grid (``RecordedGrid``, its JSON file) and its combinations (``GridConfig``).

``benchmarks/search_quality.py`` measures every combination of a reduced space once, paired, with the
engine the search uses live (``PairedWorker``, ``across_processes``), and writes a ``RecordedGrid`` (JSON):
per combination every recorded per-pair ratio against its environment's defaults (compile time amortised
over ``train_steps``, as ``stats.compare`` does), its loss at the study's sample count, and, for a
combination in another environment than the defaults', the per-process-pair factors of that environment's
defaults over the defaults. ``replay.ReplayMeasurer`` answers a search from it. A combination's recorded
measurements are split at random by the replay's seed (``GridConfig.split``): the search's half and the
confirmation's, so the measurements that chose a candidate take no part in confirming it.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AutotuneError
from ..measure import combine, stats
from ..measure.live.candidate import round_factor
from ..measure.live.process_pair import PROCESS_PAIRS

FORMAT = "autotune-paired-grid-v1"


# Knobs renamed since a grid was recorded: recorded name -> today's. With one process, the batch a process
# loads (``batch_per_rank``, recipe format 2) is the recorded ``batch_size``.
RENAMED = {"batch_size": "batch_per_rank"}


class GridMiss(AutotuneError):
    """A combination the recorded grid does not hold."""


@dataclass(frozen=True)
class GridConfig:
    """One combination as recorded: its searched knobs' values and what the paired engine measured."""

    params: dict[str, Any]  # the searched knobs only; every other knob is the grid's ``defaults``
    state: str = "ok"  # "ok", or how its arm failed ("oom", "nan", "crash": ``protocol.ArmState``)
    error: str | None = None
    ratios: list[float] = field(default_factory=list)  # per pair, amortised, against its environment's defaults
    process_pair_factors: list[float] = field(default_factory=list)  # its environment over the defaults'; [] same
    loss: float | None = None
    loss_samples: int | None = None
    window_s: float = 0.0
    warmup_s: float = 0.0  # building and warming up its arm (compile included)
    compile_s: float | None = None
    step_s: float | None = None
    data_wait: float | None = None  # the share of its windows spent waiting for data (``Arm.data_wait``)

    def split(self, confirming: bool, seed: object = 0) -> tuple[list[float], list[float]]:
        """The ratios and process-pair factors the search draws from, or (``confirming``) the confirmation, split
        at random by ``seed`` (the replay's): half the ratios each (the search's rounded up); of the process pairs,
        as many as a live search's first round runs (``PROCESS_PAIRS``), at most half, rounded up, the search's, the
        rest the confirmation's (one recorded factor: the search's alone). Recorded in time order, a split by order
        gave one side a VM's minutes-long speed state."""
        rng = random.Random(f"split:{seed}:{json.dumps(self.params, sort_keys=True, default=str)}")
        ratios = rng.sample(self.ratios, len(self.ratios))
        half = len(ratios) - len(ratios) // 2
        ratios = ratios[half:] if confirming else ratios[:half]
        factors = self.process_pair_factors
        if len(factors) < 2:
            return ratios, ([] if confirming else factors)
        factors = rng.sample(factors, len(factors))
        cut = min(PROCESS_PAIRS[0], len(factors) - len(factors) // 2)
        return ratios, (factors[cut:] if confirming else factors[:cut])

    def environment(self, confirming: bool = False, confidence: float = stats.CONFIDENCE,
                    held: float | None = None, seed: object = 0) -> stats.Interval | None:
        """Its environment's factor over the defaults' (None: the defaults' environment); confirming, a round's:
        the held-out process pair ``held`` (default: the first held out), the search's pairs lending its spread."""
        if not self.process_pair_factors:
            return None
        factors = self.split(confirming, seed)[1]
        if confirming and len(self.process_pair_factors) >= 2:
            own = round_factor(factors[0] if held is None else held, self.split(False, seed)[1], None)
            return stats.at_confidence(own, confidence)
        return stats.log_mean_interval(factors, confidence)

    def speedup(self, ratios: list[float] | None = None, confirming: bool = False,
                confidence: float = stats.CONFIDENCE, held: float | None = None, seed: object = 0) -> stats.Interval:
        """The speedup over the defaults from ``ratios``, with its interval; by default from everything recorded,
        every ratio and every process pair (the grid's own measurement, which scores a recipe)."""
        if ratios is None:
            env = stats.log_mean_interval(self.process_pair_factors, confidence) if self.process_pair_factors else None
            drawn = self.ratios
        else:
            env, drawn = self.environment(confirming, confidence, held, seed), ratios
        return stats.median_interval(drawn, confidence) if env is None else combine(env, drawn, confidence)


@dataclass(frozen=True)
class RecordedGrid:
    """A paired grid as recorded (see the module docstring); ``load``/``save`` are its JSON file."""

    workload: str
    searched: list[str]
    defaults: dict[str, Any]  # every knob and run setting of the defaults, as the search passes them
    noise: dict[str, Any]  # ``spec.Noise`` of the defaults' worker's A/A calibration
    configs: list[GridConfig]
    note: str = ""  # where and how it was recorded (machine, load average)
    recorded: dict[str, Any] = field(default_factory=dict)  # settings, wall time, load average
    format: str = FORMAT
    # The recording machine's probed facts (``Facts.to_dict``): a replay searches that machine's space (bf16
    # autocast is offered only where its CPU has AVX512-BF16 or AMX). Empty in a grid recorded before.
    facts: dict[str, Any] = field(default_factory=dict)

    def key(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """The values of the searched knobs in ``params``, a knob renamed since the recording read under its
        new name (``RENAMED``)."""
        return tuple(knob_value(params, k) for k in self.searched)

    def searched_names(self) -> set[str]:
        """The searched knobs, under their recorded names and their new ones: the search must not fix them."""
        return {*self.searched, *(RENAMED[k] for k in self.searched if k in RENAMED)}

    def find(self, params: dict[str, Any]) -> GridConfig:
        """The recorded combination of ``params``; ``GridMiss`` when a knob the grid holds fixed differs, or
        the combination was not recorded."""
        searched = self.searched_names()
        fixed = [f"{k}={params[k]!r} (grid: {v!r})" for k, v in self.defaults.items()
                 if k not in searched and k in params and params[k] != v]
        if fixed:
            raise GridMiss(f"the grid holds these knobs fixed: {', '.join(fixed)}")
        for config in self.configs:
            if self.key(config.params) == self.key(params):
                return config
        raise GridMiss("not in the recorded grid: " + ", ".join(f"{k}={params.get(k)!r}" for k in self.searched))

    def scores(self, max_loss_increase: float | None = None) -> dict[tuple[Any, ...], float]:
        """Each feasible combination's speedup over the defaults from all its recorded ratios: ok, and (with
        ``max_loss_increase``) a loss at most that much above the defaults'. The defaults are the reference,
        1.0 exactly (their recorded copy's ratios are an A/A: noise, not a speed)."""
        home = self.key(self.defaults)
        base = self.find(self.defaults).loss
        out = {home: 1.0}
        for c in self.configs:
            if c.state != "ok" or not c.ratios or self.key(c.params) == home:
                continue
            if max_loss_increase is not None and base is not None and c.loss is not None \
                    and (c.loss - base) / abs(base) > max_loss_increase:
                continue
            out[self.key(c.params)] = c.speedup().median
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecordedGrid:
        if data.get("format") != FORMAT:
            raise AutotuneError(f"not a recorded paired grid (format {data.get('format')!r}, expected {FORMAT!r})")
        return cls(**{**data, "configs": [GridConfig(**c) for c in data["configs"]]})

    @classmethod
    def load(cls, path: str | Path) -> RecordedGrid:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise AutotuneError(f"cannot read the recorded grid {path}: {e}") from e

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def knob_value(params: dict[str, Any], key: str) -> Any:
    """A searched knob's value, under its recorded name or its new one (``RENAMED``)."""
    return params.get(key, params.get(RENAMED.get(key, key)))


__all__ = ["FORMAT", "RENAMED", "GridConfig", "GridMiss", "RecordedGrid", "knob_value"]
