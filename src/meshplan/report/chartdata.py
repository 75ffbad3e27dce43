"""The data of the interactive charts, as plain JSON-ready dicts: the HTML report and ``meshplan serve``
draw them with the same script (report/assets/charts.js, on Apache ECharts), so both show the same
charts. Each dict names its ``kind`` and carries its units in its keys (GiB for memory, seconds or
milliseconds for time); every number is finite (strict JSON)."""

from __future__ import annotations

import math
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.search.rank import TIE_BAND, pareto_front
from meshplan.search.space import FAMILY_NAMES
from meshplan.search.sweep import SweepPoint, changes, log_ticks
from meshplan.units import GiB

MAX_TIMELINE_OPS = 20_000
"""Bars a timeline carries at most (a long pipeline's simulated stages have tens of thousands of ops; more
would slow the page down). Where there are more, every lane keeps its earliest bars, lanes with few keeping
all of theirs (_lane_quotas)."""


def _lane_quotas(counts: list[int], budget: int) -> list[int]:
    """Bars kept per lane within ``budget``: a lane with fewer than an even share keeps all of its own, and
    what it leaves is shared among the others (water-filling)."""
    quota = [0] * len(counts)
    left = sorted(range(len(counts)), key=lambda i: counts[i])
    while left:
        share = budget // len(left)
        i = left.pop(0)
        quota[i] = min(counts[i], share)
        budget -= quota[i]
    return quota


def _finite(x: float) -> float | None:
    return x if isinstance(x, int | float) and math.isfinite(x) else None


def plan_labels(ranked: list[Estimate], top: int) -> list[tuple[str, Estimate]]:
    """The ``top`` best feasible plans of a ranking, each named '#rank label': the rank ties a bar to its
    row of the table, as plans that differ only in options share a label."""
    return [(f"#{i} {e.plan.label()}", e) for i, e in enumerate(ranked, 1) if e.feasible][:top]


def memory_chart(rows: list[tuple[str, Estimate]]) -> dict[str, Any]:
    """Peak memory per GPU by term (binary GiB) of each plan's most loaded stage, against the HBM capacity
    of the first plan's GPU."""
    return {
        "kind": "memory", "title": "Memory per GPU by term (most loaded stage)", "unit": "GiB",
        "rows": [{"label": label, "plan": e.plan.to_string(), "feasible": e.feasible,
                  "terms": {k: v / GiB for k, v in e.memory.terms.items() if v > 0}} for label, e in rows],
        "capacity_gib": rows[0][1].memory.capacity_bytes / GiB if rows else None,
    }


def time_chart(rows: list[tuple[str, Estimate]]) -> dict[str, Any]:
    """Each timed plan's step by term (seconds; the terms sum to the step)."""
    timed = [(label, e) for label, e in rows if _finite(e.step_time_s) is not None and e.time_breakdown]
    return {
        "kind": "time", "title": "Where the step time goes (stacked terms sum to the step)", "unit": "s",
        "rows": [{"label": label, "plan": e.plan.to_string(), "step_s": e.step_time_s,
                  "terms": {k: v for k, v in e.named_breakdown().items() if v > 0 and math.isfinite(v)}}
                 for label, e in timed],
    }


def pareto_chart(ranked: list[Estimate], recommended: Estimate | None) -> dict[str, Any]:
    """Every feasible plan's step time against its memory headroom (GiB), the front of plans no other
    beats on both, and the recommendation."""
    def point(e: Estimate) -> list[Any]:
        return [e.step_time_s, e.memory.headroom_bytes / GiB, e.plan.label(), e.plan.to_string()]

    feasible = [e for e in ranked if e.feasible and _finite(e.step_time_s) is not None]
    return {
        "kind": "pareto", "title": "Step time against memory headroom", "x_unit": "s", "y_unit": "GiB",
        "points": [point(e) for e in feasible], "front": [point(e) for e in pareto_front(feasible)],
        "recommended": point(recommended) if recommended is not None else None,
    }


SWEEP_AXES = {"batch-tokens": "global batch [tokens per step]",
              "inter-node-bandwidth": "inter-node bandwidth [GB/s per GPU per direction]",
              "gpus": "GPUs", "seq-len": "sequence length [tokens]", "layers": "layers"}
"""The x-axis title of a sweep of each condition (sweep --vary NAME), with its unit."""


def sweep_chart(points: list[SweepPoint], condition: str) -> dict[str, Any]:
    """Predicted tokens/s per GPU of the recommended plan and of each family's best at each value."""
    families = sorted({f for p in points for f in p.by_family})
    return {
        "kind": "sweep", "condition": condition, "x_title": SWEEP_AXES.get(condition, condition),
        "y_title": "predicted tokens/s per GPU", "log_x": log_ticks([p.value for p in points]),
        "title": f"Sweep of {condition}: the recommended plan and each family's best (the simplest within "
                 f"{TIE_BAND:.0%} of the fastest)",
        "families": [{"name": f"best {FAMILY_NAMES.get(f, f)} plan",
                      "points": [[p.value, p.by_family[f].tokens_per_s_per_gpu, p.by_family[f].plan.label()]
                                 for p in points if f in p.by_family]} for f in families],
        "recommended": [[p.value, p.best.tokens_per_s_per_gpu, p.best.plan.label()] for p in points if p.best],
        "changes": [{"x": math.sqrt(a * b), "label": label} for a, b, _, label in changes(points)],
    }


def timeline_chart(trace: dict[str, Any]) -> dict[str, Any]:
    """A simulated step as lanes of bars, from its Chrome trace (sim.trace.chrome_trace): one lane per
    stream of each simulated stage, and one per stage of the pipeline's schedule. Times in milliseconds."""
    processes: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    bars = []
    for ev in trace["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == "process_name":
            processes[ev["pid"]] = ev["args"]["name"]
        elif ev["ph"] == "M" and ev["name"] == "thread_name":
            threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        elif ev["ph"] == "X":
            bars.append(ev)
    # the pipeline's schedule (the whole step) first, then the stages' streams (their first micro-batches)
    lanes = sorted({(ev["pid"], ev["tid"]) for ev in bars},
                   key=lambda lane: (not processes.get(lane[0], "").startswith("pipeline"), lane))
    index = {lane: i for i, lane in enumerate(lanes)}
    names = [f"{processes.get(p, f'process {p}').split(' (')[0]}: {threads.get((p, t), f'track {t}')}"
             for p, t in lanes]
    bars.sort(key=lambda ev: (ev["ts"], ev["pid"], ev["tid"]))
    quota = _lane_quotas([sum(1 for ev in bars if index[(ev["pid"], ev["tid"])] == i) for i in range(len(lanes))],
                         MAX_TIMELINE_OPS)
    kept: list[list[Any]] = []
    counts = [0] * len(lanes)
    for ev in bars:
        i = index[(ev["pid"], ev["tid"])]
        if counts[i] < quota[i]:
            counts[i] += 1
            kept.append([i, ev["ts"] / 1e3, ev["dur"] / 1e3, ev.get("cat", ""), ev["name"]])
    other = trace.get("otherData", {})
    return {
        "kind": "timeline", "title": f"Simulated step of {other.get('plan', 'the plan')}", "unit": "ms",
        "lanes": names, "ops": kept, "dropped": len(bars) - len(kept),
        "step_s": _finite(other.get("step_time_s", float("nan"))),
        "note": ("a pipeline's schedule spans the step; each stage's streams show its first micro-batches (the "
                 "steady state repeats)" if any(n.startswith("pipeline") for n in processes.values()) else
                 "the streams of the first micro-batches; the steady state repeats"),
    }


def simulated_timeline(est: Estimate, accelerator: str, software: str) -> dict[str, Any] | None:
    """``est``'s step as the timeline simulator lays it out (with the fitted parameters of ``accelerator``
    and ``software``, as ``plan`` and ``evaluate`` re-time a plan), as a timeline chart; None for a plan
    that was not timed or that the simulator does not lay out (too many pipeline passes)."""
    from meshplan.calibration import compute_params_for
    from meshplan.sim.simulate import simulable, simulate
    from meshplan.sim.trace import chrome_trace

    if _finite(est.step_time_s) is None or not est.feasible or not simulable(est):
        return None
    cp = compute_params_for(accelerator, software)
    return timeline_chart(chrome_trace(est, simulate(est, slowdown=cp.comm_slowdown,
                                                     step_overhead_s=cp.step_overhead_s)))
