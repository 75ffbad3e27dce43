"""Peak memory of one stage's GPU: the terms the plan fixes (model states, gathered units, buffers,
runtime; ``StaticMemory``), and those the micro-batch size, recomputation and activation offloading set
(activations held for the backward, working sets, logits, pipelining buffers; ``dynamic_memory``)."""

from __future__ import annotations

from typing import NamedTuple

from meshplan.cost import memory as mem
from meshplan.cost.comm import attention_kv_dim
from meshplan.cost.estimate import MemoryReport
from meshplan.cost.moe_routing import static_load_factor
from meshplan.cost.pipeline import in_flight_microbatches, rank_stage_ids, stage_alive, stage_input_grads_kept
from meshplan.cost.stage import DENSE_BLOCK, StageCtx, chunk_layers
from meshplan.memo import cache_by_identity
from meshplan.specs import JobSpec, ModelSpec
from meshplan.specs.plan import recompute_modules_of
from meshplan.units import GiB, MiB, format_gib


class StaticMemory(NamedTuple):
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


def static_memory(c: StageCtx) -> StaticMemory:
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
    return StaticMemory(terms, transient, runtime, *coefficients, cp_gather, ids, plan.pp * len(ids),
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
            moe_tokens_factor=model.top_k * static_load_factor(job) if moe_layer else 0.0,
            moe_ffn_hidden=model.expert_ffn_hidden, n_shared=model.n_shared_experts if moe_layer else 0,
            expert_tp=etp, fp8_inputs=job.fp8_saves_fp8_inputs)
        return mem.selective_freed_bytes_per_token(parts, modules, moe_layer=moe_layer, mla=model.is_mla)
    return freed(False), freed(True) if moe else 0.0


@cache_by_identity(n_specs=2)
def _activation_coefficients(model: ModelSpec, job: JobSpec, tp: int, sp: bool, moe: bool, last: bool, etp: int,
                             gathered: bool, megatron: bool
                             ) -> tuple[tuple[float, float], tuple[float, float], float, tuple[float, float], float,
                                        float]:
    """The per-token fields of ``StaticMemory`` (a_dense ... head_inputs), memoised: they depend on the
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
            moe_tokens_factor=model.top_k * static_load_factor(job),
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


def _dynamic_memory(c: StageCtx, st: StaticMemory) -> tuple[float, float, float, float, float]:
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
                                  chunk_layers=chunk_layers(c.model, c.plan, c.s))
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
                             chunk_layers=chunk_layers(c.model, plan, c.s), ep_overlap=plan.ep_overlap))
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


def offloaded_layers(offload_layers: int, n_dense: int, n_moe: int) -> tuple[int, int]:
    """(dense, MoE) layers of a stage whose activations Plan.offload_layers moves to host memory: the first
    ones, dense first (Transformer Engine's offload context counts layers from the first)."""
    d = min(offload_layers, n_dense)
    return d, min(offload_layers - d, n_moe)


def _offloaded_bytes_per_token(c: StageCtx, a_dense: float, a_moe: float) -> float:
    """Activation bytes per token that offloading takes out of HBM at the stage's peak: every offloaded
    layer's. TE's schedule (offload.offload_stalls_s) frees layer i's tensors when layer L - N + i starts and
    reloads them only as the backward nears them, so at most L - N layers' tensors are ever in HBM."""
    d, e = offloaded_layers(c.plan.offload_layers, c.n_dense, c.n_moe)
    return d * a_dense + e * a_moe


def offloaded_bytes(c: StageCtx, st: StaticMemory) -> float:
    """The activations one micro-batch offloads to host memory on stage ``c.s`` [bytes] (one micro-batch
    at a time: no pipeline, no MoE all-to-all overlap)."""
    flash = c.job.flash_attention
    return c.tokens * _offloaded_bytes_per_token(c, st.a_dense[flash], st.a_moe[flash])


def stage_peak_bytes(c: StageCtx, st: StaticMemory) -> float:
    """``stage_memory(c, st).peak_bytes`` without naming the terms (the search's memory probes)."""
    states, transients, runtime = st.fixed_bytes
    tensors = states + transients + sum(_dynamic_memory(c, st))
    return tensors * (1.0 + c.job.runtime.allocator_fraction) + runtime


def stage_memory(c: StageCtx, static: StaticMemory | None = None) -> MemoryReport:
    """Peak memory of a GPU of stage ``c.s`` and its terms [bytes]; ``static``: its ``static_memory``."""
    st = static or static_memory(c)
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


def _excess(n_bytes: float) -> str:
    """How far over capacity: MiB below a GiB (where one decimal of GiB would read as zero)."""
    return f"{n_bytes / MiB:,.0f} MiB" if n_bytes < GiB else format_gib(n_bytes)


def memory_reason(report: MemoryReport) -> str:
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
