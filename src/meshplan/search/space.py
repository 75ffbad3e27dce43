"""The plan space: every factorisation of the GPU count into mesh degrees that the topology and the
model admit, times the options of each parallelism. Generators and flat products, no nested search.

Topology rules: tensor parallelism stays inside a node (its collectives are on the critical path);
context, expert, pipeline and data parallelism may span nodes. Each structural plan (degrees, sharding,
schedule, virtual stages and, where only Megatron's embedding-and-loss split is even, that split as its
layout) comes first with its framework's default options, then with every other option
its framework offers (``option_variants``): sequence parallelism off, async TP, FSDP2's
``reshard_after_forward`` and gradient sync, and the context-parallel exchange. Micro-batch size and
recompute mode are not enumerated here: ``evaluate`` chooses them for each plan (memory is monotonic in
the micro-batch size, so the largest that fits is found without trying every value).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from meshplan.cost.offload import offload_offered
from meshplan.cost.validate import ulysses_fits, without_unsplit_sp
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs._validate import boolean, one_of, positive_int
from meshplan.specs.hardware import MAX_GPUS
from meshplan.specs.plan import (
    FRAMEWORK_CP,
    FRAMEWORK_EP_DISPATCH,
    FRAMEWORK_SCHEDULES,
    MAX_VPP,
    SCHEDULES,
    SHARDING,
    STACK_SCHEDULES,
    STACK_SHARDINGS,
    partial_reshard_blocked,
)

FAMILIES = ("ddp", "fsdp", "hsdp", "tp", "pp", "cp", "ep")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """Which parts of the plan space to search."""

    max_tp: int | None = None
    """Largest TP degree (default: GPUs per node)."""
    pipeline: bool = True
    context: bool = True
    experts: bool = True
    shardings: tuple[str, ...] = ("fsdp", "zero1", "zero2", "zero3", "megatron")
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "zb-h1", "zb-v")
    max_vpp: int = 4
    options: bool = True
    """Also enumerate each plan's non-default options (``option_variants``)."""

    def __post_init__(self) -> None:
        if self.max_tp is not None:
            positive_int("space.max_tp", self.max_tp, MAX_GPUS)
        positive_int("space.max_vpp", self.max_vpp, MAX_VPP)
        for name in ("pipeline", "context", "experts", "options"):
            boolean(f"space.{name}", getattr(self, name))
        for name, allowed in (("shardings", SHARDING), ("schedules", SCHEDULES)):
            value = getattr(self, name)
            if not isinstance(value, tuple | list) or not value:
                raise SpecError(f"space.{name}", f"must be a non-empty tuple of {', '.join(allowed)}; got {value!r}")
            for item in value:
                one_of(f"space.{name}", item, allowed)
            object.__setattr__(self, name, tuple(value))

    @classmethod
    def dp_tp(cls) -> Space:
        """The core family: DDP, FSDP, HSDP and TP x FSDP (PyTorch FSDP2 semantics)."""
        return cls(pipeline=False, context=False, experts=False, shardings=("fsdp",), schedules=("1f1b",))


def has_default_options(plan: Plan) -> bool:
    """True when every option is left to the plan's framework (the first plan of each structure)."""
    return not plan.explicit_options()


def needs_more_memory(variant: Plan) -> bool:
    """True when ``variant`` (from ``option_variants``) needs at least the memory of its default plan at
    every micro-batch size and recompute mode, so that it cannot fit where the default does not: SP off
    stores full-sequence activations, a kept or partial reshard keeps gathered parameters, gradient sync
    on the last micro-batch keeps unsharded gradients, the MoE all-to-all overlap keeps one more
    micro-batch (or model chunk) of activations and rules out full recomputation, the CP exchange's KV
    all-gather holds the gathered K and V (the default ring and Ulysses hold none), and async TP, the MoE
    dispatch and DDP's sync frequency change no memory term. The exception is FSDP2
    under a pipeline resharding per micro-batch, which frees what the default keeps (tested in
    test_properties), expert-TP, which divides the experts' states by tp but gathers their tokens, and
    activation offloading, which frees activations."""
    return not ((variant.sharding == "fsdp" and variant.pp > 1 and variant.shard_degree > 1)
                or variant.etp is not None or variant.offload_layers != 0)


def with_job_recompute(plan: Plan, job: JobSpec) -> Plan | None:
    """``plan`` running the recomputation the job restricts the search to (JobSpec.recompute): unchanged
    under 'auto' or where the plan fixes its own; None where the plan cannot run that mode (op-level SAC on
    Megatron's layers, full recomputation beside Megatron's MoE all-to-all overlap, recomputation beside
    activation offloading)."""
    if job.recompute == "auto" or plan.recompute is not None or plan.recompute_layers is not None:
        return plan
    if job.recompute == "sac" and plan.runs_megatron_layers(job.software):
        return None
    try:
        return replace(plan, recompute=job.recompute)
    except SpecError:
        return None


def option_variants(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> Iterator[Plan]:
    """The non-default options each framework offers for ``plan`` (a plan with default options):

    - TP: sequence parallelism off (all-reduce instead of reduce-scatter/all-gather; not for Megatron MoE
      plans, whose MoE layers refuse TP without it); async TP
      (torchtitan's micro-pipelined TP, Megatron's TP communication overlap), which needs SP;
    - CP: every exchange the framework implements (torchtitan ring or all-gather; Megatron also a2a);
    - FSDP2 without a pipeline: ``reshard_after_forward`` False, or the node size (a partial reshard),
      each with gradient sync after every micro-batch or only the last;
    - FSDP2 under a pipeline: reshard and reduce per micro-batch instead of keeping the stage gathered;
    - DDP: all-reduce after every micro-batch instead of ``no_sync`` (torchtitan's only way,
      specs.plan.stack_defaults);
    - Megatron MoE: DeepEP dispatch where it sends less than an all-to-all (the expert-parallel group
      spans nodes, or a GPU holds several experts of a token's top-k), the all-to-all
      overlap with another micro-batch (without a pipeline, or with the interleaved schedule), and
      with TP the routed experts split over the tp ranks too (expert-TP = tp);
    - Megatron without a pipeline (its distributed optimizer, or any sharding with job.software =
      'megatron', as Megatron-FSDP): activation offloading, ``evaluate`` taking the fewest layers that fit
      where it beats recomputation, on nodes whose host link rate is known and without per-layer CUDA
      graphs.

    Options that change nothing for the plan (grad sync with one micro-batch, a partial reshard that
    is the whole group) are not generated, so no configuration is counted twice.
    """
    per_replica = max(1, job.global_batch_seqs // plan.dp)
    sharded, gpn = plan.sharding == "fsdp" and plan.shard_degree > 1, cluster.gpus_per_node
    tp_opts: list[tuple[bool | None, bool]] = [(plan.sp, False)]
    # sp=False on a base plan: the sequence does not split over TP (enumerate_plans), so no SP or async-TP
    # variants; Megatron's MoE layers run TP only with SP
    if plan.tp > 1 and plan.sp is not False and not (model.is_moe and plan.runs_megatron_layers(job.software)):
        tp_opts.append((False, False))
        if plan.sharding in ("fsdp", "megatron"):
            tp_opts.append((None, True))
    cp_opts: list[str | None] = [None]
    if plan.cp > 1:
        cp_opts += [impl for impl in FRAMEWORK_CP[plan.sharding][1:] if impl != "a2a" or
                    ulysses_fits(model, plan.tp, plan.cp)]
    dp_opts: list[tuple[bool | int | None, str | None]] = [(None, None)]
    if sharded and plan.pp == 1:
        rafs: list[bool | int | None] = [None, False]
        if (plan.shard_degree > gpn and plan.shard_degree % gpn == 0
                and not partial_reshard_blocked(replace(plan, reshard_after_forward=gpn))):
            rafs.append(gpn)
        syncs: list[str | None] = [None, "last"] if per_replica > 1 else [None]
        dp_opts = [(r, g) for r in rafs for g in syncs]
    elif sharded:
        dp_opts.append((True, "every"))
    elif plan.is_ddp and per_replica > 1 and job.software != "torchtitan":
        # torchtitan runs DDP one way: every micro-batch without a pipeline (its loop has no no_sync;
        # stack_defaults), once per step with one (torch.distributed.pipelining's own no_sync)
        dp_opts.append((None, "every"))
    ep_opts: list[tuple[str | None, bool, int | None]] = [(None, False, None)]
    if plan.ep > 1 and model.n_experts and "deepep" in FRAMEWORK_EP_DISPATCH[plan.sharding]:
        pairs = per_replica > 1 and (plan.pp == 1 or plan.schedule == "interleaved")  # a micro-batch to pair
        overlaps = [False, True] if pairs else [False]
        etps: list[int | None] = [None]
        if plan.tp > 1 and (plan.tp * plan.cp * plan.dp_shard) % (plan.ep * plan.tp) == 0:
            etps.append(plan.tp)
        # DeepEP (modelled with whole experts only) where it sends less than an all-to-all: where the ep
        # ranks span nodes, or a GPU holds several experts, so that a token's top-k often share a GPU
        dedup = plan.ep > gpn or (model.top_k > 1 and model.n_experts > plan.ep)
        ep_opts = [(dispatch, overlap, etp) for etp in etps
                   for dispatch in ([None, "deepep"] if dedup and etp is None else [None])
                   for overlap in overlaps]
    for (sp, async_tp), cp_impl, (raf, sync), (dispatch, ep_overlap, etp) in itertools.product(
            tp_opts, cp_opts, dp_opts, ep_opts):
        if (sp is plan.sp and not async_tp and cp_impl is None and raf is None and sync is None and dispatch is None
                and not ep_overlap and etp is None):
            continue  # the default plan itself
        yield replace(plan, sp=sp, async_tp=async_tp, cp_impl=cp_impl, reshard_after_forward=raf, grad_sync=sync,
                      ep_dispatch=dispatch, ep_overlap=ep_overlap, etp=etp)
    if offload_offered(cluster, job, plan):
        yield replace(plan, offload_layers=None)


FAMILY_NAMES = {"ddp": "DDP", "fsdp": "sharded data parallel (FSDP, ZeRO, Megatron)", "hsdp": "HSDP",
                "tp": "TP x data parallel",
                "pp": "pipeline", "cp": "context parallel", "ep": "expert parallel"}
"""What reports call each ``family``."""


def family(plan: Plan) -> str:
    """The plan's family name for reports: the most distinctive parallelism it uses."""
    if plan.ep > 1:
        return "ep"
    if plan.cp > 1:
        return "cp"
    if plan.pp > 1:
        return "pp"
    if plan.tp > 1:
        return "tp"
    if plan.dp_shard > 1 and plan.dp_replicate > 1:
        return "hsdp"
    if plan.dp_shard > 1:
        return "fsdp"
    return "ddp"


def _pipeline_options(model: ModelSpec, pp: int, space: Space) -> Iterator[tuple[str, int, str]]:
    """(schedule, virtual stages, layout) of ``pp`` stages: interleaving where the chunks split the layers
    evenly, or evenly once the embedding and the loss count as a layer each (Megatron's
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split, given as its layout,
    specs.layout.embedding_loss_layout, which one chunk per rank also takes where it alone is even); a
    model with MTP splits any chunk count as NVIDIA's layouts do (cost.pipeline.mtp_chunk_layers)."""
    if pp == 1:
        yield "1f1b", 1, ""
        return
    for schedule in space.schedules:
        if schedule == "interleaved":
            for v in range(2, min(space.max_vpp, (model.n_layers + 2) // pp) + 1):  # a chunk holds a layer
                chunks = pp * v
                if model.mtp_layers:
                    if model.n_layers >= chunks:
                        yield schedule, v, ""
                elif model.n_layers % chunks == 0:
                    yield schedule, v, ""
                elif split := model.embedding_loss_layout(chunks):
                    yield schedule, v, split
        elif schedule == "zb-v":
            if model.n_layers % (2 * pp) == 0 and not model.mtp_layers:  # cost.validate: MTP has no ZB-V
                yield schedule, 1, ""
        else:  # one chunk per rank: the even split, or Megatron's where only it is even
            yield schedule, 1, model.embedding_loss_layout(pp) or ""


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space) -> Iterator[Plan]:
    """Every structurally valid plan of ``space`` with its framework's default options (valid: passes
    meshplan.cost.validate.validate_plan); ``option_variants`` gives the rest."""
    n = cluster.n_gpus
    heads = model.n_heads if model.is_mla else min(model.n_heads, model.n_kv_heads)
    max_tp = space.max_tp or cluster.gpus_per_node
    tps = [t for t in divisors(n) if t <= max_tp and model.n_heads % t == 0 and (model.is_mla or heads % t == 0)]
    pps = [p for p in divisors(n) if p <= model.n_layers] if space.pipeline else [1]
    cps = [c for c in divisors(n) if c == 1 or job.seq_len % (2 * c) == 0] if space.context else [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        eps = [1]
        if model.is_moe and space.experts:
            eps = [e for e in divisors(model.n_experts) if e == 1 or (tp * cp * dp) % e == 0]
        for dr, ep, (schedule, vpp, layout) in itertools.product(divisors(dp), eps,
                                                                 _pipeline_options(model, pp, space)):
            ds = dp // dr
            if ep > 1 and (tp * cp * ds) % ep:
                continue
            shardings = space.shardings if ds * cp > 1 else ("fsdp",)
            if ds * cp == 1 and tp > 1 and job.software not in STACK_SHARDINGS:
                # nothing to shard, but Megatron-core's tensor-parallel layers save less than PyTorch's
                # (Plan.runs_megatron_layers): both frameworks are plans, where the space has them
                shardings = tuple(s for s in ("fsdp", "megatron") if s in space.shardings) or ("fsdp",)
            if ds * cp > 1 and job.software in STACK_SHARDINGS:  # a named stack runs its own shardings only
                shardings = tuple(s for s in shardings if s in STACK_SHARDINGS[job.software])
            if pp > 1 and schedule not in STACK_SCHEDULES.get(job.software, (schedule,)):
                continue
            for sharding in shardings:
                if pp > 1 and (sharding in ("zero2", "zero3") or schedule not in FRAMEWORK_SCHEDULES[sharding]):
                    continue  # each framework runs its own schedules; DeepSpeed pipelines with ZeRO-1 only
                if cp > 1 and FRAMEWORK_CP[sharding][0] == "a2a" and not ulysses_fits(model, tp, cp):
                    continue
                plan = without_unsplit_sp(Plan(dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, pp=pp, ep=ep,
                                                sharding=sharding, schedule=schedule, vpp=vpp, layout=layout),
                                           job.seq_len)
                if plan.sp is False and model.is_moe and plan.runs_megatron_layers(job.software):
                    continue  # Megatron's MoE layers run TP only with sequence parallelism
                yield plan
