"""Search the plan space: evaluate every structural plan, keep infeasible ones with their reasons, rank."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from meshplan.calibration import compute_params_for
from meshplan.cost.estimate import Estimate
from meshplan.cost.step import evaluate
from meshplan.search.rank import pareto_front, rank
from meshplan.search.space import Space, enumerate_plans, family
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class SearchResult:
    ranked: list[Estimate]
    """Every plan searched, best first; infeasible ones last, with reasons."""
    n_plans: int
    """Structural plans evaluated (each with its best micro-batch size and recompute mode)."""
    n_configurations: int
    """Configurations covered: structural plans x micro-batch sizes x recompute modes."""
    elapsed_s: float

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


def search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
           mfu: float | None = None, progress: Progress | None = None, refine_top: int = 0) -> SearchResult:
    """Evaluate every plan of ``space`` on ``cluster`` with the closed form and rank them; the
    ``refine_top`` best feasible plans are then re-timed by the timeline simulator and re-ranked."""
    t0 = time.perf_counter()
    space = space or Space()
    compute = compute_params_for(cluster.accelerator.name, job.software)
    plans = list(enumerate_plans(model, cluster, job, space))
    results: list[Estimate] = []
    n_cfg = 0
    recompute_modes = 3 if job.flash_attention else 4
    for i, plan in enumerate(plans):
        est = evaluate(model, cluster, job, plan, mfu=mfu, compute=compute)
        results.append(est)
        per_replica = max(1, job.global_batch_seqs // plan.dp)
        n_cfg += recompute_modes * sum(1 for b in range(1, per_replica + 1) if per_replica % b == 0)
        if progress and (i % 64 == 0 or i == len(plans) - 1):
            progress(i + 1, len(plans))
    ranked = rank(results)
    if refine_top:
        from meshplan.sim.simulate import refine

        top = [e for e in ranked if e.feasible][:refine_top]
        seen = {id(e) for e in top}
        for e in ranked:  # and the best feasible plan of each family, so that families compare like with like
            fam = family(e.plan)
            if e.feasible and id(e) not in seen and all(family(t.plan) != fam for t in top):
                top.append(e)
                seen.add(id(e))
        refined = {id(e): refine(e, slowdown=compute.comm_slowdown, step_overhead_s=compute.step_overhead_s)
                   for e in top}
        ranked = rank([refined.get(id(e), e) for e in ranked])
    return SearchResult(ranked=ranked, n_plans=len(plans), n_configurations=n_cfg,
                        elapsed_s=time.perf_counter() - t0)
