"""Megatron-LM (``pretrain_gpt.py`` arguments) and Megatron-Bridge (ConfigContainer overrides): a plan as their
settings, and a Megatron-LM command line read back.

Checked against Megatron-LM's own argument parser at NVIDIA/Megatron-LM@d98e8a64 (2026-08-22, after
core_v0.19.0; megatron/training/arguments.py builds most flags from megatron-core's TransformerConfig) and
Megatron-Bridge's ConfigContainer at NVIDIA-NeMo/Megatron-Bridge@067f987d (after v0.6.0): megatron-core 0.19
and Megatron-Bridge 0.6 need Python 3.12 and do not install here, so tests/frameworks check exports against
the table tests/frameworks/dump_megatron_flags.py read from those sources, and against Megatron-LM's own
parse_args and validate_args where a checkout is at hand (MEGATRON_LM_SOURCE).

What Megatron derives: the data-parallel size is world / (tp x pp x cp) (expert layers fold ep x etp into
the same ranks); the number of micro-batches is global batch / (micro-batch x data-parallel size), all in one
pipeline step; the distributed optimizer shards over the data-parallel (and context-parallel) ranks, split
into --num-distributed-optimizer-instances replicas. Megatron-LM runs 1F1B and interleaved 1F1B only, has no
DeepSpeed ZeRO stages and no op-level selective checkpointing (torchtitan's); those plans are refused.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.errors import SpecError
from meshplan.frameworks.common import (
    Export,
    Imported,
    as_run,
    batch_of,
    comment_block,
    flag_pairs,
    read_source,
    refuse,
    resolved,
    shell_command,
    split_command,
    world_check,
)
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.units import ascii_float

STACK = "megatron"
CP_COMM = {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a"}
_SHARDING_LACK = {"zero1": "DeepSpeed's ZeRO-1", "zero2": "DeepSpeed's ZeRO-2", "zero3": "DeepSpeed's ZeRO-3"}
OPTIMIZERS = {"adamw": ["--optimizer", "adam"], "sgd-momentum": ["--optimizer", "sgd"],
              "adamw-bf16-moments": ["--optimizer", "adam", "--use-precision-aware-optimizer", "--exp-avg-dtype",
                                     "bf16", "--exp-avg-sq-dtype", "bf16"]}
"""Megatron's ``adam`` is AdamW (decoupled weight decay, megatron/core/optimizer)."""
def _checks(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Refuse what Megatron-LM cannot run as the plan says."""
    if plan.sharding in _SHARDING_LACK:
        refuse(STACK, f"Megatron-LM has no {_SHARDING_LACK[plan.sharding]} (Megatron-DeepSpeed runs it: --export "
                      "deepspeed); its own sharding is the distributed optimizer (sharding=megatron)")
    if not plan.runs_megatron_layers(job.software):
        refuse(STACK, f"the estimate assumes PyTorch's layers (sharding={plan.sharding}, job.software="
                      f"{job.software!r}); name the stack (software = \"megatron\" in the job) so that meshplan times "
                      "Megatron-core's")
    if plan.pp > 1 and plan.schedule not in ("1f1b", "interleaved"):
        refuse(STACK, f"Megatron-LM runs the 1F1B and interleaved 1F1B schedules; it has no {plan.schedule}")
    if plan.recompute == "sac":
        refuse(STACK, "Megatron-core has no op-level selective checkpointing (sac); use recompute=selective with "
                      "recompute_modules, or full")
    fsdp = plan.sharding == "fsdp" and plan.shard_degree > 1
    if plan.is_ddp:
        refuse(STACK, "Megatron's data parallelism without sharding is its own DDP (one gradient buffer), which "
                      "meshplan estimates as sharding=megatron, not PyTorch's DDP: export that plan")
    if fsdp and (plan.dp_replicate > 1 or plan.pp > 1):
        refuse(STACK, "meshplan writes Megatron-FSDP (--use-megatron-fsdp) sharding over the whole data-parallel "
                      "group without a pipeline: its hybrid (HSDP, HFSDP) and pipelined modes are not exported")
    if fsdp and plan.effective_grad_sync == "last":
        refuse(STACK, "Megatron-FSDP reduces gradients after every micro-batch; it has no grad_sync=last")
    if not fsdp and plan.grad_sync == "every":
        refuse(STACK, "Megatron accumulates gradients in its buffer and reduces them once per step; it has no "
                      "grad_sync=every")
    if plan.reshard_after_forward is not None:
        refuse(STACK, "reshard_after_forward is PyTorch FSDP2's; Megatron-FSDP frees every gathered unit after use "
                      "(--data-parallel-sharding-strategy optim_grads_params)")
    if job.optimizer not in OPTIMIZERS:
        refuse(STACK, f"Megatron-LM has no {job.optimizer!r} optimizer (it has adam, i.e. AdamW, and sgd)")
    if job.reduce_dtype_bytes not in (2, 4):
        refuse(STACK, "Megatron-LM reduces gradients in fp32 or, with --grad-reduce-in-bf16, bf16")
    if job.loss == "eager":
        refuse(STACK, "Megatron-core's cross-entropy is vocab-parallel or fused; it has no eager loss on fp32 logits")
    if plan.cp > 1 and job.seq_len % (2 * plan.cp):
        refuse(STACK, f"Megatron's context parallelism needs the sequence length divisible by 2 x cp; "
                      f"{job.seq_len} is not")


def _model_args(model: ModelSpec, job: JobSpec) -> tuple[list[str], list[str]]:
    """The architecture as Megatron-LM's flags, and what they cannot say (listed as assumptions)."""
    a = ["--num-layers", str(model.n_layers), "--hidden-size", str(model.hidden),
         "--ffn-hidden-size", str(model.ffn_hidden), "--num-attention-heads", str(model.n_heads),
         "--seq-length", str(job.seq_len), "--max-position-embeddings", str(max(job.seq_len, model.learned_pos_emb)),
         "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
         "--position-embedding-type", "learned_absolute" if model.learned_pos_emb else "rope"]
    gaps = []
    if model.n_kv_heads < model.n_heads and not model.is_mla:
        a += ["--group-query-attention", "--num-query-groups", str(model.n_kv_heads)]
    if model.head_dim is not None and not model.is_mla:
        a += ["--kv-channels", str(model.head_dim)]
    a += ["--swiglu"] if model.gated_mlp else []
    a += [] if model.linear_bias else ["--disable-bias-linear"]
    a += ["--add-qkv-bias"] if model.qkv_bias else []
    a += ["--qk-layernorm"] if model.qk_norm else []
    a += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    a += ["--softmax-type", "learnable"] if model.attention_sinks else []
    if model.is_moe:
        a += ["--num-experts", str(model.n_experts), "--moe-router-topk", str(model.top_k),
              "--moe-ffn-hidden-size", str(model.expert_ffn_hidden), "--moe-grouped-gemm"]
        if model.n_shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(model.n_shared_experts * model.expert_ffn_hidden)]
        if model.n_dense_layers:
            a += ["--moe-layer-freq", f"([0]*{model.n_dense_layers}+[1]*{model.n_moe_layers})"]
        if model.n_expert_groups:
            a += ["--moe-router-num-groups", str(model.n_expert_groups), "--moe-router-group-topk",
                  str(model.topk_groups)]
    if model.is_mla:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(model.kv_lora_rank), "--qk-head-dim",
              str(model.d_head), "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim), "--v-head-dim",
              str(model.value_head_dim)] + (["--q-lora-rank", str(model.q_lora_rank)] if model.q_lora_rank else [])
    if model.mtp_layers:
        a += ["--mtp-num-layers", str(model.mtp_layers)]
    if model.attention_window:
        a += ["--window-size", f"({model.attention_window - 1},0)"]
        if model.global_attention_every:
            a += ["--window-attn-skip-freq", str(model.global_attention_every)]
    if model.sandwich_norm:
        gaps.append("the norms after attention and after the MLP (Gemma 2/3) have no Megatron-LM flag: the model "
                    "built has two norms per layer, not four")
    if model.router_bias:
        gaps.append("the router's bias (GPT-OSS) has no Megatron-LM flag: the router built has none")
    gaps.append(f"the vocabulary of {model.vocab:,}: Megatron pads it to a multiple of 128 x tp "
                "(--make-vocab-size-divisible-by); meshplan counted it unpadded")
    return [*a, "--vocab-size", str(model.vocab)], gaps


def _layout(model: ModelSpec, plan: Plan) -> str:
    """The pipeline layout to write: the plan's, or meshplan's own split where Megatron's even split would
    differ (layers that do not divide over the chunks; a model with MTP layers)."""
    if plan.pp == 1:
        return ""
    if plan.layout:
        return plan.layout
    chunks = plan.pp * plan.model_chunks
    if model.n_layers % chunks == 0 and not model.mtp_layers:
        return ""
    from meshplan.cost.pipeline import mtp_chunk_layers, plan_stage_layers

    if model.mtp_layers:
        sizes = mtp_chunk_layers(model.n_layers, model.mtp_layers, chunks)
    else:  # each rank's layers as meshplan split them, over its chunks, the first chunks taking the remainder
        per_rank = [d + e for d, e in plan_stage_layers(model, plan)]
        sizes = [0] * chunks
        for rank, n in enumerate(per_rank):
            base, extra = divmod(n, plan.model_chunks)
            for v in range(plan.model_chunks):
                sizes[v * plan.pp + rank] = base + (1 if v < extra else 0)
    parts = ["t" * n for n in sizes]
    parts[0] = "E" + parts[0]
    parts[-1] += "m" * model.mtp_layers + "L"
    return "|".join(parts)


def _parallel_args(model: ModelSpec, plan: Plan) -> list[str]:
    a = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
         "--context-parallel-size", str(plan.cp)]
    if model.is_moe:
        a += ["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.expert_tp),
              "--moe-token-dispatcher-type", "flex" if plan.ep_dispatch == "deepep" else "alltoall"]
        a += ["--moe-flex-dispatcher-backend", "deepep"] if plan.ep_dispatch == "deepep" else []
        a += ["--overlap-moe-expert-parallel-comm"] if plan.ep_overlap else []
    a += ["--sequence-parallel"] if plan.sequence_parallel else []
    a += ["--tp-comm-overlap"] if plan.async_tp else []
    if plan.schedule == "interleaved" and plan.pp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    layout = _layout(model, plan)
    a += ["--pipeline-model-parallel-layout", layout] if layout else []
    if plan.cp > 1:
        a += ["--cp-comm-type", CP_COMM[plan.context_impl]]
    if plan.sharding == "fsdp" and plan.shard_degree > 1:  # Megatron-FSDP: parameters, grads and states sharded
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--ckpt-format",
              "fsdp_dtensor", "--init-model-with-meta-device"]
    elif plan.shard_degree > 1:
        a += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
        if plan.dp_replicate > 1:
            a += ["--num-distributed-optimizer-instances", str(plan.dp_replicate)]
    elif plan.dp > 1:
        a += ["--overlap-grad-reduce"]
    return a + _recompute_args(plan)


def _recompute_args(plan: Plan) -> list[str]:
    if plan.offload_layers:
        return ["--cpu-offloading-num-layers", str(plan.offload_layers)]
    if plan.recompute == "selective":
        modules = plan.recompute_modules.split("+") if plan.recompute_modules else ["core_attn"]
        return ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    if plan.recompute == "full":
        if plan.recompute_layers is not None:
            return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                    str(plan.recompute_layers)]
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return []


RUN_PLACEHOLDERS = ("--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "100", "--lr", "3.0e-4",
                    "--min-lr", "3.0e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "10")
"""Arguments a run needs that are not the plan's (pretrain_gpt.py fails without a learning rate: --lr defaults to
None): placeholders for the user's data, tokenizer, length and schedule."""


def _job_args(job: JobSpec, b) -> list[str]:
    a = ["--micro-batch-size", str(b.mbs), "--global-batch-size", str(b.global_seqs), "--bf16",
         *OPTIMIZERS[job.optimizer]]
    if job.precision == "fp8":
        a += ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
        a += ["--fp8-param-gather"] if job.fp8_param_gather else []
    a += ["--grad-reduce-in-bf16"] if job.reduce_dtype_bytes == 2 else []
    if job.loss in ("te", "fused"):
        a += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te" if job.loss == "te" else "native"]
    if job.cuda_graphs:
        whole = job.cuda_graph_scope == "full_iteration"
        a += ["--cuda-graph-impl", "full_iteration" if whole else "transformer_engine"]
        a += ["--no-check-for-nan-in-loss-and-grad"] if whole else []
    if job.moe_token_drop != "dropless":  # Megatron-core drops beyond the capacity; pads up to it on request
        a += ["--moe-expert-capacity-factor", f"{job.moe_capacity_factor:g}"]
        a += ["--moe-pad-expert-input-to-capacity"] if job.moe_token_drop == "pad" else []
    return a


def export(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, fmt: str = "script") -> Export:
    """``plan`` as Megatron-LM's pretrain_gpt.py arguments ('args'), a torchrun launch script ('script'), or
    Megatron-Bridge ConfigContainer overrides ('bridge')."""
    plan = resolved(STACK, plan)
    world_check(STACK, plan, cluster)
    _checks(model, job, plan)
    if job.fp8_attention and fmt != "bridge":
        refuse(STACK, "Megatron-LM's command line has no FP8 attention flag (TransformerConfig."
                      "fp8_dot_product_attention is excluded from it); use --format bridge")
    b = batch_of(STACK, plan, job)
    model_args, gaps = _model_args(model, job)
    args = model_args + _parallel_args(model, plan) + _job_args(job, b)
    data = [*RUN_PLACEHOLDERS]
    assumptions = gaps + _assumptions(cluster, job, plan, b)
    if fmt == "bridge":
        from meshplan.frameworks.bridge import overrides

        return overrides(model, cluster, job, plan, args, assumptions)
    # Hopper and before: TP or CP need one CUDA connection, FSDP2 and the MoE overlap more (validate_args)
    env = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),) if (plan.tp > 1 or plan.cp > 1) and not (
        (plan.sharding == "fsdp" and plan.shard_degree > 1) or plan.ep_overlap) else ()
    if fmt == "args":
        text = " ".join(args + data)
    else:
        head = ["torchrun", "--nnodes", str(cluster.n_nodes), "--nproc-per-node", str(cluster.gpus_per_node),
                "pretrain_gpt.py"]
        text = "\n".join([comment_block([f"meshplan: {plan.label()} [{plan.to_string()}] for Megatron-LM "
                                         "(NVIDIA/Megatron-LM@d98e8a64)",
                                         f"model {model.name}, {cluster.n_gpus} x {cluster.accelerator.name}",
                                         "replace --mock-data, --tokenizer-type NullTokenizer, --train-iters and "
                                         "the learning-rate schedule (--lr ...) with your data, tokenizer, run "
                                         "length and schedule: they are placeholders, which meshplan's "
                                         "figures do not depend on",
                                         "assumed (Megatron decides these itself):"]),
                          comment_block(assumptions, "#   - ")]
                         + [f"export {k}={v}" for k, v in env]
                         + [shell_command(head, args + data)])
    return Export(stack=STACK, format=fmt, text=text + "\n", args=tuple(args + data), assumptions=tuple(assumptions),
                  env=env)


def _assumptions(cluster: ClusterSpec, job: JobSpec, plan: Plan, b) -> list[str]:
    out = [f"data parallelism: Megatron takes it from the GPUs, {cluster.n_gpus} / (tp x pp x cp) = {plan.dp}; "
           f"{b.microbatches} micro-batches of {b.mbs} per step (global batch / (micro-batch x data-parallel "
           "size))"]
    if plan.shard_degree > 1 and plan.sharding == "fsdp":
        out.append("Megatron-FSDP's units and buckets (its defaults); meshplan assumed one unit per transformer layer, "
                   "gathered into its buffer without a copy, and the gathers and reductions hidden behind compute")
    if plan.shard_degree > 1 and plan.sharding == "megatron":
        out.append("the distributed optimizer's buckets (--ddp-bucket-size: Megatron's default) and its overlap "
                   "with the backward and the next forward; meshplan assumed the reductions hide behind the "
                   "backward and the gathers behind the forward")
    if plan.async_tp:
        out.append("TP communication overlap: Transformer Engine's userbuffers with their default configuration "
                   "(--tp-comm-overlap-cfg unset)")
    if job.precision == "fp8":
        out.append("the FP8 recipe: tensorwise current scaling written; meshplan times FP8 GEMMs the same under any "
                   "recipe")
    out.append("kernels: Transformer Engine's fused attention, bias-SwiGLU and cross-entropy as Megatron picks "
               "them (meshplan's Megatron calibration was fitted on such runs)")
    out.append("collectives: NCCL's defaults (meshplan assumed rings over every NIC of a node and NVLS for "
               "all-reduce inside one); CUDA_DEVICE_MAX_CONNECTIONS=1 where tp or cp > 1 (Megatron requires it before "
               "Blackwell, except with Megatron-FSDP or the MoE overlap, which need more)")
    return out


# ---- import ----------------------------------------------------------------------------------------------

_CP_IMPL = {v: k for k, v in CP_COMM.items()}


def read(source: str, world_size: int | None = None) -> Imported:
    """A Megatron-LM command line or launch script (pretrain_gpt.py arguments) as a plan, a job and, where its
    flags give the architecture, a model. Flags meshplan does not model are listed in ``unsupported``."""
    cmd = split_command(read_source(source), ("pretrain_gpt.py", "pretrain_mamba.py", "train.py"))
    world = cmd.world_size or world_size
    flags: dict[str, list[str]] = {}
    unsupported: list[str] = []
    for key, vals in flag_pairs(cmd.program):
        if not key:
            continue
        if key in flags:
            unsupported.append(f"{key} given twice; the last is read")
        flags[key] = vals
    if world is None:
        raise SpecError("from.megatron", "needs the GPU count: give --nodes / --gpus-per-node, or a launch command "
                                         "with torchrun --nnodes / --nproc-per-node")
    plan = _plan(flags, world)
    job = _job(flags, plan)
    model = _model(flags)
    read_keys = _READ | _MODEL_KEYS
    unsupported += [" ".join([k, *v]) for k, v in flags.items() if k not in read_keys]
    return Imported(stack=STACK, plan=plan, job=job, model_spec=model, world_size=world,
                    unsupported=tuple(unsupported))


def _float(flags: dict[str, list[str]], key: str) -> float:
    try:
        return ascii_float(flags[key][0])
    except (ValueError, IndexError):
        raise SpecError(f"from.megatron {key}", f"must be a number; got {' '.join(flags[key])!r}") from None


def _int(flags: dict[str, list[str]], key: str, default: int) -> int:
    vals = flags.get(key)
    if not vals:
        return default
    try:
        return int(vals[0])
    except ValueError:
        raise SpecError(f"from.megatron {key}", f"must be a whole number; got {vals[0]!r}") from None


def _plan(flags: dict[str, list[str]], world: int) -> Plan:
    from meshplan.specs.plan import parse_plan

    tp, pp, cp = _int(flags, "--tensor-model-parallel-size", 1), _int(flags, "--pipeline-model-parallel-size", 1), \
        _int(flags, "--context-parallel-size", 1)
    if world % (tp * pp * cp):
        raise SpecError("from.megatron", f"{world} GPUs is not a multiple of tp x pp x cp = {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    fsdp = "--use-torch-fsdp2" in flags or "--use-megatron-fsdp" in flags
    distopt = "--use-distributed-optimizer" in flags
    instances = _int(flags, "--num-distributed-optimizer-instances", 1)
    items = [f"tp={tp}", f"pp={pp}", f"cp={cp}"]
    if fsdp:
        items += [f"dp_shard={dp}", "sharding=fsdp"]  # with dp 1, FSDP2 shards over the cp ranks
    elif distopt:
        items += [f"dp_replicate={instances}", f"dp_shard={dp // instances}", "sharding=megatron"]
    else:
        items += [f"dp_replicate={dp}", "sharding=megatron"]
    if "--torch-fsdp2-no-reshard-after-forward" in flags:
        items.append("reshard_after_forward=false")
    ep = _int(flags, "--expert-model-parallel-size", 1)
    if ep > 1 or "--num-experts" in flags:
        items.append(f"ep={ep}")
        etp = _int(flags, "--expert-tensor-parallel-size", tp)
        items.append(f"etp={etp}")
        if flags.get("--moe-token-dispatcher-type", ["alltoall"])[0] == "flex":
            items.append("ep_dispatch=deepep")
        if "--overlap-moe-expert-parallel-comm" in flags:
            items.append("ep_overlap=true")
    if tp > 1 and "--sequence-parallel" not in flags:
        items.append("sp=false")
    if "--tp-comm-overlap" in flags:
        items.append("async_tp=true")
    vpp = _int(flags, "--num-virtual-stages-per-pipeline-rank", 1)
    if pp > 1 and vpp > 1:
        items += ["schedule=interleaved", f"vpp={vpp}"]
    layout = flags.get("--pipeline-model-parallel-layout")
    if layout and pp > 1:
        items.append(f"layout={layout[0]}")
    if cp > 1:
        comm = flags.get("--cp-comm-type", ["p2p"])
        if len(comm) != 1 or comm[0] not in _CP_IMPL:
            raise SpecError("from.megatron --cp-comm-type", f"meshplan models one of p2p, all_gather, a2a for every "
                                                            f"layer; got {' '.join(comm)}")
        items.append(f"cp_impl={_CP_IMPL[comm[0]]}")
    items.append(f"mbs={_int(flags, '--micro-batch-size', 1)}")
    items += _recompute(flags)
    plan = parse_plan(",".join(items))
    if plan.etp is not None and plan.etp == (plan.tp if plan.ep == 1 else 1):
        plan = replace(plan, etp=None)
    return plan


def _recompute(flags: dict[str, list[str]]) -> list[str]:
    offload = _int(flags, "--cpu-offloading-num-layers", 0)
    if offload:
        return ["recompute=none", f"offload_layers={offload}"]
    granularity = (flags.get("--recompute-granularity") or [None])[0]
    if "--recompute-activations" in flags:
        granularity = "selective"
    if granularity == "selective":
        modules = flags.get("--recompute-modules") or ["core_attn"]
        return ["recompute=selective", f"recompute_modules={'+'.join(modules)}"]
    if granularity == "full":
        method = (flags.get("--recompute-method") or ["uniform"])[0]
        n = _int(flags, "--recompute-num-layers", 1)
        if method == "block":
            return ["recompute=full", f"recompute_layers={n}"]
        if n != 1:
            raise SpecError("from.megatron --recompute-num-layers", f"uniform recomputation of groups of {n} layers "
                                                                    "is not modelled (only 1: every layer)")
        return ["recompute=full"]
    return ["recompute=none"]


def _job(flags: dict[str, list[str]], plan: Plan) -> dict[str, object]:
    seq = _int(flags, "--seq-length", 4096)
    gbs = _int(flags, "--global-batch-size", (plan.mbs or 1) * plan.dp)
    job: dict[str, object] = {"global_batch_tokens": gbs * seq, "seq_len": seq, "software": "megatron"}
    if "--fp8-format" in flags:
        job["precision"] = "fp8"
        job["fp8_param_gather"] = "--fp8-param-gather" in flags
    if "--grad-reduce-in-bf16" in flags:
        job["reduce_dtype_bytes"] = 2.0
    opt = (flags.get("--optimizer") or ["adam"])[0]
    if opt == "sgd":
        job["optimizer"] = "sgd-momentum"
    elif "--use-precision-aware-optimizer" in flags and (flags.get("--exp-avg-dtype") or [""])[0] == "bf16":
        job["optimizer"] = "adamw-bf16-moments"
    if "--cross-entropy-loss-fusion" in flags:
        job["loss"] = "te" if (flags.get("--cross-entropy-fusion-impl") or ["native"])[0] == "te" else "fused"
    impl = (flags.get("--cuda-graph-impl") or ["none"])[0]
    if impl != "none" or "--enable-cuda-graph" in flags:
        job.update(cuda_graphs=True, cuda_graph_scope="full_iteration" if impl == "full_iteration" else "layers")
    if "--moe-expert-capacity-factor" in flags:
        job.update(moe_token_drop="pad" if "--moe-pad-expert-input-to-capacity" in flags else "drop",
                   moe_capacity_factor=_float(flags, "--moe-expert-capacity-factor"))
    return job


_READ = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
         "--use-torch-fsdp2", "--use-megatron-fsdp", "--use-distributed-optimizer",
         "--num-distributed-optimizer-instances", "--torch-fsdp2-no-reshard-after-forward",
         "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--moe-token-dispatcher-type",
         "--moe-flex-dispatcher-backend", "--overlap-moe-expert-parallel-comm", "--sequence-parallel",
         "--tp-comm-overlap", "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
         "--cp-comm-type", "--micro-batch-size", "--global-batch-size", "--seq-length", "--cpu-offloading-num-layers",
         "--recompute-granularity", "--recompute-activations", "--recompute-modules", "--recompute-method",
         "--recompute-num-layers", "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--grad-reduce-in-bf16",
         "--optimizer", "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype",
         "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "--cuda-graph-impl", "--enable-cuda-graph",
         "--bf16", "--overlap-grad-reduce", "--overlap-param-gather", "--no-gradient-accumulation-fusion",
         "--no-check-for-nan-in-loss-and-grad", "--data-parallel-sharding-strategy", "--ckpt-format",
         "--init-model-with-meta-device", "--moe-expert-capacity-factor",
         "--moe-pad-expert-input-to-capacity", *RUN_PLACEHOLDERS[::2]}
"""Flags read into the plan and the job (RUN_PLACEHOLDERS's stand for the user's data, run length and
schedule)."""
_MODEL_KEYS = {"--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
               "--group-query-attention", "--kv-channels", "--swiglu", "--disable-bias-linear", "--add-qkv-bias",
               "--qk-layernorm", "--untie-embeddings-and-output-weights", "--softmax-type", "--num-experts",
               "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
               "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-router-num-groups",
               "--moe-router-group-topk", "--multi-latent-attention", "--kv-lora-rank", "--qk-head-dim",
               "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--mtp-num-layers", "--window-size",
               "--window-attn-skip-freq", "--vocab-size", "--normalization", "--position-embedding-type",
               "--max-position-embeddings"}


def _model(flags: dict[str, list[str]]) -> ModelSpec | None:
    """The architecture the flags give, where they give one (--num-layers and --hidden-size at least)."""
    if "--num-layers" not in flags or "--hidden-size" not in flags:
        return None
    from meshplan.frameworks.megatron_model import model_from_flags

    return model_from_flags(flags)


def round_trip(plan: Plan, model: ModelSpec) -> Plan:
    """The plan as Megatron runs it (common.as_run), for comparing an import with its export: a layout that is
    meshplan's own split of ``model`` (what an export writes where Megatron's even split differs) reads as none."""
    plan = as_run(plan, STACK)
    if plan.sharding == "fsdp" and plan.shard_degree == 1 and plan.dp == 1:
        plan = replace(plan, sharding="megatron")  # no data parallelism: nothing for either to do
    if plan.layout and plan.layout == _layout(model, replace(plan, layout="")):
        plan = replace(plan, layout="")
    return plan
