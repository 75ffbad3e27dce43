"""Collective sweeps over the mesh-axis groups of a plan, reported with nccl-tests' definitions.

Payload S per call (formulas.md §1.1; nccl-tests doc/PERFORMANCE.md):

- all_gather: the full gathered buffer (each rank contributes S/n);
- reduce_scatter: the full unscattered input (each rank keeps S/n);
- all_reduce: the buffer;
- all_to_all: the per-rank send buffer (including the chunk a rank keeps);
- send_recv: the message; each rank sends S to the next rank of its group and receives S from the
  previous one at the same time (nccl-tests ``sendrecv_perf``).

algbw = S/t and busbw = algbw·f(op, n) (``meshplan.harness.measure.fit``). t is the median over
repetitions of the slowest rank's time: every repetition starts after a barrier of the group, and
the per-rank times are reduced with MAX over the world (all groups of an axis run at once, as they
do in training). Buffers are float32; S is rounded down to a multiple of 4·n bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshplan.cost.collectives import COLLECTIVES
from meshplan.harness.measure.dist import AxisGroup, RunContext
from meshplan.harness.measure.fit import AlphaBetaFit, algbw_bytes_per_s, busbw_bytes_per_s, fit_alpha_beta
from meshplan.harness.measure.timing import Timing, reps_for, summarize, sync
from meshplan.units import KiB, MiB

OPS = COLLECTIVES  # the ledger's collective names (meshplan.cost.collectives)
ELEMENT_BYTES = 4


@dataclass(frozen=True, slots=True)
class CollectivePoint:
    axis: str
    op: str
    link: str
    group_size: int
    ranks_per_node: int
    message_bytes: int
    timing: Timing

    @property
    def algbw_bytes_per_s(self) -> float:
        return algbw_bytes_per_s(self.message_bytes, self.timing.median_s)

    @property
    def busbw_bytes_per_s(self) -> float:
        return busbw_bytes_per_s(self.op, self.group_size, self.message_bytes, self.timing.median_s)

    def as_profile_entry(self) -> dict:
        return {"op": self.op, "link": self.link, "group_size": self.group_size, "message_bytes": self.message_bytes,
                "median_s": self.timing.median_s, "algbw_bytes_per_s": self.algbw_bytes_per_s,
                "busbw_bytes_per_s": self.busbw_bytes_per_s}


def default_sizes(*, gpu: bool, min_bytes: int | None = None, max_bytes: int | None = None) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` by factors of 4 (default 1 KiB .. 64 MiB on a
    CPU, 1 KiB .. 1 GiB on a GPU)."""
    lo = min_bytes or KiB
    hi = max_bytes or (1024 * MiB if gpu else 64 * MiB)
    if lo > hi:
        raise ValueError(f"--min-bytes {lo} exceeds --max-bytes {hi}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    if out[-1] != hi:
        out.append(hi)
    return out


def _operation(op: str, g: AxisGroup, message_bytes: int, ctx: RunContext) -> Callable[[], object]:
    n = g.size
    numel = message_bytes // ELEMENT_BYTES
    dev = ctx.device
    full = torch.ones(numel, device=dev, dtype=torch.float32)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_gather":
        shard = torch.ones(numel // n, device=dev)
        return lambda: ag(full, shard, group=g.group)
    if op == "reduce_scatter":
        shard = torch.empty(numel // n, device=dev)
        return lambda: rs(shard, full, group=g.group)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=g.group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=g.group)
    if op == "send_recv":
        me = g.ranks.index(ctx.rank)
        nxt, prv = g.ranks[(me + 1) % n], g.ranks[(me - 1) % n]
        recv = torch.empty_like(full)

        def exchange() -> None:
            ops = [dist.P2POp(dist.isend, full, nxt, g.group), dist.P2POp(dist.irecv, recv, prv, g.group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        return exchange
    raise ValueError(f"unknown collective {op!r}; one of {', '.join(OPS)}")


def _world_max(values: Sequence[float], ctx: RunContext) -> list[float]:
    t = torch.tensor(list(values), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed(fn: Callable[[], object], g: AxisGroup, ctx: RunContext, reps: int) -> list[float]:
    """Per-repetition time of this rank: barrier, then the call; CUDA events on a GPU."""
    import time

    out = []
    for _ in range(reps):
        dist.barrier(group=g.group)
        sync(ctx.device)
        if ctx.device.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def measure_point(op: str, g: AxisGroup, message_bytes: int, ctx: RunContext, *, budget_s: float,
                  max_reps: int) -> CollectivePoint:
    """Time one (op, group, size) point; every rank of the world must call this in the same order."""
    quantum = ELEMENT_BYTES * g.size
    s = max(quantum, message_bytes // quantum * quantum)
    fn = _operation(op, g, s, ctx)
    warm = _timed(fn, g, ctx, 2)
    est = _world_max([warm[-1]], ctx)[0]
    reps = reps_for(est, budget_s=budget_s, min_reps=3, max_reps=max_reps)
    samples = _world_max(_timed(fn, g, ctx, reps), ctx)
    return CollectivePoint(axis=g.axis, op=op, link=g.link, group_size=g.size, ranks_per_node=g.ranks_per_node,
                           message_bytes=s, timing=summarize(samples))


def fit_points(points: Sequence[CollectivePoint]) -> dict[tuple[str, str], tuple[CollectivePoint, AlphaBetaFit]]:
    """Alpha-beta fit per (axis, op) of a sweep; keyed by (axis, op), with one point for its metadata."""
    by: dict[tuple[str, str], list[CollectivePoint]] = {}
    for p in points:
        by.setdefault((p.axis, p.op), []).append(p)
    out = {}
    for key, pts in by.items():
        if len(pts) >= 2:
            out[key] = (pts[0], fit_alpha_beta(pts[0].op, pts[0].group_size, [p.message_bytes for p in pts],
                                               [p.timing.median_s for p in pts]))
    return out


def profile_fits(points: Sequence[CollectivePoint]) -> tuple[dict[str, dict], list[str]]:
    """The profile's ``collective_fits`` ("op@link" -> fit) and notes. Where several axes share a link
    and an op, the largest group wins (the figure the planner's ring model describes)."""
    fits: dict[str, dict] = {}
    sizes: dict[str, int] = {}
    notes = []
    for (axis, op), (p, fit) in sorted(fit_points(points).items()):
        key = f"{op}@{p.link}"
        if not (fit.busbw_bytes_per_s > 0 and fit.busbw_bytes_per_s != float("inf")):
            notes.append(f"collectives: {op} on axis {axis} shows no growth with size; no fit written")
            continue
        notes.append(f"collectives: {op} on axis {axis} ({p.group_size} ranks, {p.link}): alpha "
                     f"{fit.alpha_s * 1e6:.1f} us, busbw {fit.busbw_bytes_per_s / 1e9:.3g} GB/s, max relative "
                     f"fit error {fit.max_rel_error:.0%} over {fit.n_points} sizes")
        if sizes.get(key, 0) >= p.group_size:
            continue
        sizes[key] = p.group_size
        fits[key] = {"alpha_s": fit.alpha_s, "busbw_bytes_per_s": fit.busbw_bytes_per_s, "group_size": p.group_size,
                     "n_points": fit.n_points, "ranks_per_node": p.ranks_per_node}
    return fits, notes
