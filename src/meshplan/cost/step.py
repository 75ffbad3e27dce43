"""Evaluate one plan: memory, FLOPs, communication ledger, step time and MFU (the faithful mode).

The step time is a closed form over the ledger and a per-operation compute model:

.. math:: t_{step} = \\max_{stage} \\big[ m(t_F + t_B + t_W + t_R) + \\sum exposed + contention
          + bubble + t_{opt} \\big] + overhead

Each collective is hidden behind the compute window it can overlap (``CommEntry.window``) up to that
window's length times ``overlap_efficiency``, per link; what does not fit, plus the parts no compute can
cover (``edge_s``), is exposed. Hidden traffic slows compute by ``comm_slowdown`` of its time.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import NamedTuple

from meshplan.cost import memory as mem
from meshplan.cost.comm import StageTraffic, Unit, comm_ledger
from meshplan.cost.compute import (
    ComputeParams,
    LayerTimes,
    layer_times,
    lm_head_times,
    optimizer_step_time_s,
)
from meshplan.cost.estimate import CommEntry, Estimate, FlopReport, MemoryReport, StageDetail
from meshplan.cost.flops import model_flop_per_token, recompute_flop_per_token
from meshplan.cost.mesh import Group, axis_groups
from meshplan.cost.params import ParamCounts, param_counts
from meshplan.cost.pipeline import bubble_fraction, bubble_time_s, in_flight_microbatches, stage_layers
from meshplan.cost.validate import validate_plan
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.units import MiB, format_gib

DDP_BUCKET_BYTES = 25 * MiB  # torch DDP default bucket_cap_mb=25


class _AccelKey(NamedTuple):
    """The accelerator figures the compute model reads (hashable, for the cache)."""

    bf16_flop_per_s: float
    fp8_flop_per_s: float | None
    gemm_efficiency: float
    hbm_bytes_per_s: float


@functools.lru_cache(maxsize=16384)
def _layer_times(model: ModelSpec, accel: _AccelKey, compute: ComputeParams, tokens: float, seq_len: int, cp: int,
                 tp: int, precision: str, moe: bool, expert_tokens: float, local: float, cp_chunked: bool,
                 flash_attention: bool) -> LayerTimes:
    """layer_times, memoised: a search evaluates the same layer shapes under many sharding variants."""
    return layer_times(model, accel, compute, tokens=tokens, seq_len=seq_len, cp=cp, tp=tp,  # type: ignore[arg-type]
                       precision=precision, moe=moe, expert_tokens=expert_tokens, local_experts=local,
                       cp_chunked=cp_chunked, flash_attention=flash_attention)


@dataclass(frozen=True, slots=True)
class _StageCtx:
    """What every part of one stage's evaluation shares."""

    model: ModelSpec
    counts: ParamCounts
    cluster: ClusterSpec
    job: JobSpec
    plan: Plan
    groups: dict[str, Group]
    s: int
    n_dense: int
    n_moe: int
    m: int
    units: tuple[Unit, ...]

    @property
    def tokens(self) -> float:
        return (self.plan.mbs or 1) * self.job.seq_len / self.plan.cp

    @property
    def recompute(self) -> str:
        return self.plan.recompute or "none"

    @property
    def last(self) -> bool:
        return self.s == self.plan.pp - 1

    def params(self, group: str) -> float:
        return sum(u.n_params * u.count for u in self.units if u.group == group)


def _local_params(counts: ParamCounts, plan: Plan, s: int, n_dense: int, n_moe: int, tied_copy: bool
                  ) -> tuple[Unit, ...]:
    """FSDP units of stage ``s`` with their parameters on one rank (matrices split by TP, experts by EP)."""
    return _units(counts, plan.tp, plan.ep, plan.pp, s, n_dense, n_moe, tied_copy)


@functools.lru_cache(maxsize=8192)
def _units(counts: ParamCounts, t: int, ep: int, pp: int, s: int, n_dense: int, n_moe: int, tied_copy: bool
           ) -> tuple[Unit, ...]:
    dense = (counts.attention_per_layer + counts.dense_mlp_per_layer) / t + counts.norms_per_layer
    moe = ((counts.attention_per_layer + counts.shared_experts_per_moe_layer) / t + counts.norms_per_layer
           + counts.router_per_moe_layer)
    experts = counts.routed_experts_per_moe_layer / ep
    root = 0.0
    if s == 0:
        root += counts.embedding / t
    if s == pp - 1:
        head = counts.lm_head if counts.lm_head else (counts.lm_head_matmul if tied_copy else 0)
        root += head / t + counts.final_norm
    units = [Unit("block", dense, n_dense, "dp_shard"), Unit("MoE block (non-expert)", moe, n_moe, "dp_shard"),
             Unit("experts", experts, n_moe, "edp"), Unit("root (embedding / LM head)", root, 1, "dp_shard",
                                                           root=True)]
    return tuple(u for u in units if u.count and u.n_params)


def _set_exposure(entries: list[CommEntry], windows: dict[str, float], overlap: float,
                  dp_overlap: float | None = None) -> None:
    """Set ``exposed_s`` on each entry: per (window, link), traffic beyond the window is exposed.
    ``dp_overlap`` replaces ``overlap`` for data-parallel traffic (an implementation's own prefetching)."""
    by_key: dict[tuple[str, str, bool], list[CommEntry]] = defaultdict(list)
    for e in entries:
        by_key[(e.window, e.link, dp_overlap is not None and e.axis in ("dp_shard", "edp"))].append(e)
    for (window, _link, dp), group in by_key.items():
        hideable = sum(e.time_s - e.edge_s for e in group)
        capacity = windows.get(window, 0.0) * (dp_overlap if dp else overlap)
        excess = max(0.0, hideable - capacity)
        share = excess / hideable if hideable > 0 else 0.0
        for e in group:
            e.exposed_s = e.edge_s + (e.time_s - e.edge_s) * share


def _stage_memory(c: _StageCtx) -> MemoryReport:
    """Peak memory of a GPU of stage ``c.s`` and its terms [bytes]."""
    model, job, plan = c.model, c.job, c.plan
    sp = plan.sequence_parallel
    tokens, recompute = c.tokens, c.recompute
    n_d, edp = plan.shard_degree, c.groups["edp"].size
    dense_params, expert_params = c.params("dp_shard"), c.params("edp")
    terms: dict[str, float] = {}
    for n_params, degree, kind in ((dense_params, n_d, ""), (expert_params, edp, "expert_")):
        state = mem.state_bytes_per_param(sharding=plan.sharding, optimizer=job.optimizer,
                                          dp_sharded=degree > 1, reduce_dtype_bytes=job.reduce_dtype_bytes)
        for k, v in mem.model_state_bytes(n_params=n_params, shard_degree=degree, state=state).items():
            if v:
                terms[kind + k] = terms.get(kind + k, 0.0) + v
    static = sum(terms.values())

    flash = job.flash_attention or recompute == "selective"
    a_dense = mem.layer_activation_bytes_per_token(model, ffn_hidden=model.ffn_hidden, tp=plan.tp, sp=sp,
                                                   flash_attention=flash, seq_len=job.seq_len)
    a_moe = 0.0
    if c.n_moe:
        a_moe = mem.layer_activation_bytes_per_token(
            model, ffn_hidden=model.ffn_hidden, tp=plan.tp, sp=sp, flash_attention=flash, seq_len=job.seq_len,
            moe_tokens_factor=model.top_k * job.moe_capacity_factor * job.moe_routing_imbalance,
            moe_ffn_hidden=model.expert_ffn_hidden, n_shared=model.n_shared_experts)
    held = in_flight_microbatches(schedule=plan.schedule, pp=plan.pp, m=c.m, vpp=plan.vpp, stage=c.s)
    layers = c.n_dense + c.n_moe
    working = 0.0
    if recompute == "full":
        stored = tokens * layers * mem.full_recompute_bytes_per_token(hidden=model.hidden, tp=plan.tp, sp=sp)
        working = tokens * max(a_dense, a_moe)
    elif recompute == "sac":
        sac_d = mem.sac_activation_bytes_per_token(model, ffn_hidden=model.ffn_hidden, tp=plan.tp, sp=sp)
        sac_m = (mem.sac_activation_bytes_per_token(model, ffn_hidden=model.expert_ffn_hidden * model.top_k,
                                                    tp=plan.tp, sp=sp) if c.n_moe else 0.0)
        stored = tokens * (c.n_dense * sac_d + c.n_moe * sac_m)
        working = tokens * (max(a_dense, a_moe) - max(sac_d, sac_m))
    else:
        stored = tokens * (c.n_dense * a_dense + c.n_moe * a_moe)
    act_terms = {"activations": held * stored}
    if c.s == 0:
        act_terms["embedding_output"] = held * tokens * model.hidden * 2.0 / (plan.tp if sp else 1)
    activation = sum(act_terms.values())
    terms.update(act_terms)

    transient: dict[str, float] = {}
    if working:
        transient["recompute_working_set"] = working
    if c.last:
        transient["logits_and_loss"] = tokens * mem.logits_bytes_per_token(vocab=model.vocab, tp=plan.tp)
    block_units = [u for u in c.units if not u.root]
    if plan.sharding in ("fsdp", "zero3") and n_d > 1 and block_units:
        u_max = max(u.n_params for u in block_units)
        transient["fsdp_unsharded_params"] = 2 * u_max * 2.0  # current unit + the one prefetched
        transient["fsdp_unsharded_grads"] = u_max * (2.0 + job.reduce_dtype_bytes)
        root = sum(u.n_params for u in c.units if u.root)
        if root:
            transient["fsdp_root_unsharded"] = root * 2.0
        raf = plan.effective_reshard_after_forward
        block_params = sum(u.n_params * u.count for u in block_units)
        if raf is False:
            transient["fsdp_kept_after_forward"] = block_params * 2.0
        elif not isinstance(raf, bool):
            transient["fsdp_kept_after_forward"] = block_params * 2.0 / raf
        if plan.effective_grad_sync == "last" and plan.sharding == "fsdp":
            transient["unsharded_grad_accumulation"] = (dense_params + expert_params) * job.reduce_dtype_bytes
    elif plan.sharding == "fsdp" and n_d == 1 and plan.dp_replicate > 1:
        transient["ddp_buckets"] = 2 * DDP_BUCKET_BYTES
    terms.update(transient)
    transient_total = sum(transient.values())

    rt = job.runtime
    n_groups = 1 + sum(1 for a in ("tp", "cp", "dp_shard", "dp_replicate", "pp", "ep") if c.groups[a].size > 1)
    runtime = {"cuda_context": rt.cuda_context_bytes, "nccl_buffers": rt.nccl_bytes_per_group * n_groups,
               "allocator_fragmentation": rt.allocator_fraction * (static + activation + transient_total)}
    terms.update(runtime)
    runtime_total = sum(runtime.values())
    return MemoryReport(terms=terms, static_bytes=static, activation_bytes=activation,
                        transient_bytes=transient_total, runtime_bytes=runtime_total,
                        peak_bytes=static + activation + transient_total + runtime_total,
                        capacity_bytes=c.cluster.accelerator.hbm_capacity_bytes, stage=c.s)


def _stage_compute(c: _StageCtx, compute: ComputeParams) -> tuple[float, ...]:
    """Per micro-batch on stage ``c.s`` [s]: (t_F, t_B, t_W, t_R recompute, attention forward) of the layers,
    and the LM head's forward and backward (0 except on the last stage)."""
    model, job, plan, accel = c.model, c.job, c.plan, c.cluster.accelerator
    tokens = c.tokens
    sp = plan.sequence_parallel

    def lt(moe: bool) -> LayerTimes:
        expert_tokens = local = 0.0
        if moe:
            t_rank = tokens / (plan.tp if sp else 1)
            expert_tokens = (t_rank * plan.ep * model.top_k * job.moe_capacity_factor * job.moe_routing_imbalance
                             / model.n_experts)
            local = model.n_experts / plan.ep
        return _layer_times(model, _AccelKey(accel.bf16_flop_per_s, accel.fp8_flop_per_s, accel.gemm_efficiency,
                                             accel.hbm_bytes_per_s), compute, tokens, job.seq_len, plan.cp, plan.tp,
                            job.precision, moe, expert_tokens, local, plan.context_impl != "a2a",
                            job.flash_attention)

    kinds = [(c.n_dense, lt(False))] + ([(c.n_moe, lt(True))] if c.n_moe else [])
    t_f = sum(n * x.fwd_s for n, x in kinds)
    t_b = sum(n * x.bwd_input_s for n, x in kinds)
    t_w = sum(n * x.bwd_weight_s for n, x in kinds)
    attn = sum(n * x.attention_fwd_s for n, x in kinds)
    t_r = 0.0
    if c.recompute == "full":
        t_r = t_f
    elif c.recompute == "sac":
        t_r = 0.5 * sum(n * x.gemm_fwd_s for n, x in kinds)
    elif c.recompute == "selective" and not job.flash_attention:
        t_r = attn
    hf = hb = 0.0
    if c.last:
        hf, hb = lm_head_times(model, accel, compute, tokens=tokens, tp=plan.tp, precision=job.precision)
    return t_f, t_b, t_w, t_r, attn, hf, hb


def _stage_time(c: _StageCtx, compute: ComputeParams, times: tuple[float, ...]) -> StageDetail:
    """Communication ledger, exposure and the stage's step time [s]."""
    plan, job, m = c.plan, c.job, c.m
    lf, lb, t_w, t_r, attn, hf, hb = times
    t_f, t_b = lf + hf, lb + hb
    st = StageTraffic(units=c.units, n_layers=c.n_dense + c.n_moe, n_moe_layers=c.n_moe, has_embedding=c.s == 0,
                      has_lm_head=c.last, tokens=c.tokens, m=m, recompute=c.recompute)
    ledger = comm_ledger(c.model, c.cluster, job, plan, c.groups, st)
    attn_passes = 1.0 + 2.5 + (1.0 if c.recompute == "full" else 0.0)
    windows = {
        "forward": m * t_f, "backward": m * (t_b + t_w + t_r), "first_forward": t_f,
        "last_backward": t_b + t_w + t_r, "attention": m * attn * attn_passes,
        "pipeline": m * (t_f + t_b + t_w + t_r), "none": 0.0,
    }
    _set_exposure(ledger, windows, compute.overlap_efficiency,
                  compute.zero3_overlap_efficiency if plan.sharding == "zero3" else None)
    bubble = bubble_time_s(schedule=plan.schedule, pp=plan.pp, vpp=plan.vpp, t_f_s=t_f, t_b_s=t_b + t_r, t_w_s=t_w)
    state = mem.state_bytes_per_param(sharding=plan.sharding, optimizer=job.optimizer, dp_sharded=True,
                                      reduce_dtype_bytes=job.reduce_dtype_bytes)
    touched = 2 * (4.0 + state.optimizer) + state.grads + (2.0 if state.master else 0.0)
    local = c.params("dp_shard") / plan.shard_degree + c.params("edp") / c.groups["edp"].size
    opt = optimizer_step_time_s(n_params_local=local, bytes_touched_per_param=touched,
                                accel=c.cluster.accelerator, params=compute)
    hidden = sum(x.time_s - x.exposed_s for x in ledger)
    breakdown: dict[str, float] = {"compute": m * (t_f + t_b + t_w), "recompute": m * t_r}
    for x in ledger:
        key = f"exposed {x.collective} ({x.axis})"
        breakdown[key] = breakdown.get(key, 0.0) + x.exposed_s
    breakdown["pipeline bubble"] = bubble
    breakdown["optimizer step"] = opt
    breakdown["comm contention"] = compute.comm_slowdown * hidden
    breakdown["step overhead"] = compute.step_overhead_s
    return StageDetail(stage=c.s, n_layers=c.n_dense + c.n_moe, t_f_s=lf, t_b_s=lb, t_w_s=t_w, t_r_s=t_r,
                       attention_fwd_s=attn, head_f_s=hf, head_b_s=hb, comm=ledger, optimizer_s=opt,
                       breakdown=breakdown, time_s=sum(breakdown.values()))


@functools.lru_cache(maxsize=1024)
def _flops(model: ModelSpec, counts: ParamCounts, seq_len: int, convention: str, recompute: str,
           flash_attention: bool, tokens: int) -> FlopReport:
    """FLOPs per step in both conventions, and with recomputation (memoised: plan-independent)."""
    causal = convention == "causal"
    f_palm = model_flop_per_token(model, counts, seq_len=seq_len, causal=False)
    f_causal = model_flop_per_token(model, counts, seq_len=seq_len, causal=True)
    f_tok = f_causal if causal else f_palm
    f_re = recompute_flop_per_token(model, counts, seq_len=seq_len, recompute=recompute,
                                    flash_attention=flash_attention, causal=causal)
    return FlopReport(model_flop_per_step=f_tok * tokens, hardware_flop_per_step=(f_tok + f_re) * tokens,
                      model_flop_per_token=f_tok, convention=convention,
                      model_flop_per_step_palm=f_palm * tokens, model_flop_per_step_causal=f_causal * tokens)


def _memory_only_estimate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, m: int, job: JobSpec,
                          reasons: list[str], mem_report: MemoryReport, flops: FlopReport) -> Estimate:
    """A probe used while bisecting the micro-batch size: memory and feasibility, no timing."""
    return Estimate(model=model.name, cluster=cluster.name, n_gpus=cluster.n_gpus, plan=plan, n_microbatches=m,
                    global_batch_tokens=job.global_batch_tokens, seq_len=job.seq_len, feasible=not reasons,
                    infeasible_reasons=reasons, memory=mem_report, flops=flops, step_time_s=float("nan"),
                    time_breakdown={}, mfu=float("nan"), hfu=float("nan"), comm=[])


def _evaluate_fixed(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                    compute: ComputeParams, mfu: float | None, *, memory_only: bool = False) -> Estimate:
    reasons: list[str] = []
    seqs, dp = job.global_batch_seqs, plan.dp
    mbs = plan.mbs or 1
    if seqs % dp:
        reasons.append(f"global batch of {seqs} sequences does not split evenly over {dp} data-parallel "
                       f"replicas")
    per_replica = max(1, seqs // dp)
    if seqs < dp:
        reasons.append(f"global batch of {seqs} sequences is smaller than {dp} data-parallel replicas")
    if per_replica % mbs:
        reasons.append(f"micro-batch size {mbs} does not divide the {per_replica} sequences per replica")
    m = max(1, per_replica // mbs)
    if plan.schedule == "interleaved" and plan.pp > 1 and m % plan.pp:
        reasons.append(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp={plan.pp}")
    groups = axis_groups(plan, cluster)
    layout = stage_layers(model, plan.pp)
    tokens = job.global_batch_tokens
    flops = _flops(model, counts, job.seq_len, job.flop_convention, plan.recompute or "none", job.flash_attention,
                   tokens)
    peak = cluster.accelerator.peak_flop_per_s(job.precision)
    ctxs = [_StageCtx(model, counts, cluster, job, plan, groups, s, *layout[s], m,
                      _local_params(counts, plan, s, *layout[s], tied_copy=plan.pp > 1))
            for s in sorted({0, plan.pp - 1})]
    mem_report = max((_stage_memory(c) for c in ctxs), key=lambda r: r.peak_bytes)
    if mem_report.peak_bytes > mem_report.capacity_bytes:
        t = mem_report.terms
        reasons.append(
            f"needs {format_gib(mem_report.peak_bytes)} per GPU (model states {format_gib(mem_report.static_bytes)}"
            f" + activations {format_gib(mem_report.activation_bytes)} + transient "
            f"{format_gib(mem_report.transient_bytes)} + runtime {format_gib(mem_report.runtime_bytes)}) on "
            f"stage {mem_report.stage}, over the {format_gib(mem_report.capacity_bytes)} of HBM"
            + (f"; unsharded gradient accumulation alone is {format_gib(t['unsharded_grad_accumulation'])}"
               if "unsharded_grad_accumulation" in t else ""))
    if memory_only:
        return _memory_only_estimate(model, cluster, plan, m, job, reasons, mem_report, flops)
    times = [_stage_compute(c, compute) for c in ctxs]
    if mfu is not None:
        # compute runs at the given MFU: hardware FLOPs per GPU / (peak · mfu); scale the kernel model to it
        target = flops.hardware_flop_per_step / cluster.n_gpus / (peak * mfu)
        kernel = m * (sum(times[0][:4]) + sum(times[0][5:]))
        scale = target / kernel if kernel > 0 else 1.0
        times = [tuple(x * scale for x in t) for t in times]  # type: ignore[misc]
    details = tuple(_stage_time(c, compute, t) for c, t in zip(ctxs, times, strict=True))
    slowest = max(details, key=lambda x: x.time_s)
    step = slowest.time_s
    return Estimate(
        model=model.name, cluster=cluster.name, n_gpus=cluster.n_gpus, plan=plan, n_microbatches=m,
        global_batch_tokens=tokens, seq_len=job.seq_len, feasible=not reasons, infeasible_reasons=reasons,
        memory=mem_report, flops=flops, step_time_s=step, time_breakdown=slowest.breakdown,
        mfu=flops.model_flop_per_step / (cluster.n_gpus * peak * step),
        hfu=flops.hardware_flop_per_step / (cluster.n_gpus * peak * step),
        comm=slowest.comm, bubble_fraction=bubble_fraction(schedule=plan.schedule, pp=plan.pp, m=m, vpp=plan.vpp),
        stages=details,
        compute_source=f"assumed MFU {mfu:.0%}" if mfu is not None else f"kernel model ({compute.source})",
    )


def _mbs_options(job: JobSpec, plan: Plan) -> list[int]:
    per_replica = job.global_batch_seqs // plan.dp if job.global_batch_seqs >= plan.dp else 1
    return [b for b in range(per_replica, 0, -1) if per_replica % b == 0] or [1]


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None = None,
             compute: ComputeParams | None = None) -> Estimate:
    """Evaluate ``plan``. A micro-batch size or recompute mode left as None is chosen: the fastest
    feasible combination (the number of micro-batches follows from memory); if none fits, the one
    that needs the least memory, reported infeasible with its reasons."""
    validate_plan(model, cluster, job, plan)
    if compute is None:
        from meshplan.calibration import compute_params_for  # catalog data, loaded lazily once

        compute = compute_params_for(cluster.accelerator.name, job.software)
    counts = param_counts(model)
    recomputes = [plan.recompute] if plan.recompute else (
        ["none", "sac", "full"] if job.flash_attention else ["none", "selective", "sac", "full"])
    mbs_list = [plan.mbs] if plan.mbs else _mbs_options(job, plan)
    cache: dict[tuple[str, int], Estimate] = {}

    probes: dict[tuple[str, int], Estimate] = {}
    variants: dict[tuple[str, int], Plan] = {}

    def variant(rc: str, b: int) -> Plan:
        if (rc, b) not in variants:
            variants[rc, b] = replace(plan, mbs=b, recompute=rc)
        return variants[rc, b]

    def fits(rc: str, b: int) -> bool:
        if (rc, b) not in probes:
            probes[rc, b] = _evaluate_fixed(model, counts, cluster, job, variant(rc, b), compute, mfu,
                                            memory_only=True)
        return probes[rc, b].feasible

    def at(rc: str, b: int) -> Estimate:
        if (rc, b) not in cache:
            cache[rc, b] = _evaluate_fixed(model, counts, cluster, job, variant(rc, b), compute, mfu)
        return cache[rc, b]

    # the most lenient combination (most recomputation, smallest micro-batch) fails: nothing fits
    if not fits(recomputes[-1], mbs_list[-1]):
        return at(recomputes[-1], mbs_list[-1])
    # Memory only shrinks with the micro-batch size and with more recomputation (recomputes is ordered
    # from least to most): bisect for the largest micro-batch that fits, most recomputation first, each
    # mode searching only micro-batches no larger than the previous mode's.
    first_fits: dict[str, int | None] = {}
    lo_bound = 0
    for rc in reversed(recomputes):
        lo, hi = lo_bound, len(mbs_list) - 1  # mbs_list is descending
        found = None
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(rc, mbs_list[mid]):
                found, hi = mid, mid - 1
            else:
                lo = mid + 1
        first_fits[rc] = found
        if found is None:
            break  # modes that recompute less need more memory: none of them fits either
        lo_bound = found
    best: Estimate | None = None
    smallest: Estimate | None = None
    for rc in recomputes:
        if best is not None and plan.pp == 1 and best.plan.mbs == mbs_list[0] and best.plan.recompute == "none":
            break  # nothing recomputed at the largest micro-batch: recomputing can only be slower
        first_fit = first_fits.get(rc)
        if first_fit is None:
            fits(rc, mbs_list[-1])
            probe = probes[rc, mbs_list[-1]]
            if smallest is None or probe.memory.peak_bytes < smallest.memory.peak_bytes:
                smallest = probe
            continue
        # without a pipeline the largest micro-batch that fits is the fastest; with one, fewer and
        # larger micro-batches trade GEMM efficiency against the bubble: try the largest that fits, the
        # smallest, and the one in the middle (in micro-batch count)
        last = len(mbs_list) - 1
        tries = [first_fit] if plan.pp == 1 else sorted({first_fit, (first_fit + last) // 2, last})
        for i in tries:
            est = at(rc, mbs_list[i])
            if est.feasible and (best is None or est.step_time_s < best.step_time_s):
                best = est
    if best is not None:
        return best
    assert smallest is not None
    return at(smallest.plan.recompute or "none", smallest.plan.mbs or 1)
