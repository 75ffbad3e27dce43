"""Lower bounds on a plan's step time, for pruning: from its compute, bubble and unhidden in-layer
communication (over micro-batch sizes and recompute modes), and from its traffic (``traffic_floors``)."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from meshplan.cost.batch import micro_batch_sizes, micro_batches
from meshplan.cost.comm import StageTraffic, comm_ledger
from meshplan.cost.compute import ComputeParams
from meshplan.cost.flops import attention_recomputed
from meshplan.cost.mesh import axis_groups
from meshplan.cost.pipeline import head_stage, plan_stage_layers, round_robin_chunks, stage_bubbles_s, stage_layers
from meshplan.cost.stage import StageCtx, bounding_stages, recomputed_layers
from meshplan.cost.stage_compute import loss_of, stage_compute_times
from meshplan.cost.stage_time import stage_comm
from meshplan.memo import cache_by_identity
from meshplan.specs import AcceleratorSpec, ClusterSpec, JobSpec, ModelSpec, Plan


class TrafficFloors(NamedTuple):
    """Lower bounds on a plan's step time from its communication (``traffic_floors``) [s]."""

    link_s: float
    """The busiest link's traffic outside the attention window, plus the fixed step overhead: a floor on
    the whole step time."""
    contention_s: float
    """A floor on what the hideable traffic, on every link, adds to the compute, the bubble, the overhead
    and the critical communication of the busiest stage (``compute_bound_s``)."""


def traffic_floors(ctxs: list[StageCtx], compute: ComputeParams) -> TrafficFloors:
    """What the traffic of the stages ``ctxs`` alone makes their step time at least [s]; with the fewest,
    largest micro-batches and the least recomputation, over every choice of them: each call costs a latency
    plus its bytes over a rate, so the same bytes in fewer calls take less time, data-parallel traffic runs
    once or once per micro-batch, and recomputation only adds calls.

    A stage's step time includes its whole compute W, every exposed second and the contention
    (``stage_time.stage_time``). On one link L carrying T_L:

    - ``link_s``: the forward windows together hide at most overlap·(the forwards), the backward windows
      overlap·(the backwards) and the whole-step windows only what those left of overlap·W
      (``exposure.set_exposure``), so the traffic outside the attention window hides at most overlap·W <= W
      and T_L - W of it is exposed; exposure overlapping on two links (``exposure._overlap_links``) still leaves
      the larger link's, and ``exposure.absorb_contention`` charges max(contention, excess). So the step is at
      least W + T_L - W = T_L. Attention-window traffic may hide behind attention a second time and is
      left out; with an overlap efficiency above 1 this floor is 0.
    - ``contention_s``: of the traffic T compute may hide (every window but 'none', on every link), the
      edges are exposed, a part X beyond them is exposed too and the rest is hidden, which slows compute by
      comm_slowdown·(T - edges - X); the step pays the edges and max(comm_slowdown·(T - edges - X), X)
      (``exposure.absorb_contention``), at least comm_slowdown/(1 + comm_slowdown) of T whatever X is. The compute
      bound takes its busiest stage, which need not be the one with the most traffic, so this floor is the
      least over the stages.
    """
    link, hideable = 0.0, float("inf")
    for c in ctxs:
        outside: dict[str, float] = defaultdict(float)
        overlappable = 0.0
        for e in stage_comm(c, compute):
            if e.window != "attention":
                outside[e.link] += e.time_s
            if e.window != "none":
                overlappable += e.time_s
        link = max(link, max(outside.values(), default=0.0))
        hideable = min(hideable, overlappable)
    if max(compute.overlap_efficiency, compute.zero3_overlap_efficiency) > 1.0:
        link = 0.0
    slowdown = max(0.0, compute.comm_slowdown)
    return TrafficFloors(link_s=link + compute.step_overhead_s,
                         contention_s=slowdown / (1.0 + slowdown) * (hideable if ctxs else 0.0))


def compute_bound_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, compute: ComputeParams,
                    mbs: int, recompute: str, recompute_layers: int | None = None) -> float:
    """The compute, recomputation and bubble of the busiest stage of ``plan`` (of ``bounding_stages``) at
    micro-batch size ``mbs`` and ``recompute``, the fixed step overhead and the communication no compute
    hides (``critical_comm_s``) [s]: every term of the step time except the hideable communication,
    contention and the optimizer step, all of which are non-negative."""
    m = micro_batches(job, plan.dp, mbs)
    return (_shape_bound_s(model, cluster.accelerator, compute, job, plan.tp, plan.cp, plan.ep, plan.expert_tp,
                           plan.pp, plan.schedule, plan.vpp, plan.layout, plan.sequence_parallel,
                           plan.context_impl != "a2a", mbs, recompute, m, recompute_layers,
                           loss_of(job, plan), plan.runs_megatron_layers(job.software))
            + critical_comm_s(model, cluster, job, plan, mbs, m, recompute, recompute_layers))


def critical_comm_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, mbs: int, m: int,
                    recompute: str, recompute_layers: int | None) -> float:
    """The in-layer communication no compute hides (window 'none': tensor parallelism without async TP,
    Ulysses all-to-alls, expert all-to-alls without overlap; not ZeRO-1/2's blocking all-gather after the
    optimizer step, which only adds to the step) of the lightest of the bounding stages at
    micro-batch size ``mbs`` [s]: every stage's step time includes its own in full. Each such collective
    runs a fixed number of times per micro-batch, so this is ``m`` times its value for one micro-batch."""
    if not ((plan.tp > 1 and not plan.async_tp) or (plan.cp > 1 and plan.context_impl == "a2a")
            or (plan.ep > 1 and model.n_moe_layers and not plan.ep_overlap)):
        return 0.0
    stages = plan_stage_layers(model, plan)
    megatron = plan.runs_megatron_layers(job.software)
    per = _layer_comm_s(model, cluster, job, plan.tp, plan.sequence_parallel, plan.async_tp, megatron, plan.cp,
                        plan.context_impl, plan.ep, plan.expert_tp, plan.ep_dispatch, plan.ep_overlap, mbs,
                        attention_recomputed(plan.recompute_key, job.flash_attention, megatron), plan)
    least = float("inf")
    head = head_stage(plan.schedule, plan.pp)
    # the compute bound takes the busiest of these, which may be a middle one
    for s in bounding_stages(stages, head):
        n_dense, n_moe = stages[s]
        r_dense, r_moe = recomputed_layers(recompute, recompute_layers, n_dense, n_moe)
        least = min(least, per[0] * n_dense + per[1] * n_moe + per[2] * (s == 0)
                    + per[3] * (s == head)
                    + per[4] * r_dense + per[5] * r_moe)
    return m * least


@cache_by_identity(n_specs=3, n_unkeyed=1)
def _layer_comm_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, tp: int, sp: bool, async_tp: bool,
                  megatron: bool, cp: int, context_impl: str, ep: int, etp: int, ep_dispatch: str | None,
                  ep_overlap: bool, mbs: int, attention_rerun: bool, plan: Plan
                  ) -> tuple[float, float, float, float, float, float]:
    """The unhidden in-layer communication of one micro-batch [s] per dense layer, per MoE layer, for the
    embedding, for the LM head, per recomputed dense layer and per recomputed MoE layer of a stage. The TP,
    CP and EP ledgers count their calls linearly in these, so a stage's is their weighted sum (``attention_rerun``:
    selective recomputation re-runs every layer's CP exchanges, flops.attention_recomputed); each is
    read off the ledger of a stage holding just that (a recomputed layer beside the layer it re-runs)."""
    groups = axis_groups(plan, cluster)

    def unhidden(n_dense: int, n_moe: int, first: bool, last: bool, recomputed: tuple[int, int]) -> float:
        st = StageTraffic(units=(), n_layers=n_dense + n_moe, n_moe_layers=n_moe, has_embedding=first,
                          has_lm_head=last, tokens=mbs * job.seq_len / cp, m=1, recomputed=recomputed)
        return sum(e.time_s for e in comm_ledger(model, cluster, job, plan, groups, st, in_layer=True)
                   if e.window == "none")

    dense, moe = unhidden(1, 0, False, False, (0, 0)), unhidden(0, 1, False, False, (0, 0))
    return (dense, moe, unhidden(0, 0, True, False, (0, 0)), unhidden(0, 0, False, True, (0, 0)),
            unhidden(1, 0, False, False, (1, 0)) - dense, unhidden(0, 1, False, False, (0, 1)) - moe)


@cache_by_identity(n_specs=4, maxsize=1 << 18)  # a large search's shapes, by loss too, exceed the default
def _shape_bound_s(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec, tp: int,
                   cp: int, ep: int, etp: int, pp: int, schedule: str, vpp: int, layout: str, sp: bool,
                   cp_chunked: bool, mbs: int, recompute: str, m: int, recompute_layers: int | None,
                   loss: str, megatron: bool) -> float:
    """``compute_bound_s`` on the plan fields it reads (memoised: plans that differ in sharding or in
    their communication options share it)."""
    stages = stage_layers(model, pp, layout, round_robin_chunks(schedule, vpp))
    tokens = mbs * job.seq_len / cp
    head = head_stage(schedule, pp)
    timed = bounding_stages(stages, head)
    passes = []
    for s in timed:
        n_dense, n_moe = stages[s]
        t_f, t_b, t_w, t_r, _, hf, hb = stage_compute_times(
            model, accelerator, compute, job, tokens, tp, cp, ep, etp, sp, cp_chunked, n_dense, n_moe, s == head,
            recompute, recomputed_layers(recompute, recompute_layers, n_dense, n_moe), loss if s == head else "",
            megatron)
        passes.append((t_f + hf, t_b + hb + t_r, t_w))
    bubbles = stage_bubbles_s(schedule=schedule, pp=pp, vpp=vpp, m=m, stages=timed, passes=passes)
    worst = max(m * sum(x) + b for x, b in zip(passes, bubbles, strict=True))
    return worst + compute.step_overhead_s


def step_time_lower_bound_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                            compute: ComputeParams) -> float:
    """A lower bound on ``step.evaluate(plan).step_time_s`` over every micro-batch size and recompute mode [s].

    Each stage's step time is a sum of non-negative terms (module docstring); keeping only the compute
    without recomputation, the pipeline bubble it implies (which only grows with recomputation), the
    fixed step overhead and the communication no compute hides bounds it from below. That communication
    is taken at the largest micro-batch size without recomputation, where it is least: the same bytes in
    fewer, larger calls, none repeated for a recomputed forward. The search sorts option variants by the
    bound and stops where it passes the tie band of the best plan.
    """
    b = plan.mbs or micro_batch_sizes(job, plan.dp)[0]
    return (_shape_lower_bound_s(model, cluster.accelerator, compute, job, plan.dp, plan.tp, plan.cp, plan.ep,
                                 plan.expert_tp, plan.pp, plan.schedule, plan.vpp, plan.layout,
                                 plan.sequence_parallel, plan.context_impl != "a2a", plan.mbs,
                                 loss_of(job, plan))
            + critical_comm_s(model, cluster, job, plan, b, micro_batches(job, plan.dp, b), "none", None))


@cache_by_identity(n_specs=4)
def _shape_lower_bound_s(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec,
                         dp: int, tp: int, cp: int, ep: int, etp: int, pp: int, schedule: str, vpp: int,
                         layout: str, sp: bool, cp_chunked: bool, mbs: int | None, loss: str) -> float:
    """``step_time_lower_bound_s`` on the plan fields it reads (memoised: option variants that change
    only communication or memory share it)."""
    sizes = [mbs] if mbs else micro_batch_sizes(job, dp)
    return min(_shape_bound_s(model, accelerator, compute, job, tp, cp, ep, etp, pp, schedule, vpp, layout, sp,
                              cp_chunked, b, "none", micro_batches(job, dp, b), None, loss, True)
               # nothing recomputed, so Megatron's layers time as others do, but for MLA's down-projections
               # under SP, which they run on T/t tokens (the lesser: layer_times' mla_down_local)
               for b in sizes)
