"""One stage's step time: its communication ledger, what of it is exposed (cost.exposure), the waits that
stretch its compute (the host's kernel launches, offload copies), the optimizer step, and the breakdown
that sums to its time; then each stage's pipeline bubble from the other ranks' passes."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.comm import StageTraffic, comm_ledger
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import OTHER_MICROBATCH, CommEntry, StageDetail
from meshplan.cost.exposure import SHARDED_DP_AXES, absorb_contention, set_exposure
from meshplan.cost.offload import offload_waits_s
from meshplan.cost.pipeline import stage_bubbles_s, unpaired_microbatches
from meshplan.cost.stage import StageCtx
from meshplan.cost.stage_compute import optimizer_s
from meshplan.cost.stage_memory import StaticMemory
from meshplan.specs import Plan

LAYER_AXES = ("tp", "cp", "ep")
"""Axes whose collectives the transformer layers issue themselves (between their kernels)."""


RECOMPUTE_LUMPED = ("ep", "cp")
"""Axes whose forward ledger entry also counts the recomputed forwards' calls (comm.py: the expert
all-to-alls, Ulysses' all-to-alls); tensor parallelism and ring attention list those under the backward."""


HOST_BOUND = "host-bound MoE launches"
"""Breakdown key: the time a stage's MoE layers wait for the host to launch their kernels."""


OFFLOAD = "activation offload"
"""Breakdown key: the time a stage's layers wait for offloaded activations to reach host memory (forward)
or to come back (backward) beyond what the layers' compute hides (Plan.offload_layers, offload.offload_stalls_s)."""


STALLS = (HOST_BOUND, OFFLOAD)
"""Breakdown keys of waits that stretch a stage's compute (the simulator runs the stretched layers)."""


def _stage_ledger(c: StageCtx) -> list[CommEntry]:
    """Every collective stage ``c.s`` issues in a step (exposure not yet set)."""
    plan = c.plan
    unpaired = unpaired_microbatches(schedule=plan.schedule, pp=plan.pp, m=c.m, vpp=plan.vpp, stage=c.s)
    st = StageTraffic(units=c.units, n_layers=c.n_dense + c.n_moe, n_moe_layers=c.n_moe, has_embedding=c.s == 0,
                      has_lm_head=c.last, tokens=c.tokens, m=c.m, recomputed=c.recomputed, unpaired=unpaired,
                      stage=c.s)
    return comm_ledger(c.model, c.cluster, c.job, plan, c.groups, st)


def stage_comm(c: StageCtx, compute: ComputeParams) -> list[CommEntry]:
    """``_stage_ledger`` with each call's time as the step prices it: ZeRO-3's data-parallel collectives
    slowed by ComputeParams.zero3_collective_efficiency."""
    ledger = _stage_ledger(c)
    if c.plan.sharding == "zero3" and compute.zero3_collective_efficiency < 1.0:
        eff = compute.zero3_collective_efficiency
        ledger = [replace(e, time_s=e.time_s / eff, edge_s=e.edge_s / eff) if e.axis in SHARDED_DP_AXES else e
                  for e in ledger]
    return ledger


def _host_waits_s(c: StageCtx, compute: ComputeParams, ledger: list[CommEntry], fwd_s: float,
                  bwd_s: float) -> tuple[float, float]:
    """Per micro-batch, how long stage ``c.s``'s layers wait for the host to launch their kernels, forward
    and backward [s]. The host launches a MoE layer in ComputeParams.moe_layer_host_s plus moe_expert_host_s
    per local expert, a third of it for the forward and two thirds for the backward (the backward runs two
    GEMMs per forward one), a fully recomputed forward again a third in the backward. Each phase waits for
    what its launches take beyond its kernels (``fwd_s``, ``bwd_s``: every layer of the stage, dense ones
    included, which run while the host launches) and the in-layer communication that always stalls them;
    a recomputed layer therefore costs its launches when the host sets the pace. Not modelled: dense
    layers' own launches, and those of op-level (SAC) or selective recomputation. 0 when the layers are
    captured in CUDA graphs (JobSpec.cuda_graphs)."""
    per_layer = compute.moe_layer_host_s + compute.moe_expert_host_s * c.model.n_experts / c.plan.ep
    if not c.n_moe or c.job.cuda_graphs or per_layer <= 0.0:
        return 0.0, 0.0
    stalls = {"forward": 0.0, "backward": 0.0}
    r_dense, r_moe = c.recomputed
    for x in ledger:
        if x.axis in LAYER_AXES and x.window == "none" and x.phase in stalls:
            t = x.time_s / c.m
            if x.phase == "forward" and x.axis in RECOMPUTE_LUMPED and r_dense + r_moe:
                # the recomputed forwards' share runs in the backward
                r, n = (r_moe, c.n_moe) if x.axis == "ep" else (r_dense + r_moe, c.n_dense + c.n_moe)
                stalls["backward"] += t * r / (n + r)
                t *= n / (n + r)
            stalls[x.phase] += t
    host_f = c.n_moe * per_layer / 3.0
    host_b = (2.0 * c.n_moe + r_moe) * per_layer / 3.0
    return (max(0.0, host_f - fwd_s - stalls["forward"]), max(0.0, host_b - bwd_s - stalls["backward"]))


def stage_time(c: StageCtx, compute: ComputeParams, times: tuple[float, ...], st: StaticMemory) -> StageDetail:
    """Communication ledger, exposure and the stage's step time [s]; ``st``: its ``stage_memory.static_memory``."""
    plan, m = c.plan, c.m
    lf, lb, t_w, t_r, attn, hf, hb = times
    ledger = stage_comm(c, compute)
    bwd = lb + t_w + t_r
    host_f, host_b = _host_waits_s(c, compute, ledger, lf, bwd)
    off_f, off_b = offload_waits_s(c, st, lf + host_f, bwd + host_b)  # the copies overlap the host's pace too
    wait_f, wait_b = host_f + off_f, host_b + off_b
    r_share = t_r / bwd if bwd else 0.0
    if wait_f:  # the phase runs at the host's (or the copies') pace: its parts stretched alike, bubble and
        lf *= 1.0 + wait_f / lf  # windows with them
    if wait_b:
        k = 1.0 + wait_b / bwd
        lb, t_w, t_r = lb * k, t_w * k, t_r * k
    t_f, t_b = lf + hf, lb + hb
    attn_passes = 1.0 + 2.5 + sum(c.recomputed) / (c.n_dense + c.n_moe)
    whole = m * (t_f + t_b + t_w + t_r)  # every compute of the step
    windows = {
        "forward": m * t_f, "backward": m * (t_b + t_w + t_r), "first_forward": t_f,
        "last_backward": t_b + t_w + t_r, "attention": m * attn * attn_passes,
        "pipeline": whole, OTHER_MICROBATCH: whole, "none": 0.0,
    }
    set_exposure(ledger, windows, compute.overlap_efficiency,
                 compute.zero3_overlap_efficiency if plan.sharding == "zero3" else None)
    # the warm-up and cool-down micro-batches stall on the layers' unhidden collectives as the steady
    # ones do (the expert all-to-all without ep_overlap, TP without async TP, Ulysses)
    # (not the once-a-step TP all-reduce after the backward, comm._sequence_parallel_grads)
    stall_f, stall_b = (sum(x.exposed_s for x in ledger if x.window == "none" and x.axis in LAYER_AXES
                            and x.phase == ("forward" if fwd else "backward")) / m for fwd in (True, False))
    opt = optimizer_s(c, compute)
    hidden = sum(x.time_s - x.exposed_s for x in ledger)
    absorb_contention(ledger, compute.comm_slowdown * hidden)
    breakdown: dict[str, float] = {"compute": m * (t_f + t_b + t_w), "recompute": m * t_r}
    for x in ledger:
        breakdown[x.breakdown_key] = breakdown.get(x.breakdown_key, 0.0) + x.exposed_s
    if wait_f or wait_b:
        breakdown["compute"] -= m * (wait_f + wait_b * (1.0 - r_share))
        breakdown["recompute"] -= m * wait_b * r_share
        for key, wait in ((HOST_BOUND, host_f + host_b), (OFFLOAD, off_f + off_b)):
            if wait:
                breakdown[key] = m * wait
    breakdown["pipeline bubble"] = 0.0  # the other stages' passes set it (with_bubbles)
    breakdown["optimizer step"] = opt
    breakdown["comm contention"] = compute.comm_slowdown * hidden
    breakdown["step overhead"] = compute.step_overhead_s
    return StageDetail(stage=c.s, n_layers=c.n_dense + c.n_moe, t_f_s=lf, t_b_s=lb, t_w_s=t_w, t_r_s=t_r,
                       attention_fwd_s=attn, head_f_s=hf, head_b_s=hb, comm=ledger, optimizer_s=opt,
                       breakdown=breakdown, time_s=sum(breakdown.values()),
                       passes_s=(t_f + stall_f, t_b + t_r + stall_b, t_w))


def with_bubbles(details: tuple[StageDetail, ...], plan: Plan, m: int) -> tuple[StageDetail, ...]:
    """``details`` with each stage's pipeline bubble, from the other ranks' passes (stage_bubbles_s)."""
    bubbles = stage_bubbles_s(schedule=plan.schedule, pp=plan.pp, vpp=plan.vpp, m=m,
                              stages=[d.stage for d in details], passes=[d.passes_s for d in details])
    out = []
    for d, b in zip(details, bubbles, strict=True):
        d.breakdown["pipeline bubble"] = b  # the stage's own dict, made by stage_time; keyed there in order
        out.append(StageDetail(stage=d.stage, n_layers=d.n_layers, t_f_s=d.t_f_s, t_b_s=d.t_b_s, t_w_s=d.t_w_s,
                               t_r_s=d.t_r_s, attention_fwd_s=d.attention_fwd_s, head_f_s=d.head_f_s,
                               head_b_s=d.head_b_s, comm=d.comm, optimizer_s=d.optimizer_s, breakdown=d.breakdown,
                               time_s=d.time_s + b, passes_s=d.passes_s))  # not dataclasses.replace: 6x faster
    return tuple(out)
