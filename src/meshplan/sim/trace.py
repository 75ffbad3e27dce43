"""The simulated step as Chrome trace JSON (chrome://tracing, Perfetto): one process per simulated stage
with a track per stream (compute, and each communication stream by link), and a 'pipeline' process
with a track per stage showing the schedule of forward, backward and weight-gradient chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.fileio import write_json
from meshplan.sim.simulate import SimResult

US = 1e6


def chrome_trace(est: Estimate, result: SimResult) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    pid = 0
    for sim in result.stages:
        pid += 1
        name = f"stage {sim.detail.stage} ({len(set(o.stream for o in sim.ops))} streams, first micro-batches)"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        tids: dict[str, int] = {}
        for op in sim.ops:
            if op.stream not in tids:
                tids[op.stream] = len(tids) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[op.stream],
                               "args": {"name": op.stream}})
            if op.end_s > op.start_s:
                events.append({"name": op.name, "cat": op.category, "ph": "X", "pid": pid, "tid": tids[op.stream],
                               "ts": op.start_s * US, "dur": (op.end_s - op.start_s) * US})
    if result.pipeline:
        pid += 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "pipeline schedule"}})
        for s in sorted({t.stage for t in result.pipeline}):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": s + 1, "args": {"name": f"stage {s}"}})
        for t in result.pipeline:
            events.append({"name": f"{t.kind} mb{t.mb}" + (f" chunk {t.chunk}" if t.chunk else ""), "cat": t.kind,
                           "ph": "X", "pid": pid, "tid": t.stage + 1, "ts": t.start_s * US,
                           "dur": (t.end_s - t.start_s) * US})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"model": est.model, "cluster": est.cluster, "plan": est.plan.to_string(),
                          "step_time_s": result.step_time_s, "breakdown_s": result.breakdown,
                          "note": "detail processes show the first micro-batches of a stage; the steady state "
                                  "repeats. Times in microseconds."}}


def write_trace(est: Estimate, result: SimResult, path: Path) -> None:
    write_json(path, chrome_trace(est, result), indent=None)
