"""Simulate one training step of an evaluated plan and attribute every second of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from meshplan.cost.estimate import Estimate, StageDetail
from meshplan.cost.pipeline import stand_ins
from meshplan.cost.stage_time import HOST_BOUND, OFFLOAD, STALLS
from meshplan.errors import SpecError
from meshplan.sim.build import stage_ops
from meshplan.sim.engine import Op, run
from meshplan.sim.pipeline import Task, schedule_pipeline


@dataclass(slots=True)
class StageSim:
    detail: StageDetail
    ops: list[Op]
    makespan_s: float
    chunk_f_s: float
    chunk_b_s: float
    tail_s: float
    breakdown: dict[str, float]
    chunk_terms: dict[str, float] = field(default_factory=dict)
    """The steady micro-batch's forward and backward chunks, attributed (_attribute): what a pipeline's
    busy time is made of."""
    head: dict[str, float] = field(default_factory=dict)
    """The wait before the first compute (the first unit's parameter all-gather), by what was waited on
    (_blame): once per step."""
    tail_key: str = "other"
    """The breakdown key of the tail's wait (the collective that ends last)."""

    @property
    def head_s(self) -> float:
        return sum(self.head.values())


@dataclass(slots=True)
class SimResult:
    step_time_s: float
    breakdown: dict[str, float]
    stages: list[StageSim]
    pipeline: list[Task] = field(default_factory=list)
    shown: StageDetail | None = None
    """The stage whose rank the breakdown is told from (the busiest one under a pipeline)."""


def _blame(op: Op, cursor: float, before: dict[int, Op], terms: dict[str, float]) -> None:
    """Charge the compute stream's wait from ``cursor`` to ``op``'s start along the chain of communication
    that held it: the collective it waited on for as long as that ran, then what that collective waited on
    (a dependency or the op before it on its stream), and so on back to ``cursor``. A wait the chain does
    not explain (a busy link) goes to the last collective found, or to 'other'."""
    t, cur, key = op.start_s, op, "other"
    while t > cursor + 1e-12:
        waits = [*cur.deps, *([before[id(cur)]] if cur is not op and id(cur) in before else [])]
        blocker = max((d for d in waits if d.end_s <= t + 1e-12), key=lambda d: d.end_s, default=None)
        if blocker is None or not blocker.is_comm:
            break
        start = max(blocker.start_s, cursor)
        terms[blocker.category] = terms.get(blocker.category, 0.0) + t - start
        t, cur, key = start, blocker, blocker.category
    if t > cursor + 1e-12:
        terms[key] = terms.get(key, 0.0) + t - cursor


def _stream_predecessors(ops: list[Op]) -> dict[int, Op]:
    """Each op's predecessor on its stream (stream order = list order), by id."""
    before: dict[int, Op] = {}
    last: dict[str, Op] = {}
    for o in ops:
        if o.stream in last:
            before[id(o)] = last[o.stream]
        last[o.stream] = o
    return before


def _attribute(ops: list[Op], before: dict[int, Op], start_s: float = 0.0, end_s: float = math.inf, *,
               until: Op | None = None) -> tuple[dict[str, float], float]:
    """Split the compute stream's timeline within [start_s, end_s) into compute, contention and waits
    (by what was waited on, _blame; ``before``: _stream_predecessors), and with ``until`` (the compute op
    at ``end_s``) the wait before it; returns (terms, end of the last compute op counted)."""
    terms: dict[str, float] = {}
    cursor = start_s
    for op in (o for o in ops if o.stream == "compute"):
        if op.start_s < start_s - 1e-12 or op.start_s >= end_s - 1e-12:
            continue
        if op.start_s - cursor > 1e-12:
            _blame(op, cursor, before, terms)
        dur = op.end_s - op.start_s
        terms[op.category] = terms.get(op.category, 0.0) + op.work_s
        if dur - op.work_s > 0:
            terms["comm contention"] = terms.get("comm contention", 0.0) + dur - op.work_s
        cursor = op.end_s
    if until is not None and until.start_s - cursor > 1e-12:
        _blame(until, cursor, before, terms)
    return terms, cursor


M_SIM = 3  # micro-batches simulated: the first, a steady one, the last


def simulate_stage(detail: StageDetail, est: Estimate, slowdown: float) -> StageSim:
    """Simulate M_SIM micro-batches of one stage and extrapolate the steady state to all of them."""
    plan, m = est.plan, est.n_microbatches
    ops, chunks = stage_ops(detail, plan, m, m_sim=M_SIM)
    makespan = run(ops, slowdown=slowdown)
    before = _stream_predecessors(ops)
    terms, end_compute = _attribute(ops, before)
    tail, tail_key = makespan - end_compute, "other"
    if tail > 1e-12:
        tail_key = max((o for o in ops if o.is_comm), key=lambda o: o.end_s).category
        terms[tail_key] = terms.get(tail_key, 0.0) + tail
    else:
        tail = 0.0
    head: dict[str, float] = {}
    _blame(next(o for o in ops if o.stream == "compute"), 0.0, before, head)  # the stream's first op
    k = min(1, m - 1)  # the steady micro-batch
    (f0, f1), (b0, b1) = chunks[("F", k)], chunks[("B", k)]
    # each chunk from the end of the compute before it: a wait before its first compute (a gather the
    # params stream could not prefetch in time) recurs with every micro-batch, so it belongs to the chunk.
    # Where the stage's warm-up covers the simulated micro-batches (pp - stage >= M_SIM), the steady
    # forward follows a forward, not a backward as in 1F1B's steady state: its wait is measured there.
    f_from, b_from = (before[id(o)].end_s if id(o) in before else o.start_s for o in (f0, b0))
    chunk_f, chunk_b = f1.end_s - f_from, b1.end_s - b_from
    chunk_terms: dict[str, float] = {}
    for t0, t1 in ((f_from, f1.end_s), (b_from, b1.end_s)):
        for key, v in _attribute(ops, before, t0, t1)[0].items():
            chunk_terms[key] = chunk_terms.get(key, 0.0) + v
    m_run = min(m, M_SIM)
    if m > m_run and plan.pp == 1:
        # one steady period: from the steady micro-batch's forward start to the next one's
        nxt = chunks[("F", k + 1)][0]
        t0, t1 = f0.start_s, nxt.start_s
        steady, _ = _attribute(ops, before, t0, t1, until=nxt)  # with the wait before the next period's compute
        extra = m - m_run
        for key, v in steady.items():
            terms[key] = terms.get(key, 0.0) + extra * v
        makespan += extra * (t1 - t0)
    return StageSim(detail, ops, makespan, chunk_f, chunk_b, tail, terms, chunk_terms, head, tail_key)


MAX_PIPELINE_PASSES = 200_000
"""The most chunk passes (micro-batches x model chunks of the pipeline) the simulator lays out one by one, a
few seconds' work; beyond them (millions of micro-batches, a batch far past any real one) the closed form
stands alone."""


def simulable(est: Estimate) -> bool:
    """Whether ``simulate`` times ``est``: it has stage detail and, pipelined, at most MAX_PIPELINE_PASSES."""
    plan = est.plan
    return bool(est.stages) and (plan.pp == 1 or est.n_microbatches * plan.pp * plan.model_chunks
                                 <= MAX_PIPELINE_PASSES)


def simulate(est: Estimate, *, slowdown: float, step_overhead_s: float) -> SimResult:
    """The simulated step of ``est`` (an estimate from meshplan.cost.step.evaluate)."""
    if not est.stages:
        raise ValueError("the estimate carries no stage detail (worked-example mode cannot be simulated)")
    if not simulable(est):
        raise SpecError("plan", f"{est.n_microbatches:,} micro-batches over {est.plan.pp} pipeline stages are more "
                                f"than the simulator lays out ({MAX_PIPELINE_PASSES:,} chunk passes); the closed "
                                f"form times it")
    plan, m = est.plan, est.n_microbatches
    sims = [simulate_stage(d, est, slowdown) for d in est.stages]
    if plan.pp == 1:
        s = sims[0]
        br = dict(s.breakdown)
        br["optimizer step"] = s.detail.optimizer_s
        br["step overhead"] = step_overhead_s
        _after_step(s.detail, br)
        _cap_exposed(br, s.detail)
        return SimResult(s.makespan_s + _after_last_backward_s(s.detail, step_overhead_s), _ordered(br, s.detail, m),
                         sims, shown=s.detail)
    # the first, the last and the slowest middle stage timed (cost.stage.bounding_stages) stand for the ranks
    per_stage = [sims[i] for i in stand_ins([d.stage for d in est.stages], plan.pp,
                                            [x.chunk_f_s + x.chunk_b_s for x in sims])]
    first = per_stage[0]
    # the W share of the backward chunk, for zero-bubble schedules
    f_s = [x.chunk_f_s for x in per_stage]
    w_frac = [x.detail.t_w_s / max(1e-30, x.detail.t_b_s + x.detail.t_w_s + x.detail.t_r_s) for x in per_stage]
    b_s = [x.chunk_b_s * (1 - w) for x, w in zip(per_stage, w_frac, strict=True)]
    w_s = [x.chunk_b_s * w for x, w in zip(per_stage, w_frac, strict=True)]
    # one hop of the fill: the mean over the pipeline's boundaries (some may be NVLink, some not)
    p2p = [e for e in first.detail.comm if e.window == "pipeline"]
    p2p_s = max((e.edge_s / min(e.count, plan.pp - 1) for e in p2p), default=0.0)
    if plan.schedule == "interleaved":
        tasks = _interleaved_tasks(plan.pp, plan.vpp, m, f_s, b_s, w_s, p2p_s)
    else:
        _, tasks = schedule_pipeline(schedule=plan.schedule, pp=plan.pp, m=m, chunks=plan.model_chunks, f_s=f_s,
                                     b_s=b_s, w_s=w_s, p2p_s=p2p_s)
    ends, busies = _ends_and_busies(tasks, plan.pp)
    # the step ends with the rank that finishes last, its optimizer step and the collectives after it
    # included (a stage that ends its backward early reduces while the others still work); it is told from the
    # busiest rank's side, whose idle time is the pipeline's bubble (a lighter first or last stage, which
    # often ends last, idles for the imbalance too)
    done = [x.head_s + end + x.tail_s + _after_last_backward_s(x.detail, step_overhead_s)
            for x, end in zip(per_stage, ends, strict=True)]
    shown = max(range(plan.pp), key=lambda s: (busies[s], done[s]))
    br = _rank_breakdown(per_stage[shown], busies[shown], step_overhead_s)
    step = max(done)
    br["pipeline bubble"] = step - sum(br.values())
    return SimResult(step, _ordered(br, per_stage[shown].detail, m), sims, tasks, per_stage[shown].detail)


def _ends_and_busies(tasks: list[Task], pp: int) -> tuple[list[float], list[float]]:
    """Each stage's last end and its busy time (the sum of its tasks' durations, in task order, by ``sum``
    as a per-stage scan of the tasks gives it: Python 3.12's ``sum`` of floats is compensated) [s]: the tasks
    grouped by stage in one pass."""
    ends: list[list[float]] = [[] for _ in range(pp)]
    durations: list[list[float]] = [[] for _ in range(pp)]
    for t in tasks:
        ends[t.stage].append(t.end_s)
        durations[t.stage].append(t.dur_s)
    return [max(e) for e in ends], [sum(d) for d in durations]


def _after_last_backward_s(detail: StageDetail, step_overhead_s: float) -> float:
    """What a rank adds after its last backward: the optimizer step, the collectives that block after it
    (CommEntry.blocks_after_step) and the step overhead [s]."""
    return detail.optimizer_s + _after_step(detail, {}) + step_overhead_s


def _rank_breakdown(sim: StageSim, busy: float, step_overhead_s: float) -> dict[str, float]:
    """One pipeline rank's step without its idle time, attributed [s]: its ``busy`` time, the waits before
    its first compute and after its last, and what follows its last backward (``_after_last_backward_s``).
    The busy time is m steady micro-batches: split as the steady micro-batch's chunks split; the waits
    come once per step, on top."""
    chunk_total = sum(sim.chunk_terms.values())
    br = {k: v * busy / chunk_total for k, v in sim.chunk_terms.items()} if chunk_total > 0 else {}
    for key, wait in [*sim.head.items(), (sim.tail_key, sim.tail_s)]:
        if wait > 0:
            br[key] = br.get(key, 0.0) + wait
    br["optimizer step"] = sim.detail.optimizer_s
    br["step overhead"] = step_overhead_s
    _after_step(sim.detail, br)
    _cap_exposed(br, sim.detail)
    return br


LINK_SHARING = "exposed link sharing"
"""Breakdown key of the waits a collective on the critical path spends beyond its own time because other
traffic shares its link (the engine divides a link's bandwidth among the transfers on it)."""


def _cap_exposed(br: dict[str, float], detail: StageDetail) -> None:
    """Hold each collective's exposed time in ``br`` to the time of its calls (as the ledger's exposed column
    is, ``_exposed_from``); what ``_blame`` charged it beyond that, waiting while other traffic shared its
    link, goes under LINK_SHARING."""
    own: dict[str, float] = {}
    for e in detail.comm:
        own[e.breakdown_key] = own.get(e.breakdown_key, 0.0) + e.time_s
    for key, mine in own.items():
        excess = br.get(key, 0.0) - mine
        if excess > 1e-12:
            br[key] = mine
            br[LINK_SHARING] = br.get(LINK_SHARING, 0.0) + excess


def _after_step(detail: StageDetail, br: dict[str, float]) -> float:
    """The collectives that block after the optimizer step (CommEntry.blocks_after_step), added to ``br``;
    their time [s]."""
    total = 0.0
    for e in detail.comm:
        if e.blocks_after_step:
            br[e.breakdown_key] = br.get(e.breakdown_key, 0.0) + e.time_s
            total += e.time_s
    return total


def _interleaved_tasks(pp: int, vpp: int, m: int, f_s: list[float], b_s: list[float], w_s: list[float],
                       p2p_s: float) -> list[Task]:
    """Megatron's interleaved schedule, timed as 1F1B over m·v micro-batches of 1/v of each stage's chunk
    times: the same busy time, a fill and drain of (p - 1) chunk-sized slots, (p - 1)·(t_F + t_B)/v
    (Narayanan et al. 2021 §2.2), and, where stages are unequal, every stage held to the slowest one's
    pace, of which interleaving hides nothing (a greedy list scheduler does not reproduce Megatron's
    interleaved order faithfully enough to trust its own bubble; dividing a 1F1B run's idle time by v had
    also divided that pacing, and left the drain behind a heavy last stage out). The tasks are that 1F1B's:
    m·v slots of 1/v of a stage's chunk, numbered 0 .. m·v - 1 (a trace shows these, not Megatron's
    order of chunks, which runs more forwards before its first backward)."""
    _, tasks = schedule_pipeline(schedule="1f1b", pp=pp, m=m * vpp, chunks=1, f_s=[f / vpp for f in f_s],
                                 b_s=[b / vpp for b in b_s], w_s=[w / vpp for w in w_s], p2p_s=p2p_s)
    return tasks


def _ordered(br: dict[str, float], detail: StageDetail, m: int) -> dict[str, float]:
    """``br`` in the closed form's order, the host's and the offload copies' waits named as the closed form
    names them."""
    br = _stalls_named(br, detail, m)
    keys = ["compute", "recompute", HOST_BOUND, OFFLOAD, *sorted(k for k in br if k.startswith("exposed")),
            "pipeline bubble", "comm contention", "other", "optimizer step", "step overhead"]
    return {k: br[k] for k in keys if k in br and math.isfinite(br[k])}


def _stalls_named(br: dict[str, float], detail: StageDetail, m: int) -> dict[str, float]:
    """``br`` with the share of compute and of recomputation that the closed form attributes to waits
    (cost.stage_time.STALLS: the host's kernel launches, activation offload copies) moved there, each wait its
    share: the simulator runs the stretched layers, so its compute and recomputation include them."""
    waits = {k: detail.breakdown.get(k, 0.0) for k in STALLS}
    wait = sum(waits.values())
    if wait <= 0.0:
        return br
    br = dict(br)
    closed_r = detail.breakdown.get("recompute", 0.0)
    wait_r = max(0.0, m * detail.t_r_s - closed_r)  # the recomputation's stretch, per step
    for k, closed, w in (("compute", detail.breakdown.get("compute", 0.0), wait - wait_r),
                         ("recompute", closed_r, wait_r)):
        moved = br.get(k, 0.0) * w / (closed + w) if closed + w > 0.0 else 0.0
        br[k] = br.get(k, 0.0) - moved
        for key, v in waits.items():
            if v:
                br[key] = br.get(key, 0.0) + moved * v / wait
    return br


def refine(est: Estimate, *, slowdown: float, step_overhead_s: float) -> Estimate:
    """``est`` with its step time, MFU and breakdown from the timeline simulator (the closed form kept); ``est``
    itself where its step time is not finite (a rate too small to time anything: nothing to simulate)."""
    if not math.isfinite(est.step_time_s):
        return est
    if not simulable(est):
        return replace(est, notes=[*est.notes, f"timed by the closed form only: {est.n_microbatches:,} "
                                               f"micro-batches are more than the simulator lays out"])
    r = simulate(est, slowdown=slowdown, step_overhead_s=step_overhead_s)
    scale = r.step_time_s / est.step_time_s
    return replace(est, step_time_s=r.step_time_s, time_breakdown=r.breakdown, mfu=est.mfu / scale,
                   hfu=est.hfu / scale, closed_form_step_time_s=est.step_time_s, comm=_exposed_from(r),
                   comm_stage=r.shown.stage if r.shown else est.comm_stage,
                   compute_source=est.compute_source + ", timeline simulator")


def refine_fitted(est: Estimate, accelerator: str, software: str) -> Estimate:
    """``refine`` with the fitted compute parameters of ``accelerator`` and ``software``
    (calibration.compute_params_for), as ``plan`` and ``evaluate`` re-time a plan that fits; ``est`` itself
    where it does not fit."""
    from meshplan.calibration import compute_params_for

    if not est.feasible:
        return est
    cp = compute_params_for(accelerator, software)
    return refine(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s)


def _exposed_from(r: SimResult) -> list:
    """The ledger of the stage the breakdown is told from, each entry's exposed time taken from the
    simulation: the simulated exposure of its collective and axis, shared among the entries of that kind in
    proportion to their closed-form exposure (or their time, where the closed form hid them all)."""
    assert r.shown is not None
    comm = r.shown.comm
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(comm):
        groups.setdefault(e.breakdown_key, []).append(i)
    out = list(comm)
    for key, idx in groups.items():
        weights = [comm[i].exposed_s for i in idx]
        if sum(weights) <= 0:
            weights = [comm[i].time_s for i in idx]
        shares = _share(r.breakdown.get(key, 0.0), weights, [comm[i].time_s for i in idx])
        for i, x in zip(idx, shares, strict=True):
            out[i] = replace(comm[i], exposed_s=x)
    return out


def _share(total: float, weights: list[float], caps: list[float]) -> list[float]:
    """``total`` split in proportion to ``weights``, no share above its cap; what a capped share cannot
    take goes to the others in the same proportion, so the shares add up to min(total, sum of caps)."""
    out = [0.0] * len(caps)
    open_ = [i for i in range(len(caps)) if caps[i] > 0]
    left = min(total, sum(caps))
    while left > 1e-15 and open_:
        norm = sum(weights[i] for i in open_)
        split = {i: left * (weights[i] / norm if norm > 0 else 1.0 / len(open_)) for i in open_}
        full = [i for i in open_ if out[i] + split[i] >= caps[i]]
        if not full:
            for i in open_:
                out[i] += split[i]
            break
        for i in full:
            left -= caps[i] - out[i]
            out[i] = caps[i]
        open_ = [i for i in open_ if i not in full]
    return out
