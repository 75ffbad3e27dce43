"""Search the plan space: evaluate every structural plan, keep infeasible ones with their reasons, rank."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from meshplan.calibration import compute_params_for
from meshplan.cost.batch import micro_batch_sizes
from meshplan.cost.bounds import step_time_lower_bound_s
from meshplan.cost.choice import recompute_options
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate
from meshplan.cost.step import evaluate, evaluate_within, evaluate_within_fitting
from meshplan.errors import SpecError
from meshplan.parallel import parallel_map
from meshplan.search.rank import TIE_BAND, pareto_front, rank
from meshplan.search.space import (
    Space,
    enumerate_plans,
    family,
    needs_more_memory,
    option_variants,
    with_job_recompute,
)
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.arguments import check_scenario

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class SearchResult:
    ranked: list[Estimate]
    """Every plan searched, best first; infeasible ones last, with reasons."""
    n_plans: int
    """Plans evaluated and listed in ``ranked`` (each with its best micro-batch size and recompute mode)."""
    n_configurations: int
    """Configurations covered: plans (evaluated or pruned) x micro-batch sizes x recompute modes, counting
    partial recomputation of 1..L-1 layers of a stage as modes."""
    elapsed_s: float
    n_pruned: int = 0
    """Option variants not listed: those that do not fit in memory (their structure is listed, with its
    reasons, under its default options) and those whose step time is provably above the tie band of the
    fastest plan and the best of their family (a compute and bubble bound, ``step_time_lower_bound_s``, or
    the floors their traffic sets, ``cost.bounds.traffic_floors``): none could be recommended or shown as
    its family's best."""

    @property
    def recommended(self) -> Estimate | None:
        return self.ranked[0] if self.ranked and self.ranked[0].feasible else None

    @property
    def feasible(self) -> list[Estimate]:
        return [e for e in self.ranked if e.feasible]

    def best_by_family(self) -> dict[str, Estimate]:
        out: dict[str, Estimate] = {}
        for e in self.ranked:
            out.setdefault(family(e.plan), e)
        return out

    def pareto(self) -> list[Estimate]:
        return pareto_front(self.ranked)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: a search allocates hundreds of thousands of short-lived,
    acyclic objects, and the collector's passes over the growing caches cost 10-25 % of its time.
    Reference counting still frees everything; cycles, if any, are collected by a later full pass."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # Everything allocated meanwhile sits in the youngest generation, whose next pass would scan
            # it all (tens of milliseconds); freeze and unfreeze move it to the oldest, scanned rarely.
            gc.freeze()
            gc.unfreeze()
            gc.enable()


REFINE_TOP = 10
"""Plans of a search that ``plan`` and ``sweep`` have re-timed by the timeline simulator (the closed form
screens all of them), with the best feasible plan of each family."""


def search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
           mfu: float | None = None, progress: Progress | None = None, refine_top: int = 0,
           workers: int | None = None) -> SearchResult:
    """Evaluate every plan of ``space`` on ``cluster`` with the closed form and rank them; the
    ``refine_top`` best feasible plans are then re-timed by the timeline simulator (on up to ``workers``
    cores, default all) and re-ranked."""
    check_scenario("search", model, cluster, job, mfu=mfu)
    if space is not None and not isinstance(space, Space):
        raise SpecError("search.space", f"must be a Space (meshplan.Space), got {type(space).__name__}")
    if refine_top is not None and (isinstance(refine_top, bool) or not isinstance(refine_top, int)
                                   or not 0 <= refine_top <= 10_000):
        raise SpecError("search.refine_top", f"must be a whole number from 0 to 10,000, got {refine_top!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise SpecError("search.workers", f"must be a whole number of at least 1, got {workers!r}")
    with _no_cyclic_gc():
        result = _search(model, cluster, job, space, mfu=mfu, progress=progress, refine_top=refine_top,
                         workers=workers)
    remember_search(result, model, cluster, job, space, mfu=mfu, refine_top=refine_top)
    return result


def remember_search(result: SearchResult, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                    space: Space | None = None, *, mfu: float | None = None, refine_top: int = 0) -> None:
    """Keep ``result``, what ``search`` returned for this scenario, for ``recent_search``: ``search`` keeps its own,
    and a process that ran searches in forked workers keeps the results they sent back."""
    key = _scenario_key(model, cluster, job, space, mfu, refine_top)
    _RECENT.pop(key, None)
    _RECENT[key] = result
    while len(_RECENT) > RECENT_SEARCHES:
        del _RECENT[next(iter(_RECENT))]


RECENT_SEARCHES = 4
"""Searches this process keeps (``recent_search``): the stacks' searches of ``plan`` (run here or in its
workers), for a sweep of the same scenario that passes through its own value (``report``'s)."""
_RECENT: dict[tuple[object, ...], SearchResult] = {}
"""The last searches, by ``_scenario_key``."""


def recent_search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
                  mfu: float | None = None, refine_top: int = 0) -> SearchResult | None:
    """The result of a search this process ran (or inherited when forked) on a scenario equal to this one,
    field by field, with the same space, MFU and re-timing: what ``search`` would return again; None if none
    of the last RECENT_SEARCHES was."""
    return _RECENT.get(_scenario_key(model, cluster, job, space, mfu, refine_top))


def _scenario_key(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None, mfu: float | None,
                  refine_top: int) -> tuple[object, ...]:
    """A search's inputs by value: the specs' reprs (every field, floats as they round-trip; some hold dicts,
    so they do not hash)."""
    return repr(model), repr(cluster), repr(job), repr(space or Space()), mfu, refine_top


def _search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None, *, mfu: float | None,
            progress: Progress | None, refine_top: int, workers: int | None) -> SearchResult:
    t0 = time.perf_counter()
    space = space or Space()
    compute = compute_params_for(cluster.accelerator.name, job.software)
    plans, variants, base_of = enumerate_space(model, cluster, job, space)
    total = len(plans) + len(variants)

    def tick(i: int) -> None:
        if progress and (i % 64 == 0 or i == total):
            progress(i, total)

    # every structure with its default options: each family is represented and each infeasible
    # layout keeps its reasons
    results = []
    for i, plan in enumerate(plans, 1):
        results.append(evaluate(model, cluster, job, plan, mfu=mfu, compute=compute, time_infeasible=False))
        tick(i)
    bb = _BranchAndBound(model, cluster, job, mfu, compute, variants, results)
    bb.unfit_families_first()
    bb.by_bound([results[k].feasible for k in base_of], len(plans), tick)
    if progress:
        progress(total, total)
    n_cfg = _configurations(model, job, [*plans, *variants])
    # a variant that settles on its base plan's choices (automatic offloading that offloads no layer) is
    # that plan: ranked once
    seen: set[Plan] = set()
    ranked = rank([e for e in results if not (e.plan in seen or seen.add(e.plan))])
    if refine_top:
        ranked = _refine(ranked, refine_top, compute, workers)
    return SearchResult(ranked=ranked, n_plans=len(ranked), n_configurations=n_cfg,
                        elapsed_s=time.perf_counter() - t0, n_pruned=bb.n_pruned)


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space
                    ) -> tuple[list[Plan], list[Plan], list[int]]:
    """The structures (each with its default options), their option variants, and the index of each variant's
    structure, every plan with the recomputation the job allows (JobSpec.recompute); a structure's variants
    are derived from it unrestricted, since an option may rule out a mode (MoE overlap, full recomputation)."""
    plans: list[Plan] = []
    variants, base_of = [], []
    for base in enumerate_plans(model, cluster, job, space):
        p = with_job_recompute(base, job)
        if p is None:
            continue
        plans.append(p)
        for v in option_variants(model, cluster, job, base) if space.options else ():
            rv = with_job_recompute(v, job)
            if rv is not None:
                variants.append(rv)
                base_of.append(len(plans) - 1)
    return plans, variants, base_of


class _BranchAndBound:
    """Option variants, in order of their lower bound: evaluated only if they could join the tie band or
    beat the best plan of their family (branch and bound; exact for the recommendation and for each
    family's best, since the bounds never exceed the step time). ``results``: the structures' estimates,
    to which the variants evaluated are added."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, mfu: float | None,
                 compute: ComputeParams, variants: list[Plan], results: list[Estimate]) -> None:
        self.model, self.cluster, self.job, self.mfu, self.compute = model, cluster, job, mfu, compute
        self.variants, self.results = variants, results
        self.families = [family(v) for v in variants]
        self.n_pruned = 0
        self.fastest = min((e.step_time_s for e in results if e.feasible), default=_INF)
        """The fastest feasible step so far [s]."""
        self.family_best: dict[str, float] = {}
        """The fastest feasible step so far of each family [s]."""
        for e in results:
            if e.feasible:
                self.family_best[family(e.plan)] = min(self.family_best.get(family(e.plan), _INF), e.step_time_s)
        self.done: set[int] = set()

    def _found(self, k: int, est: Estimate) -> None:
        self.fastest = min(self.fastest, est.step_time_s)
        self.family_best[self.families[k]] = min(self.family_best.get(self.families[k], _INF), est.step_time_s)

    def unfit_families_first(self) -> None:
        """A family none of whose structures fits may still fit through an option that frees memory
        (needs_more_memory): those variants are evaluated in full first, so that its best is known."""
        first = [k for k, v in enumerate(self.variants)
                 if self.families[k] not in self.family_best and not needs_more_memory(v)]
        for k in first:
            found = evaluate(self.model, self.cluster, self.job, self.variants[k], mfu=self.mfu, compute=self.compute,
                             time_infeasible=False)
            if found.feasible:
                self.results.append(found)
                self._found(k, found)
            else:
                self.n_pruned += 1  # its structure, listed with its reasons, stands for it
        self.done = set(first)

    def by_bound(self, base_fits: list[bool], n_plans: int, tick: Callable[[int], None],
                 unfit: set[int] | None = None) -> None:
        """The other variants, by their lower bound, until it passes the tie band and every family's best
        (``base_fits``: whether each variant's default plan fits; ``n_plans``: the structures evaluated,
        for the progress count). ``unfit``: the variants known to fit at no micro-batch size (from a search of
        a scenario that differs only in what memory does not depend on, search.leading), which
        ``evaluate_within`` would rule out: passed over as it would, and those found here added."""
        model, cluster, job, compute = self.model, self.cluster, self.job, self.compute
        if self.mfu is None:
            bounds = sorted((step_time_lower_bound_s(model, cluster, job, v, compute), k)
                            for k, v in enumerate(self.variants))
        else:  # the assumed-MFU mode rescales compute per plan: no bound, evaluate them all
            bounds = [(0.0, k) for k in range(len(self.variants))]
        bounds = [(b, k) for b, k in bounds if k not in self.done]
        start = n_plans + len(self.done) + 1
        for i, (bound, k) in enumerate(bounds, start):
            cutoff = self.fastest * (1.0 + TIE_BAND)
            if bound > cutoff and bound >= max(self.family_best.values(), default=0.0):
                self.n_pruned += len(bounds) - (i - start)
                break
            # the tie band, or the best so far of its family (a family none of whose plans fits keeps its
            # structures' reasons: no other option of it can fit)
            limit = max(cutoff, self.family_best.get(self.families[k], 0.0))
            if bound >= limit or (not base_fits[k] and needs_more_memory(self.variants[k])):
                # it cannot reach either, or its default options do not fit and these need more memory
                self.n_pruned += 1
                continue
            if self.mfu is None:
                found = self._within(k, limit, unfit)
            else:
                found = evaluate(model, cluster, job, self.variants[k], mfu=self.mfu, compute=compute)
            if found is None:
                self.n_pruned += 1
            else:
                self.results.append(found)
                if found.feasible:
                    self._found(k, found)
            tick(i)

    def _within(self, k: int, limit: float, unfit: set[int] | None) -> Estimate | None:
        """Variant ``k`` evaluated within ``limit`` (cost.step.evaluate_within), ``unfit`` read and kept."""
        if unfit is None:
            return evaluate_within(self.model, self.cluster, self.job, self.variants[k], cutoff_s=limit,
                                   compute=self.compute)
        if k in unfit:
            return None
        found, fits = evaluate_within_fitting(self.model, self.cluster, self.job, self.variants[k], cutoff_s=limit,
                                              compute=self.compute)
        if not fits:
            unfit.add(k)
        return found


_INF = float("inf")


def _configurations(model: ModelSpec, job: JobSpec, plans: list[Plan]) -> int:
    """Configurations ``plans`` cover: micro-batch sizes x (recompute modes + partial recomputation layer
    counts) that evaluate chooses among; for the search's plans (mbs and recompute unset) that depends on
    dp, pp, ep_overlap, whether Megatron runs it (its selective modules instead of op-level SAC) and
    whether it may offload activations only."""
    counted: dict[tuple[int, int, bool, bool, bool], int] = {}
    for p in plans:
        key = (p.dp, p.pp, p.ep_overlap, p.sharding == "megatron", p.offload_layers is None)
        if key not in counted:
            modes, partial = recompute_options(model, job, p)
            if p.offload_layers is None:  # what its base plan does not: offloading 1..L-1 layers (pp = 1)
                counted[key] = (model.n_layers - 1) * len(micro_batch_sizes(job, p.dp))
            else:
                counted[key] = (len(modes) + partial) * len(micro_batch_sizes(job, p.dp))
    return sum(counted[(p.dp, p.pp, p.ep_overlap, p.sharding == "megatron", p.offload_layers is None)]
               for p in plans)


REFINE_ROUNDS = 4
"""The most rounds of re-timing a search makes: each re-times what the previous ranking put on top without a
simulated time (a plan the closed form times fast but the tie band ranked below the first ``refine_top``)."""

Retime = Callable[[list[Estimate]], list[Estimate]]
"""Estimates re-timed by the timeline simulator, in order."""


def _refine(ranked: list[Estimate], refine_top: int, compute: ComputeParams, workers: int | None) -> list[Estimate]:
    """``ranked`` with its ``refine_top`` best feasible plans, and the best feasible plan of each family,
    re-timed by the timeline simulator (on up to ``workers`` cores), re-ranked; repeated until the first
    ``refine_top`` feasible plans of the ranking and the fastest plan are all re-timed (the simulator times
    most plans slower than the closed form, so a plan left on the closed form could otherwise overtake the
    re-timed ones on a time it would not keep)."""
    return refine_rounds(ranked, refine_top, lambda todo: retime_all(todo, compute, workers))[-1]


def retime_all(estimates: list[Estimate], compute: ComputeParams, workers: int | None) -> list[Estimate]:
    """``estimates`` re-timed by the timeline simulator (on up to ``workers`` cores)."""
    from meshplan.sim.simulate import refine

    return parallel_map(lambda e: refine(e, slowdown=compute.comm_slowdown,
                                         step_overhead_s=compute.step_overhead_s), estimates, workers)


def refine_rounds(ranked: list[Estimate], refine_top: int, retime: Retime) -> list[list[Estimate]]:
    """``_refine``'s rankings, the closed-form ``ranked`` first and the final one last, each round's plans
    re-timed by ``retime``: a round re-times what the ranking before it asks for (``to_retime``)."""
    rankings = [ranked]
    timed_ids: set[int] = set()
    for _ in range(REFINE_ROUNDS):
        todo = [e for e in to_retime(ranked, refine_top) if id(e) not in timed_ids]
        if not todo:
            break
        timed = retime(todo)
        refined = {id(e): r for e, r in zip(todo, timed, strict=True)}
        timed_ids |= {id(r) for r in timed}
        ranked = rank([refined.get(id(e), e) for e in ranked])
        rankings.append(ranked)
    return rankings


def to_retime(ranked: list[Estimate], refine_top: int) -> list[Estimate]:
    """The plans a ranking asks the simulator to time: its first ``refine_top`` feasible plans, the fastest
    feasible plan, and the best feasible plan of each family (so that families compare like with like)."""
    feasible = [e for e in ranked if e.feasible]
    top = feasible[:refine_top]
    if feasible:
        fastest = min(feasible, key=lambda e: e.step_time_s)
        if all(t is not fastest for t in top):
            top.append(fastest)
    seen = {id(e) for e in top}
    for e in feasible:
        fam = family(e.plan)
        if id(e) not in seen and all(family(t.plan) != fam for t in top):
            top.append(e)
            seen.add(id(e))
    return top
