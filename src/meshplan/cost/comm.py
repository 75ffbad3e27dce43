"""The communication ledger: every collective one GPU of a pipeline stage issues in a step.

Symbols: m micro-batches, T = b·S/cp tokens per micro-batch on a rank, D hidden, t tensor-parallel
degree, U parameters of one FSDP unit on the rank (after TP/EP), N_d sharding degree (dp_shard·cp).

Semantics per implementation (formulas.md §3, checked against the sources cited there):
- FSDP2 (fully_shard per block and at the root) [fsdp2_api]: per micro-batch, each unit all-gathers
  its bf16 parameters before forward and (reshard_after_forward=True) again before backward, then
  reduce-scatters its gradients in reduce_dtype; the root unit is not resharded after forward. With
  HSDP the reduce-scattered shard is all-reduced over dp_replicate. With grad_sync='last' the reduction
  happens once per step. Activation recomputation inside a unit does not re-gather (the unit is already
  unsharded for its backward).
- DeepSpeed ZeRO [rajbhandari2020]: ZeRO-1 reduces at the accumulation boundary only; ZeRO-2/3 reduce
  every micro-batch; ZeRO-3 all-gathers forward and backward every micro-batch, and again for a
  recomputed forward.
- Megatron distributed optimizer [megatron_memory]: one reduce-scatter of the gradient buffer and one
  all-gather of updated bf16 parameters per step, overlapped with the last backward and the first
  forward.
- Tensor parallelism [shoeybi2019, korthikanti2022]: 2 all-reduces forward, 2 backward per layer; with
  sequence parallelism all-gather/reduce-scatter pairs instead (same bytes); Megatron-core re-gathers
  the sequence-parallel input in backward for the weight gradient (+2 all-gathers); full recomputation
  repeats the forward collectives (in PyTorch all but the block's last, which early-stopping
  checkpointing skips); the vocab-parallel embedding's reduce-scatter is undone by an all-gather of its
  gradient in backward. These counts match what PyTorch issues under a fake process group
  (docs/measure-and-crosscheck.md). An MoE layer: torchtitan gathers the block's input and reduce-scatters its output;
  Megatron-core only around its shared experts (the dispatcher moves the routed tokens). Megatron's MLA
  gathers its latents, not the hidden state.
- Context parallelism: ring passes (cp-1) KV chunks forward and KV plus dKV backward
  [liu2023ring]; 'allgather' gathers KV and reduce-scatters dKV; 'a2a' (Ulysses) exchanges Q, K, V
  and the output by all-to-all [jacobs2023ulysses]. PyTorch's context_parallel (the FSDP plans) sends
  dKV round the ring in FP32 under either KV exchange, cp passes per layer.
- Expert parallelism: dispatch and combine all-to-alls forward and backward per MoE layer.
- Megatron-core with sequence parallelism: the parameters every TP rank holds whole but computes a
  partial gradient of on its sequence shard (the norms, MLA's duplicated down-projections and their
  norms, the MoE router, the row-parallel linears' biases) carry the ``sequence_parallel`` attribute,
  and finalize_model_grads all-reduces their gradients over TP in one coalesced call after the backward
  (_allreduce_non_tensor_model_parallel_grads, distributed/finalize_model_grads.py; the attribute is set
  in extensions/transformer_engine.py for parallel_mode='duplicated' and row-parallel biases, and in
  moe/router.py; Megatron-FSDP reduces the local shard of the gradient).
- Pipeline: one activation send forward and one gradient send backward per micro-batch per model
  chunk at each stage boundary; with TP the message is split t ways (SP or scatter-gather).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.cost.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    SEND_RECV,
    busbw_factor,
    collective_time_s,
    remote_nodes_per_token,
)
from meshplan.cost.estimate import OTHER_MICROBATCH, CommEntry
from meshplan.cost.flops import attention_recomputed
from meshplan.cost.mesh import Group, intra_boundaries, stage_links_intra
from meshplan.cost.moe_routing import rank_load
from meshplan.cost.params import param_counts
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

PARAM_DTYPE_BYTES = 2.0  # bf16 all-gather (FSDP2 MixedPrecisionPolicy.param_dtype)
ZERO3_FETCHES_PER_BLOCK = 6
"""DeepSpeed ZeRO-3 gathers parameters module by module (deepspeed/runtime/zero/partitioned_param_coordinator.py
fetches each submodule's parameters as it is entered): a transformer block's QKV, output, two MLP linears and
two norms are six all-gathers, each paying a collective's latency, where FSDP2 issues one per block."""
ZERO_REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default reduce_bucket_size (deepspeed/runtime/zero/config.py, 5e8 elements)."""
ACT_BYTES = 2.0
MOE_BLOCK = "MoE block (non-expert)"
"""The name of an MoE layer's unit without its routed experts (cost.stage._units)."""
FP32_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class Unit:
    """Parameters gathered or reduced together: one FSDP unit, or under DDP one block's gradients, reduced
    by one all-reduce. PyTorch's DDP fills buckets of 25 MiB (bucket_cap_mb) in reverse parameter order,
    each weight matrix above the cap closing a bucket of its own: about one all-reduce per matrix of a
    full-size block (four to seven), one for the whole of a small model. The bytes are exact; the calls,
    so the latencies, are not (a review against PyTorch found 1 call per sync where the ledger had 3 for
    a two-block toy model, and at full size the ledger has fewer)."""

    name: str
    n_params: float
    """Parameters of the unit on this rank before data-parallel sharding [count]."""
    count: int
    """How many such units the stage holds."""
    group: str
    """'dp_shard' for dense parameters, 'edp' for routed-expert parameters."""
    root: bool = False


@dataclass(frozen=True, slots=True)
class StageTraffic:
    """What one stage's GPU runs in a step, as the ledger needs it."""

    units: tuple[Unit, ...]
    n_layers: int
    n_moe_layers: int
    has_embedding: bool
    has_lm_head: bool
    tokens: float
    """T = mbs·S/cp tokens per micro-batch on the rank."""
    m: int
    recomputed: tuple[int, int]
    """(dense, MoE) layers whose forward recompute='full' re-runs (all, or the first recompute_layers)."""
    unpaired: float = 1.0
    """Micro-batches whose forward (and as many backwards) run with no other micro-batch beside them:
    pipeline warm-up and cool-down (pipeline.unpaired_microbatches)."""
    stage: int = 0
    """The stage's index in the pipeline (0 without pipelining), for the links to its neighbours."""


Traffic = tuple[str, str, float, str]
"""One ledger entry as the traffic floors read it: (link, window, time of all its calls [s], mesh axis)."""


class _Ledger:
    def __init__(self, cluster: ClusterSpec, groups: dict[str, Group], traffic_only: bool = False) -> None:
        self.cluster = cluster
        self.groups = groups
        self.entries: list[CommEntry] = []
        self.traffic_only = traffic_only
        """Record each entry as ``Traffic`` in ``traffic`` instead (the same time, none of the rest)."""
        self.traffic: list[Traffic] = []

    def add(self, op: str, axis: str, purpose: str, phase: str, count: int, message_bytes: float,
            window: str, *, group: Group | None = None, edge_calls: float = 0.0, time_scale: float = 1.0,
            remote_share: float | None = None, rank_share: float | None = None,
            edge_call_s: float | None = None) -> None:
        """``edge_call_s``: the time of one of the ``edge_calls`` no compute hides, where it differs from
        the entry's own call (a pipeline fill crossing links the stage's own sends do not).
        ``remote_share``, ``rank_share``: a deduplicated all-to-all (collectives.collective_time_s)."""
        grp = group or self.groups[axis]
        if count <= 0 or message_bytes <= 0 or (grp.size <= 1 and op != SEND_RECV):
            return
        t_one = collective_time_s(op, message_bytes, grp, self.cluster, remote_share=remote_share,
                                  rank_share=rank_share) * time_scale
        if self.traffic_only:
            self.traffic.append((grp.link, window, count * t_one, grp.axis))
            return
        factor = rank_share if op == ALL_TO_ALL and rank_share is not None else busbw_factor(op, grp.size)
        sent = count * message_bytes * factor
        inter = 0.0
        if grp.n_nodes > 1:
            r = grp.ranks_per_node
            inter = sent if op in (SEND_RECV, ALL_TO_ALL) else sent / r
            if op == ALL_TO_ALL:
                share = remote_share if remote_share is not None else (grp.size - r) / grp.size
                inter = count * message_bytes * share
        self.entries.append(CommEntry(
            collective=op, axis=grp.axis, purpose=purpose, phase=phase, count=count,
            message_bytes=message_bytes, group_size=grp.size, link=grp.link, bytes_per_gpu=sent,
            inter_node_bytes_per_gpu=inter, time_s=count * t_one, window=window,
            edge_s=min(count, edge_calls) * (t_one if edge_call_s is None else edge_call_s),
        ))


def _data_parallel(led: _Ledger, plan: Plan, job: JobSpec, st: StageTraffic) -> None:
    m, sync = st.m, plan.effective_grad_sync
    pb = 1.0 if job.fp8_param_gather else PARAM_DTYPE_BYTES  # FP8 all-gather: "50% parameter all-gather"
    reduce_calls = m if sync == "every" else 1
    units = st.units
    if plan.sharding == "fsdp" and led.groups["edp"].size == led.groups["dp_shard"].size:
        units = _moe_blocks_whole(units)
    for u in units:
        shard = led.groups[u.group]
        n = shard.size
        calls = u.count
        if plan.sharding in ("fsdp", "zero3") and n > 1:
            # under torch.distributed.pipelining a stage gathers once per step and keeps its parameters
            gathers = 1 if plan.fsdp_pipelined else m
            # DeepSpeed splits a block into per-module gathers and bucketed reductions; FSDP2 issues one each
            zero3 = plan.sharding == "zero3" and not u.root
            ag_split = ZERO3_FETCHES_PER_BLOCK if zero3 else 1
            rs_split = max(1, math.ceil(u.n_params / ZERO_REDUCE_BUCKET_ELEMENTS)) if zero3 else 1
            rs_calls, rs_params = calls * rs_split, u.n_params / rs_split
            calls *= ag_split
            u = Unit(u.name, u.n_params / ag_split, u.count, u.group, u.root)
            led.add(ALL_GATHER, u.group, f"{u.name} params all-gather (forward)", "forward", gathers * calls,
                    u.n_params * pb, "forward", edge_calls=gathers if not u.root else 0)
            raf = plan.effective_reshard_after_forward
            regather = plan.sharding == "zero3" or (raf is not False and not u.root)
            if regather:
                grp = shard
                if isinstance(raf, int) and not isinstance(raf, bool):
                    grp = Group(shard.axis, min(n, raf), min(n, raf, shard.ranks_per_node))
                led.add(ALL_GATHER, u.group, f"{u.name} params all-gather (backward)", "backward",
                        m * calls, u.n_params * pb, "backward", group=grp)
            if plan.sharding == "zero3" and sum(st.recomputed) and not u.root:
                led.add(ALL_GATHER, u.group, f"{u.name} params all-gather (recomputed forward)", "backward",
                        round(m * calls * sum(st.recomputed) / st.n_layers), u.n_params * pb, "backward")
            grad_bytes = _grad_bytes(plan, job)
            led.add(REDUCE_SCATTER, u.group, f"{u.name} grads reduce-scatter", "backward",
                    reduce_calls * rs_calls, rs_params * grad_bytes, "backward" if sync == "every"
                    else "last_backward", edge_calls=reduce_calls)
            if plan.dp_replicate > 1:
                led.add(ALL_REDUCE, "dp_replicate", f"{u.name} grad shards all-reduce (HSDP)", "backward",
                        reduce_calls * rs_calls, rs_params * grad_bytes / n,
                        "backward" if sync == "every" else "last_backward", edge_calls=reduce_calls)
        elif plan.sharding in ("zero1", "zero2", "megatron") and n > 1:
            grad_bytes = _grad_bytes(plan, job)
            rs_calls = m if (plan.sharding == "zero2" and sync == "every") else 1
            led.add(REDUCE_SCATTER, u.group, f"{u.name} grads reduce-scatter", "backward", rs_calls * calls,
                    u.n_params * grad_bytes, "backward" if rs_calls > 1 else "last_backward", edge_calls=1)
            # Megatron's distributed optimizer overlaps it with the next step's first forward
            # (--overlap-param-gather); DeepSpeed's ZeRO-1/2 gathers the updated partitions inside step(),
            # before it returns (stage_1_and_2.py, all_gather_dp_groups: "ready for next round forward")
            led.add(ALL_GATHER, u.group, f"{u.name} updated params all-gather", "step", calls,
                    u.n_params * pb, "first_forward" if plan.sharding == "megatron" else "none", edge_calls=1)
            if plan.dp_replicate > 1:
                led.add(ALL_REDUCE, "dp_replicate", f"{u.name} grad shards all-reduce", "backward",
                        rs_calls * calls, u.n_params * grad_bytes / n, "last_backward", edge_calls=1)
        elif plan.dp_replicate > 1:
            led.add(ALL_REDUCE, "dp_replicate", f"{u.name} grads all-reduce (DDP)", "backward",
                    reduce_calls * calls, u.n_params * _grad_bytes(plan, job),
                    "backward" if sync == "every" else "last_backward", edge_calls=reduce_calls)


def _moe_blocks_whole(units: tuple[Unit, ...]) -> tuple[Unit, ...]:
    """``units`` with each MoE block's experts and the rest as one unit: where the experts shard over the
    block's own ranks (no expert parallelism) FSDP2 wraps the block whole (torchtitan's apply_fsdp gives
    the experts a ``fully_shard`` of their own only with EP), one all-gather and one reduce-scatter for
    both; crosscheck records it so."""
    experts = next((u for u in units if u.group == "edp"), None)
    if experts is None:
        return units
    return tuple(Unit("MoE block", u.n_params + experts.n_params, u.count, u.group) if u.name == MOE_BLOCK else u
                 for u in units if u is not experts)


def _grad_bytes(plan: Plan, job: JobSpec) -> float:
    """Bytes per gradient element on the wire: reduce_dtype for FSDP2/DDP and Megatron, bf16 for ZeRO."""
    return 2.0 if plan.sharding.startswith("zero") else job.reduce_dtype_bytes


def _tensor_parallel(led: _Ledger, model: ModelSpec, plan: Plan, job: JobSpec, st: StageTraffic) -> None:
    if plan.tp <= 1:
        return
    msg = st.tokens * model.hidden * ACT_BYTES
    megatron = plan.runs_megatron_layers(job.software)
    # one collective pair per layer for attention and one for the MLP. In Megatron-core an MoE layer's routed
    # experts need none under expert parallelism (the dispatcher moves the sequence-parallel tokens, and with
    # ETP > 1 gathers them over the expert-TP ranks: _expert_parallel), only its shared experts, which are
    # split over TP like a dense MLP; torchtitan gathers the whole MoE block's input and reduce-scatters its
    # output whatever the experts (apply_moe_ep_tp: PrepareModuleInputOutput on 'moe', Shard(1) to
    # Replicate in, Partial to Shard(1) out)
    experts_split = plan.ep == 1 and plan.expert_tp > 1
    moe_pairs = 2 if (experts_split or model.n_shared_experts or not megatron) else 1
    r_dense, r_moe = st.recomputed
    per_layer = st.m * (2 * (st.n_layers - st.n_moe_layers) + moe_pairs * st.n_moe_layers)
    recomputed = st.m * (2 * r_dense + moe_pairs * r_moe)
    # PyTorch's non-reentrant checkpoint stops recomputing once the last saved tensor is rebuilt
    # (torch/utils/checkpoint.py, set_checkpoint_early_stop), so a block's final reduction after its MLP or
    # MoE block is not re-run; Megatron's recomputation re-runs the whole forward.
    ends_on_reduction = r_dense + r_moe
    recomputed_rs = recomputed if megatron else recomputed - st.m * ends_on_reduction
    window_f = "forward" if plan.async_tp else "none"
    window_b = "backward" if plan.async_tp else "none"
    if plan.sequence_parallel:
        # Megatron-core's MLA runs its (replicated) down-projections on the rank's tokens and gathers the
        # latents, not the hidden state: the query's (or, without one, the hidden state for the query's own
        # projection) with linear_q_up_proj's input gather, the KV latent and the rotary key explicitly
        # (gather_from_sequence_parallel_region, multi_latent_attention.py); only the query's is re-gathered
        # for its weight gradient
        mla = megatron and model.is_mla
        attn = st.m * st.n_layers if mla else 0
        attn_re = st.m * (r_dense + r_moe) if mla else 0
        q_width = model.q_lora_rank or model.hidden
        latent = st.tokens * (q_width + model.kv_lora_rank + model.qk_rope_head_dim) * ACT_BYTES
        led.add(ALL_GATHER, "tp", "SP all-gather before QKV and MLP (forward)", "forward", per_layer - attn,
                msg, window_f)
        led.add(ALL_GATHER, "tp", "SP all-gather of MLA latents (forward)", "forward", attn, latent, window_f)
        led.add(REDUCE_SCATTER, "tp", "SP reduce-scatter after attention and MLP (forward)", "forward",
                per_layer, msg, window_f)
        led.add(REDUCE_SCATTER, "tp", "SP reduce-scatter of input grads (backward)", "backward",
                per_layer - attn, msg, window_b)
        led.add(REDUCE_SCATTER, "tp", "SP reduce-scatter of MLA latent grads (backward)", "backward", attn,
                latent, window_b)
        led.add(ALL_GATHER, "tp", "SP all-gather of output grads (backward)", "backward",
                per_layer, msg, window_b)
        if megatron:
            led.add(ALL_GATHER, "tp", "SP input re-gather for weight grads (Megatron-core backward)",
                    "backward", per_layer - attn, msg, window_b)
            led.add(ALL_GATHER, "tp", "SP query-latent re-gather for weight grads (Megatron-core backward)",
                    "backward", attn, st.tokens * q_width * ACT_BYTES, window_b)
        led.add(ALL_GATHER, "tp", "SP all-gather (recomputed forward)", "backward", recomputed - attn_re,
                msg, window_b)
        led.add(ALL_GATHER, "tp", "SP all-gather of MLA latents (recomputed forward)", "backward", attn_re,
                latent, window_b)
        led.add(REDUCE_SCATTER, "tp", "SP reduce-scatter (recomputed forward)", "backward",
                recomputed_rs, msg, window_b)
        if st.has_embedding:
            led.add(REDUCE_SCATTER, "tp", "vocab-parallel embedding output (forward)", "forward", st.m, msg,
                    window_f)
            led.add(ALL_GATHER, "tp", "vocab-parallel embedding output grad (backward)", "backward", st.m, msg,
                    window_b)
        if st.has_lm_head:
            led.add(ALL_GATHER, "tp", "LM head input all-gather (forward)", "forward", st.m, msg, window_f)
            led.add(REDUCE_SCATTER, "tp", "LM head input-grad reduce-scatter (backward)", "backward", st.m,
                    msg, window_b)
    else:
        led.add(ALL_REDUCE, "tp", "TP all-reduce after attention and MLP (forward)", "forward",
                per_layer, msg, window_f)
        led.add(ALL_REDUCE, "tp", "TP all-reduce of input grads (backward)", "backward", per_layer,
                msg, window_b)
        led.add(ALL_REDUCE, "tp", "TP all-reduce (recomputed forward)", "backward",
                recomputed_rs, msg, window_b)
        if st.has_embedding:
            led.add(ALL_REDUCE, "tp", "vocab-parallel embedding output (forward)", "forward", st.m, msg, window_f)
        if st.has_lm_head:
            led.add(ALL_REDUCE, "tp", "LM head input-grad all-reduce (backward)", "backward", st.m, msg,
                    window_b)


def _sequence_parallel_grads(led: _Ledger, model: ModelSpec, plan: Plan, job: JobSpec, st: StageTraffic) -> None:
    """Megatron-core's TP all-reduce of the replicated parameters' partial gradients under sequence
    parallelism: once per step, one coalesced call, after the gradients are reduced and before the
    optimizer step, so no compute hides it (module docstring)."""
    if plan.tp <= 1 or not plan.sequence_parallel or not plan.runs_megatron_layers(job.software):
        return
    pc = param_counts(model)
    row_biases = 2 * model.hidden if model.linear_bias else 0  # the attention output's and the MLP's
    n = (st.n_layers * (pc.norms_per_layer + pc.attention_replicated_per_layer + row_biases)
         + st.n_moe_layers * pc.router_per_moe_layer + (pc.final_norm if st.has_lm_head else 0))
    if plan.sharding == "fsdp":  # Megatron-FSDP all-reduces the rank's data-parallel shard of them
        n /= plan.shard_degree
    led.add(ALL_REDUCE, "tp", "sequence-parallel replicated grads all-reduce (finalize_model_grads)", "step", 1,
            n * _grad_bytes(plan, job), "none")


def attention_kv_dim(model: ModelSpec, job: JobSpec) -> int:
    """The width of each of K and V as attention receives them: the query heads' where the stack repeats
    them to every head (JobSpec.attention_kv_expanded: torchtitan), else the model's KV heads'."""
    return model.q_dim if job.attention_kv_expanded else model.kv_dim


def _context_parallel(led: _Ledger, model: ModelSpec, plan: Plan, job: JobSpec, st: StageTraffic) -> None:
    cp = plan.cp
    if cp <= 1:
        return
    kv_local = st.tokens * 2 * attention_kv_dim(model, job) * ACT_BYTES / plan.tp  # the local chunk, TP heads
    if model.is_mla:
        kv_local = st.tokens * model.n_heads * (model.qk_head_dim + model.value_head_dim) * ACT_BYTES / plan.tp
    calls = st.m * st.n_layers
    recomputed = st.m * sum(st.recomputed)  # the recomputed forwards run within the backward
    if attention_recomputed(plan.recompute_key, job.flash_attention, plan.runs_megatron_layers(job.software)):
        recomputed = calls  # selective recomputation re-runs every layer's attention core, its exchanges too
    fwd_calls = calls + recomputed
    # PyTorch's context_parallel (FSDP plans off the Megatron stack: torchtitan) passes dK and dV round the
    # ring in its backward whatever exchange it uses for K and V, as an FP32 accumulator (``convert_to_f32``),
    # in one permute per ring step including the last, which returns each chunk's sum to its owner
    # (torch/distributed/tensor/experimental/_context_parallel/_attention.py,
    # ``_templated_ring_attention_backward``: ``dkv_rotater``, ``accum_dtype``). Transformer Engine's
    # (Megatron) passes dKV beside KV in the ring, or reduce-scatters it after its KV all-gather.
    pytorch = not plan.runs_megatron_layers(job.software)
    if plan.context_impl == "ring":
        led.add(SEND_RECV, "cp", "ring attention KV pass (forward)", "forward", calls * (cp - 1),
                kv_local, "attention")
        led.add(SEND_RECV, "cp", "ring attention KV pass (recomputed forward)", "backward",
                recomputed * (cp - 1), kv_local, "attention")
        if pytorch:
            led.add(SEND_RECV, "cp", "ring attention KV pass (backward)", "backward", calls * (cp - 1),
                    kv_local, "attention")
        else:
            led.add(SEND_RECV, "cp", "ring attention KV and dKV passes (backward)", "backward",
                    calls * (cp - 1), 2 * kv_local, "attention")
    elif plan.context_impl == "allgather":
        led.add(ALL_GATHER, "cp", "KV all-gather (forward)", "forward", calls, kv_local * cp, "attention")
        led.add(ALL_GATHER, "cp", "KV all-gather (recomputed forward)", "backward", recomputed, kv_local * cp,
                "attention")
        led.add(ALL_GATHER, "cp", "KV all-gather (backward)", "backward", calls, kv_local * cp, "attention")
        if not pytorch:
            led.add(REDUCE_SCATTER, "cp", "dKV reduce-scatter (backward)", "backward", calls, kv_local * cp,
                    "attention")
    else:
        qkv = st.tokens * (model.q_dim + 2 * model.kv_dim) * ACT_BYTES / plan.tp
        out = st.tokens * model.q_dim * ACT_BYTES / plan.tp
        led.add(ALL_TO_ALL, "cp", "Ulysses all-to-all of Q, K, V and output (forward)", "forward",
                fwd_calls, qkv + out, "none")
        led.add(ALL_TO_ALL, "cp", "Ulysses all-to-all of gradients (backward)", "backward", calls, qkv + out,
                "none")
    if pytorch and plan.context_impl != "a2a":
        led.add(SEND_RECV, "cp", "dKV ring pass in FP32 (backward)", "backward", calls * cp,
                kv_local / ACT_BYTES * FP32_BYTES, "attention")


def _expert_parallel(led: _Ledger, model: ModelSpec, plan: Plan, job: JobSpec, st: StageTraffic) -> None:
    """Dispatch and combine of every MoE layer, forward and backward, timed at the busiest rank's load of a
    micro-batch (meshplan.cost.moe_routing.rank_load: the sampling spread of its routing, the router's skew,
    or a padded capacity). With ``ep_dispatch='deepep'`` a token
    crosses the network once per node, and reaches each GPU, holding one of its experts (experts in
    consecutive blocks over the EP ranks, as Megatron-core places them); with ``ep_overlap`` the all-to-alls of
    one micro-batch hide behind another's compute, except those of the forwards that run with no backward
    beside them (warm-up) and of the backwards with no forward (cool-down)."""
    if plan.ep <= 1 or st.n_moe_layers == 0:
        return
    tokens = st.tokens / (plan.tp if plan.sequence_parallel else 1)
    sent, busiest = rank_load(model, job, tokens, plan.ep)  # the busiest rank receives, and the rest wait
    msg = tokens * model.top_k * sent * model.hidden * ACT_BYTES
    calls = st.m * st.n_moe_layers
    fwd_calls = calls + st.m * st.recomputed[1]  # the recomputed forwards dispatch again
    scale = busiest / sent
    grp = led.groups["ep"]
    share = ranks = None
    if plan.ep_dispatch == "deepep":
        share = remote_nodes_per_token(model.n_experts, model.top_k, grp.n_nodes, model.n_expert_groups,
                                       model.topk_groups) / model.top_k
        # each EP rank as a "node" of E/ep experts: the other GPUs a token's experts lie on
        ranks = remote_nodes_per_token(model.n_experts, model.top_k, plan.ep, model.n_expert_groups,
                                       model.topk_groups) / model.top_k
    window, edge = (OTHER_MICROBATCH, 2 * st.n_moe_layers * st.unpaired) if plan.ep_overlap else ("none", 0)
    led.add(ALL_TO_ALL, "ep", "MoE token dispatch and combine (forward)", "forward", 2 * fwd_calls, msg, window,
            time_scale=scale, remote_share=share, rank_share=ranks, edge_calls=edge)
    led.add(ALL_TO_ALL, "ep", "MoE dispatch and combine gradients (backward)", "backward", 2 * calls, msg,
            window, time_scale=scale, remote_share=share, rank_share=ranks, edge_calls=edge)
    if plan.expert_tp > 1:
        # Megatron-core's dispatcher with expert-TP: after the dispatch it all-gathers the received tokens
        # over the expert-TP ranks (the tp group), which each run 1/etp of the experts' FFN, and
        # reduce-scatters the expert outputs before the combine; the backward runs the transposes.
        gathered = msg * plan.expert_tp
        for op, name, phase, n in ((ALL_GATHER, "dispatched tokens all-gather (forward)", "forward", fwd_calls),
                                   (REDUCE_SCATTER, "expert outputs reduce-scatter (forward)", "forward", fwd_calls),
                                   (REDUCE_SCATTER, "dispatched-token grads reduce-scatter (backward)", "backward",
                                    calls),
                                   (ALL_GATHER, "expert-output grads all-gather (backward)", "backward", calls)):
            led.add(op, "tp", f"expert-TP {name}", phase, n, gathered, window, time_scale=scale, edge_calls=edge / 2)


def _pipeline(led: _Ledger, model: ModelSpec, plan: Plan, st: StageTraffic) -> None:
    if plan.pp <= 1:
        return
    msg = st.tokens * model.hidden * ACT_BYTES / plan.tp
    chunks = plan.model_chunks
    # A stage whose neighbours share its node (an NVLink domain: GB200 NVL72 holds two PP stages of 32)
    # sends over NVLink however far the pipeline spreads; the fill, one message across each of the pp - 1
    # boundaries, takes each boundary's own link.
    grp, gpn = led.groups["pp"], led.cluster.gpus_per_node
    intra = Group("pp", plan.pp, plan.pp)
    hop = None  # one hop of the fill, the mean over its boundaries
    if grp.n_nodes > 1:
        n_intra = intra_boundaries(plan, gpn)
        hop = (n_intra * collective_time_s(SEND_RECV, msg, intra, led.cluster)
               + (plan.pp - 1 - n_intra) * collective_time_s(SEND_RECV, msg, grp, led.cluster)) / (plan.pp - 1)
        if stage_links_intra(plan, st.stage, gpn):
            grp = intra
    for purpose, phase in (("stage-boundary activations (forward)", "forward"),
                           ("stage-boundary gradients (backward)", "backward")):
        led.add(SEND_RECV, "pp", purpose, phase, st.m * chunks, msg, "pipeline", group=grp, edge_calls=plan.pp - 1,
                edge_call_s=hop)


def comm_ledger(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, groups: dict[str, Group],
                st: StageTraffic, *, in_layer: bool = False) -> list[CommEntry]:
    """Every collective of one step on a GPU of the stage described by ``st``; with ``in_layer`` only those
    inside the layers (tensor, context and expert parallelism), without the data-parallel and pipeline
    traffic between them."""
    return _fill(_Ledger(cluster, groups), model, job, plan, st, in_layer).entries


def comm_traffic(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, groups: dict[str, Group],
                 st: StageTraffic) -> list[Traffic]:
    """``comm_ledger``'s entries, in its order, as (link, window, time, axis) only: what the traffic floors
    read (cost.bounds.traffic_floors), without building the entries."""
    return _fill(_Ledger(cluster, groups, traffic_only=True), model, job, plan, st, False).traffic


def _fill(led: _Ledger, model: ModelSpec, job: JobSpec, plan: Plan, st: StageTraffic, in_layer: bool) -> _Ledger:
    """``led`` with every collective of the stage ``st`` (``in_layer``: only those inside the layers)."""
    if not in_layer:
        _data_parallel(led, plan, job, st)
        _sequence_parallel_grads(led, model, plan, job, st)
    _tensor_parallel(led, model, plan, job, st)
    _context_parallel(led, model, plan, job, st)
    _expert_parallel(led, model, plan, job, st)
    if not in_layer:
        _pipeline(led, model, plan, st)
    return led
