"""Which trial a search measures next, and when: the seeds, the sampled trials' turns, the in-process turn, the
input-bound seeds, the combination, and the budget's end (``SearchLoop``'s ``turns``)."""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..measure import PROCESS_PAIRS, PairedMeasurer, environment_differences, environment_keys, paired_method
from ..trial.spec import Status, TrialResult
from . import budget, reserve, verdict
from .combinations import (
    combination,
    enqueue_combination,
    extension,
    interaction_seeds,
    prospective_combination,
    winner_combined,
)
from .events import Phase, Progress
from .records import BASELINE, COMBINED, CONFIRM, IN_PROCESS, MEASURED, SEARCH, Attr, params_key, records
from .seeds import Seed, input_first, next_seed, promising

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts
    from .budget import Budget
    from .options import SearchOptions

DUPLICATES_YIELD = 5  # consecutive samples of measured recipes after which the in-process turn gives way
IN_PROCESS_WEIGHT = 2.0  # sampled trials that start no process get this many times the time of those that do
# while seeds remain, the least share of sampled trials after every candidate but the first (exact: no rounding)
SAMPLED_SHARE = Fraction(1, 3)
Prospect = tuple[TrialResult, dict[str, Any]]  # a candidate as the reserve prices it (``Turns._prospect``)


def fresh_processes(measurer: PairedMeasurer | None) -> bool:
    """Whether every trial ``measurer`` measures starts processes of its own (script mode's): none is cheaper (the
    live measurer's, None, does not)."""
    return measurer is not None and measurer.fresh_processes


class Turns:
    """Chooses the next trial of a ``SearchLoop`` and when it goes: holds the seeds still to measure and what the
    turns have read; reads the loop's study, budget and measurer, which it shares."""

    def __init__(self, study: optuna.Study, facts: Facts, ctx: spaces.SpaceContext, options: SearchOptions,
                 budget: Budget, defaults: dict[str, Any], seeds: list[Seed], measurer: PairedMeasurer,
                 run_settings: dict[str, Any], notify: Progress, outside_sampler: bool) -> None:
        self.study, self.facts, self.ctx, self.options, self.budget = study, facts, ctx, options, budget
        self.defaults, self.measurer, self.run_settings, self.notify = defaults, measurer, run_settings, notify
        self.seeds = seeds  # (role, params) measured first, in order (``autotune.study.seeds``)
        self.duplicates = 0  # consecutive samples of a recipe measured before (``verdict.measured_before``)
        self.input_read = False  # whether the baseline's wait for data was read (``seed_the_input``)
        self.interactions_read = False  # whether the interactions joined the seeds (``seed_the_interactions``)
        self.gave_way: str | None = None  # the environment's seed that gave its turn to a promising one, by key
        self.outside_sampler = outside_sampler  # a sampler given to ``search()`` (a benchmark's) picks every trial

    def estimate_s(self, compile_mode: str | None = None) -> float | None:
        """How long one full trial will likely take (``budget.estimate_s``)."""
        return budget.estimate_s(self.study, compile_mode)

    def next_estimate_s(self) -> float | None:
        """How long the next trial will likely take, by its kind: the trial waiting, else what goes ahead of the seeds
        (``_ahead``), else the next seed, else the combination, else a trial of role ``in-process`` on its turn
        (``in_process_turn``), else one Optuna samples, which nearly always changes an environment knob. One that
        compiles: as that compile mode's trials (``budget.estimate_s``); one that starts no process (``warm``): as
        those (``budget.in_process_estimate_s``); else as those that started processes (``budget.started_estimate_s``).
        None before the calibration."""
        general = self.estimate_s()
        if general is None:
            return None
        waiting = self.waiting()
        if not waiting and self.sampled_turn():
            return self._cheap_estimate_s() or general
        seed, ahead = next_seed(self.study, self.seeds), self._ahead()
        params = ({**self.defaults, **waiting[0].system_attrs.get("fixed_params", {})} if waiting
                  else ahead[1] if ahead is not None
                  else seed[1] if seed is not None
                  else self._combined())
        if params is None and self.in_process_turn():
            return self._cheap_estimate_s()
        if params is None:
            return budget.started_estimate_s(self.study)
        mode = params.get("compile_mode") or "none"
        if mode != "none":
            return budget.estimate_s(self.study, mode) or general
        return self._cheap_estimate_s() if self._warm(params) else budget.started_estimate_s(self.study)

    def _cheap_estimate_s(self) -> float | None:
        """A trial that starts no process (``budget.in_process_estimate_s``); None where every trial starts some
        (``fresh_processes``): read as cheap there, a trial would take the time its confirmation's rounds need."""
        return None if fresh_processes(self.measurer) else budget.in_process_estimate_s(self.study)

    def fill(self, available: float) -> bool:
        """The budget's end, where a typical trial no longer fits before the time kept for the confirmation but one
        that starts no process still may (``budget.in_process_estimate_s``; a measurer's ``warm``): enqueue one and
        return True: the combination where it goes ahead (``_combined``) and is one, else the first seed not taken
        that is one, else the combination if it is one, else a trial of role ``in-process`` (``enqueue_in_process``).
        False when none fits, or a trial already waiting would start one."""

        cheap = self._cheap_estimate_s()
        if cheap is None or available < cheap or self.outside_sampler:  # its next sample may start processes
            return False
        waiting = self.waiting()
        if waiting:
            return self._warm({**self.defaults, **waiting[0].system_attrs.get("fixed_params", {})})
        if self.sampled_turn():
            self.enqueue_in_process()
            return True
        ahead, seed, combined = self._combined(True), next_seed(self.study, self.seeds, self._warm), self._combined()
        if ahead is not None and self._warm(ahead):
            self.study.enqueue_trial(ahead, user_attrs={Attr.ROLE: COMBINED})
        elif seed is not None:
            self.study.enqueue_trial(seed[1], user_attrs={Attr.ROLE: seed[0]})
        elif combined is not None and self._warm(combined):
            self.study.enqueue_trial(combined, user_attrs={Attr.ROLE: COMBINED})
        else:  # a sample that repeats a measured recipe is skipped at once: asking again costs nothing, and
            self.enqueue_in_process()  # MAX_SKIPS of them in a row end the search (False here would leave time unused)
        return True

    def _combined(self, ahead: bool = False) -> dict[str, Any] | None:
        """The combination (``combinations.combination``; ``ahead``: one to go before the seeds left); none unseeded."""
        return combination(self.study, self.facts, self.ctx, self.options.fixed, ahead) if self.options.seeded else None

    def enqueue_combined(self) -> bool:
        """Enqueue ``_combined`` unless a trial is waiting (``combinations.enqueue_combination``); True if one was."""
        return self.options.seeded and enqueue_combination(self.study, self.facts, self.ctx, self.options.fixed)

    def _ahead(self) -> Seed | None:
        """What goes before the seeds left: the combination where its environment's gain was measured
        (``_combined(ahead=True)``), but first a seed that may make its in-process part faster
        (``combinations.extension``: an arm of the defaults' worker, as cheap as the combination's look) where the
        combination's look and the time kept with it counted still fit after it; None otherwise."""
        combined = self._combined(ahead=True)
        if combined is None:
            return None
        first, look = extension(self.study, self.seeds, self.asked), self._cheap_estimate_s()
        if first is None or look is None or self.budget.left() - look < self._combination_needs_s(combined, look):
            return COMBINED, combined
        return first

    def _combination_needs_s(self, params: dict[str, Any], look: float) -> float:
        """The combination's first look (an arm) and the time kept for the confirmation with it counted
        (``reserve.reserve_s``'s ``racing``)."""
        prospect = [self._prospect(self.asked(params), look)]
        return look + reserve.reserve_s(self.study, self.options, None, racing=prospect)

    def enqueue_ahead(self) -> bool:
        """Enqueue ``_ahead`` unless a trial is waiting; True if one was."""
        ahead = None if self.waiting() else self._ahead()
        if ahead is not None:
            self.study.enqueue_trial(ahead[1], user_attrs={Attr.ROLE: ahead[0]})
        return ahead is not None

    def ready_next(self) -> None:
        """Before the next trial is chosen and estimated: the seeds the measured trials call for (``seed_the_input``,
        ``seed_the_interactions``), then an environment's seed enqueued where it is due (``environment_seed_due``),
        else the combination where it is (``combination_due``)."""
        self.seed_the_input()
        self.seed_the_interactions()
        if not self.environment_seed_due():
            self.combination_due()

    def environment_seed_due(self) -> bool:
        """Enqueue the next seed that changes the environment (the heuristic, then its allocator alone) ahead of its
        turn where one more trial that starts no process would leave it too little time: its first look
        (``budget.started_estimate_s``) and the time kept for the confirmation with it counted (``reserve.reserve_s``'s
        ``racing``: its rounds, a round's process pair priced as one of its first look's, and the claim's pairs of your
        runs), and its combination's where an in-process winner would make one
        (``combinations.prospective_combination``: its first look an arm of the environment's worker, its rounds' own
        windows), while the seed alone still fits. True if it was. In a sampled trial's turn it takes that turn; ahead
        of a seed's (``Attr.AHEAD``), only where that seed may wait (``_displaced_fits``), and that seed keeps the
        next turn (``sampled_turn``); where it may not, that seed goes first and this one takes the turn after it
        wherever the loop admits it (``gave_way``), or gives way again to the next promising seed. Where the
        confirmation's top is full, its own rounds are not counted (``reserve_s``). One that does not fit now keeps
        its turn (taken first, it takes a short search's time from the in-process seeds that may hold the gain); its
        combination is counted (docs/search.md)."""
        gave_way, self.gave_way = self.gave_way, None  # for the next call only
        if self._no_turn_ahead():
            return False
        seed, sampled = next_seed(self.study, self.seeds, lambda params: not self._warm(params)), self.sampled_turn()
        if seed is None or (seed == next_seed(self.study, self.seeds) and not sampled) \
                or self._combined(ahead=True) is not None:
            return False  # none, or it is next anyway, or the combination goes first (this is asked again after it)
        first, upcoming = budget.started_estimate_s(self.study), self.next_estimate_s()
        if first is None or upcoming is None:  # not calibrated
            return False
        params = self.asked(seed[1])
        alone = [self._prospect(params, first)]
        needs = first + reserve.reserve_s(self.study, self.options, None, racing=alone)
        then, looks_s = self._combination_plan(seed[1])
        both = needs if not then else first + looks_s + reserve.reserve_s(
            self.study, self.options, None, racing=[*alone, *then])
        if not self._goes_now(first, needs, both, upcoming) \
                and not (gave_way == params_key(seed[1]) and self._admitted(first)):
            return False
        if not sampled and not self._displaced_fits(first, alone, then, looks_s):
            self.gave_way = params_key(seed[1])  # to a promising seed: the next call may take it, though late
            return False
        # ahead of a seed's turn, not a sample's: that seed keeps its turn, next (``sampled_turn``)
        ahead = {} if sampled else {Attr.AHEAD: True}
        self.study.enqueue_trial(seed[1], user_attrs={Attr.ROLE: seed[0], **ahead})
        return True

    def _displaced_fits(self, first: float, alone: list[Prospect], then: list[Prospect], looks_s: float) -> bool:
        """Whether the seed an environment's seed would go ahead of (``displaced``) may wait: it is not ``promising``,
        or still fits after it, its look and the time kept with it counted beside the environment's and its plan's.
        A precision whose kernels ran faster is the likeliest gain: taken second, it got no look in a 3-minute demo."""
        moved, moved_s = self.displaced(bool(then))
        if not moved or not promising(self.study, moved[0][1], {**self.defaults, **self.options.fixed}):
            return True
        return first + looks_s + moved_s + reserve.reserve_s(
            self.study, self.options, None, racing=[*alone, *moved, *then]) <= self.budget.left()

    def combination_due(self) -> bool:
        """Enqueue the combination (``_combined``) ahead of the trial that would go before it (a sampled trial's turn,
        a seed) where its environment's worker is warm and one more trial would leave it too little time for its
        first look (an arm) and the time kept for the confirmation with it counted (``reserve.reserve_s``'s
        ``racing``), while that still fits. True if it was. Where a seed may make its in-process part faster
        (``combinations.extension``), that seed goes first, one look earlier, while both looks fit."""
        if self._no_turn_ahead():
            return False
        params = self._combined()
        if params is None or not self._warm(params) or next_seed(self.study, self.seeds) is None:
            return False  # none, or one whose first look starts processes, or it is next anyway
        look, upcoming = self._cheap_estimate_s(), self.next_estimate_s()
        if look is None or upcoming is None:
            return False
        needs = self._combination_needs_s(params, look)
        first = extension(self.study, self.seeds, self.asked)
        if first is not None and self._goes_now(look, look + needs, look + needs, upcoming):
            self.study.enqueue_trial(first[1], user_attrs={Attr.ROLE: first[0]})
        elif self._goes_now(look, needs, needs, upcoming):
            self.study.enqueue_trial(params, user_attrs={Attr.ROLE: COMBINED})
        else:
            return False
        return True

    def _no_turn_ahead(self) -> bool:
        """No trial goes ahead of its turn (``environment_seed_due``, ``combination_due``): without a budget, where
        every trial starts processes, while one waits, or where a sampler given to ``search()`` picks every trial."""
        return (self.options.budget_s is None or fresh_processes(self.measurer) or bool(self.waiting())
                or self.outside_sampler)

    def _goes_now(self, first: float, alone: float, together: float, upcoming: float) -> bool:
        """Whether a trial whose first look takes ``first`` goes ahead of its turn now: after one more trial
        (``upcoming``) too little would be left for ``together`` (its look, what it brings, the time kept with them
        counted), while it fits now ``alone`` and the loop's own check (the time kept for the contenders alone)
        admits it: refused there, it would wait unmeasured. ``together`` may be less than ``alone``: one more
        candidate can lower the rounds the reserve keeps (``reserve.kept_rounds``)."""
        left = self.budget.left()
        return left - upcoming < max(alone, together) and alone <= left and self._admitted(first)

    def _admitted(self, first: float) -> bool:
        """Whether the loop admits a trial whose look takes ``first`` beside the contenders' time (``reserve_s``)."""
        left = self.budget.left()
        return left - reserve.reserve_s(self.study, self.options, first, left=left) >= first

    def following(self, params: dict[str, Any], role: str) -> tuple[list[Prospect], float]:
        """What follows a seed of another environment where an in-process winner would combine with it and none with
        that winner was measured (``combinations.prospective_combination``), as ``environment_seed_due`` counted it
        (``_combination_plan``); nothing otherwise (a sampled trial's combination would have to beat the fastest
        environment measured): its race must not take that time."""
        if not self.options.seeded or role in (SEARCH, IN_PROCESS, COMBINED) \
                or not environment_differences(self.defaults, params) or winner_combined(self.study):
            return [], 0.0
        return self._combination_plan(params)

    def displaced(self, planned: bool) -> tuple[list[Prospect], float]:
        """The seed an environment's seed went ahead of (``Attr.AHEAD``: the next seed not taken while it runs) as the
        reserve prices a candidate (``_prospect``), and its look's seconds (none where ``planned``, ``following``, looks
        at it as the extension); nothing where it starts processes, none is cheap, or a sample measured its recipe."""
        seed, look = next_seed(self.study, self.seeds), self._cheap_estimate_s()
        if seed is None or look is None or not self._warm(seed[1]):
            return [], 0.0
        params = self.asked(seed[1])
        if verdict.measured_before(self.study, params) is not None:
            return [], 0.0
        counted = planned and extension(self.study, self.seeds, self.asked) == seed
        return [self._prospect(params, look)], 0.0 if counted else look

    def _combination_plan(self, environment: dict[str, Any]) -> tuple[list[Prospect], float]:
        """The combination an environment would make (``combinations.prospective_combination``) as the reserve prices it
        (``_prospect``), and the seconds of its look and of the look of the seed that goes before it
        (``combinations.extension``, ``_ahead``); nothing where it would make none or no trial is cheap."""
        look = self._cheap_estimate_s()
        joined = prospective_combination(self.study, self.facts, self.ctx, self.options.fixed, environment)
        if look is None or joined is None:
            return [], 0.0
        looks = 1 + (extension(self.study, self.seeds, self.asked) is not None)
        return [self._prospect(self.asked(joined), look)], looks * look

    def _prospect(self, params: dict[str, Any], wall_s: float) -> Prospect:
        """A candidate not measured yet as the reserve prices its rounds (``reserve_s``'s ``racing``): its first
        look's time and process pairs, measured as its params say (``paired_method``), and its params."""
        return TrialResult(Status.OK, wall_s=wall_s, timed_s=0.0, pairs=PROCESS_PAIRS[0],
                           method=paired_method(params, self.defaults)), params

    def seed_the_input(self) -> None:
        """Once the baseline is measured, read how much of its step waits for data (``TrialResult.data_wait``):
        where the input bounds the step, its seeds go first (``seeds.input_first``)."""
        if self.input_read or not self.options.seeded:  # the sampler alone: no seed of any kind
            return
        base = next((r for r in records(self.study) if r.role == BASELINE and r.result.status == Status.OK), None)
        if base is None:
            return
        self.input_read = True
        found = input_first(self.seeds, base.result.data_wait, self.facts, self.ctx, self.options.fixed)
        if found is None:
            return
        self.seeds = found
        self.notify(Phase("input-bound", None, f"the defaults wait for data {base.result.data_wait:.0%} of a step: "
                                               "DataLoader workers and the threads they leave are measured first"))

    def seed_the_interactions(self) -> None:
        """Once every seed and the combination are measured and an in-process recipe beats the defaults: that recipe
        with the changes that may pay only beside it (``combinations.interaction_seeds``) join the seeds, once, and
        take their turns with the sampled trials (``sampled_turn``): no single-change seed makes them."""
        if self.interactions_read or not self.options.seeded or next_seed(self.study, self.seeds) is not None \
                or self.waiting() or combination(self.study, self.facts, self.ctx, self.options.fixed) is not None:
            return  # the combination first: its environment's factor is measured, its worker may be alive
        found = interaction_seeds(self.study, self.facts, self.ctx, self.options.fixed)
        if found:
            self.interactions_read = True
            self.seeds = [*self.seeds, *found]

    def sampled_turn(self) -> bool:
        """Whether a trial Optuna samples goes before the next seed: while seeds remain, whenever a seed next would
        leave fewer than ``SAMPLED_SHARE`` of the candidates sampled (the warm start, the heuristic and the
        combination count as seeds): seed, sample, seed, sample, then two seeds to a sample. An environment's seed that
        went ahead of a seed's turn (``environment_seed_due``) is neither counted nor in that third: the seed it went
        before comes next, as it would have (its race kept that seed's time: ``displaced``). The turn is taken by an
        in-process trial (``enqueue_in_process``); it goes before the combination too (docs/search.md)."""
        if next_seed(self.study, self.seeds) is None:
            return False
        seeded = sampled = 0
        for t in self.study.get_trials(deepcopy=False):
            role, status = t.user_attrs.get(Attr.ROLE), t.user_attrs.get(Attr.STATUS)
            if role in (SEARCH, IN_PROCESS) and (status in MEASURED or status == Status.DUPLICATE):
                sampled += 1  # a sample of a recipe measured before took its turn too (or a small space loops)
            elif role not in (BASELINE, CONFIRM, SEARCH, IN_PROCESS) and status in MEASURED \
                    and not t.user_attrs.get(Attr.AHEAD):
                seeded += 1
        return seeded > 0 and sampled < SAMPLED_SHARE * (seeded + sampled + 1)

    def in_process_turn(self) -> bool:
        """Whether the next sampled trial should start no process: the search's candidates that started none
        have taken less than ``IN_PROCESS_WEIGHT`` x as long as those that started processes (another
        environment's process pairs, ``processes`` > 1), so the in-process knobs, in the best warm environment, get
        twice the environments' time (docs/search.md). The turn gives way once ``DUPLICATES_YIELD`` samples in a row
        were recipes measured before: a sample Optuna draws freely comes next. Never for a sampler given to
        ``search()`` (``outside_sampler``): a benchmark's random search or plan would not follow its own."""
        if self.outside_sampler or self.duplicates >= DUPLICATES_YIELD or fresh_processes(self.measurer):
            return False  # a measurer that starts processes for every trial (script mode's) has no cheap ones
        started = not_started = 0.0
        for r in records(self.study):
            if r.role in (BASELINE, CONFIRM):
                continue
            if budget.started_processes(r.result.method, r.result.startup_s):
                started += r.result.wall_s
            else:
                not_started += r.result.wall_s
        return IN_PROCESS_WEIGHT * started > not_started

    def enqueue_in_process(self) -> None:
        """Enqueue a trial of role ``in-process`` (unless one waits already): the environment fixed, the best
        recipe's when the measurer says it is warm (else the defaults'), no compilation, and the in-process knobs
        left to Optuna (in one process, ``spaces.suggest`` gives DDP's settings PyTorch's defaults)."""
        if self.waiting():
            return
        best = verdict.best_record(self.study)
        env = best.params if best is not None and self._warm(best.params) else self.defaults
        params = {**{k: env[k] for k in environment_keys() if k in env}, "compile_mode": "none"}
        if self.measurer is not None and self.measurer.in_place_only:  # script mode's long-lived copy changes no other
            movable = set(spaces.in_place())
            params = {**{k: v for k, v in env.items() if k not in movable}, **params}
        self.study.enqueue_trial({**params, **self.options.fixed}, user_attrs={Attr.ROLE: IN_PROCESS})

    def _warm(self, params: dict[str, Any]) -> bool:
        """Whether a trial of ``params``, read as asked (``asked``: with the run's settings, as its trial will measure
        them; without, every seed read as another environment's), would start no process (the measurer's ``warm``);
        for a measurer that says nothing of its workers, only the defaults' environment."""
        params = self.asked(params)
        warm = self.measurer.warm(params)
        if warm is not None:
            return warm
        return not environment_differences(self.defaults, params) and spaces.processes.count(params) == 1

    def asked(self, params: dict[str, Any]) -> dict[str, Any]:
        """A trial's params as the loop asks them: with the run's settings, a knob another knob makes moot as the
        trial records it (``spaces.as_trial``), and as they run here (``spaces.as_run``: a pinning whose memory
        binding cannot happen asked unbound, as its record will say)."""
        return spaces.as_run(spaces.as_trial({**params, **self.run_settings}, self.facts, self.ctx), self.facts)

    def waiting(self) -> list[optuna.trial.FrozenTrial]:
        """The study's enqueued trials not asked yet (a seed, the combination, an in-process trial)."""
        return [t for t in self.study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
