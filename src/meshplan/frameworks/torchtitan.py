"""torchtitan 0.3.0: a plan as the command line of its config manager, and that command line read back.

torchtitan 0.3.0 selects a run with ``--module M --config F`` (a registered function returning the whole
``Trainer.Config``: the model, its converters such as Float8, the loss, the optimizer, defaults for
everything) and takes ``--section.option`` overrides on top (torchtitan/config/manager.py, tyro). What the
overrides can change, and so what an export sets:

- ``--parallelism.*``: ``data_parallel_replicate_degree``, ``data_parallel_shard_degree`` (-1 takes the
  GPUs left: ParallelDims), ``tensor_parallel_degree``, ``enable_sequence_parallel``,
  ``context_parallel_degree``, ``pipeline_parallel_degree``, ``expert_parallel_degree`` (it borrows its
  ranks from dp_shard x cp x tp, which it must divide), ``fsdp_reshard_after_forward``
  (default|always|never; "default" keeps parameters gathered under a pipeline), the pipeline's
  ``pipeline_parallel_schedule`` (1F1B, GPipe, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble,
  DualPipeV: torch.distributed.pipelining), ``pipeline_parallel_microbatch_size``,
  ``pipeline_parallel_layers_per_stage`` and the embedding's and head's weight in the split
  (``pipeline_parallel_first/last_stage_less_layers``, 1 each by default);
- ``--training.*``: ``local_batch_size`` (sequences per data-parallel rank per accumulation step, split into
  pipeline micro-batches under a pipeline), ``global_batch_size`` (gradient accumulation = global /
  (local x data-parallel degree)), ``seq_len``, ``disable_cuda_graphs`` (CUDA graphs are on by default in
  0.3.0 and refuse a pipeline);
- ``activation_checkpoint:none|full|selective|memory-budget`` (a tyro subcommand: FullAC, SelectiveAC's
  op-level policy, the compiler's memory budget; no per-layer count);
- ``--compile.enable``, ``--compile.components``, ``--compile.enable_async_tensor_parallel`` (async TP needs
  the model compiled).

What the command line cannot change is refused: Float8/MX training and the model's architecture are set by
the config function (``model_spec`` is suppressed from the command line), FSDP2's reduce dtype is float32
only, context parallelism is torch's all-gather rotation (torch's ``_cp_options.rotate_method`` default; no
option), and torchtitan has no ZeRO-1/2, no Megatron distributed optimizer, no attention-only or partial
recomputation, no activation offloading and no single-chunk ZB-H1 schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

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

STACK = "torchtitan"
VERSION = "0.3.0"


@dataclass(frozen=True, slots=True)
class Registered:
    """A config function of torchtitan 0.3.0's registry and the defaults an import needs from it
    (torchtitan/models/<module>/config_registry.py)."""

    module: str
    config: str
    kind: str
    """'dense' (Llama 3), 'qk_norm' (Qwen3), 'moe_qk_norm' (Qwen3-MoE), 'mla' (DeepSeek-V3), 'window_moe' (GPT-OSS)."""
    n_layers: int
    hidden: int
    catalog: str | None
    """The meshplan catalog model of the same architecture, if any."""
    tp: int = 1
    ep: int = 1
    local_batch_size: int = 8
    seq_len: int = 8192
    ac: str = "selective"
    compile: bool = False
    cuda_graphs_off: bool = False
    float8: bool = False
    """The config function converts the linears to Float8 (torchao), and so trains in FP8."""


REGISTRY = (
    Registered("llama3", "llama3_8b", "dense", 32, 4096, "llama-3-8b", local_batch_size=1),
    Registered("llama3", "llama3_70b", "dense", 80, 8192, "llama-3-70b", tp=8, ac="full"),
    Registered("llama3", "llama3_405b", "dense", 126, 16384, "llama-3.1-405b", tp=8, local_batch_size=2, ac="full",
               compile=True, float8=True),
    Registered("qwen3", "qwen3_0_6b", "qk_norm", 28, 1024, None, local_batch_size=4, seq_len=4096),
    Registered("qwen3", "qwen3_1_7b", "qk_norm", 28, 2048, None, local_batch_size=4, seq_len=4096),
    Registered("qwen3", "qwen3_14b", "qk_norm", 40, 5120, None, local_batch_size=4, seq_len=4096, ac="full"),
    Registered("qwen3", "qwen3_32b", "qk_norm", 64, 5120, None, local_batch_size=2, seq_len=4096, ac="full"),
    Registered("qwen3", "qwen3_30b_a3b", "moe_qk_norm", 48, 2048, None, local_batch_size=2, seq_len=4096,
               ac="full"),
    Registered("deepseek_v3", "deepseek_v3_16b", "mla", 27, 2048, None, ep=8, local_batch_size=4, seq_len=4096,
               compile=True, cuda_graphs_off=True),
    Registered("deepseek_v3", "deepseek_v3_671b", "mla", 61, 7168, "deepseek-v3", ep=2, local_batch_size=4,
               seq_len=4096, compile=True, cuda_graphs_off=True),
    Registered("deepseek_v3", "deepseek_v3_671b_float8", "mla", 61, 7168, "deepseek-v3", ep=2, local_batch_size=4,
               seq_len=4096, compile=True, cuda_graphs_off=True, float8=True),
    Registered("gpt_oss", "gpt_oss_20b", "window_moe", 24, 2880, None, local_batch_size=1, ac="full"),
    Registered("gpt_oss", "gpt_oss_120b", "window_moe", 36, 2880, "gpt-oss-120b", local_batch_size=1, ac="full"),
)

SCHEDULE_NAMES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zb-v": "ZBVZeroBubble"}
_RESHARD = {None: "default", True: "always", False: "never"}
_SHARDING_LACK = {"zero1": "ZeRO-1 (it shards optimizer states only with FSDP2, which shards everything)",
                  "zero2": "ZeRO-2 (FSDP2 shards parameters too: use sharding=fsdp)",
                  "zero3": "DeepSpeed's ZeRO-3 (its own is FSDP2: use sharding=fsdp)",
                  "megatron": "Megatron-core's distributed optimizer"}


def model_kind(model: ModelSpec) -> str:
    """Which registered architecture a model is closest to."""
    if model.is_mla:
        return "mla"
    if model.is_moe and (model.attention_window or model.linear_bias):
        return "window_moe"
    if model.is_moe:
        return "moe_qk_norm"
    return "qk_norm" if model.qk_norm else "dense"


def closest(model: ModelSpec, fp8: bool = False) -> Registered:
    """The registered config function of the same kind of architecture, the same precision (Float8 or not) and
    the nearest shape: the catalog model's own where there is one; refuses where none trains in the job's
    precision."""
    kind = model_kind(model)
    same = [r for r in REGISTRY if r.kind == kind and r.float8 == fp8]
    if not same:
        refuse(STACK, "torchtitan 0.3.0 sets Float8 in the config function (model_spec converters), which its "
                      f"command line cannot change, and no registered config of this kind of model ({kind}) "
                      f"trains in {'FP8' if fp8 else 'BF16'}: write a config function")
    exact = [r for r in same if r.catalog == model.name]
    if exact:
        return exact[0]
    return min(same, key=lambda r: (abs(r.n_layers - model.n_layers) / model.n_layers
                                    + abs(r.hidden - model.hidden) / model.hidden))


def _checks(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Refuse what torchtitan 0.3.0 cannot run as the plan says."""
    if plan.sharding != "fsdp":
        refuse(STACK, f"torchtitan runs PyTorch FSDP2, HSDP and DDP; it has no {_SHARDING_LACK[plan.sharding]}")
    if plan.runs_megatron_layers(job.software):
        refuse(STACK, f"the job runs Megatron-core's layers (job.software={job.software!r}); torchtitan runs its own")
    if plan.recompute == "selective":
        refuse(STACK, "torchtitan has no attention-only recomputation (Megatron's selective); its selective "
                      "checkpointing is op-level: recompute=sac")
    if plan.recompute_layers is not None:
        refuse(STACK, "torchtitan 0.3.0 recomputes every block or none (FullAC); it has no partial count "
                      "(recompute_layers)")
    if plan.offload_layers:
        refuse(STACK, "torchtitan has no activation offloading (offload_layers)")
    if model.is_moe and job.moe_token_drop != "dropless":
        refuse(STACK, "torchtitan's MoE is dropless (no expert capacity): job.moe_token_drop must be 'dropless'")
    if plan.pp > 1 and plan.schedule not in SCHEDULE_NAMES:
        refuse(STACK, "torch.distributed.pipelining has no single-chunk ZB-H1 schedule (its zero-bubble schedules "
                      "are InterleavedZeroBubble and ZBVZeroBubble)")
    if plan.cp > 1 and plan.context_impl != "allgather":
        refuse(STACK, f"torchtitan 0.3.0 runs context parallelism as torch's all-gather rotation only (no option "
                      f"chooses another); use cp_impl=allgather, not {plan.context_impl}")
    if plan.reshard_after_forward is not None and not isinstance(plan.reshard_after_forward, bool):
        refuse(STACK, "torchtitan's fsdp_reshard_after_forward is default, always or never; it has no partial "
                      "reshard group")
    _sync_checks(plan)
    if plan.ep > 1 and (plan.dp_shard * plan.cp * plan.tp) % plan.ep:
        refuse(STACK, f"torchtitan borrows expert-parallel ranks from dp_shard x cp x tp = "
                      f"{plan.dp_shard * plan.cp * plan.tp}, which ep={plan.ep} must divide")
    if plan.async_tp and not job.compiled:
        refuse(STACK, "torchtitan runs async TP only with the model compiled (job.compiled = true)")
    if job.fp8_param_gather or job.fp8_attention or job.fused_grouped_mlp:
        refuse(STACK, "torchtitan's FP8 options (Float8 all-gather, FP8 attention, fused grouped MLP) are set in the "
                      "config function, which its command line cannot change")
    if job.reduce_dtype_bytes != 4:
        refuse(STACK, "torchtitan 0.3.0 reduces FSDP gradients in float32 only (mixed_precision_reduce)")
    if job.optimizer != "adamw":
        refuse(STACK, f"the registered configs run AdamW (default_adamw); optimizer {job.optimizer!r} needs a "
                      "config function of its own")
    if job.loss in ("vocab_parallel", "te") or (job.loss == "fused" and not job.compiled):
        refuse(STACK, f"torchtitan's cross-entropy runs eager or compiled; loss {job.loss!r} is not one of them")
    if job.cuda_graphs and (plan.pp > 1 or plan.ep > 1 or job.cuda_graph_scope != "full_iteration"):
        refuse(STACK, "torchtitan 0.3.0 captures the whole forward and backward in one CUDA graph "
                      "(cuda_graph_scope = full_iteration), without a pipeline and without expert parallelism")
    if plan.cp > 1 and job.seq_len % (2 * plan.cp * (plan.tp if plan.sequence_parallel else 1)):
        refuse(STACK, f"torchtitan needs the sequence length divisible by 2 x cp x tp; {job.seq_len} is not")


def _sync_checks(plan: Plan) -> None:
    """Gradient sync and resharding as torchtitan runs them: FSDP2 reduces every micro-batch and DDP has no
    no_sync, except under a pipeline, where torch.distributed.pipelining holds a stage's gradients unsharded
    and its parameters gathered until the last micro-batch."""
    shards = plan.shard_degree > 1
    if plan.pp == 1 and plan.effective_grad_sync == "last" and (shards or plan.grad_sync == "last"):
        refuse(STACK, "torchtitan reduces gradients after every micro-batch without a pipeline; it has no "
                      "grad_sync=last (no_sync)")
    if plan.pp > 1 and shards and (plan.grad_sync == "every" or plan.reshard_after_forward is True):
        refuse(STACK, "under a pipeline torchtitan keeps a stage's parameters gathered and reduces its gradients "
                      "after the last micro-batch (torch.distributed.pipelining); reshard_after_forward=true or "
                      "grad_sync=every is not how it runs")
    if plan.pp > 1 and not shards and plan.grad_sync == "every":
        refuse(STACK, "under a pipeline torchtitan's DDP reduces once per step (the pipeline's no_sync); "
                      "grad_sync=every is not how it runs")


def _layers_per_stage(n_layers: int, plan: Plan) -> int | None:
    """``pipeline_parallel_layers_per_stage`` that splits the ``n_layers`` of the model torchtitan builds (the
    config function's) into pp x vpp chunks, None where the schedule's default (one chunk per rank, two for a
    multi-stage schedule) is the plan's; refuses where no value gives pp x vpp chunks."""
    chunks = plan.pp * plan.model_chunks
    default = plan.pp * (2 if plan.schedule in ("interleaved", "zb-v") else 1)
    if chunks == default:
        return None
    fits = [n for n in range(1, n_layers + 1) if -(-n_layers // n) == chunks]
    if not fits:
        refuse(STACK, f"no pipeline_parallel_layers_per_stage splits {n_layers} layers into {chunks} stages "
                      f"(pp={plan.pp} x vpp={plan.vpp})")
    return fits[0]


def export(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, fmt: str = "script", *,
           exact_model: bool = False) -> Export:
    """``plan`` as torchtitan 0.3.0's command line (``fmt`` 'args') or a torchrun launch script ('script'). The
    model is a registered config function's; where none is this model, the closest one's, with a warning on
    the script's first line (``Export.warnings``), or refused where ``exact_model``."""
    plan = resolved(STACK, plan)
    world_check(STACK, plan, cluster)
    _checks(model, job, plan)
    b = batch_of(STACK, plan, job)
    reg = closest(model, fp8=job.precision == "fp8")
    approximate = not is_model(model, reg)
    if approximate and exact_model:
        refuse(STACK, f"torchtitan {VERSION} names its model by a registered config function, and none is "
                      f"{model.name}: the closest, {reg.module}/{reg.config}, differs{_differences(model, reg)}; "
                      "write a config function for it")
    warnings = ([f"WARNING: this runs torchtitan's {reg.config}, not {model.name}: torchtitan {VERSION} names its "
                 f"model by a registered config function and has none for {model.name}; the plan was sized for "
                 f"{model.name} and may not fit or run as predicted for {reg.config}; write a config function for "
                 f"{model.name} and name it with --module/--config to run the model planned"]
                if approximate else [])
    args = ["--module", reg.module, "--config", reg.config,
            "--parallelism.data_parallel_replicate_degree", str(plan.dp_replicate),
            "--parallelism.data_parallel_shard_degree", str(plan.dp_shard),
            "--parallelism.tensor_parallel_degree", str(plan.tp),
            "--parallelism.context_parallel_degree", str(plan.cp),
            "--parallelism.pipeline_parallel_degree", str(plan.pp),
            "--parallelism.expert_parallel_degree", str(plan.ep),
            "--parallelism.fsdp_reshard_after_forward", _RESHARD[plan.reshard_after_forward]]  # type: ignore[index]
    sp_off = plan.tp > 1 and not plan.sequence_parallel
    args.append("--parallelism." + ("no_" if sp_off else "") + "enable_sequence_parallel")
    if plan.pp > 1:
        args += ["--parallelism.pipeline_parallel_schedule", SCHEDULE_NAMES[plan.schedule],
                 "--parallelism.pipeline_parallel_microbatch_size", str(b.mbs),
                 "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
                 "--parallelism.pipeline_parallel_last_stage_less_layers", "0"]
        lps = _layers_per_stage(reg.n_layers, plan)
        if lps is not None:
            args += ["--parallelism.pipeline_parallel_layers_per_stage", str(lps)]
        local = b.local_seqs  # one pipeline step runs every micro-batch: no gradient accumulation on top
    else:
        local = b.mbs
    args += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(b.global_seqs),
             "--training.seq_len", str(job.seq_len)]
    args.append("--training." + ("no_" if job.cuda_graphs else "") + "disable_cuda_graphs")
    if job.compiled:
        args += ["--compile.enable", "--compile.components", "model,loss" if job.loss == "fused" else "model"]
    else:
        args.append("--compile.no_enable")
    args.append("--compile." + ("" if plan.async_tp else "no_") + "enable_async_tensor_parallel")
    args.append({"none": "activation_checkpoint:none", "full": "activation_checkpoint:full",
                 "sac": "activation_checkpoint:selective"}[plan.recompute or "none"])
    assumptions = _assumptions(model, cluster, job, plan, reg, b)
    if fmt == "args":
        text = " ".join(args)
    else:
        head = ["torchrun", "--nnodes", str(cluster.n_nodes), "--nproc-per-node", str(cluster.gpus_per_node),
                "-m", "torchtitan.train"]
        text = "\n".join([comment_block([*warnings, f"meshplan: {plan.label()} [{plan.to_string()}] for torchtitan "
                                         f"{VERSION}",
                                         f"model {model.name}, {cluster.n_gpus} x {cluster.accelerator.name}",
                                         "assumed (torchtitan decides these itself, or the config function does):"]),
                          comment_block(assumptions, "#   - "), shell_command(head, args)])
    return Export(stack=STACK, format=fmt, text=text + "\n", args=tuple(args), assumptions=tuple(assumptions),
                  warnings=tuple(warnings))


def _assumptions(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, reg: Registered, b) -> list[str]:
    out = []
    if reg.catalog != model.name:
        out.append(f"the model: {reg.module}/{reg.config} is the registered config closest to {model.name}"
                   f"{_differences(model, reg)}; its architecture comes from the config function, which the "
                   f"command line cannot change: write a config function for {model.name} to run it exactly")
    out.append(f"data parallelism: {plan.dp_replicate} x {plan.dp_shard} ranks (torchtitan would also take "
               f"dp_shard from the GPUs left, -1); gradient accumulation = global batch / (local batch x "
               f"{b.dp}) = {b.global_seqs // (b.dp * (b.local_seqs if plan.pp > 1 else b.mbs))} step(s)")
    if plan.pp > 1:
        out.append(f"pipeline: {b.microbatches} micro-batches of {b.mbs} per step; the embedding and the head "
                   "count as no layer in the split (first/last_stage_less_layers 0), as meshplan assumed")
    out.append("FSDP2 units: one per transformer block, the embedding and the head (torchtitan's apply_fsdp); "
               "bf16 parameters, float32 gradient reduction (its defaults)")
    out.append("the loss: the config function's (chunked cross-entropy in 0.3.0's registered configs); meshplan "
               f"sized the logits as {job.loss_impl(False)} cross-entropy")
    out.append("collectives: NCCL's defaults (meshplan assumed rings over every NIC of a node and NVLS for "
               "all-reduce inside one); no NCCL environment is set here")
    out.append("the optimizer, learning-rate schedule, data, tokenizer and checkpointing: the config function's")
    return out


def is_model(model: ModelSpec, reg: Registered) -> bool:
    """Whether the registered config builds ``model``: its catalog twin, or a model of its kind, depth and width
    (where meshplan's catalog has no twin to compare every field with)."""
    if reg.catalog is not None:
        return reg.catalog == model.name or not _field_differences(model, reg.catalog)
    return model_kind(model) == reg.kind and (model.n_layers, model.hidden) == (reg.n_layers, reg.hidden)


def _differences(model: ModelSpec, reg: Registered) -> str:
    """How the registered config's model differs from ``model`` (its catalog twin's fields, where there is one)."""
    if reg.catalog is None:
        return f" ({reg.n_layers} layers of width {reg.hidden} against {model.n_layers} of {model.hidden})"
    diff = _field_differences(model, reg.catalog)
    return f" ({reg.catalog} in meshplan's catalog; " + ("; ".join(diff) if diff else "the same architecture") + ")"


def _field_differences(model: ModelSpec, catalog_name: str) -> list[str]:
    """The architecture fields in which ``model`` differs from the catalog model ``catalog_name``."""
    from dataclasses import fields

    from meshplan.catalog import load_model

    twin = load_model(catalog_name)
    skip = {"name", "source", "nominal_params"}
    return [f"{f.name} {getattr(twin, f.name)} against {getattr(model, f.name)}" for f in fields(ModelSpec)
            if f.name not in skip and getattr(twin, f.name) != getattr(model, f.name)]


# ---- import ----------------------------------------------------------------------------------------------

_INV_SCHEDULES = {v.lower(): k for k, v in SCHEDULE_NAMES.items()}
_AC = {"activation_checkpoint:none": "none", "activation_checkpoint:full": "full",
       "activation_checkpoint:selective": "sac"}


def read(source: str, world_size: int | None = None, n_layers: int | None = None) -> Imported:
    """A torchtitan command line (or a launch script holding one, or a file of its arguments) as a plan and a
    job. Degrees and settings the command line leaves out come from the config function's defaults where it
    is a registered one meshplan knows (REGISTRY); dp_shard -1 takes the GPUs left of ``world_size`` (the
    launch command's torchrun --nnodes x --nproc-per-node where it says). ``n_layers``: the model's, for an
    interleaved pipeline's chunks under a config function meshplan does not know."""
    cmd = split_command(read_source(source), ("torchtitan.train", "train.py", "run_train.sh"))
    world = cmd.world_size or world_size
    subcommands = [t for t in cmd.program if ":" in t and not t.startswith("-")]  # tyro's: activation_checkpoint:full
    pairs = flag_pairs([t for t in cmd.program if t not in subcommands])
    flags = {k: v for k, v in pairs if k}
    bare = subcommands + [v[0] for k, v in pairs if not k]
    module, config = _one(flags, "--module"), _one(flags, "--config")
    reg = next((r for r in REGISTRY if r.module == module and r.config == config), None)
    notes, unsupported = [], []
    if reg is None:
        notes.append(f"config function {module}/{config} is not one meshplan knows: what the command line leaves "
                     "out is taken as torchtitan's class defaults")
        reg = Registered(module or "?", config or "?", "dense", 0, 0, None, local_batch_size=8, seq_len=2048)
    known = _known_flags()
    values: dict[str, str] = {}
    for key, vals in pairs:
        if not key:
            continue
        name = key[2:].replace("-", "_")
        if name in known:
            values[name] = vals[0] if vals else "true"
        elif name.startswith("parallelism.no_") or name.startswith("compile.no_") or name.startswith("training.no_"):
            values[name.replace(".no_", ".", 1)] = "false"
        elif name not in ("module", "config"):
            unsupported.append(" ".join([key, *vals]))
    ac = reg.ac
    for tok in bare:
        norm = tok.replace("-", "_")
        if norm in _AC:
            ac = {"none": "none", "full": "full", "sac": "selective"}[_AC[norm]]
        elif norm.startswith("activation_checkpoint:"):
            unsupported.append(tok)
        else:
            unsupported.append(tok)
    return _imported(values, reg, ac, world, notes, unsupported, reg.n_layers or n_layers or 0)


def _one(flags: dict[str, list[str]], key: str) -> str | None:
    v = flags.get(key)
    return v[0] if v else None


def _known_flags() -> set[str]:
    p = "parallelism."
    return {p + n for n in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                            "context_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree",
                            "fsdp_reshard_after_forward", "enable_sequence_parallel", "pipeline_parallel_schedule",
                            "pipeline_parallel_microbatch_size", "pipeline_parallel_first_stage_less_layers",
                            "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage")} | {
        "training.local_batch_size", "training.global_batch_size", "training.seq_len", "training.disable_cuda_graphs",
        "compile.enable", "compile.components", "compile.enable_async_tensor_parallel"}


def _int(values: dict[str, str], key: str, default: int) -> int:
    from meshplan.errors import SpecError

    raw = values.get(key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SpecError(f"from.torchtitan --{key}", f"must be a whole number; got {raw!r}") from None


def _imported(values: dict[str, str], reg: Registered, ac: str, world: int | None, notes: list[str],
              unsupported: list[str], n_layers: int) -> Imported:
    from meshplan.errors import SpecError
    from meshplan.specs.plan import parse_plan

    p = "parallelism."
    deg = {"dp_replicate": _int(values, p + "data_parallel_replicate_degree", 1),
           "dp_shard": _int(values, p + "data_parallel_shard_degree", -1),
           "tp": _int(values, p + "tensor_parallel_degree", reg.tp),
           "cp": _int(values, p + "context_parallel_degree", 1),
           "pp": _int(values, p + "pipeline_parallel_degree", 1),
           "ep": _int(values, p + "expert_parallel_degree", reg.ep)}
    if deg["dp_shard"] == -1 and world is None:
        raise SpecError("from.torchtitan", "data_parallel_shard_degree is -1 (the GPUs left): give the GPU count "
                                           "(--nodes / --gpus-per-node, or torchrun --nnodes / --nproc-per-node)")
    items = [f"{k}={v}" for k, v in deg.items()]
    if deg["cp"] > 1:
        items.append("cp_impl=allgather")  # torch's default rotation, the only one torchtitan 0.3.0 runs
    sp = values.get(p + "enable_sequence_parallel", "true").lower() in ("true", "1")
    if deg["tp"] > 1 and not sp:
        items.append("sp=false")
    raf = values.get(p + "fsdp_reshard_after_forward", "default")
    if raf != "default":
        items.append(f"reshard_after_forward={'true' if raf == 'always' else 'false'}")
    local = _int(values, "training.local_batch_size", reg.local_batch_size)
    if deg["pp"] > 1:
        name = values.get(p + "pipeline_parallel_schedule", "1F1B").lower()
        if name not in _INV_SCHEDULES:
            raise SpecError("from.torchtitan --parallelism.pipeline_parallel_schedule",
                            f"{name!r} is not one meshplan models; it models {', '.join(SCHEDULE_NAMES.values())}")
        schedule = _INV_SCHEDULES[name]
        mbs = _int(values, p + "pipeline_parallel_microbatch_size", 1)
        items += [f"schedule={schedule}", f"mbs={mbs}"]
        if schedule == "interleaved":
            items.append(f"vpp={_vpp(values, n_layers, deg['pp'])}")
        for side in ("first", "last"):
            if _int(values, p + f"pipeline_parallel_{side}_stage_less_layers", 1) != 0:
                notes.append(f"pipeline_parallel_{side}_stage_less_layers is not 0: torchtitan gives that stage a "
                             "layer fewer, where meshplan splits the layers evenly")
    else:
        items.append(f"mbs={local}")
    compiled = values.get("compile.enable", "true" if reg.compile else "false").lower() in ("true", "1")
    if values.get("compile.enable_async_tensor_parallel", "false").lower() in ("true", "1"):
        items.append("async_tp=true")
    items.append(f"recompute={ {'none': 'none', 'full': 'full', 'selective': 'sac'}[ac] }")
    plan = parse_plan(",".join(items), world_size=world)
    seq = _int(values, "training.seq_len", reg.seq_len)
    dp = plan.dp
    global_seqs = _int(values, "training.global_batch_size", -1)
    if global_seqs < 0:
        global_seqs = local * dp
    job = {"global_batch_tokens": global_seqs * seq, "seq_len": seq, "software": "torchtitan",
           "compiled": compiled}
    components = values.get("compile.components", "model,loss")
    if compiled and "loss" in components.split(","):
        job["loss"] = "fused"
    cg_off = values.get("training.disable_cuda_graphs", "true" if reg.cuda_graphs_off else "false").lower()
    if cg_off not in ("true", "1"):
        job.update(cuda_graphs=True, cuda_graph_scope="full_iteration")
    if reg.float8:
        job["precision"] = "fp8"  # its config function converts the linears to Float8 (torchao)
    return Imported(stack=STACK, plan=plan, job=job, model=reg.catalog, world_size=world,
                    unsupported=tuple(unsupported), notes=tuple(notes))


def _vpp(values: dict[str, str], n_layers: int, pp: int) -> int:
    """Model chunks per rank of an interleaved pipeline: two by default, else those layers_per_stage makes."""
    lps = values.get("parallelism.pipeline_parallel_layers_per_stage")
    if lps is None or not n_layers:
        return 2
    return max(2, -(-n_layers // int(lps)) // pp)


def round_trip(plan: Plan) -> Plan:
    """The plan as torchtitan runs it (common.as_run), for comparing an import with its export."""
    return as_run(plan, STACK)
