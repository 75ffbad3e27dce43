"""Evaluate one plan: memory, FLOPs, communication ledger, step time and MFU (the faithful mode).

The step time is a closed form over the ledger and a per-operation compute model:

.. math:: t_{step} = \\max_{stage} \\big[ m(t_F + t_B + t_W + t_R) + \\sum exposed + contention
          + bubble + t_{opt} \\big] + overhead

Each collective is hidden behind the compute window it can overlap (``CommEntry.window``) up to that
window's length times ``overlap_efficiency``, per link, less what traffic of an overlapping window on the
same link already hid there (``_set_exposure``); what does not fit, plus the parts no compute can cover
(``edge_s``), is exposed, and excess on different links in the same phase overlaps (``_overlap_links``).
Hidden traffic slows compute by ``comm_slowdown`` of its time, and that slower compute hides as much more
of the excess (``_absorb_contention``).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

from meshplan.cost import memory as mem
from meshplan.cost.comm import MOE_BLOCK, PARAM_DTYPE_BYTES, StageTraffic, Unit, attention_kv_dim, comm_ledger
from meshplan.cost.compute import (
    FP8_ATTENTION_SPEEDUP,
    ComputeParams,
    LayerTimes,
    layer_times,
    lm_head_times,
    mtp_projection_time_s,
    optimizer_step_time_s,
    selective_recompute_s,
)
from meshplan.cost.estimate import OTHER_MICROBATCH, CommEntry, Estimate, FlopReport, MemoryReport, StageDetail
from meshplan.cost.flops import attention_recomputed, model_flop_per_token, recompute_flop_per_token
from meshplan.cost.mesh import Group, axis_groups
from meshplan.cost.params import ParamCounts, param_counts
from meshplan.cost.pipeline import (
    bubble_fraction,
    head_stage,
    in_flight_microbatches,
    plan_stage_layers,
    rank_stage_ids,
    round_robin_chunks,
    stage_alive,
    stage_bubbles_s,
    stage_chunk_layers,
    stage_input_grads_kept,
    stage_layers,
    unpaired_microbatches,
)
from meshplan.cost.validate import recompute_module_needs, validate_plan
from meshplan.memo import cache_by_identity
from meshplan.specs import AcceleratorSpec, ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.plan import recompute_modules_of, stack_defaults
from meshplan.units import GB, GiB, MiB, format_gib


class _AccelKey(NamedTuple):
    """The accelerator figures the compute model reads (hashable, for the cache)."""

    bf16_flop_per_s: float
    fp8_flop_per_s: float | None
    gemm_efficiency: float
    hbm_bytes_per_s: float


def _accel_key(accel: AcceleratorSpec) -> _AccelKey:
    return _AccelKey(accel.bf16_flop_per_s, accel.fp8_flop_per_s, accel.gemm_efficiency, accel.hbm_bytes_per_s)


@functools.lru_cache(maxsize=16384)
def _layer_times(model: ModelSpec, accel: _AccelKey, compute: ComputeParams, tokens: float, seq_len: int, cp: int,
                 tp: int, precision: str, moe: bool, expert_tokens: float, local: float, cp_chunked: bool,
                 flash_attention: bool, etp: int, sp: bool, fused_grouped_mlp: bool, mla_down_local: bool
                 ) -> LayerTimes:
    """layer_times, memoised: a search evaluates the same layer shapes under many sharding variants."""
    return layer_times(model, accel, compute, tokens=tokens, seq_len=seq_len, cp=cp, tp=tp,  # type: ignore[arg-type]
                       precision=precision, moe=moe, expert_tokens=expert_tokens, local_experts=local,
                       cp_chunked=cp_chunked, flash_attention=flash_attention, expert_tp=etp,
                       sequence_parallel=sp and tp > 1, fused_grouped_mlp=fused_grouped_mlp,
                       mla_down_local=mla_down_local)


@functools.lru_cache(maxsize=64)
def _kernel_params(compute: ComputeParams, job: JobSpec) -> ComputeParams:
    """``compute`` as the job's kernels run: compiled blocks at the fused minimum of elementwise traffic,
    under a whole-iteration CUDA graph no per-MoE-layer gaps (JobSpec.cuda_graph_scope), and FP8 attention
    FP8_ATTENTION_SPEEDUP faster than the stack's BF16 kernel (JobSpec.fp8_attention)."""
    if job.fp8_attention:
        compute = replace(compute, attention_kernel_scale=compute.attention_kernel_scale * FP8_ATTENTION_SPEEDUP)
    if job.compiled:
        compute = replace(compute, elementwise_passes=1.0)
    if job.cuda_graphs and job.cuda_graph_scope == "full_iteration":
        compute = replace(compute, moe_layer_overhead_s=0.0)
    return compute


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
        return self.plan.recompute_key

    @property
    def last(self) -> bool:
        """Whether this stage holds the LM head and the loss (pipeline.head_stage)."""
        return self.s == head_stage(self.plan.schedule, self.plan.pp)

    @property
    def recomputed(self) -> tuple[int, int]:
        """(dense, MoE) layers of this stage whose forward is recomputed (the first ones: dense first)."""
        return recomputed_layers(self.plan.recompute, self.plan.recompute_layers, self.n_dense, self.n_moe)

    def params(self, group: str) -> float:
        return sum(u.n_params * u.count for u in self.units if u.group == group)


def recomputed_layers(recompute: str | None, recompute_layers: int | None, n_dense: int, n_moe: int
                      ) -> tuple[int, int]:
    """(dense, MoE) layers of a stage with ``n_dense`` then ``n_moe`` layers that recompute='full' re-runs:
    all, or the first ``recompute_layers`` (Megatron's block method); none for other modes."""
    if recompute != "full":
        return 0, 0
    n = n_dense + n_moe if recompute_layers is None else min(recompute_layers, n_dense + n_moe)
    return min(n, n_dense), n - min(n, n_dense)


def _local_params(model: ModelSpec, counts: ParamCounts, plan: Plan, s: int, n_dense: int, n_moe: int,
                  tied_copy: bool) -> tuple[Unit, ...]:
    """FSDP units of stage ``s`` with their parameters on one rank (matrices split by TP, experts by EP)."""
    mtp = (model.mtp_layers, model.hidden) if model.mtp_layers else (0, 0)
    return _units(counts, plan.tp, plan.ep, plan.expert_tp, s, head_stage(plan.schedule, plan.pp), n_dense, n_moe,
                  tied_copy, *mtp)


DENSE_BLOCK = "block"
"""The name of a dense layer's unit (``_units``); an MoE layer's are its non-expert part and its experts."""


@functools.lru_cache(maxsize=8192)
def _units(counts: ParamCounts, t: int, ep: int, etp: int, s: int, head: int, n_dense: int, n_moe: int,
           tied_copy: bool, mtp: int = 0, hidden: int = 0) -> tuple[Unit, ...]:
    """``_local_params``; ``head``: the stage holding the LM head (pipeline.head_stage). ``mtp`` MTP depths
    (their layers counted in ``n_dense`` / ``n_moe``) add to the head's stage its 2D -> D projections and,
    where that is not the embedding's stage, a copy of the embedding, which the MTP module looks the shifted
    tokens up in (Megatron-core keeps it on the last stage as it does a tied one)."""
    attention = counts.attention_per_tp_rank(t)
    dense = attention + counts.dense_mlp_per_layer / t + counts.norms_per_layer
    moe = attention + counts.shared_experts_per_moe_layer / t + counts.norms_per_layer + counts.router_per_moe_layer
    experts = counts.routed_experts_per_moe_layer / ep / etp
    root = 0.0
    if s == 0:
        root += counts.embedding / t
    if s == head:
        weights = counts.lm_head if counts.lm_head else (counts.lm_head_matmul if tied_copy else 0)
        root += weights / t + counts.final_norm
        if mtp:
            root += mtp * 2 * hidden * hidden / t + (counts.embedding / t if s != 0 else 0.0)
    units = [Unit(DENSE_BLOCK, dense, n_dense, "dp_shard"), Unit(MOE_BLOCK, moe, n_moe, "dp_shard"),
             Unit("experts", experts, n_moe, "edp"), Unit("root (embedding / LM head)", root, 1, "dp_shard",
                                                           root=True)]
    return tuple(u for u in units if u.count and u.n_params)


WINDOW_ORDER = ("attention", "forward", "backward", "first_forward", "last_backward", "pipeline", OTHER_MICROBATCH)
"""The order in which traffic claims the compute that hides it on a link: the most constrained first.
Attention traffic (context-parallel exchanges) must hide behind attention, which lies within the
forwards and backwards; the first forward and the last backward are one micro-batch of those; pipeline
transfers and traffic beside another micro-batch can use any compute of the step."""
_PHASE = {"forward": "forward", "first_forward": "forward", "backward": "backward", "last_backward": "backward"}
_PARENT = {"first_forward": "forward", "last_backward": "backward"}
_WHOLE = ("pipeline", OTHER_MICROBATCH)
_RANK = {w: i for i, w in enumerate(WINDOW_ORDER)}


SHARDED_DP_AXES = ("dp_shard", "edp")
"""The mesh axes that shard data-parallel state (dense and expert parameters): their traffic is what an
implementation's own prefetching hides (``_set_exposure``) and what ZeRO-3's collective efficiency slows."""
LAYER_AXES = ("tp", "cp", "ep")
"""Axes whose collectives the transformer layers issue themselves (between their kernels)."""
RECOMPUTE_LUMPED = ("ep", "cp")
"""Axes whose forward ledger entry also counts the recomputed forwards' calls (comm.py: the expert
all-to-alls, Ulysses' all-to-alls); tensor parallelism and ring attention list those under the backward."""
HOST_BOUND = "host-bound MoE launches"
"""Breakdown key: the time a stage's MoE layers wait for the host to launch their kernels."""
OFFLOAD = "activation offload"
"""Breakdown key: the time a stage's layers wait for offloaded activations to reach host memory (forward)
or to come back (backward) beyond what the layers' compute hides (Plan.offload_layers, offload_stalls_s)."""
STALLS = (HOST_BOUND, OFFLOAD)
"""Breakdown keys of waits that stretch a stage's compute (the simulator runs the stretched layers)."""


def _set_exposure(entries: list[CommEntry], windows: dict[str, float], overlap: float,
                  dp_overlap: float | None = None) -> None:
    """Set ``exposed_s`` on each entry. The traffic of each window on a link hides behind that window's
    compute (times ``overlap``, or ``dp_overlap`` for data-parallel traffic: an implementation's own
    prefetching) less what traffic of an overlapping window on the same link already hid there
    (WINDOW_ORDER); the rest, and the edges, are exposed. Windows overlap in time: attention lies within
    the forwards and backwards, the first forward and the last backward are one micro-batch of them, and
    the pipeline and OTHER_MICROBATCH windows span the whole step, so the same compute never hides more
    traffic on one link than it lasts."""
    groups: dict[tuple[str, str, bool], list[CommEntry]] = defaultdict(list)
    for e in entries:
        groups[(e.window, e.link, dp_overlap is not None and e.axis in SHARDED_DP_AXES)].append(e)
    hidden: dict[tuple[str, str], float] = defaultdict(float)  # (link, window) -> compute already claimed [s]
    attention: dict[tuple[str, str], float] = defaultdict(float)  # (link, phase) -> attention traffic hidden [s]
    for (window, link, dp), group in sorted(groups.items(), key=lambda kv: _RANK.get(kv[0][0], -1)):
        if window in _WHOLE:
            used = sum(v for (lk, _), v in hidden.items() if lk == link)
        else:
            used = hidden[link, window]
            phase = _PHASE.get(window)
            if phase is not None:  # attention traffic of this phase, and the parent's share of one micro-batch
                parent = _PARENT.get(window)
                share = windows.get(window, 0.0) / windows[parent] if parent and windows.get(parent) else 1.0
                used += share * (attention[link, phase] + (hidden[link, parent] if parent else 0.0))
        _expose(group, max(0.0, windows.get(window, 0.0) * (dp_overlap if dp else overlap) - used))
        for e in group:
            hidden[link, window] += e.time_s - e.exposed_s
            if window == "attention":
                attention[link, e.phase] += e.time_s - e.exposed_s
    _overlap_links(groups)


def _overlap_links(groups: dict[tuple[str, str, bool], list[CommEntry]]) -> None:
    """Links run side by side: what exceeds the compute of one phase on two links (an intra-node
    all-gather and an inter-node reduce-scatter of the same backward) runs at the same time, so the
    phase is extended by the larger excess, not by their sum. Each link's exposed part (beyond its
    edges) is scaled by max / sum, per phase: the forward windows and the backward windows (attention,
    pipeline and other-micro-batch traffic by the phase of its collective). Traffic on the critical path
    (window 'none') stays summed."""
    if len({link for (_, link, _) in groups}) < 2:
        return

    def phase(window: str, e: CommEntry) -> str:
        return _PHASE.get(window, e.phase)

    excess: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (window, link, _), group in groups.items():
        if window != "none":
            for e in group:
                excess[phase(window, e)][link] += e.exposed_s - e.edge_s
    keep = {p: max(links.values()) / sum(links.values()) for p, links in excess.items()
            if len(links) > 1 and sum(links.values()) > 0}
    if not keep:
        return
    for (window, _, _), group in groups.items():
        if window != "none":
            for e in group:
                e.exposed_s = e.edge_s + (e.exposed_s - e.edge_s) * keep.get(phase(window, e), 1.0)


def _expose(group: list[CommEntry], capacity: float) -> None:
    """Expose what of ``group`` exceeds ``capacity`` seconds of hiding compute, pro rata, plus the edges."""
    hideable = sum(e.time_s - e.edge_s for e in group)
    excess = max(0.0, hideable - capacity)
    share = excess / hideable if hideable > 0 else 0.0
    for e in group:
        e.exposed_s = e.edge_s + (e.time_s - e.edge_s) * share


def _absorb_contention(entries: list[CommEntry], slowed_s: float) -> None:
    """Hidden traffic slows the compute that hides it by ``slowed_s`` in all; that longer compute hides
    as much more of the traffic its windows could not (the exposed part beyond the edges), so the step
    pays max(contention, excess), not their sum. Where traffic exceeds compute (expert all-to-alls
    overlapped with another micro-batch), the step is the traffic's time and the slowed compute runs
    inside it, as the simulator has it; where compute exceeds traffic, nothing changes."""
    excess = sum(e.exposed_s - e.edge_s for e in entries if e.overlappable)
    if excess <= 0.0 or slowed_s <= 0.0:
        return
    keep = 1.0 - min(slowed_s, excess) / excess
    for e in entries:
        if e.overlappable:
            e.exposed_s = e.edge_s + (e.exposed_s - e.edge_s) * keep


class _StaticMemory(NamedTuple):
    """What a stage's memory needs that the micro-batch size and recomputation do not change."""

    state_terms: dict[str, float]
    """Model states [bytes]: parameters, gradients, optimizer (dense and expert)."""
    transient_terms: dict[str, float]
    """Gathered FSDP units, kept parameters, unsharded gradients, DDP buckets [bytes]."""
    runtime_terms: dict[str, float]
    """CUDA context, NCCL buffers and DeepEP buffers [bytes] (fragmentation scales with the rest)."""
    a_dense: tuple[float, float]
    """Activation bytes per token of a dense layer without recomputation: (unfused, flash) attention."""
    a_moe: tuple[float, float]
    """The same for an MoE layer (0 without MoE layers)."""
    full_recompute: float
    """Bytes per token per layer kept under full recomputation (the layer input)."""
    sac: tuple[float, float]
    """Bytes per token per (dense, MoE) layer kept by op-level selective checkpointing."""
    logits: float
    """Loss working set per token on the last stage (0 elsewhere)."""
    head_inputs: float
    """Bytes per token the last stage saves per micro-batch beside its layers: the final norm's input and
    the LM head's (0 elsewhere)."""
    cp_gather: float = 0.0
    """Context parallelism's gathered K, V and dK, dV per local token at a layer's backward (KV all-gather
    only; memory.cp_kv_gather_bytes_per_token)."""
    stage_ids: tuple[int, ...] = (0,)
    """The pipeline stages the rank runs (pipeline.rank_stage_ids), of ``n_stages``."""
    n_stages: int = 1
    torch_pipelined: bool = False
    """Whether torch.distributed.pipelining keeps the stage-boundary tensors (memory.pipelining_boundary_tensors;
    each a layer's input, ``full_recompute`` per token): Plan.torch_pipelined."""
    kept_logits: float = 0.0
    """Bytes per token of the logits PyTorch's pipelining keeps through an eager loss's backward."""
    logit_grads: float = 0.0
    """Bytes per token of the logits' gradient, on the loss's stage under PyTorch's pipelining: a
    zero-bubble schedule's deferred W of the LM head keeps it until it runs."""
    loss_graphs: float = 0.0
    """Bytes per token each micro-batch alive on the loss's stage under PyTorch's pipelining keeps, but the
    one whose backward is the peak, where the backward runs whole: its logits and loss graph
    (memory.loss_graph_bytes_per_token; GPipe holds m)."""

    @property
    def fixed_bytes(self) -> tuple[float, float, float]:
        """(model states, static transients, CUDA context and NCCL) totals [bytes]."""
        return (sum(self.state_terms.values()), sum(self.transient_terms.values()),
                sum(self.runtime_terms.values()))


def _static_memory(c: _StageCtx) -> _StaticMemory:
    model, job, plan = c.model, c.job, c.plan
    n_d, edp = plan.shard_degree, c.groups["edp"].size
    dense_params, expert_params = c.params("dp_shard"), c.params("edp")
    terms: dict[str, float] = {}
    for n_params, degree, kind in ((dense_params, n_d, ""), (expert_params, edp, "expert_")):
        state = mem.state_bytes_per_param(sharding=plan.sharding, optimizer=job.optimizer,
                                          dp_sharded=degree > 1, reduce_dtype_bytes=job.reduce_dtype_bytes)
        for k, v in mem.model_state_bytes(n_params=n_params, shard_degree=degree, state=state).items():
            if v:
                terms[kind + k] = terms.get(kind + k, 0.0) + v
    transient: dict[str, float] = {}
    block_units = [u for u in c.units if not u.root]
    if plan.sharding in ("fsdp", "zero3") and n_d > 1 and block_units:
        if plan.sharding == "zero3":  # DeepSpeed gathers module by module, the embedding or head among them
            module = max(model.hidden * model.ffn_hidden * (2 if model.gated_mlp else 1),
                         model.vocab * model.hidden) / plan.tp  # an MLP matrix, or the embedding or head
            transient["fsdp_unsharded_params"] = mem.zero3_live_params(module) * 2.0
            transient["fsdp_unsharded_grads"] = (module + mem.ZERO3_REDUCE_BUCKET_ELEMENTS) * 2.0
        else:  # FSDP2: whole units; an MoE layer's two (its experts and the rest) are gathered together,
            # torchtitan prefetching [next block, next block's experts] (apply_fsdp)
            u_max = max([u.n_params for u in block_units if u.name == DENSE_BLOCK]
                        + [sum(u.n_params for u in block_units if u.name != DENSE_BLOCK)])
            if plan.effective_reshard_after_forward is not False:  # else every unit stays gathered (below)
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
    elif plan.is_ddp and not plan.runs_megatron_layers(job.software):
        transient["ddp_gradient_buckets"] = mem.ddp_bucket_bytes(terms)
    rt = job.runtime
    n_groups = 1 + sum(1 for a in ("tp", "cp", "dp_shard", "dp_replicate", "pp", "ep") if c.groups[a].size > 1)
    runtime = {"cuda_context": rt.cuda_context_bytes, "nccl_buffers": rt.nccl_bytes_per_group * n_groups}
    if plan.ep_dispatch == "deepep" and c.n_moe:
        runtime["deepep_buffers"] = mem.deepep_buffer_bytes(hidden=model.hidden, ep=plan.ep)

    megatron = plan.runs_megatron_layers(job.software)
    cp_gather = (mem.cp_kv_gather_bytes_per_token(kv_dim=attention_kv_dim(model, job), tp=plan.tp, cp=plan.cp,
                                                  gathered_grads=megatron)
                 if plan.cp > 1 and plan.context_impl == "allgather" and c.n_dense + c.n_moe else 0.0)
    coefficients = _activation_coefficients(model, job, plan.tp, plan.sequence_parallel, c.n_moe > 0, c.last,
                                            plan.expert_tp, plan.sequence_parallel and not megatron, megatron)
    ids = rank_stage_ids(plan.schedule, plan.pp, plan.vpp, c.s)
    torch_pipelined = plan.torch_pipelined(job.software)
    head = torch_pipelined and c.last
    logits = 2.0 * model.vocab / plan.tp if head else 0.0  # bf16, per token
    loss = job.loss_impl(False)
    return _StaticMemory(terms, transient, runtime, *coefficients, cp_gather, ids, plan.pp * len(ids),
                         torch_pipelined, logits if loss == "eager" else 0.0, logits,
                         mem.loss_graph_bytes_per_token(vocab=model.vocab, tp=plan.tp, loss=loss) if head else 0.0)


@cache_by_identity(n_specs=2)
def _selective_freed(model: ModelSpec, job: JobSpec, tp: int, sp: bool, moe: bool, etp: int,
                     modules: frozenset[str]) -> tuple[float, float]:
    """Bytes per token a (dense, MoE) layer no longer holds under Megatron's selective ``modules``
    (memory.selective_freed_bytes_per_token), memoised."""
    def freed(moe_layer: bool) -> float:
        parts = mem.activation_parts_per_token(
            model, ffn_hidden=model.ffn_hidden, tp=tp, sp=sp, flash_attention=True, seq_len=job.seq_len,
            moe_tokens_factor=model.top_k * job.moe_capacity_factor * job.moe_routing_imbalance if moe_layer else 0.0,
            moe_ffn_hidden=model.expert_ffn_hidden, n_shared=model.n_shared_experts if moe_layer else 0,
            expert_tp=etp, fp8_inputs=job.fp8_saves_fp8_inputs)
        return mem.selective_freed_bytes_per_token(parts, modules, moe_layer=moe_layer, mla=model.is_mla)
    return freed(False), freed(True) if moe else 0.0


@cache_by_identity(n_specs=2)
def _activation_coefficients(model: ModelSpec, job: JobSpec, tp: int, sp: bool, moe: bool, last: bool, etp: int,
                             gathered: bool, megatron: bool
                             ) -> tuple[tuple[float, float], tuple[float, float], float, tuple[float, float], float,
                                        float]:
    """The per-token fields of ``_StaticMemory`` (a_dense ... head_inputs), memoised: they depend on the
    model, the job and the TP split (of the experts: ``etp``; ``gathered``: the QKV, MLP and LM head inputs
    are saved as the sequence-parallel all-gather delivered them, memory.activation_parts_per_token) and
    whether Megatron-core's layers run (its fused SwiGLU and cross-entropy) only."""
    glu = job.glu_saves_activation(megatron)

    def act(flash: bool, moe: bool) -> float:
        if not moe:
            return mem.layer_activation_bytes_per_token(
                model, ffn_hidden=model.ffn_hidden, tp=tp, sp=sp, flash_attention=flash, seq_len=job.seq_len,
                fp8_inputs=job.fp8_saves_fp8_inputs, gathered_inputs=gathered,
                kv_expanded=job.attention_kv_expanded, glu_saves_activation=glu)
        return mem.layer_activation_bytes_per_token(
            model, ffn_hidden=model.ffn_hidden, tp=tp, sp=sp, flash_attention=flash, seq_len=job.seq_len,
            moe_tokens_factor=model.top_k * job.moe_capacity_factor * job.moe_routing_imbalance,
            moe_ffn_hidden=model.expert_ffn_hidden, n_shared=model.n_shared_experts, expert_tp=etp,
            fp8_inputs=job.fp8_saves_fp8_inputs, gathered_inputs=gathered,
            kv_expanded=job.attention_kv_expanded, glu_saves_activation=glu)

    a_moe = (act(False, True), act(True, True)) if moe else (0.0, 0.0)
    sac_m = (mem.sac_activation_bytes_per_token(model, ffn_hidden=model.expert_ffn_hidden * model.top_k, tp=tp,
                                                sp=sp) if moe else 0.0)
    return ((act(False, False), act(True, False)), a_moe,
            mem.full_recompute_bytes_per_token(hidden=model.hidden, tp=tp, sp=sp),
            (mem.sac_activation_bytes_per_token(model, ffn_hidden=model.ffn_hidden, tp=tp, sp=sp), sac_m),
            # the main loss's and each MTP depth's, all alive until the backward
            mem.logits_bytes_per_token(vocab=model.vocab, tp=tp, loss=job.loss_impl(megatron),
                                       losses=1 + model.mtp_layers)
            if last else 0.0,
            mem.head_input_bytes_per_token(hidden=model.hidden, tp=tp, sp=sp, gathered=gathered,
                                           mtp_layers=model.mtp_layers) if last else 0.0)


def _dynamic_memory(c: _StageCtx, st: _StaticMemory) -> tuple[float, float, float, float, float]:
    """The terms the micro-batch size and recomputation set [bytes]: (activations held for backward,
    recomputation working set, logits and loss, context parallelism's gathered KV, the stage-boundary
    tensors torch.distributed.pipelining keeps (memory.pipelining_boundary_tensors, each a layer's input,
    ``full_recompute`` per token)). The first stage's
    embedding output is its first layer's input, which that layer's input norm (or its checkpoint) saves
    and the activations count: no term of its own (every rank runs a layer, specs.plan; checked with
    saved_tensors_hooks under TP and FSDP2, and in Megatron's LanguageModelEmbedding, whose dropout at
    p = 0 returns its input)."""
    tokens, recompute = c.tokens, c.recompute
    modules = recompute_modules_of(recompute)
    flash = c.job.flash_attention or "core_attn" in modules
    a_dense, a_moe = st.a_dense[flash], st.a_moe[flash]
    freed = (0.0, 0.0)
    if modules - {"core_attn"}:
        freed = _selective_freed(c.model, c.job, c.plan.tp, c.plan.sequence_parallel, c.n_moe > 0, c.plan.expert_tp,
                                 modules)
        a_dense, a_moe = a_dense - freed[0], a_moe - freed[1]
    held = in_flight_microbatches(schedule=c.plan.schedule, pp=c.plan.pp, m=c.m, vpp=c.plan.vpp, stage=c.s,
                                  ep_overlap=c.plan.ep_overlap, layers=c.n_dense + c.n_moe,
                                  chunk_layers=_chunk_layers(c.model, c.plan, c.s))
    working = 0.0
    if recompute == "full":
        r_dense, r_moe = c.recomputed
        stored = tokens * ((r_dense + r_moe) * st.full_recompute + (c.n_dense - r_dense) * a_dense
                           + (c.n_moe - r_moe) * a_moe)
        working = tokens * max(a_dense if r_dense else 0.0, a_moe if r_moe else 0.0)
    elif recompute == "sac":
        stored = tokens * (c.n_dense * st.sac[0] + c.n_moe * st.sac[1])
        working = tokens * (max(a_dense, a_moe) - max(st.sac))
    else:
        stored = tokens * (c.n_dense * a_dense + c.n_moe * a_moe)
        if freed[0] or freed[1]:  # one layer's discarded tensors, re-created for its backward
            working = tokens * max(freed[0] if c.n_dense else 0.0, freed[1] if c.n_moe else 0.0)
        if c.plan.offload_layers:
            stored -= tokens * _offloaded_bytes_per_token(c, a_dense, a_moe)
    pipelined = head = 0.0
    if st.torch_pipelined or st.head_inputs:
        plan, ids, kept = c.plan, st.stage_ids, None
        alive = ((held,) if len(ids) == 1 else
                 stage_alive(schedule=plan.schedule, pp=plan.pp, vpp=plan.vpp, m=c.m, rank=c.s, held=held,
                             chunk_layers=_chunk_layers(c.model, plan, c.s), ep_overlap=plan.ep_overlap))
        if st.torch_pipelined:
            kept = stage_input_grads_kept(schedule=plan.schedule, pp=plan.pp, m=c.m, rank=c.s, alive=alive)
            pipelined = tokens * (st.kept_logits + st.full_recompute * mem.pipelining_boundary_tensors(
                stage_ids=ids, n_stages=st.n_stages, m=c.m, alive=alive, grads_kept=kept))
        # the final norm and the LM head run outside the layers' recomputation: their inputs are kept, for
        # the micro-batches alive on the loss's stage
        if st.head_inputs:
            head = alive[ids.index(st.n_stages - 1)]
            if kept is not None:  # all but the one in its passes wait for the head's W
                pipelined += tokens * st.logit_grads * max(0.0, head - 1.0)
            else:  # the backward runs whole: all but the one in its backward hold their logits and loss
                pipelined += tokens * st.loss_graphs * max(0.0, head - 1.0)
    return (held * stored + head * tokens * st.head_inputs, working, tokens * st.logits, tokens * st.cp_gather,
            pipelined)


def _chunk_layers(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, ...]:
    """The layers of each model chunk of an interleaved stage, in order (in_flight_microbatches weighs
    the chunks its warm-up runs by them); none for other schedules."""
    if plan.schedule != "interleaved" or plan.pp == 1:
        return ()
    return stage_chunk_layers(model, plan.pp, plan.layout, plan.vpp, stage)


def offloaded_layers(offload_layers: int, n_dense: int, n_moe: int) -> tuple[int, int]:
    """(dense, MoE) layers of a stage whose activations Plan.offload_layers moves to host memory: the first
    ones, dense first (Transformer Engine's offload context counts layers from the first)."""
    d = min(offload_layers, n_dense)
    return d, min(offload_layers - d, n_moe)


def _offloaded_bytes_per_token(c: _StageCtx, a_dense: float, a_moe: float) -> float:
    """Activation bytes per token that offloading takes out of HBM at the stage's peak: every offloaded
    layer's. TE's schedule (offload_stalls_s) frees layer i's tensors when layer L - N + i starts and
    reloads them only as the backward nears them, so at most L - N layers' tensors are ever in HBM."""
    d, e = offloaded_layers(c.plan.offload_layers, c.n_dense, c.n_moe)
    return d * a_dense + e * a_moe


def _stage_peak_bytes(c: _StageCtx, st: _StaticMemory) -> float:
    """``_stage_memory(c, st).peak_bytes`` without naming the terms (the search's memory probes)."""
    states, transients, runtime = st.fixed_bytes
    tensors = states + transients + sum(_dynamic_memory(c, st))
    return tensors * (1.0 + c.job.runtime.allocator_fraction) + runtime


def _stage_memory(c: _StageCtx, static: _StaticMemory | None = None) -> MemoryReport:
    """Peak memory of a GPU of stage ``c.s`` and its terms [bytes]; ``static``: its ``_static_memory``."""
    st = static or _static_memory(c)
    activation, working, logits, cp_gather, pipelined = _dynamic_memory(c, st)
    static_total, static_transient, static_runtime = st.fixed_bytes
    transient_total = working + logits + cp_gather + pipelined + static_transient
    fragmentation = c.job.runtime.allocator_fraction * (static_total + activation + transient_total)
    runtime_total = static_runtime + fragmentation
    named = {**st.state_terms, "activations": activation,
             **({"recompute_working_set": working} if working else {}),
             **({"logits_and_loss": logits} if logits else {}),
             **({"cp_kv_gather": cp_gather} if cp_gather else {}),
             **({"pipelining_buffers": pipelined} if pipelined else {}), **st.transient_terms, **st.runtime_terms,
             "allocator_fragmentation": fragmentation}
    return MemoryReport(terms=named, static_bytes=static_total, activation_bytes=activation,
                        transient_bytes=transient_total, runtime_bytes=runtime_total,
                        peak_bytes=static_total + activation + transient_total + runtime_total,
                        capacity_bytes=c.cluster.accelerator.hbm_capacity_bytes, stage=c.s)


def _stage_compute(c: _StageCtx, compute: ComputeParams) -> tuple[float, ...]:
    """Per micro-batch on stage ``c.s`` [s]: (t_F, t_B, t_W, t_R recompute, attention forward) of the layers,
    and the LM head's forward and backward (0 except on the last stage)."""
    plan = c.plan
    return _stage_compute_times(c.model, c.cluster.accelerator, compute, c.job, c.tokens, plan.tp, plan.cp,
                                plan.ep, plan.expert_tp, plan.sequence_parallel, plan.context_impl != "a2a",
                                c.n_dense, c.n_moe, c.last, c.recompute, c.recomputed,
                                _loss(c.job, plan) if c.last else "", plan.runs_megatron_layers(c.job.software))


def _with_fsdp_copies(c: _StageCtx, compute: ComputeParams, times: tuple[float, ...]) -> tuple[float, ...]:
    """``times`` (``_stage_compute``) with FSDP2's copies added: the parameter copy-out of the forward gather
    to t_F, that of the backward re-gather to t_B, and the gradient copies to t_W (they follow the
    unit's weight gradients)."""
    copy_f, copy_b, copy_w = _fsdp_copies_s(c, compute)
    t_f, t_b, t_w, *rest = times
    return (t_f + copy_f, t_b + copy_b, t_w + copy_w, *rest)


ZERO_COPY_FSDP_STACKS = ("llm-foundry", "megatron", "maxtext")
"""Software stacks whose fully sharded data parallelism gathers into the parameters' own storage and
reduces from the gradients' (no copies; ``_fsdp_copies_s``): FSDP1's flat parameter is the all-gather's
output and the reduce-scatter's input (llm-foundry); Megatron-FSDP keeps parameters and main gradients in
its ParamAndGradBuffer ("zero copy communication", NVIDIA/Megatron-LM
megatron/core/distributed/fsdp/src/README.md, "Optimizations": the all-gather writes the bucket that the
parameters are views of, the reduce-scatter reads the bucket Transformer Engine's gradient-accumulation
fusion writes; parameters outside TE's linears, norms and embeddings, copy their gradients in, a small
share left out); maxtext: assumed, not sourced, that XLA's all-gather writes the buffer its matrix
multiply reads and its reduce-scatter reads the one the gradient's multiply wrote."""


def _fsdp_copies_s(c: _StageCtx, compute: ComputeParams) -> tuple[float, float, float]:
    """FSDP2's memory-bound copies on the compute stream per micro-batch on stage ``c.s``: (forward gather,
    backward re-gather, gradients) [s].

    After each parameter all-gather, the gathered buffer is copied out into the unsharded parameters
    (read and write, 2 x 2 bytes per parameter; 2 x 1 with FP8 all-gathers); the root module (embedding,
    LM head) is not resharded after the forward, so only the other units gather again in the backward.
    Gradients: with a reduce-scatter every micro-batch, the unsharded BF16 gradients are copied into the
    reduce buffer in the reduce dtype r (2 + r bytes). Without one (``grad_sync='last'``, and a pipelined
    stage), FSDP2 accumulates them unsharded: the first micro-batch casts them to the reduce dtype (2 + r),
    each later one adds (2 + 2r), and the last copies the sum in (2r); with r = 2 autograd accumulates in
    place (6 bytes from the second on) and the last copies 4.

    All run on the default stream, between the layers' kernels. The cast of the FP32 shard into the
    all-gather input runs on the all-gather copy-in stream, beside compute, and is left out. PyTorch
    ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` (``foreach_all_gather_copy_out`` through
    ``split_with_sizes_copy``; ``foreach_reduce``: ``foreach_reduce_scatter_copy_in`` through ``chunk_cat``,
    before ``reduce_scatter_stream.wait_stream``) and ``_fsdp_param.py`` (``to_accumulated_grad_if_needed``,
    ``accumulate_unsharded_grad_if_needed``). Not for other sharding, nor for stacks that shard in place
    (ZERO_COPY_FSDP_STACKS), nor without sharding (DDP). On one rank FSDP2 skips the gather and casts
    instead: the H200 measured that cast and the gradient copy-in, docs/measure.md."""
    plan, job = c.plan, c.job
    if plan.sharding != "fsdp" or plan.shard_degree == 1 or job.software in ZERO_COPY_FSDP_STACKS:
        return 0.0, 0.0, 0.0
    sizes = {"dp_shard": plan.shard_degree, "edp": c.groups["edp"].size}
    units = [u for u in c.units if sizes[u.group] > 1]
    params = sum(u.n_params * u.count for u in units)
    regathered = sum(u.n_params * u.count for u in units if not u.root)
    copy_out = 2.0 * (1.0 if job.fp8_param_gather else PARAM_DTYPE_BYTES)
    m, r = c.m, job.reduce_dtype_bytes
    fwd_gathers = 1.0 / m if plan.fsdp_pipelined else 1.0
    bwd = regathered * copy_out if plan.effective_reshard_after_forward else 0.0
    if plan.effective_grad_sync == "every":
        grads = PARAM_DTYPE_BYTES + r
    elif r > PARAM_DTYPE_BYTES:
        grads = ((PARAM_DTYPE_BYTES + r) + (m - 1) * (PARAM_DTYPE_BYTES + 2 * r) + 2 * r) / m
    else:
        grads = ((m - 1) * 3 * PARAM_DTYPE_BYTES + 2 * PARAM_DTYPE_BYTES) / m
    bw = c.cluster.accelerator.hbm_bytes_per_s * compute.memory_efficiency
    return fwd_gathers * params * copy_out / bw, bwd / bw, params * grads / bw


@cache_by_identity(n_specs=4)
def _stage_compute_times(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec,
                         tokens: float, tp: int, cp: int, ep: int, etp: int, sp: bool, cp_chunked: bool, n_dense: int,
                         n_moe: int, last: bool, recompute: str, recomputed: tuple[int, int], loss: str,
                         megatron: bool) -> tuple[float, ...]:
    """``_stage_compute`` on the values it reads (``loss``: JobSpec.loss_impl on the last stage, '' on the
    others, which run no loss; ``megatron``: Plan.runs_megatron_layers), memoised: plans that differ only in
    their communication options, and the search's bounds, share it."""
    accel = _accel_key(accelerator)

    def lt(moe: bool) -> LayerTimes:
        expert_tokens = local = 0.0
        if moe:
            # the tokens routed from each rank of the EP group: its own share of the micro-batch (T/t after
            # sequence parallelism), or with the experts split over TP every token of the TP group
            t_rank = tokens if etp > 1 else tokens / (tp if sp else 1)
            expert_tokens = (t_rank * ep * model.top_k * job.moe_capacity_factor * job.moe_routing_imbalance
                             / model.n_experts)
            local = model.n_experts / ep
        return _layer_times(model, accel, _kernel_params(compute, job), tokens, job.seq_len, cp, tp,
                            job.precision, moe, expert_tokens, local, cp_chunked, job.flash_attention, etp, sp,
                            job.fused_grouped_mlp, megatron and model.is_mla and sp and tp > 1)

    kinds = [(n_dense, lt(False))] + ([(n_moe, lt(True))] if n_moe else [])
    t_f = sum(n * x.fwd_s for n, x in kinds)
    t_b = sum(n * x.bwd_input_s for n, x in kinds)
    t_w = sum(n * x.bwd_weight_s for n, x in kinds)
    attn = sum(n * x.attention_fwd_s for n, x in kinds)
    t_r = 0.0
    if recompute == "full":
        t_r = recomputed[0] * kinds[0][1].fwd_s + (recomputed[1] * kinds[1][1].fwd_s if n_moe else 0.0)
    elif recompute == "sac":
        t_r = 0.5 * sum(n * x.gemm_fwd_s for n, x in kinds)
    elif recompute.startswith("selective"):
        modules = recompute_modules_of(recompute)
        if attention_recomputed(recompute, job.flash_attention, megatron):
            t_r = attn
        t_r += sum(n * selective_recompute_s(x, modules, moe_layer=moe, mla=model.is_mla)
                   for (n, x), moe in zip(kinds, (False, True)[:len(kinds)], strict=True))
    hf = hb = 0.0
    if last:
        hf, hb = lm_head_times(model, accelerator, compute, tokens=tokens, tp=tp, loss=loss)
        if model.mtp_layers:  # each MTP depth: its 2D -> D projection, and the head and loss again
            pf = mtp_projection_time_s(model, accelerator, compute, tokens=tokens, tp=tp, precision=job.precision)
            hf, hb = (model.mtp_layers * (hf + pf) + hf, model.mtp_layers * (hb + 2 * pf) + hb)
    return t_f, t_b, t_w, t_r, attn, hf, hb


def _optimizer_s(c: _StageCtx, compute: ComputeParams) -> float:
    """The optimizer step of stage ``c.s`` [s]: memory-bound over the states of its local parameters."""
    plan, job = c.plan, c.job
    state = mem.state_bytes_per_param(sharding=plan.sharding, optimizer=job.optimizer, dp_sharded=True,
                                      reduce_dtype_bytes=job.reduce_dtype_bytes)
    touched = 2 * (4.0 + state.optimizer) + state.grads + (2.0 if state.master else 0.0)
    local = c.params("dp_shard") / plan.shard_degree + c.params("edp") / c.groups["edp"].size
    return optimizer_step_time_s(n_params_local=local, bytes_touched_per_param=touched,
                                 accel=c.cluster.accelerator, params=compute)


def _stage_ledger(c: _StageCtx) -> list[CommEntry]:
    """Every collective stage ``c.s`` issues in a step (exposure not yet set)."""
    plan = c.plan
    unpaired = unpaired_microbatches(schedule=plan.schedule, pp=plan.pp, m=c.m, vpp=plan.vpp, stage=c.s)
    st = StageTraffic(units=c.units, n_layers=c.n_dense + c.n_moe, n_moe_layers=c.n_moe, has_embedding=c.s == 0,
                      has_lm_head=c.last, tokens=c.tokens, m=c.m, recomputed=c.recomputed, unpaired=unpaired,
                      stage=c.s)
    return comm_ledger(c.model, c.cluster, c.job, plan, c.groups, st)


def _stage_comm(c: _StageCtx, compute: ComputeParams) -> list[CommEntry]:
    """``_stage_ledger`` with each call's time as the step prices it: ZeRO-3's data-parallel collectives
    slowed by ComputeParams.zero3_collective_efficiency."""
    ledger = _stage_ledger(c)
    if c.plan.sharding == "zero3" and compute.zero3_collective_efficiency < 1.0:
        eff = compute.zero3_collective_efficiency
        ledger = [replace(e, time_s=e.time_s / eff, edge_s=e.edge_s / eff) if e.axis in SHARDED_DP_AXES else e
                  for e in ledger]
    return ledger


class TrafficFloors(NamedTuple):
    """Lower bounds on a plan's step time from its communication (``traffic_floors``) [s]."""

    link_s: float
    """The busiest link's traffic outside the attention window, plus the fixed step overhead: a floor on
    the whole step time."""
    contention_s: float
    """A floor on what the hideable traffic, on every link, adds to the compute, the bubble, the overhead
    and the critical communication of the busiest stage (``_compute_bound_s``)."""


def traffic_floors(ctxs: list[_StageCtx], compute: ComputeParams) -> TrafficFloors:
    """What the traffic of the stages ``ctxs`` alone makes their step time at least [s]; with the fewest,
    largest micro-batches and the least recomputation, over every choice of them: each call costs a latency
    plus its bytes over a rate, so the same bytes in fewer calls take less time, data-parallel traffic runs
    once or once per micro-batch, and recomputation only adds calls.

    A stage's step time includes its whole compute W, every exposed second and the contention
    (``_stage_time``). On one link L carrying T_L:

    - ``link_s``: the forward windows together hide at most overlap·(the forwards), the backward windows
      overlap·(the backwards) and the whole-step windows only what those left of overlap·W
      (``_set_exposure``), so the traffic outside the attention window hides at most overlap·W <= W
      and T_L - W of it is exposed; exposure overlapping on two links (``_overlap_links``) still leaves
      the larger link's, and ``_absorb_contention`` charges max(contention, excess). So the step is at
      least W + T_L - W = T_L. Attention-window traffic may hide behind attention a second time and is
      left out; with an overlap efficiency above 1 this floor is 0.
    - ``contention_s``: of the traffic T compute may hide (every window but 'none', on every link), the
      edges are exposed, a part X beyond them is exposed too and the rest is hidden, which slows compute by
      comm_slowdown·(T - edges - X); the step pays the edges and max(comm_slowdown·(T - edges - X), X)
      (``_absorb_contention``), at least comm_slowdown/(1 + comm_slowdown) of T whatever X is. The compute
      bound takes its busiest stage, which need not be the one with the most traffic, so this floor is the
      least over the stages.
    """
    link, hideable = 0.0, float("inf")
    for c in ctxs:
        outside: dict[str, float] = defaultdict(float)
        overlappable = 0.0
        for e in _stage_comm(c, compute):
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


def _host_waits_s(c: _StageCtx, compute: ComputeParams, ledger: list[CommEntry], fwd_s: float,
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


def _offload_waits_s(c: _StageCtx, st: _StaticMemory, fwd_s: float, bwd_s: float) -> tuple[float, float]:
    """Per micro-batch, how long stage ``c.s``'s layers wait for activation offloading, forward and backward
    [s] (offload_stalls_s, with each offloaded layer's saved tensors over the host link,
    ClusterSpec.host_bytes_per_s, and the stage's mean layer: ``fwd_s`` and ``bwd_s`` over its layers). The
    copies run on the copy engines; the HBM bandwidth they take (a few per cent of it) is not modelled."""
    host = c.cluster.host_bytes_per_s
    layers = c.n_dense + c.n_moe
    if not c.plan.offload_layers or not host or not layers:
        return 0.0, 0.0
    flash = c.job.flash_attention
    d, e = offloaded_layers(c.plan.offload_layers, c.n_dense, c.n_moe)
    copies = [c.tokens * st.a_dense[flash] / host] * d + [c.tokens * st.a_moe[flash] / host] * e
    # TE schedules over the decoder's layers (Megatron passes num_layers; MTP layers run after them)
    return offload_stalls_s(fwd_s / layers, bwd_s / layers, copies, c.model.n_layers)


def offload_stalls_s(layer_f_s: float, layer_b_s: float, copies_s: list[float], n_layers: int
                     ) -> tuple[float, float]:
    """The compute stream's waits, forward and backward [s], of ``n_layers`` layers of equal time whose first
    len(``copies_s``) = N offload their saved tensors, each copy taking its ``copies_s`` each way, as
    Transformer Engine schedules them by default from TE 2.10 (cpu_offload.py, DefaultOffloadSynchronizer;
    TE PR #1762): one copy stream for both directions, in order; layer i's copy out is queued when it
    ends, and layer L - N + i waits for it before it starts (so at most L - N layers' tensors are ever in
    HBM); in the backward, layer i's copy back is queued when the backward of layer L - 1 - N + i begins
    and its own backward waits for it. The limit is the link's throughput, not one layer's compute: with
    N <= L - 2, uniform layers wait N·c - (L - 2)·t in each phase when a copy c outlasts a layer t; with
    N = L - 1 every layer waits for the copy before it whatever the link (TE warns that it prevents
    overlap). TE queues each tensor's copy when it is saved, not when its layer ends, so this is slightly
    pessimistic. (TE 2.9 and earlier bulk copied each layer with about L / N layers to hide it: waits of
    about max(0, c - t·L / N) each.)"""
    n_off, t = len(copies_s), 0.0
    done, stream = [0.0] * n_off, 0.0
    for j in range(n_layers):  # layer j + 1, forward
        i = j - (n_layers - n_off)  # the offloaded layer whose copy must have ended (0-based), if any
        if i >= 0:
            t = max(t, done[i])
        t += layer_f_s
        if j < n_off:
            stream = max(stream, t) + copies_s[j]
            done[j] = stream
    fwd_wait = _beyond(t, n_layers * layer_f_s)
    t, stream = 0.0, max(0.0, stream - t)  # the backward starts where the forward ends
    back = [0.0] * n_off
    for j in range(n_layers - 1, -1, -1):  # layer j + 1, backward
        i = j - (n_layers - 1 - n_off)  # the layer whose copy back its start queues
        if 0 <= i < n_off:
            stream = max(stream, t) + copies_s[i]
            back[i] = stream
        if j < n_off:
            t = max(t, back[j])
        t += layer_b_s
    return fwd_wait, _beyond(t, n_layers * layer_b_s)


def _beyond(t: float, compute: float) -> float:
    """How far ``t`` runs past ``compute`` [s], rounding error (summing layer times) taken as none."""
    return t - compute if t > compute * (1.0 + 1e-9) else 0.0


def _stage_time(c: _StageCtx, compute: ComputeParams, times: tuple[float, ...], st: _StaticMemory) -> StageDetail:
    """Communication ledger, exposure and the stage's step time [s]; ``st``: its ``_static_memory``."""
    plan, m = c.plan, c.m
    lf, lb, t_w, t_r, attn, hf, hb = times
    ledger = _stage_comm(c, compute)
    bwd = lb + t_w + t_r
    host_f, host_b = _host_waits_s(c, compute, ledger, lf, bwd)
    off_f, off_b = _offload_waits_s(c, st, lf + host_f, bwd + host_b)  # the copies overlap the host's pace too
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
    _set_exposure(ledger, windows, compute.overlap_efficiency,
                  compute.zero3_overlap_efficiency if plan.sharding == "zero3" else None)
    # the warm-up and cool-down micro-batches stall on the layers' unhidden collectives as the steady
    # ones do (the expert all-to-all without ep_overlap, TP without async TP, Ulysses)
    # (not the once-a-step TP all-reduce after the backward, comm._sequence_parallel_grads)
    stall_f, stall_b = (sum(x.exposed_s for x in ledger if x.window == "none" and x.axis in LAYER_AXES
                            and x.phase == ("forward" if fwd else "backward")) / m for fwd in (True, False))
    opt = _optimizer_s(c, compute)
    hidden = sum(x.time_s - x.exposed_s for x in ledger)
    _absorb_contention(ledger, compute.comm_slowdown * hidden)
    breakdown: dict[str, float] = {"compute": m * (t_f + t_b + t_w), "recompute": m * t_r}
    for x in ledger:
        breakdown[x.breakdown_key] = breakdown.get(x.breakdown_key, 0.0) + x.exposed_s
    if wait_f or wait_b:
        breakdown["compute"] -= m * (wait_f + wait_b * (1.0 - r_share))
        breakdown["recompute"] -= m * wait_b * r_share
        for key, wait in ((HOST_BOUND, host_f + host_b), (OFFLOAD, off_f + off_b)):
            if wait:
                breakdown[key] = m * wait
    breakdown["pipeline bubble"] = 0.0  # the other stages' passes set it (_with_bubbles)
    breakdown["optimizer step"] = opt
    breakdown["comm contention"] = compute.comm_slowdown * hidden
    breakdown["step overhead"] = compute.step_overhead_s
    return StageDetail(stage=c.s, n_layers=c.n_dense + c.n_moe, t_f_s=lf, t_b_s=lb, t_w_s=t_w, t_r_s=t_r,
                       attention_fwd_s=attn, head_f_s=hf, head_b_s=hb, comm=ledger, optimizer_s=opt,
                       breakdown=breakdown, time_s=sum(breakdown.values()),
                       passes_s=(t_f + stall_f, t_b + t_r + stall_b, t_w))


def _with_bubbles(details: tuple[StageDetail, ...], plan: Plan, m: int) -> tuple[StageDetail, ...]:
    """``details`` with each stage's pipeline bubble, from the other ranks' passes (stage_bubbles_s)."""
    bubbles = stage_bubbles_s(schedule=plan.schedule, pp=plan.pp, vpp=plan.vpp, m=m,
                              stages=[d.stage for d in details], passes=[d.passes_s for d in details])
    out = []
    for d, b in zip(details, bubbles, strict=True):
        d.breakdown["pipeline bubble"] = b  # the stage's own dict, made by _stage_time; keyed there in order
        out.append(StageDetail(stage=d.stage, n_layers=d.n_layers, t_f_s=d.t_f_s, t_b_s=d.t_b_s, t_w_s=d.t_w_s,
                               t_r_s=d.t_r_s, attention_fwd_s=d.attention_fwd_s, head_f_s=d.head_f_s,
                               head_b_s=d.head_b_s, comm=d.comm, optimizer_s=d.optimizer_s, breakdown=d.breakdown,
                               time_s=d.time_s + b, passes_s=d.passes_s))  # not dataclasses.replace: 6x faster
    return tuple(out)


@cache_by_identity(n_specs=2, maxsize=1024)
def _flops(model: ModelSpec, counts: ParamCounts, seq_len: int, convention: str, recompute: str,
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


class _PlanShared(NamedTuple):
    """What every micro-batch size and recompute mode of one plan shares: its groups, stage layout, the
    parameters each stage holds and its static memory."""

    groups: dict[str, Group]
    layout: list[tuple[int, int]]
    units: dict[int, tuple[Unit, ...]]
    static: dict[int, _StaticMemory]


def _plan_shared(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan
                 ) -> _PlanShared:
    groups = axis_groups(plan, cluster)
    layout = plan_stage_layers(model, plan)
    head = head_stage(plan.schedule, plan.pp)
    stages = bounding_stages(layout, head)
    # a tied head is a copy of the embedding where another stage holds it
    units = {s: _local_params(model, counts, plan, s, *layout[s], tied_copy=head != 0) for s in stages}
    static = {s: _static_memory(_StageCtx(model, counts, cluster, job, plan, groups, s, *layout[s], 1, units[s]))
              for s in stages}
    return _PlanShared(groups, layout, units, static)


def batch_split_reasons(job: JobSpec, plan: Plan) -> tuple[list[str], int]:
    """Why the batch does not split as ``plan`` says (empty if it does), and the micro-batch count."""
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
    m = _micro_batches(job, dp, mbs)
    if plan.schedule == "interleaved" and plan.pp > 1 and m % plan.pp:
        reasons.append(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp={plan.pp}")
    return reasons, m


def _offload_reasons(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, ctxs: list[_StageCtx],
                     shared: _PlanShared) -> list[str]:
    """Why ``plan``'s activation offloading cannot run here (empty if it can): it is Megatron-core's (TE's
    offload context under Megatron's transformer block); Megatron offloads at most the decoder layers less
    one (cpu_offloading_num_layers < num_layers, MTP layers not counted); the host link's rate must be known
    to time it (ClusterSpec.host_bytes_per_s); it runs in a CUDA graph only if the graph is the whole
    iteration (offload_runs_with); and the offloaded tensors must fit in the GPU's share of host memory
    where the node spec gives it (ClusterSpec.host_memory_bytes)."""
    reasons = []
    if not plan.runs_megatron_layers(job.software):
        reasons.append(f"activation offloading is Megatron-core's (Transformer Engine's offload context): needs "
                       f"sharding=megatron or job software = megatron, got sharding={plan.sharding} and software="
                       f"{job.software}")
    if plan.offload_layers > model.n_layers - 1:
        reasons.append(f"offload_layers={plan.offload_layers}: Megatron offloads at most the decoder layers less "
                       f"one ({model.n_layers - 1} of {model.n_layers})")
    if cluster.host_bytes_per_s is None:
        reasons.append("activation offloading needs the node's host link rate (cluster node key host_gb_per_s)")
    if not offload_runs_with(job):
        reasons.append("activation offloading does not run inside per-layer CUDA graphs (job cuda_graphs = true "
                       "with cuda_graph_scope = layers; a full_iteration graph can)")
    host_memory = cluster.host_memory_bytes
    if host_memory is not None:
        moved = max(_offloaded_bytes(c, shared.static[c.s]) for c in ctxs)
        if moved > host_memory:
            reasons.append(f"the offloaded activations need {format_gib(moved)} of host memory per GPU, over "
                           f"the {format_gib(host_memory)} the node has per GPU")
    return reasons


def offload_runs_with(job: JobSpec) -> bool:
    """Whether Megatron-core runs activation offloading with ``job``'s CUDA graphs: without any, or with one
    graph for the whole iteration (TransformerConfig.__post_init__ refuses other cuda_graph_impl values)."""
    return not job.cuda_graphs or job.cuda_graph_scope == "full_iteration"


def offload_offered(cluster: ClusterSpec, job: JobSpec, plan: Plan) -> bool:
    """Whether activation offloading is an option for ``plan`` at all (the search's variant, the memory
    question's alternative): a Megatron plan (its distributed optimizer, or job software = megatron, as
    Megatron-FSDP) without a pipeline, on a node whose host link rate is known, outside per-layer CUDA
    graphs (_offload_reasons names each of these where a plan offloads anyway)."""
    return (plan.pp == 1 and cluster.host_bytes_per_s is not None and offload_runs_with(job)
            and plan.runs_megatron_layers(job.software))


def bounding_stages(layout: list[tuple[int, int]], head: int | None = None) -> list[int]:
    """The stages that bound the step and the memory: the first (embedding, and the most micro-batches in
    flight), the last (LM head, MTP) and the earliest middle stage of each (dense, MoE) layer count that no
    earlier stage holds at least as many of both: a layout or MTP's split can give a middle stage more
    layers, and an MoE model's leading dense layers give its first stage lighter ones (DeepSeek-V3 at
    PP=16: 3 dense and 1 MoE layer first, 4 MoE layers in the middle). Where the first stage holds the LM
    head too (``head`` 0: ZB-V), it stands for no middle stage: the simulator times the middle ranks by
    the middle stage it is given."""
    pp = len(layout)
    middle: dict[tuple[int, int], int] = {}
    for s in range(1, pp - 1):
        middle.setdefault(layout[s], s)
    first = [(layout[0], 0)] if head != 0 else []

    def covered(x: tuple[int, int]) -> bool:  # by an earlier stage (more micro-batches in flight) of as many
        return any(y[0] >= x[0] and y[1] >= x[1] and s < middle[x]
                   for y, s in [*first, *middle.items()])

    return sorted({0, *(s for x, s in middle.items() if not covered(x)), pp - 1})


def _stage_ctxs(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan, m: int,
                shared: _PlanShared) -> list[_StageCtx]:
    """The stages that bound the step (bounding_stages)."""
    return [_StageCtx(model, counts, cluster, job, plan, shared.groups, s, *shared.layout[s], m, shared.units[s])
            for s in sorted(shared.units)]


def _peak_memory(ctxs: list[_StageCtx], shared: _PlanShared) -> MemoryReport:
    return max((_stage_memory(c, shared.static[c.s]) for c in ctxs), key=lambda r: r.peak_bytes)


def _excess(n_bytes: float) -> str:
    """How far over capacity: MiB below a GiB (where one decimal of GiB would read as zero)."""
    return f"{n_bytes / MiB:,.0f} MiB" if n_bytes < GiB else format_gib(n_bytes)


def _memory_reason(report: MemoryReport) -> str:
    t = report.terms
    # two decimals where one would show the need equal to the capacity
    gib = (lambda b: f"{b / GiB:,.2f} GiB") if report.peak_bytes - report.capacity_bytes < 0.1 * GiB else format_gib
    return (f"needs {gib(report.peak_bytes)} per GPU (model states {format_gib(report.static_bytes)}"
            f" + activations {format_gib(report.activation_bytes)} + transient "
            f"{format_gib(report.transient_bytes)} + runtime {format_gib(report.runtime_bytes)}) on "
            f"stage {report.stage}, {_excess(report.peak_bytes - report.capacity_bytes)} over the "
            f"{gib(report.capacity_bytes)} of HBM"
            + (f"; unsharded gradient accumulation alone is {format_gib(t['unsharded_grad_accumulation'])}"
               if "unsharded_grad_accumulation" in t else ""))


class _Probe(NamedTuple):
    """A memory probe while choosing the micro-batch size and recomputation: no timing, no messages."""

    plan: Plan
    feasible: bool
    peak_bytes: float
    """Of the busiest stage."""


def _probe(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan,
           shared: _PlanShared) -> _Probe:
    reasons, m = batch_split_reasons(job, plan)
    ctxs = _stage_ctxs(model, counts, cluster, job, plan, m, shared)
    if plan.offload_layers:
        reasons += _offload_reasons(model, cluster, job, plan, ctxs, shared)
    peak = max(_stage_peak_bytes(c, shared.static[c.s]) for c in ctxs)
    return _Probe(plan, not reasons and peak <= cluster.accelerator.hbm_capacity_bytes, peak)


def _evaluate_fixed(model: ModelSpec, counts: ParamCounts, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                    compute: ComputeParams, mfu: float | None, *, shared: _PlanShared | None = None,
                    timed: bool = True) -> Estimate:
    """Memory, FLOPs and (if ``timed`` or the plan fits) the step time of a plan whose micro-batch size
    and recomputation are set; an untimed infeasible estimate has NaN times and no ledger."""
    reasons, m = batch_split_reasons(job, plan)
    shared = shared or _plan_shared(model, counts, cluster, job, plan)
    tokens = job.global_batch_tokens
    fraction = 1.0
    if plan.recompute == "full" and plan.recompute_layers is not None:  # the blocks' share that is re-run
        fraction = sum(sum(recomputed_layers("full", plan.recompute_layers, *lay)) for lay in shared.layout
                       ) / sum(d + e for d, e in shared.layout)  # MTP layers counted on both sides
    flops = _flops(model, counts, job.seq_len, job.flop_convention, plan.recompute_key, job.flash_attention,
                   tokens, fraction, plan.runs_megatron_layers(job.software))
    peak = cluster.accelerator.peak_flop_per_s(job.precision)
    ctxs = _stage_ctxs(model, counts, cluster, job, plan, m, shared)
    if plan.offload_layers:
        reasons += _offload_reasons(model, cluster, job, plan, ctxs, shared)
    mem_report = _peak_memory(ctxs, shared)
    if mem_report.peak_bytes > mem_report.capacity_bytes:
        reasons.append(_memory_reason(mem_report))
    if reasons and not timed:
        nan = float("nan")
        return Estimate(model=model.name, cluster=cluster.name, n_gpus=cluster.n_gpus, plan=plan, n_microbatches=m,
                        global_batch_tokens=tokens, seq_len=job.seq_len, feasible=False,
                        infeasible_reasons=reasons, memory=mem_report, flops=flops, step_time_s=nan,
                        time_breakdown={}, mfu=nan, hfu=nan, comm=[],
                        compute_source="not timed: the plan does not fit")
    times = [_stage_compute(c, compute) for c in ctxs]
    if mfu is not None:
        # compute runs at the given MFU: hardware FLOPs per GPU / (peak · mfu); scale the kernel model to it
        target = flops.hardware_flop_per_step / cluster.n_gpus / (peak * mfu)
        kernel = m * (sum(times[0][:4]) + sum(times[0][5:]))
        scale = target / kernel if kernel > 0 else 1.0
        times = [tuple(x * scale for x in t) for t in times]  # type: ignore[misc]
    times = [_with_fsdp_copies(c, compute, t) for c, t in zip(ctxs, times, strict=True)]
    details = _with_bubbles(tuple(_stage_time(c, compute, t, shared.static[c.s])
                                  for c, t in zip(ctxs, times, strict=True)), plan, m)
    slowest = max(details, key=lambda x: x.time_s)
    step = slowest.time_s
    notes = [_offload_note(ctxs[0], shared.static[0], cluster)] if plan.offload_layers else []
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


def _offloaded_bytes(c: _StageCtx, st: _StaticMemory) -> float:
    """The activations one micro-batch offloads to host memory on stage ``c.s`` [bytes] (one micro-batch
    at a time: no pipeline, no MoE all-to-all overlap)."""
    flash = c.job.flash_attention
    return c.tokens * _offloaded_bytes_per_token(c, st.a_dense[flash], st.a_moe[flash])


def _offload_note(c: _StageCtx, st: _StaticMemory, cluster: ClusterSpec) -> str:
    """What activation offloading moves, for the report (pp = 1: one stage)."""
    host = cluster.host_bytes_per_s
    link = f"over the host link at {host / GB:,.0f} GB/s per GPU per direction" if host else "(no host link rate)"
    return (f"activation offload: {c.plan.offload_layers} of {c.model.n_layers} decoder layers, "
            f"{_offloaded_bytes(c, st) / GB:,.1f} GB to host memory and back per micro-batch {link}")


_PLAN_FIELDS = tuple(f.name for f in fields(Plan))


OFFLOAD_MODE = "offload"
"""The choice's mode for activation offloading (Plan.offload_layers) instead of recomputation; its layer
count is chosen as full recomputation's is."""


def _with_choice(plan: Plan, mbs: int, recompute: str, layers: int | None) -> Plan:
    """``replace(plan, mbs=..., recompute=..., recompute_modules=..., recompute_layers=...)`` from a
    Plan.recompute_key, or ``offload_layers=layers`` for OFFLOAD_MODE (a plan left to choose its offloading
    offloads none under the other modes), without re-validating the other fields (a valid plan's): the hot
    path of the micro-batch and recompute search, whose values are valid by construction (a divisor of the
    batch, a mode of RECOMPUTE or a key of Megatron's modules, layers only with 'full' or offloading)."""
    new = object.__new__(Plan)
    for name in _PLAN_FIELDS:
        object.__setattr__(new, name, getattr(plan, name))
    object.__setattr__(new, "mbs", mbs)
    offload = recompute == OFFLOAD_MODE
    mode, _, modules = ("none" if offload else recompute).partition(":")  # 'selective:layernorm+moe_act'
    object.__setattr__(new, "recompute", mode)
    object.__setattr__(new, "recompute_modules", modules)
    object.__setattr__(new, "recompute_layers", None if offload else layers)
    if offload or plan.offload_layers is None:
        object.__setattr__(new, "offload_layers", layers if offload else 0)
    return new


def micro_batch_sizes(job: JobSpec, dp: int) -> list[int]:
    """Micro-batch sizes that divide each of ``dp`` replicas' share of the batch, largest first (a shared
    list: do not modify)."""
    return _divisors_descending(job.global_batch_seqs // dp if job.global_batch_seqs >= dp else 1)


@functools.lru_cache(maxsize=4096)
def _divisors_descending(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]  # O(sqrt n): batches may be huge
    return sorted({*small, *(n // d for d in small)}, reverse=True) or [1]


def _loss(job: JobSpec, plan: Plan) -> str:
    """The cross-entropy ``plan`` runs (JobSpec.loss_impl): Megatron-core's where it runs Megatron's layers."""
    return job.loss_impl(plan.runs_megatron_layers(job.software))


def _compute_bound_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, compute: ComputeParams,
                     mbs: int, recompute: str, recompute_layers: int | None = None) -> float:
    """The compute, recomputation and bubble of the busiest stage of ``plan`` (of ``bounding_stages``) at
    micro-batch size ``mbs`` and ``recompute``, the fixed step overhead and the communication no compute
    hides (``_critical_comm_s``) [s]: every term of the step time except the hideable communication,
    contention and the optimizer step, all of which are non-negative."""
    m = _micro_batches(job, plan.dp, mbs)
    return (_shape_bound_s(model, cluster.accelerator, compute, job, plan.tp, plan.cp, plan.ep, plan.expert_tp,
                           plan.pp, plan.schedule, plan.vpp, plan.layout, plan.sequence_parallel,
                           plan.context_impl != "a2a", mbs, recompute, m, recompute_layers,
                           _loss(job, plan), plan.runs_megatron_layers(job.software))
            + _critical_comm_s(model, cluster, job, plan, mbs, m, recompute, recompute_layers))


def _critical_comm_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, mbs: int, m: int,
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


def _micro_batches(job: JobSpec, dp: int, mbs: int) -> int:
    """Micro-batches per step of each data-parallel replica (as ``batch_split_reasons`` counts them)."""
    return max(1, max(1, job.global_batch_seqs // dp) // mbs)


@cache_by_identity(n_specs=4, maxsize=1 << 18)  # a large search's shapes, by loss too, exceed the default
def _shape_bound_s(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec, tp: int,
                   cp: int, ep: int, etp: int, pp: int, schedule: str, vpp: int, layout: str, sp: bool,
                   cp_chunked: bool, mbs: int, recompute: str, m: int, recompute_layers: int | None,
                   loss: str, megatron: bool) -> float:
    """``_compute_bound_s`` on the plan fields it reads (memoised: plans that differ in sharding or in
    their communication options share it)."""
    stages = stage_layers(model, pp, layout, round_robin_chunks(schedule, vpp))
    tokens = mbs * job.seq_len / cp
    head = head_stage(schedule, pp)
    timed = bounding_stages(stages, head)
    passes = []
    for s in timed:
        n_dense, n_moe = stages[s]
        t_f, t_b, t_w, t_r, _, hf, hb = _stage_compute_times(
            model, accelerator, compute, job, tokens, tp, cp, ep, etp, sp, cp_chunked, n_dense, n_moe, s == head,
            recompute, recomputed_layers(recompute, recompute_layers, n_dense, n_moe), loss if s == head else "",
            megatron)
        passes.append((t_f + hf, t_b + hb + t_r, t_w))
    bubbles = stage_bubbles_s(schedule=schedule, pp=pp, vpp=vpp, m=m, stages=timed, passes=passes)
    worst = max(m * sum(x) + b for x, b in zip(passes, bubbles, strict=True))
    return worst + compute.step_overhead_s


def step_time_lower_bound_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                            compute: ComputeParams) -> float:
    """A lower bound on ``evaluate(plan).step_time_s`` over every micro-batch size and recompute mode [s].

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
                                 _loss(job, plan))
            + _critical_comm_s(model, cluster, job, plan, b, _micro_batches(job, plan.dp, b), "none", None))


@cache_by_identity(n_specs=4)
def _shape_lower_bound_s(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec,
                         dp: int, tp: int, cp: int, ep: int, etp: int, pp: int, schedule: str, vpp: int,
                         layout: str, sp: bool, cp_chunked: bool, mbs: int | None, loss: str) -> float:
    """``step_time_lower_bound_s`` on the plan fields it reads (memoised: option variants that change
    only communication or memory share it)."""
    sizes = [mbs] if mbs else micro_batch_sizes(job, dp)
    return min(_shape_bound_s(model, accelerator, compute, job, tp, cp, ep, etp, pp, schedule, vpp, layout, sp,
                              cp_chunked, b, "none", _micro_batches(job, dp, b), None, loss, True)
               # nothing recomputed, so Megatron's layers time as others do, but for MLA's down-projections
               # under SP, which they run on T/t tokens (the lesser: layer_times' mla_down_local)
               for b in sizes)


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None = None,
             compute: ComputeParams | None = None, time_infeasible: bool = True) -> Estimate:
    """Evaluate ``plan``. A micro-batch size or recompute mode left as None is chosen: the fastest
    feasible combination (the number of micro-batches follows from memory); if none fits, the one
    that needs the least memory, reported infeasible with its reasons, and timed as if it fitted
    unless ``time_infeasible`` is False (the search lists such plans by memory, not time)."""
    est = _evaluate(model, cluster, job, plan, mfu=mfu, compute=compute, cutoff_s=None,
                    time_infeasible=time_infeasible)
    assert est is not None
    return est


def evaluate_within(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, cutoff_s: float,
                    compute: ComputeParams | None = None) -> Estimate | None:
    """``evaluate``, for a search that only needs plans faster than ``cutoff_s``: None when nothing fits
    in memory, or when every combination that fits has a compute bound (``_compute_bound_s``, plus the
    contention its traffic must add) or a busiest link (``traffic_floors``) above ``cutoff_s``, so that
    its step time is too. The memory probes still run; the communication
    ledgers of the pruned combinations do not."""
    return _evaluate(model, cluster, job, plan, mfu=None, compute=compute, cutoff_s=cutoff_s)


def _evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None,
              compute: ComputeParams | None, cutoff_s: float | None, time_infeasible: bool = True
              ) -> Estimate | None:
    validate_plan(model, cluster, job, plan)
    if compute is None:
        from meshplan.calibration import compute_params_for  # catalog data, loaded lazily once

        compute = compute_params_for(cluster.accelerator.name, job.software)
    runs = stack_defaults(job.software, plan)
    est = _Choice(model, cluster, job, runs, compute, mfu, cutoff_s).choose(time_infeasible=time_infeasible)
    if est is None or runs is plan:
        return est
    # the stack's default is not an option the plan chose: the estimate names the plan as given (its
    # labels, layout key and tie-break), and says what ran
    return replace(est, plan=replace(est.plan, grad_sync=plan.grad_sync), stack_grad_sync=runs.grad_sync)


def megatron_selective_keys(model: ModelSpec, flash_attention: bool = True,
                            fused_grouped_mlp: bool = False) -> list[str]:
    """The selective recomputations evaluate offers a Megatron plan, least first (Plan.recompute_key): the
    modules that discard cheap outputs (the norms that run on their own, the routed experts' activation,
    unless a fused grouped MLP keeps it inside its kernel, MLA's up-projections), where the model has them;
    then those and the MLPs (dense layers' and shared experts'); without FlashAttention each with core_attn
    too, as plain 'selective' before them. Each frees a superset of the one before, as the choice's
    bisection needs."""
    core = [] if flash_attention else ["core_attn"]
    needs = recompute_module_needs(model, fused_grouped_mlp)
    light = [m for m, has in (("layernorm", model.n_moe_layers > 0 or model.is_mla),
                              ("moe_act", needs["moe_act"][0]), ("mla_up_proj", needs["mla_up_proj"][0])) if has]
    heavy = light + [m for m, has in (("mlp", model.n_layers > model.n_moe_layers),
                                      ("shared_experts", needs["shared_experts"][0])) if has]
    keys = ["selective:" + "+".join(core + mods) for mods in (light, heavy) if mods]
    return list(dict.fromkeys(keys))  # a model without dense layers or shared experts: one key


def recompute_options(model: ModelSpec, job: JobSpec, plan: Plan) -> tuple[list[str], int]:
    """The recompute modes ``evaluate`` chooses among for ``plan``, least recomputation first (and
    OFFLOAD_MODE last where the plan leaves its offloading to the choice), and the largest number of layers
    per stage it may recompute partially (full recomputation of the first 1..L-1 layers of an L-layer
    stage, searched when nothing is fixed; 0: none)."""
    offload = [OFFLOAD_MODE] if plan.offload_layers is None else []  # after the rest: it frees the most
    if plan.recompute:
        return [plan.recompute_key, *offload], 0
    if plan.recompute_layers:
        return ["full"], 0
    if plan.offload_layers:  # Megatron offloads only without recomputation
        return ["none"], 0
    modes = ["none", "sac", "full"] if job.flash_attention else ["none", "selective", "sac", "full"]
    if plan.runs_megatron_layers(job.software):  # Megatron-core has modules, not op-level SAC
        keys = megatron_selective_keys(model, job.flash_attention, job.fused_grouped_mlp)
        modes[modes.index("sac"):modes.index("sac") + 1] = keys
    if plan.ep_overlap:  # Megatron's all-to-all overlap runs without full recomputation (or offloading)
        return modes[:-1], 0
    return modes + offload, max(d + e for d, e in plan_stage_layers(model, plan)) - 1


def _bisect(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest index in [lo, hi] where ``ok`` holds, ``ok`` being monotone; None if nowhere."""
    found = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if ok(mid):
            found, hi = mid, mid - 1
        else:
            lo = mid + 1
    return found


_Key = tuple[str, int, int | None]
"""(recompute mode, micro-batch size, recomputed layers or None)."""


@cache_by_identity(n_specs=4)
def _shared_bounds(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, compute: ComputeParams, *fields: object
                   ) -> dict[_Key, float]:
    """The table of ``_compute_bound_s`` values that plans alike in ``fields`` (every plan field the bound
    reads, and the fixed micro-batch size) share: option variants that change only the sharding fill it
    once."""
    return {}


class _Choice:
    """Choosing a plan's micro-batch size and recomputation: the fastest combination that fits.

    Memory only shrinks with a smaller micro-batch, with more recomputation (``recomputes`` is ordered
    from least to most) and with more recomputed layers, so each is bisected. Modes are taken from the
    least recomputation on, and a combination whose compute bound (``_compute_bound_s``) cannot beat
    the best one timed, or the cutoff, is neither probed nor timed. Every probe and timing is cached.
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, compute: ComputeParams,
                 mfu: float | None, cutoff_s: float | None) -> None:
        self.model, self.cluster, self.job, self.plan = model, cluster, job, plan
        self.compute, self.mfu, self.cutoff_s = compute, mfu, cutoff_s
        self.counts = param_counts(model)
        self.shared = _plan_shared(model, self.counts, cluster, job, plan)
        self.mbs_list = [plan.mbs] if plan.mbs else micro_batch_sizes(job, plan.dp)  # largest first
        self.recomputes, self.partial_layers = recompute_options(model, job, plan)
        # the most layers a stage may offload (Megatron: all but one), when the choice includes offloading
        offered = OFFLOAD_MODE in self.recomputes and cluster.host_bytes_per_s is not None and offload_runs_with(job)
        self.offload_max = model.n_layers - 1 if offered else 0
        self.best: Estimate | None = None
        self._plans: dict[_Key, Plan] = {}
        self._probes: dict[_Key, _Probe] = {}
        self._timed: dict[_Key, Estimate] = {}
        self._floors: dict[int, TrafficFloors] = {}
        self.largest = 0
        """The index in ``mbs_list`` of the largest micro-batch size at which anything may fit (``choose``
        finds it): the bounds over every size (b = 0) take only it and the smaller ones."""
        self._bounds = _shared_bounds(model, cluster, job, compute, plan.tp, plan.cp, plan.ep, plan.expert_tp,
                                      plan.pp, plan.dp,
                                      plan.schedule, plan.vpp, plan.sequence_parallel, plan.context_impl,
                                      plan.async_tp, plan.runs_megatron_layers(job.software), plan.ep_dispatch,
                                      plan.ep_overlap,
                                      plan.mbs)

    def variant(self, rc: str, b: int, n: int | None = None) -> Plan:
        if (rc, b, n) not in self._plans:
            self._plans[rc, b, n] = _with_choice(self.plan, b, rc, n or self.plan.recompute_layers)
        return self._plans[rc, b, n]

    def probe(self, rc: str, b: int, n: int | None = None) -> _Probe:
        if (rc, b, n) not in self._probes:
            self._probes[rc, b, n] = _probe(self.model, self.counts, self.cluster, self.job, self.variant(rc, b, n),
                                            self.shared)
        return self._probes[rc, b, n]

    def fits(self, rc: str, b: int, n: int | None = None) -> bool:
        return self.probe(rc, b, n).feasible

    def at(self, rc: str, b: int, n: int | None = None, *, timed: bool = True) -> Estimate:
        if (rc, b, n) not in self._timed:
            self._timed[rc, b, n] = _evaluate_fixed(self.model, self.counts, self.cluster, self.job,
                                                    self.variant(rc, b, n), self.compute, self.mfu,
                                                    shared=self.shared, timed=timed)
        return self._timed[rc, b, n]

    def floors(self, b: int) -> TrafficFloors:
        """``traffic_floors`` of the plan at micro-batch size ``b`` and the least recomputation: floors over
        every recomputation at that size (``b`` 0: at the largest that may fit, so at every size that may)."""
        b = b or self.mbs_list[self.largest]
        if b not in self._floors:
            plan = self.variant(self.recomputes[0], b)
            ctxs = _stage_ctxs(self.model, self.counts, self.cluster, self.job, plan,
                               _micro_batches(self.job, plan.dp, b), self.shared)
            self._floors[b] = traffic_floors(ctxs, self.compute)
        return self._floors[b]

    def fewest_recomputed(self, b: int) -> int:
        """A lower bound on the layers per stage that full recomputation must re-run to fit at micro-batch
        size ``b``: what the plan without recomputation needs beyond the HBM, over the most one recomputed
        layer can free on any stage (its activations less the layer input it keeps, for every micro-batch
        in flight; recomputing also needs a working set, so it frees less)."""
        over = self.probe("none", b).peak_bytes - self.cluster.accelerator.hbm_capacity_bytes
        if over <= 0:
            return 1
        plan = self.plan
        tokens, m = b * self.job.seq_len / plan.cp, _micro_batches(self.job, plan.dp, b)
        flash = self.job.flash_attention
        frees = 0.0
        for s, st in self.shared.static.items():
            held = in_flight_microbatches(schedule=plan.schedule, pp=plan.pp, m=m, vpp=plan.vpp, stage=s,
                                          ep_overlap=plan.ep_overlap, layers=sum(self.shared.layout[s]),
                                          chunk_layers=_chunk_layers(self.model, plan, s))
            frees = max(frees, held * tokens * (max(st.a_dense[flash], st.a_moe[flash]) - st.full_recompute))
        frees *= 1.0 + self.job.runtime.allocator_fraction
        return self.partial_layers if frees <= 0 else max(1, min(self.partial_layers, math.ceil(over / frees)))

    def pruned(self, rc: str, b: int, n: int | None = None) -> bool:
        """True when this combination cannot beat the cutoff nor the best one timed so far."""
        limit = self.cutoff_s if self.cutoff_s is not None else float("inf")
        if self.best is not None and self.mfu is None:  # with an assumed MFU compute is rescaled: no bound
            limit = min(limit, self.best.step_time_s)
        if limit == float("inf"):
            return False
        bound = self.bound(rc, b, n)
        if bound >= limit:
            return True
        if self.cutoff_s is None:  # a plan evaluated in full: its floors cost about what they save
            return False
        coarse = self.floors(0)  # at the largest size that may fit: floors at every size that may
        if coarse.link_s >= limit or bound + coarse.contention_s >= limit:
            return True
        top = self.mbs_list[self.largest]
        if not b or b >= top:
            return False
        # at a smaller size every call is repeated at most m_b / m_top times as often with no larger a message,
        # so its traffic takes at most that ratio of the time: its own floors only where those could prune
        ratio = _micro_batches(self.job, self.plan.dp, b) / _micro_batches(self.job, self.plan.dp, top)
        over = self.compute.step_overhead_s
        if (coarse.link_s - over) * ratio + over < limit and bound + coarse.contention_s * ratio < limit:
            return False
        floors = self.floors(b)
        return floors.link_s >= limit or bound + floors.contention_s >= limit

    def bound(self, rc: str, b: int, n: int | None = None) -> float:
        """``_compute_bound_s`` of a combination; b = 0: the least over every micro-batch size that may fit
        (``largest``). ``n`` None: the plan's own recompute_layers (as ``variant`` does)."""
        if rc == OFFLOAD_MODE:  # offloading only adds to the compute of the same micro-batch without it
            return self.bound("none", b)
        if b == 0:
            return min(self.bound(rc, x, n) for x in self.mbs_list[self.largest:])
        n = n or self.plan.recompute_layers
        key = (rc, b, n)
        if key not in self._bounds:
            self._bounds[key] = _compute_bound_s(self.model, self.cluster, self.job, self.plan, self.compute,
                                                 b, rc, n)
        return self._bounds[key]

    def consider(self, rc: str, b: int, n: int | None = None) -> None:
        """Time the combination unless the bound rules it out; keep it if it is the fastest that fits."""
        if self.pruned(rc, b, n):
            return
        est = self.at(rc, b, n)
        if est.feasible and (self.best is None or est.step_time_s < self.best.step_time_s):
            self.best = est

    def tries(self, first_fit: int) -> list[int]:
        """Micro-batch indices to time once the largest that fits is known. Without a pipeline the largest
        is the fastest; with one, fewer and larger micro-batches trade GEMM efficiency against the bubble:
        the largest that fits, the smallest, and the one in the middle (in micro-batch count)."""
        last = len(self.mbs_list) - 1
        return [first_fit] if self.plan.pp == 1 else sorted({first_fit, (first_fit + last) // 2, last})

    def choose(self, *, time_infeasible: bool) -> Estimate | None:
        """The fastest feasible combination. If none fits: with a cutoff None, else the combination that
        needs the least memory, infeasible (timed only if ``time_infeasible``). With a cutoff, also None
        when nothing can beat it."""
        mbs = self.mbs_list
        # the most lenient combinations: the most recomputation, and the most offloading where offered
        lenient = [(rc, None) for rc in self.recomputes if rc != OFFLOAD_MODE][-1:]
        if self.offload_max:
            lenient.append((OFFLOAD_MODE, self.fewest_offloaded(mbs[-1]) or self.offload_max))
        if not any(self.fits(rc, mbs[-1], n) for rc, n in lenient):  # even those do not fit
            if self.cutoff_s is not None:
                return None
            rc, n = min(lenient, key=lambda x: self.probe(x[0], mbs[-1], x[1]).peak_bytes)
            return self.at(rc, mbs[-1], n, timed=time_infeasible)
        if self.cutoff_s is not None:  # no combination can beat the cutoff: the least recomputation at its best
            if self.pruned(self.recomputes[0], 0):  # size, with the floors of the largest size
                return None
            # no combination fits in HBM at a micro-batch larger than the most lenient ones do (with
            # offloading, every layer it may offload): the bounds, their floors and the bisections below
            # start there
            cap = self.cluster.accelerator.hbm_capacity_bytes
            most = [(rc, self.offload_max if rc == OFFLOAD_MODE else n) for rc, n in lenient]
            self.largest = _bisect(lambda i: any(self.probe(rc, mbs[i], n).peak_bytes <= cap for rc, n in most),
                                   0, len(mbs) - 1) or 0
            if self.largest and self.pruned(self.recomputes[0], 0):
                return None
        first_fits: dict[str, int | None] = {}
        smallest: tuple[float, str, int, int | None] | None = None  # (peak, mode, mbs, layers) if none fits
        hi_bound = len(mbs) - 1  # a mode fits no smaller a micro-batch than the one before it (less recompute)
        for rc in self.recomputes:
            best = self.best
            if best is not None and self.plan.pp == 1 and best.plan.mbs == mbs[0] and best.plan.recompute == "none":
                break  # nothing recomputed at the largest micro-batch: recomputing can only be slower
            if rc == OFFLOAD_MODE:
                smallest = self._offload(smallest)
                continue
            # every micro-batch size, and for full recomputation the fewest layers it may recompute
            if self.pruned(rc, 0, 1 if rc == "full" and self.partial_layers else None):
                continue
            first_fit = _bisect(lambda i, rc=rc: self.fits(rc, mbs[i]), self.largest, hi_bound)
            first_fits[rc] = first_fit
            if first_fit is None:
                probe = self.probe(rc, mbs[-1])
                if smallest is None or probe.peak_bytes < smallest[0]:
                    smallest = (probe.peak_bytes, rc, mbs[-1], None)
                continue
            hi_bound = first_fit
            none_fit = first_fits.get("none")
            tries = self.tries(first_fit)
            if rc == "full" and self.partial_layers and self.plan.pp == 1:
                # without a pipeline too, a smaller micro-batch recomputes fewer layers and may so be the
                # faster: every size from the largest that fits recomputing to the largest that fits without
                tries = list(range(first_fit, none_fit if none_fit is not None else len(mbs))) or tries
            for i in tries:
                b = mbs[i]
                if rc == "full" and self.partial_layers and (none_fit is None or i < none_fit):
                    # Partial recomputation at this micro-batch size: time grows and memory shrinks with
                    # the number of recomputed layers, so the fewest that fit is the fastest, faster than
                    # recomputing them all; bisect for it.
                    least = self.fewest_recomputed(b)
                    if self.pruned(rc, b, least):
                        continue
                    n = _bisect(lambda k, b=b: self.fits("full", b, k), least, self.partial_layers)
                    if n is not None:
                        self.consider(rc, b, n)
                        continue
                self.consider(rc, b)
        if self.best is not None or self.cutoff_s is not None:
            return self.best
        assert smallest is not None
        return self.at(*smallest[1:])

    def _offload(self, smallest: tuple[float, str, int, int | None] | None
                 ) -> tuple[float, str, int, int | None] | None:
        """Consider activation offloading at every micro-batch size: the fewest offloaded layers that fit
        in HBM there, which are the fastest (each offloaded layer can only add time) and need the least host
        memory. A smaller micro-batch needs fewer layers offloaded and may so wait less on the copies, so
        no size is skipped but by its bound. Returns ``smallest`` updated where nothing fits."""
        mbs, rc = self.mbs_list, OFFLOAD_MODE
        if self.offload_max < 1 or self.pruned(rc, 0):
            return smallest
        fitted = False
        for b in mbs[self.largest:]:
            if self.pruned(rc, b):
                continue
            n = self.fewest_offloaded(b)
            if n is not None and self.fits(rc, b, n):
                fitted = True
                self.consider(rc, b, n)
        if not fitted:
            probe = self.probe(rc, mbs[-1], self.offload_max)
            if smallest is None or probe.peak_bytes < smallest[0]:
                return probe.peak_bytes, rc, mbs[-1], self.offload_max
        return smallest

    def fewest_offloaded(self, b: int) -> int | None:
        """The fewest layers whose offloading brings micro-batch size ``b`` within HBM, or None (HBM only:
        host memory grows with the layers, so the fewest is also the likeliest to fit there)."""
        cap = self.cluster.accelerator.hbm_capacity_bytes
        return _bisect(lambda k: self.probe(OFFLOAD_MODE, b, k).peak_bytes <= cap, 1, self.offload_max)
