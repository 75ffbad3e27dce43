"""Ranking: predicted step time first; plans within TIE_BAND of the fastest are a tie, decided toward the
simpler plan (fewer parallel axes, fewer non-default options) and then more memory headroom."""

from __future__ import annotations

from meshplan.cost.estimate import Estimate
from meshplan.cost.validate import sequence_parallel_fits
from meshplan.specs import Plan

TIE_BAND = 0.05
"""Step-time differences below 5 % are ties: the model's cross-validated error on published runs is about 6 %
(MAPE; docs/validation.md), so a smaller gap is no reason to take on another parallel axis."""


def complexity(plan: Plan, seq_len: int | None = None) -> int:
    """How exotic a plan is: one point per parallel axis in use and per non-default option; sequence
    parallelism turned off is no choice where ``seq_len`` does not split over TP (search.space runs such
    plans without it)."""
    axes = sum(1 for d in (plan.dp_shard, plan.dp_replicate, plan.tp, plan.pp, plan.cp, plan.ep) if d > 1)
    options = ((plan.sharding != "fsdp") + (plan.schedule not in ("1f1b",) and plan.pp > 1)
               + len(plan.explicit_options()) + (plan.recompute_layers is not None))
    forced = (plan.sp is False and plan.tp > 1 and seq_len is not None
              and not sequence_parallel_fits(seq_len, plan.tp, plan.cp))
    return axes + options - forced


def rank(estimates: list[Estimate]) -> list[Estimate]:
    """Feasible plans first: the tie set (within TIE_BAND of the fastest) by simplicity and headroom, then
    the rest by step time; infeasible plans last, the closest to fitting first."""
    feasible = sorted((e for e in estimates if e.feasible), key=lambda e: e.step_time_s)
    # closest to fitting first (a search does not time plans that do not fit)
    infeasible = sorted((e for e in estimates if not e.feasible),
                        key=lambda e: (e.memory.peak_bytes / e.memory.capacity_bytes, e.plan.to_string()))
    if not feasible:
        return infeasible
    limit = feasible[0].step_time_s * (1.0 + TIE_BAND)
    ties = [e for e in feasible if e.step_time_s <= limit]
    rest = [e for e in feasible if e.step_time_s > limit]
    ties.sort(key=lambda e: (complexity(e.plan, e.seq_len), -e.memory.headroom_bytes, e.step_time_s))
    return ties + rest + infeasible


def pareto_front(estimates: list[Estimate]) -> list[Estimate]:
    """Feasible plans not beaten on both step time and memory headroom."""
    feas = sorted((e for e in estimates if e.feasible), key=lambda e: (e.step_time_s, -e.memory.headroom_bytes))
    front: list[Estimate] = []
    best_headroom = -float("inf")
    for e in feas:
        if e.memory.headroom_bytes > best_headroom:
            front.append(e)
            best_headroom = e.memory.headroom_bytes
    return front
