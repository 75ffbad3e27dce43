"""Ranking: predicted throughput first; within 1 % ties toward simpler plans and more headroom."""

from __future__ import annotations

from meshplan.cost.estimate import Estimate
from meshplan.specs import Plan

TIE_BAND = 0.01


def complexity(plan: Plan) -> int:
    """How exotic a plan is: one point per parallel axis in use and per non-default option."""
    axes = sum(1 for d in (plan.dp_shard, plan.dp_replicate, plan.tp, plan.pp, plan.cp, plan.ep) if d > 1)
    options = (plan.sharding != "fsdp") + (plan.schedule not in ("1f1b",) and plan.pp > 1) + plan.async_tp
    return axes + options


def rank_key(e: Estimate) -> tuple[float, ...]:
    # bucket step time in 1 % bands so near-ties fall to simplicity and headroom
    import math

    band = math.floor(math.log(e.step_time_s) / math.log1p(TIE_BAND)) if e.step_time_s > 0 else 0
    return (0 if e.feasible else 1, band, complexity(e.plan), -e.memory.headroom_bytes, e.step_time_s)


def rank(estimates: list[Estimate]) -> list[Estimate]:
    return sorted(estimates, key=rank_key)


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
