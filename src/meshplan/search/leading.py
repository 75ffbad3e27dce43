"""A search for the leading plans only: what the conditions of change confirm a change with, and what a sweep
records at each value. Its answer is the full search's (``search.search``), on everything those read.

The full search lists every plan: each structure evaluated in full, then the option variants by their lower
bound (branch and bound). A sweep point reads the recommendation and the best plan of each family; a
condition's confirmation the plans of another layout than the recommendation's, the first and the fastest of
them. Both are read from the ranking after the simulator re-times the leading plans (``search.refine_rounds``:
in rounds, each re-timing the ten best of the ranking before it, its fastest and the best of each family), so
they depend on the plans near the top of those rankings and near the top of each class of plans they read,
not on the thousands of structures far behind.

``search_leading`` therefore evaluates the structures lazily:

1. every structure is probed for memory (``cost.step.fits_at_all``, as ``evaluate(...).feasible`` has it) and
   bounded from below (``cost.bounds.step_time_lower_bound_s``, never above its step time);
2. each family's fastest structure is found by branch and bound on those bounds, so that the option variants
   then run the full search's own branch and bound from the same state (the fastest plan and each family's
   best), and evaluate and prune exactly the variants it does;
3. every other structure is evaluated only where its bound does not rule it out of what is read: in each
   ranking the re-timing goes through, its tie band, its ten best and the fastest plan of the structure's
   family (what that round re-times), and in the last, the fastest plan of the structure's class
   (``classes``: its family for a sweep, other layout or not for a condition). A structure slower than all
   of those cannot change the plans re-timed, the recommendation, nor the first or fastest plan of any
   class. Each is evaluated within a cutoff (``cost.step.evaluate_within``: the estimate
   ``evaluate`` would give where the plan beats the cutoff, else a proof that it does not); as structures join,
   the thresholds are recomputed until none is left to evaluate.

The plans it returns are those of the full search's ranking that beat these thresholds, in the same order,
with the same estimates. ``tests/test_conditions_reuse.py`` compares it with the full search on a set of
scenarios.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields

from meshplan.calibration import compute_params_for
from meshplan.cost.bounds import step_time_lower_bound_s
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate
from meshplan.cost.step import evaluate, evaluate_within, fits_at_all
from meshplan.search.rank import TIE_BAND, rank
from meshplan.search.search import (
    REFINE_TOP,
    _BranchAndBound,
    _no_cyclic_gc,
    enumerate_space,
    refine_rounds,
    retime_all,
    search,
)
from meshplan.search.space import Space, family
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

MARGIN = 1e-9
"""A cutoff's margin above the threshold it serves: a plan at the threshold is evaluated exactly."""


@dataclass(frozen=True, slots=True)
class LeadingResult:
    """The feasible plans of the full search's ranking that ``search_leading`` guarantees (module docstring)."""

    feasible: list[Estimate]
    """Best first, as the full search ranks them after re-timing its leading plans."""
    structures_timed: int = 0
    """Structures evaluated (of ``structures``)."""
    structures: int = 0

    @property
    def recommended(self) -> Estimate | None:
        return self.feasible[0] if self.feasible else None

    def best_by_family(self) -> dict[str, Estimate]:
        out: dict[str, Estimate] = {}
        for e in self.feasible:
            out.setdefault(family(e.plan), e)
        return out


def search_leading(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
                   mfu: float | None = None, refine_top: int = REFINE_TOP,
                   classes: Callable[[Plan], Hashable] = family) -> LeadingResult:
    """The full search's feasible ranking (``search(..., refine_top=refine_top)``, its leading plans re-timed
    by the simulator in this process), as far as its recommendation, its tie band and the first and the
    fastest plan of each class of ``classes`` go (module docstring)."""
    space = space or Space()
    if mfu is not None:  # an assumed MFU rescales compute per plan: no bound, the full search
        full = search(model, cluster, job, space, mfu=mfu, refine_top=refine_top, workers=1)
        return LeadingResult(full.feasible)
    with _no_cyclic_gc():
        return _Leading(model, cluster, job, space, refine_top, classes).run()


class _Leading:
    """``search_leading``'s state: the structures evaluated so far (``timed``), those proven slower than a
    cutoff (``proven``), and the option variants' estimates from the branch and bound."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space, refine_top: int,
                 classes: Callable[[Plan], Hashable]) -> None:
        self.model, self.cluster, self.job, self.refine_top, self.classes = model, cluster, job, refine_top, classes
        self.compute: ComputeParams = compute_params_for(cluster.accelerator.name, job.software)
        self.memory = _memory_facts(model, cluster, job, space, self.compute)
        self.plans, self.variants, self.base_of = self.memory.plans, self.memory.variants, self.memory.base_of
        self.fits = self.memory.fits
        self.bounds = [step_time_lower_bound_s(model, cluster, job, p, self.compute) if ok else math.inf
                       for p, ok in zip(self.plans, self.fits, strict=True)]
        self.timed: dict[int, Estimate] = {}
        self.proven: dict[int, float] = {}
        self.evaluated = 0
        self.refined: dict[int, Estimate] = {}

    def run(self) -> LeadingResult:
        self.family_bests()
        structures = [self.timed[k] for k in sorted(self.timed)]
        n_structures = len(structures)
        bb = _BranchAndBound(self.model, self.cluster, self.job, None, self.compute, self.variants, structures)
        bb.unfit_families_first()
        bb.by_bound([self.fits[k] for k in self.base_of], len(self.plans), lambda i: None, self.memory.unfit_variants)
        variants = bb.results[n_structures:]
        while True:
            rankings = self.ranking(variants)
            todo = self.wanted(rankings)
            if not todo:
                return LeadingResult([e for e in rankings[-1] if e.feasible], self.evaluated, len(self.plans))
            for k, threshold in todo:
                self.time_below(k, threshold)

    def settled(self, k: int, threshold: float) -> bool:
        """Whether structure ``k`` is evaluated, or known to take more than ``threshold`` (its bound, or a
        cutoff it was proven slower than, is above it; ``proven`` infinite: it does not fit)."""
        proven = self.proven.get(k, -math.inf)
        return k in self.timed or self.bounds[k] > threshold or proven > threshold or proven == math.inf

    def time_below(self, k: int, threshold: float) -> None:
        """Evaluate structure ``k`` where its step time may be at most ``threshold``: kept in ``timed`` with
        the estimate ``evaluate`` gives, or proven slower than a cutoff just above the threshold."""
        if self.settled(k, threshold):
            return
        self.evaluated += 1
        if math.isinf(threshold):
            est = evaluate(self.model, self.cluster, self.job, self.plans[k], compute=self.compute,
                           time_infeasible=False)
            if est.feasible:
                self.timed[k] = est
            else:
                self.proven[k] = math.inf
            return
        cutoff = threshold * (1.0 + MARGIN)
        found = evaluate_within(self.model, self.cluster, self.job, self.plans[k], cutoff_s=cutoff,
                                compute=self.compute)
        if found is not None and found.feasible and found.step_time_s < cutoff:
            self.timed[k] = found
        else:
            self.proven[k] = cutoff

    def family_bests(self) -> None:
        """Each family's fastest structures (all those as fast as the fastest), by branch and bound."""
        by_family: dict[str, list[int]] = {}
        for k in sorted((k for k, ok in enumerate(self.fits) if ok), key=lambda k: self.bounds[k]):
            by_family.setdefault(family(self.plans[k]), []).append(k)
        for ks in by_family.values():
            best = math.inf
            for k in ks:
                if self.bounds[k] > best:
                    break
                self.time_below(k, best)
                if k in self.timed:
                    best = min(best, self.timed[k].step_time_s)

    def ranking(self, variants: list[Estimate]) -> list[list[Estimate]]:
        """The closed-form ranking of the plans evaluated (structures in their order, then the variants, a
        variant that settles on its structure's choices ranked once, as the full search does), then the
        rankings of each round of re-timing (search.refine_rounds), the last the answer."""
        seen: set[Plan] = set()
        results = [self.timed[k] for k in sorted(self.timed)] + variants
        closed = rank([e for e in results if not (e.plan in seen or seen.add(e.plan))])
        return refine_rounds(closed, self.refine_top, self.retime)

    def retime(self, todo: list[Estimate]) -> list[Estimate]:
        """``todo`` re-timed by the simulator, each plan once over the rounds of every ranking."""
        new = [e for e in todo if id(e) not in self.refined]
        for e, r in zip(new, retime_all(new, self.compute, 1), strict=True):
            self.refined[id(e)] = r
        return [self.refined[id(e)] for e in todo]

    def wanted(self, rankings: list[list[Estimate]]) -> list[tuple[int, float]]:
        """The structures not yet evaluated whose bound does not rule them out of what is read, each with the
        threshold its step time must beat to matter: in every ranking the re-timing went through, its tie
        band, its ``refine_top``-th plan and the fastest plan of the structure's family (each asks the
        simulator for those: search.to_retime); in the last, the fastest plan of the structure's class."""
        if not any(e.feasible for e in rankings[0]):
            return [(k, math.inf) for k, ok in enumerate(self.fits) if ok and not self.settled(k, math.inf)]
        common, by_family = 0.0, {}
        for ranked in rankings:
            feasible = [e for e in ranked if e.feasible]
            ties = min(e.step_time_s for e in feasible) * (1.0 + TIE_BAND)
            n_ties = sum(1 for e in feasible if e.step_time_s <= ties)
            tenth = (feasible[self.refine_top - 1].step_time_s if len(feasible) >= self.refine_top else math.inf
                     ) if n_ties < self.refine_top else 0.0
            common = max(common, ties, tenth)
            for f, t in _fastest(feasible, family).items():
                by_family[f] = max(by_family.get(f, 0.0), t)
        by_class = _fastest([e for e in rankings[-1] if e.feasible], self.classes)
        out = []
        for k, ok in enumerate(self.fits):
            if ok:
                plan = self.plans[k]
                threshold = max(common, by_family.get(family(plan), math.inf),
                                by_class.get(self.classes(plan), math.inf))
                if not self.settled(k, threshold):
                    out.append((k, threshold))
        return out


@dataclass(slots=True)
class _MemoryFacts:
    """What a search establishes that depends on memory alone, not on the network: its structures and their
    option variants (``search.enumerate_space``), whether each structure fits (``fits``), and the variants that
    fit at no micro-batch size (``unfit_variants``, filled as the branch and bound meets them)."""

    plans: list[Plan]
    variants: list[Plan]
    base_of: list[int]
    fits: list[bool]
    unfit_variants: set[int] = field(default_factory=set)


MEMORY_SCENARIOS = 2
"""Scenarios whose ``_MemoryFacts`` this process keeps: a sweep of the inter-node bandwidth, and the walk of
the conditions of change along it, search scenarios that differ only in the network."""
_MEMORY: dict[str, _MemoryFacts] = {}


def _memory_facts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space, compute: ComputeParams
                  ) -> _MemoryFacts:
    """The ``_MemoryFacts`` of this scenario: those of a search this process ran on a scenario equal to it in
    everything but the inter-node network (``ClusterSpec.inter``, which only the collectives' times read:
    neither the plans enumerated nor any memory term depends on it), else computed."""
    key = repr((model, job, space, [(f.name, getattr(cluster, f.name)) for f in fields(cluster) if f.name != "inter"]))
    facts = _MEMORY.pop(key, None)
    if facts is None:
        plans, variants, base_of = enumerate_space(model, cluster, job, space)
        facts = _MemoryFacts(plans, variants, base_of, [fits_at_all(model, cluster, job, p, compute) for p in plans])
    _MEMORY[key] = facts
    while len(_MEMORY) > MEMORY_SCENARIOS:
        del _MEMORY[next(iter(_MEMORY))]
    return facts


def _fastest(estimates: list[Estimate], classes: Callable[[Plan], Hashable]) -> dict[Hashable, float]:
    """The least step time of each class of ``estimates``."""
    out: dict[Hashable, float] = {}
    for e in estimates:
        c = classes(e.plan)
        out[c] = min(out.get(c, math.inf), e.step_time_s)
    return out
