"""Structural checks of a plan against the model and the cluster. Violations raise SpecError naming the
field and what is allowed: these plans cannot be built at all (as opposed to plans that run out of
memory, which are estimates with ``feasible=False``)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.pipeline import plan_stage_layers
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.layout import parse_layout
from meshplan.specs.plan import RECOMPUTE_MODULES, partial_reshard_blocked


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def ulysses_fits(model: ModelSpec, tp: int, cp: int) -> bool:
    """Ulysses all-to-all splits the query (and, without MLA, the KV) heads of each TP rank over cp."""
    return not (model.n_heads // tp % cp or (not model.is_mla and model.n_kv_heads // tp % cp))


def sequence_parallel_fits(seq_len: int, tp: int, cp: int) -> bool:
    """Whether sequence parallelism can split the tokens each CP rank holds of a sequence over ``tp``."""
    return seq_len // cp % tp == 0


def without_unsplit_sp(plan: Plan, seq_len: int) -> Plan:
    """``plan`` as it can run on sequences of ``seq_len``: without sequence parallelism (nor async TP, which
    rides on it) where the sequence does not split over TP (sequence_parallel_fits). The search enumerates
    such plans so, and the conditions and the report re-time the recommendation and the TP alternative so."""
    if plan.sequence_parallel and not sequence_parallel_fits(seq_len, plan.tp, plan.cp):
        return replace(plan, sp=False, async_tp=False)
    return plan


def validate_plan(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> None:
    """Raise SpecError, naming the field, for the first thing ``plan`` cannot run with on ``model``,
    ``cluster`` and ``job``: its degrees, its pipeline split, its experts, its recomputation, its options
    (checked in that order)."""
    _check_degrees(model, cluster, job, plan)
    _check_pipeline_split(model, plan)
    _check_experts(model, job, plan)
    _check_recomputation(model, job, plan)
    _check_options(model, plan)


def _check_degrees(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> None:
    """The degrees multiply to the cluster's GPUs; TP divides the heads; CP and SP split the sequence."""
    n = cluster.n_gpus
    if plan.world_size != n:
        raise SpecError("plan", f"degrees dp_replicate={plan.dp_replicate} x dp_shard={plan.dp_shard} x "
                                f"cp={plan.cp} x tp={plan.tp} x pp={plan.pp} = {plan.world_size}, but the cluster "
                                f"has {n} GPUs ({cluster.n_nodes} node{'s' if cluster.n_nodes != 1 else ''} x "
                                f"{cluster.gpus_per_node})")
    if model.n_heads % plan.tp:
        raise SpecError("plan.tp", f"must divide n_heads={model.n_heads} of {model.name}; allowed: "
                                   f"{_divisors(model.n_heads)}")
    if not model.is_mla and model.n_kv_heads % plan.tp:
        raise SpecError("plan.tp", f"must divide n_kv_heads={model.n_kv_heads} of {model.name}; allowed: "
                                   f"{_divisors(model.n_kv_heads)}")
    if plan.cp > 1:
        if job.seq_len % (2 * plan.cp):
            raise SpecError("plan.cp", f"2·cp must divide seq_len={job.seq_len} (load-balanced causal "
                                       f"chunks); got cp={plan.cp}")
        if plan.context_impl == "a2a" and not ulysses_fits(model, plan.tp, plan.cp):
            heads, kv = model.n_heads // plan.tp, (model.n_kv_heads // plan.tp if not model.is_mla else 0)
            raise SpecError("plan.cp", f"Ulysses all-to-all needs cp to divide the heads per TP rank "
                                           f"({heads} query, {kv} KV); got cp={plan.cp}")
    if plan.sequence_parallel and not sequence_parallel_fits(job.seq_len, plan.tp, plan.cp):
        where = f"the {job.seq_len // plan.cp} tokens each CP rank holds" if plan.cp > 1 else \
            f"seq_len={job.seq_len}"
        raise SpecError("plan.sp", f"sequence parallelism splits {where} over tp={plan.tp}, which must divide "
                                   f"them (Megatron-core asserts it; PyTorch's Shard(1) would leave ranks "
                                   f"uneven): set sp=false or use a tp that divides them")


def _check_pipeline_split(model: ModelSpec, plan: Plan) -> None:
    """Every stage and model chunk gets layers; a layout lists the model's layers."""
    if plan.pp > model.n_layers:
        raise SpecError("plan.pp", f"{plan.pp} stages for {model.n_layers} layers; allowed: 1..{model.n_layers}")
    # Model chunks need not hold equal layer counts (Megatron's pipeline_model_parallel_layout and its
    # account_for_embedding/loss_in_pipeline_split, torchtitan's per-stage module lists). Without a layout
    # each needs a layer; a layout may leave a chunk only the embedding or the loss (Plan checks that
    # every rank keeps a layer).
    chunks = plan.pp * plan.model_chunks
    if plan.layout:
        listed = parse_layout(plan.layout)
        layers, mtp = sum(c.layers for c in listed), sum(c.mtp for c in listed)
        if layers != model.n_layers:
            raise SpecError("plan.layout", f"lists {layers} decoder layers (t); {model.name} has "
                                           f"n_layers={model.n_layers}")
        if mtp != model.mtp_layers:
            raise SpecError("plan.layout", f"lists {mtp} MTP layers (m); {model.name} has "
                                           f"mtp_layers={model.mtp_layers}")
    if plan.model_chunks > 1 and model.n_layers < chunks and not plan.layout:  # a layout's ranks each hold one
        split = model.embedding_loss_layout(chunks)
        hint = (f", or give Megatron's split with the embedding and the loss as slots: layout={split}" if split
                else "")
        raise SpecError("plan.vpp", f"pp x chunks = {plan.pp} x {plan.model_chunks} model chunks for "
                                    f"n_layers={model.n_layers}; each chunk needs a layer{hint}")


def _check_experts(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Expert parallelism needs an MoE model whose experts it divides and a mesh it folds onto; Megatron's
    MoE layers need sequence parallelism under TP."""
    if plan.ep > 1:
        if not model.is_moe:
            raise SpecError("plan.ep", f"{model.name} is dense; expert parallelism needs an MoE model")
        if model.n_experts % plan.ep:
            raise SpecError("plan.ep", f"must divide n_experts={model.n_experts}; allowed: "
                                       f"{_divisors(model.n_experts)}")
        folded = plan.tp * plan.cp * plan.dp_shard
        if folded % plan.ep:
            raise SpecError("plan.ep", f"must divide tp x cp x dp_shard = {folded} (experts fold onto those "
                                       f"ranks); got {plan.ep}")
        if folded % (plan.ep * plan.expert_tp):
            raise SpecError("plan.etp", f"ep x etp = {plan.ep} x {plan.expert_tp} must divide tp x cp x dp_shard "
                                        f"= {folded} (the expert mesh folds onto those ranks); use etp=1")
    if model.is_moe and plan.runs_megatron_layers(job.software) and plan.tp > 1 and not plan.sequence_parallel:
        raise SpecError("plan.sp", "Megatron-core trains MoE layers with TP only under sequence parallelism "
                                   "(MoELayer raises otherwise): leave sp out or set sp=true")


def _check_recomputation(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Megatron's recompute modules the model has; no more recomputed layers than a stage holds."""
    if plan.recompute_modules:
        _check_recompute_modules(model, job, plan)
    if plan.recompute_layers:
        most = max(d + e for d, e in plan_stage_layers(model, plan))
        if plan.recompute_layers > most:
            raise SpecError("plan.recompute_layers", f"recomputes that many layers of each stage; the largest "
                                                     f"stage has {most}: allowed 1..{most}")


def _check_options(model: ModelSpec, plan: Plan) -> None:
    """Expert TP only on MoE models; no ZB-V with MTP layers; DeepSpeed pipelines with ZeRO-1 only; FSDP2's
    reshard_after_forward only under FSDP, dividing its group, on parameters it can reshard."""
    if plan.etp is not None and not model.is_moe:
        raise SpecError("plan.etp", f"{model.name} is dense; expert-TP applies to MoE models: leave etp out")
    if plan.pp > 1 and plan.schedule == "zb-v" and model.mtp_layers:
        raise SpecError("plan.schedule", f"{model.name} has {model.mtp_layers} MTP layer(s), modelled as "
                                         "Megatron-core places them, beside the loss on the last stage, and Megatron "
                                         "runs no ZB-V (which puts the loss on the first rank): use 1f1b, "
                                         "interleaved or zb-h1")
    if plan.pp > 1 and plan.sharding in ("zero2", "zero3"):
        raise SpecError("plan.sharding", "DeepSpeed's pipeline engine supports ZeRO-1 only; with pp > 1 use "
                                         "zero1, megatron or fsdp")
    raf = plan.reshard_after_forward
    if raf is not None and not isinstance(raf, bool) and plan.shard_degree % raf:
        raise SpecError("plan.reshard_after_forward", f"must divide dp_shard x cp = {plan.shard_degree}")
    if plan.sharding != "fsdp" and raf not in (None, True):
        raise SpecError("plan.reshard_after_forward", "is an FSDP2 option; use sharding=fsdp")
    if partial_reshard_blocked(plan):
        raise SpecError("plan.reshard_after_forward", f"FSDP2 cannot reshard tensor- or expert-parallel (DTensor) "
                                                      f"parameters to a smaller group after forward (tp={plan.tp}, "
                                                      f"ep={plan.ep}); allowed: true or false")


def recompute_module_needs(model: ModelSpec, fused_grouped_mlp: bool) -> dict[str, tuple[bool, str]]:
    """Megatron-core's --recompute-modules that only some models have: module -> (whether ``model``, run with
    or without a fused grouped MLP, has it; what it needs). Megatron accepts the others for every model.
    The check of a given plan (_check_recompute_modules) and the modules the search offers
    (choice.megatron_selective_keys, which further offers layernorm and mlp only where they free memory)
    read these from here."""
    moe = model.n_moe_layers > 0
    return {"mla_up_proj": (model.is_mla, "multi-latent attention"),
            "moe_act": (moe and not fused_grouped_mlp,
                        "MoE layers whose activation runs on its own (not job.fused_grouped_mlp)"),
            "shared_experts": (moe and model.n_shared_experts > 0, "shared experts")}


def _check_recompute_modules(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Megatron-core's --recompute-modules need Megatron and the parts of the model they name."""
    if job.software in ("torchtitan", "llm-foundry", "maxtext"):
        raise SpecError("plan.recompute_modules", f"are Megatron-core's; the {job.software} stack has none: use "
                                                  "recompute=none, sac or full")
    needs = recompute_module_needs(model, job.fused_grouped_mlp)
    for module in plan.recompute_modules.split("+"):
        has, what = needs.get(module, (True, ""))
        if not has:
            raise SpecError("plan.recompute_modules", f"{module} needs {what}, which {model.name} has not; "
                                                      "allowed for it: " + ", ".join(
                                                          m for m in RECOMPUTE_MODULES if needs.get(m, (True,))[0]))
