"""A small fluid discrete-event engine: ops on FIFO streams, with dependencies, sharing link bandwidth.

Rules:
- an op starts when it heads its stream and all its dependencies have finished;
- communication ops on the same link share its bandwidth equally (processor sharing): with k active,
  each progresses at 1/k of its standalone rate;
- compute progresses at 1/(1 + slowdown) while any communication op is active on the GPU (NCCL
  kernels take SMs and memory bandwidth), else at full rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EPS = 1e-12


@dataclass(eq=False, slots=True)
class Op:
    name: str
    stream: str
    work_s: float
    category: str
    """Breakdown key its time (or a wait on it) counts toward."""
    link: str | None = None
    """Bandwidth-sharing domain of a communication op; None for compute."""
    deps: list[Op] = field(default_factory=list)
    start_s: float = math.nan
    end_s: float = math.nan
    remaining_s: float = 0.0

    @property
    def is_comm(self) -> bool:
        return self.link is not None


class DeadlockError(RuntimeError):
    pass


def run(ops: list[Op], *, slowdown: float) -> float:
    """Simulate ``ops`` (stream order = list order); set start_s/end_s; return the makespan [s]."""
    if not all(math.isfinite(op.work_s) and op.work_s >= 0 for op in ops):
        raise ValueError("every op's time must be finite and non-negative")
    queues: dict[str, list[Op]] = {}
    for op in ops:
        queues.setdefault(op.stream, []).append(op)
    heads = {s: 0 for s in queues}
    active: list[Op] = []
    now = 0.0
    done = 0
    total = len(ops)
    while done < total:
        for s, q in queues.items():
            i = heads[s]
            if i < len(q):
                op = q[i]
                if math.isnan(op.start_s) and all(not math.isnan(d.end_s) for d in op.deps):
                    op.start_s = now
                    op.remaining_s = op.work_s
                    active.append(op)
        if not active:
            raise DeadlockError("no op can start: a dependency cycle or a dependency on an op never scheduled")
        comm_on: dict[str, int] = {}
        any_comm = False
        for op in active:
            if op.link is not None:
                comm_on[op.link] = comm_on.get(op.link, 0) + 1
                any_comm = True
        rates = [(1.0 / comm_on[op.link]) if op.link is not None else (1.0 / (1.0 + slowdown) if any_comm else 1.0)
                 for op in active]
        dt = min((op.remaining_s / r) for op, r in zip(active, rates, strict=True))
        now += dt
        still = []
        for op, r in zip(active, rates, strict=True):
            op.remaining_s -= r * dt
            if op.remaining_s <= EPS * max(1.0, op.work_s):
                op.end_s = now
                heads[op.stream] += 1
                done += 1
            else:
                still.append(op)
        active = still
    return now
