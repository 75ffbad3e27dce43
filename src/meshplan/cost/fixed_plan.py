"""A plan whose micro-batch size and recomputation are set: what its variants share (groups, stage
layout, units, static memory), a memory probe, and its full estimate (memory, FLOPs, stage times, step)."""

from __future__ import annotations

from typing import NamedTuple

from meshplan.cost.batch import batch_split_reasons
from meshplan.cost.comm import Unit
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate, FlopReport, MemoryReport
from meshplan.cost.flops import model_flop_per_token, recompute_flop_per_token
from meshplan.cost.mesh import Group, axis_groups
from meshplan.cost.offload import offload_note, offload_reasons
from meshplan.cost.params import ParamCounts
from meshplan.cost.pipeline import bubble_fraction, head_stage, plan_stage_layers
from meshplan.cost.stage import StageCtx, bounding_stages, local_units, recomputed_layers
from meshplan.cost.stage_compute import stage_compute, with_fsdp_copies
from meshplan.cost.stage_memory import StaticMemory, memory_reason, stage_memory, stage_peak_bytes, static_memory
from meshplan.cost.stage_time import stage_time, with_bubbles
from meshplan.memo import cache_by_identity
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan


@cache_by_identity(n_specs=2, maxsize=1024)
def step_flops(model: ModelSpec, counts: ParamCounts, seq_len: int, convention: str, recompute: str,
               flash_attention: bool, tokens: int, recomputed_fraction: float, megatron: bool) -> FlopReport:
    """FLOPs per step in both conventions, and with recomputation (memoised: plan-independent)."""
    causal = convention == "causal"
    f_palm = model_flop_per_token(model, counts, seq_len=seq_len, causal=False)
    f_causal = model_flop_per_token(model, counts, seq_len=seq_len, causal=True)
    f_tok = f_causal if causal else f_palm
    f_re = recomputed_fraction * recompute_flop_per_token(model, counts, seq_len=seq_len, recompute=recompute,
                                                          flash_attention=flash_attention, causal=causal,
                                                          megatron=megatron)
    return FlopReport(model_flop_per_step=f_tok * tokens, hardware_flop_per_step=(f_tok + f_re) * tokens,
                      model_flop_per_token=f_tok, convention=convention,
                      model_flop_per_step_palm=f_palm * tokens, model_flop_per_step_causal=f_causal * tokens)


class PlanShared(NamedTuple):
    """What every micro-batch size and recompute mode of one plan shares: its groups, stage layout, the
    parameters each stage holds and its static memory."""

    groups: dict[str, Group]
    layout: list[tuple[int, int]]
    units: dict[int, tuple[Unit, ...]]
    static: dict[int, StaticMemory]


def plan_shared(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan
                ) -> PlanShared:
    groups = axis_groups(plan, cluster)
    layout = plan_stage_layers(model, plan)
    head = head_stage(plan.schedule, plan.pp)
    stages = bounding_stages(layout, head)
    # a tied head is a copy of the embedding where another stage holds it
    units = {s: local_units(model, counts, plan, s, *layout[s], tied_copy=head != 0) for s in stages}
    static = {s: static_memory(StageCtx(model, counts, cluster, job, plan, groups, s, *layout[s], 1, units[s]))
              for s in stages}
    return PlanShared(groups, layout, units, static)


def stage_ctxs(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan, m: int,
               shared: PlanShared) -> list[StageCtx]:
    """The stages that bound the step (bounding_stages)."""
    return [StageCtx(model, counts, cluster, job, plan, shared.groups, s, *shared.layout[s], m, shared.units[s])
            for s in sorted(shared.units)]


def _peak_memory(ctxs: list[StageCtx], shared: PlanShared) -> MemoryReport:
    return max((stage_memory(c, shared.static[c.s]) for c in ctxs), key=lambda r: r.peak_bytes)


class Probe(NamedTuple):
    """A memory probe while choosing the micro-batch size and recomputation: no timing, no messages."""

    plan: Plan
    feasible: bool
    peak_bytes: float
    """Of the busiest stage."""


def probe(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan,
          shared: PlanShared) -> Probe:
    reasons, m = batch_split_reasons(job, plan)
    ctxs = stage_ctxs(model, counts, cluster, job, plan, m, shared)
    if plan.offload_layers:
        reasons += offload_reasons(model, cluster, job, plan, ctxs, shared.static)
    peak = max(stage_peak_bytes(c, shared.static[c.s]) for c in ctxs)
    return Probe(plan, not reasons and peak <= cluster.accelerator.hbm_capacity_bytes, peak)


def evaluate_fixed(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                   compute: ComputeParams, mfu: float | None, *, shared: PlanShared | None = None,
                   timed: bool = True) -> Estimate:
    """Memory, FLOPs and (if ``timed`` or the plan fits) the step time of a plan whose micro-batch size
    and recomputation are set; an untimed infeasible estimate has NaN times and no ledger."""
    reasons, m = batch_split_reasons(job, plan)
    shared = shared or plan_shared(model, counts, cluster, job, plan)
    tokens = job.global_batch_tokens
    fraction = 1.0
    if plan.recompute == "full" and plan.recompute_layers is not None:  # the blocks' share that is re-run
        fraction = sum(sum(recomputed_layers("full", plan.recompute_layers, *lay)) for lay in shared.layout
                       ) / sum(d + e for d, e in shared.layout)  # MTP layers counted on both sides
    flops = step_flops(model, counts, job.seq_len, job.flop_convention, plan.recompute_key, job.flash_attention,
                       tokens, fraction, plan.runs_megatron_layers(job.software))
    peak = cluster.accelerator.peak_flop_per_s(job.precision)
    ctxs = stage_ctxs(model, counts, cluster, job, plan, m, shared)
    if plan.offload_layers:
        reasons += offload_reasons(model, cluster, job, plan, ctxs, shared.static)
    mem_report = _peak_memory(ctxs, shared)
    if mem_report.peak_bytes > mem_report.capacity_bytes:
        reasons.append(memory_reason(mem_report))
    if reasons and not timed:
        nan = float("nan")
        return Estimate(model=model.name, cluster=cluster.name, n_gpus=cluster.n_gpus, plan=plan, n_microbatches=m,
                        global_batch_tokens=tokens, seq_len=job.seq_len, feasible=False,
                        infeasible_reasons=reasons, memory=mem_report, flops=flops, step_time_s=nan,
                        time_breakdown={}, mfu=nan, hfu=nan, comm=[],
                        compute_source="not timed: the plan does not fit")
    times = [stage_compute(c, compute) for c in ctxs]
    if mfu is not None:
        # compute runs at the given MFU: hardware FLOPs per GPU / (peak · mfu); scale the kernel model to it
        target = flops.hardware_flop_per_step / cluster.n_gpus / (peak * mfu)
        kernel = m * (sum(times[0][:4]) + sum(times[0][5:]))
        scale = target / kernel if kernel > 0 else 1.0
        times = [tuple(x * scale for x in t) for t in times]  # type: ignore[misc]
    times = [with_fsdp_copies(c, compute, t) for c, t in zip(ctxs, times, strict=True)]
    details = with_bubbles(tuple(stage_time(c, compute, t, shared.static[c.s])
                                  for c, t in zip(ctxs, times, strict=True)), plan, m)
    slowest = max(details, key=lambda x: x.time_s)
    step = slowest.time_s
    notes = [offload_note(ctxs[0], shared.static[0], cluster)] if plan.offload_layers else []
    return Estimate(
        model=model.name, cluster=cluster.name, n_gpus=cluster.n_gpus, plan=plan, n_microbatches=m,
        global_batch_tokens=tokens, seq_len=job.seq_len, feasible=not reasons, infeasible_reasons=reasons,
        memory=mem_report, flops=flops, step_time_s=step, time_breakdown=slowest.breakdown,
        mfu=flops.model_flop_per_step / (cluster.n_gpus * peak * step),
        hfu=flops.hardware_flop_per_step / (cluster.n_gpus * peak * step),
        comm=slowest.comm, comm_stage=slowest.stage,
        bubble_fraction=bubble_fraction(schedule=plan.schedule, pp=plan.pp, m=m, vpp=plan.vpp),
        stages=details, notes=notes,
        compute_source=f"assumed MFU {mfu:.0%}" if mfu is not None else f"kernel model ({compute.source})",
    )
