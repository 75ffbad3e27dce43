"""Compute time of one stage per micro-batch: its layers' forward, backward and recomputation, the LM
head, FSDP2's copies on the compute stream, and the optimizer step (memoised on the values they read, so
that plans differing only in communication options share them)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

from meshplan.cost import memory as mem
from meshplan.cost.comm import PARAM_DTYPE_BYTES
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
from meshplan.cost.flops import attention_recomputed
from meshplan.cost.moe_routing import rank_load
from meshplan.cost.stage import StageCtx
from meshplan.memo import cache_by_identity
from meshplan.specs import AcceleratorSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.hardware import ExpertGemmPoint
from meshplan.specs.plan import recompute_modules_of


class _AccelKey(NamedTuple):
    """The accelerator figures the compute model reads (hashable, for the cache)."""

    bf16_flop_per_s: float
    fp8_flop_per_s: float | None
    gemm_efficiency: float
    hbm_bytes_per_s: float
    expert_gemm_curve: tuple[ExpertGemmPoint, ...] = ()
    moe_pass_bytes_per_s: float | None = None


def _accel_key(accel: AcceleratorSpec) -> _AccelKey:
    return _AccelKey(accel.bf16_flop_per_s, accel.fp8_flop_per_s, accel.gemm_efficiency, accel.hbm_bytes_per_s,
                     accel.expert_gemm_curve, accel.moe_pass_bytes_per_s)


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
                       mla_down_local=mla_down_local, moe_kernel="grouped" if fused_grouped_mlp else "per_expert")


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


def loss_of(job: JobSpec, plan: Plan) -> str:
    """The cross-entropy ``plan`` runs (JobSpec.loss_impl): Megatron-core's where it runs Megatron's layers."""
    return job.loss_impl(plan.runs_megatron_layers(job.software))


def stage_compute(c: StageCtx, compute: ComputeParams) -> tuple[float, ...]:
    """Per micro-batch on stage ``c.s`` [s]: (t_F, t_B, t_W, t_R recompute, attention forward) of the layers,
    and the LM head's forward and backward (0 except on the last stage)."""
    plan = c.plan
    return stage_compute_times(c.model, c.cluster.accelerator, compute, c.job, c.tokens, plan.tp, plan.cp,
                               plan.ep, plan.expert_tp, plan.sequence_parallel, plan.context_impl != "a2a",
                               c.n_dense, c.n_moe, c.last, c.recompute, c.recomputed,
                               loss_of(c.job, plan) if c.last else "", plan.runs_megatron_layers(c.job.software))


@cache_by_identity(n_specs=4)
def stage_compute_times(model: ModelSpec, accelerator: AcceleratorSpec, compute: ComputeParams, job: JobSpec,
                        tokens: float, tp: int, cp: int, ep: int, etp: int, sp: bool, cp_chunked: bool, n_dense: int,
                        n_moe: int, last: bool, recompute: str, recomputed: tuple[int, int], loss: str,
                        megatron: bool) -> tuple[float, ...]:
    """``stage_compute`` on the values it reads (``loss``: JobSpec.loss_impl on the last stage, '' on the
    others, which run no loss; ``megatron``: Plan.runs_megatron_layers), memoised: plans that differ only in
    their communication options, and the search's bounds, share it."""
    accel = _accel_key(accelerator)

    def lt(moe: bool) -> LayerTimes:
        expert_tokens = local = 0.0
        if moe:
            # the tokens routed from each rank of the EP group: its own share of the micro-batch (T/t after
            # sequence parallelism), or with the experts split over TP every token of the TP group
            t_rank = tokens if etp > 1 else tokens / (tp if sp else 1)
            # on the busiest rank of the micro-batch (moe_routing.rank_load), which the others wait for
            expert_tokens = t_rank * ep * model.top_k * rank_load(model, job, t_rank, ep)[1] / model.n_experts
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


def with_fsdp_copies(c: StageCtx, compute: ComputeParams, times: tuple[float, ...]) -> tuple[float, ...]:
    """``times`` (``stage_compute``) with FSDP2's copies added: the parameter copy-out of the forward gather
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


def _fsdp_copies_s(c: StageCtx, compute: ComputeParams) -> tuple[float, float, float]:
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
    instead: the H200 measured that cast and the gradient copy-in, docs/measure-and-crosscheck.md."""
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


def optimizer_s(c: StageCtx, compute: ComputeParams) -> float:
    """The optimizer step of stage ``c.s`` [s]: memory-bound over the states of its local parameters."""
    plan, job = c.plan, c.job
    state = mem.state_bytes_per_param(sharding=plan.sharding, optimizer=job.optimizer, dp_sharded=True,
                                      reduce_dtype_bytes=job.reduce_dtype_bytes)
    touched = 2 * (4.0 + state.optimizer) + state.grads + (2.0 if state.master else 0.0)
    local = c.params("dp_shard") / plan.shard_degree + c.params("edp") / c.groups["edp"].size
    return optimizer_step_time_s(n_params_local=local, bytes_touched_per_param=touched,
                                 accel=c.cluster.accelerator, params=compute)
