"""DeepSpeed 0.19.8: a plan as its JSON config (``ds_config``) and, where the plan has tensor or pipeline
parallelism or context parallelism, the Megatron-DeepSpeed arguments that go with it; and a ds_config (or a
Megatron-DeepSpeed launch script) read back.

What DeepSpeed derives: ``train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x
data-parallel size`` (DeepSpeedConfig._batch_assertion), the data-parallel size being the world over tp x pp
(Megatron-DeepSpeed's mpu) and over the Ulysses degree (``--ds-sequence-parallel-size``); an export writes all
three. Its pipeline engine runs 1F1B with ZeRO-1 at most (``ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism``, runtime/pipe/engine.py); its context parallelism is Ulysses (all-to-all); it has no replicate
axis for ZeRO (MiCS was removed: runtime/config.py rejects ``mics_shard_size``), no FSDP2, no Megatron
distributed optimizer, no FP8 training setting. Those plans are refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from meshplan.errors import SpecError
from meshplan.fileio import strict_json
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

STACK = "deepspeed"
VERSION = "0.19.8"
STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
_COMM = {4.0: "fp32", 2.0: "bf16"}


def _checks(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    if plan.sharding == "megatron":
        refuse(STACK, "DeepSpeed has no Megatron distributed optimizer; its sharding is ZeRO (sharding=zero1, zero2 "
                      "or zero3)")
    if plan.sharding == "fsdp" and not (plan.is_ddp or plan.shard_degree == 1):
        refuse(STACK, "DeepSpeed has no PyTorch FSDP2; its sharding is ZeRO (sharding=zero3 shards parameters too)")
    if plan.sharding in STAGES and plan.dp_replicate > 1:
        refuse(STACK, "DeepSpeed 0.19.8 has no replicate axis for ZeRO (MiCS was removed; ZeRO++'s hpZ keeps a "
                      "secondary copy, not HSDP): use dp_replicate=1")
    if plan.pp > 1 and plan.schedule != "1f1b":
        refuse(STACK, f"DeepSpeed's pipeline engine runs 1F1B only; it has no {plan.schedule}")
    if plan.pp > 1 and STAGES.get(plan.sharding, 0) > 1:
        refuse(STACK, "DeepSpeed's pipeline engine runs ZeRO-1 at most (ZeRO-2 and ZeRO-3 are incompatible with "
                      "pipeline parallelism)")
    if model.is_moe:
        refuse(STACK, "meshplan's MoE layers are dropless grouped GEMMs (Megatron-core, torchtitan); DeepSpeed-MoE's "
                      "capacity-based layers are not modelled")
    default_sync = replace(plan, grad_sync=None).effective_grad_sync
    if plan.grad_sync not in (None, default_sync):
        when = "once per step" if default_sync == "last" else "after each micro-batch"
        refuse(STACK, f"DeepSpeed reduces gradients as its stage does ({when}); grad_sync={plan.grad_sync} is not how "
                      "it runs")
    if plan.reshard_after_forward is not None:
        refuse(STACK, "reshard_after_forward is FSDP2's; ZeRO-3 releases gathered parameters after use")
    if plan.async_tp:
        refuse(STACK, "Megatron-DeepSpeed has no TP communication overlap (async_tp)")
    mds = uses_megatron_deepspeed(plan)
    if mds and (plan.recompute == "sac" or plan.recompute_modules or plan.offload_layers):
        refuse(STACK, "Megatron-DeepSpeed recomputes whole layers or the attention core only; no op-level (sac), "
                      "module list or activation offloading")
    if plan.offload_layers:
        refuse(STACK, "activation offloading (offload_layers) is Megatron-core's; DeepSpeed's config has none")
    if plan.cp > 1 and plan.sequence_parallel:
        refuse(STACK, "DeepSpeed's sequence parallelism (Ulysses) cannot be combined with Megatron's (tp's SP): "
                      "use sp=false with cp")
    if mds and not plan.runs_megatron_layers(job.software):
        refuse(STACK, f"Megatron-DeepSpeed runs Megatron's layers, and the estimate assumes PyTorch's (job.software="
                      f"{job.software!r}); name the stack (software = \"megatron\" in the job)")
    if job.precision != "bf16":
        refuse(STACK, "DeepSpeed's config has no FP8 training setting (Transformer Engine's layers are the model's)")
    if job.reduce_dtype_bytes not in _COMM:
        refuse(STACK, "DeepSpeed communicates gradients in fp32, bf16 or fp16 (communication_data_type)")
    if job.optimizer != "adamw":
        refuse(STACK, f"the export writes DeepSpeed's AdamW; optimizer {job.optimizer!r} is not written")


def uses_megatron_deepspeed(plan: Plan) -> bool:
    """Whether the plan needs Megatron-DeepSpeed's model (tensor, pipeline or Ulysses parallelism); without, the
    ds_config goes with the user's own training script."""
    return plan.tp > 1 or plan.pp > 1 or plan.cp > 1


def ds_config(plan: Plan, job: JobSpec) -> dict:
    """The DeepSpeed JSON config of ``plan``."""
    b = batch_of(STACK, plan, job)
    stage = STAGES.get(plan.sharding, 0)
    zero: dict[str, object] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": stage > 0}
    cfg: dict[str, object] = {
        "train_batch_size": b.global_seqs, "train_micro_batch_size_per_gpu": b.mbs,
        "gradient_accumulation_steps": b.microbatches, "bf16": {"enabled": True},
        "communication_data_type": _COMM[job.reduce_dtype_bytes], "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
    }
    if plan.cp > 1:
        cfg["sequence_parallel_size"] = plan.cp
    return cfg


def _mds_args(model: ModelSpec, job: JobSpec, plan: Plan, b) -> list[str]:
    """Megatron-DeepSpeed's pretrain_gpt.py arguments for the plan's tp, pp and Ulysses degree."""
    a = ["--num-layers", str(model.n_layers), "--hidden-size", str(model.hidden), "--ffn-hidden-size",
         str(model.ffn_hidden), "--num-attention-heads", str(model.n_heads), "--num-key-value-heads",
         str(model.n_kv_heads), "--seq-length", str(job.seq_len), "--max-position-embeddings", str(job.seq_len),
         "--micro-batch-size", str(b.mbs), "--global-batch-size", str(b.global_seqs),
         "--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp),
         "--ds-sequence-parallel-size", str(plan.cp), "--bf16", "--zero-stage", str(STAGES.get(plan.sharding, 0)),
         "--normalization", "rmsnorm" if model.norm == "rmsnorm" else "layernorm"]
    a += ["--swiglu"] if model.gated_mlp else []
    a += [] if model.linear_bias else ["--disable-bias-linear"]
    a += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    a += ["--no-pipeline-parallel"] if plan.pp == 1 else []
    a += ["--sequence-parallel"] if plan.sequence_parallel else []
    a += ["--use-rotary-position-embeddings"] if not model.learned_pos_emb else []
    if plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method",
              "block" if plan.recompute_layers is not None else "uniform", "--recompute-num-layers",
              str(plan.recompute_layers or 1)]
    return [*a, "--deepspeed", "--deepspeed_config", "ds_config.json"]


def export(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, fmt: str = "script") -> Export:
    """``plan`` as DeepSpeed's JSON config ('json'), or a launch script ('script'): the config written to
    ds_config.json, then Megatron-DeepSpeed's pretrain_gpt.py under the deepspeed launcher."""
    plan = resolved(STACK, plan)
    world_check(STACK, plan, cluster)
    _checks(model, job, plan)
    cfg = ds_config(plan, job)
    b = batch_of(STACK, plan, job)
    assumptions = _assumptions(plan, b)
    body = strict_json(cfg)
    if fmt == "json":
        return Export(stack=STACK, format=fmt, text=body + "\n", assumptions=tuple(assumptions))
    if uses_megatron_deepspeed(plan):
        args, program = _mds_args(model, job, plan, b), "pretrain_gpt.py"
    else:
        args, program = ["--deepspeed", "--deepspeed_config", "ds_config.json"], "your_training_script.py"
    head = ["deepspeed", "--num_nodes", str(cluster.n_nodes), "--num_gpus", str(cluster.gpus_per_node), program]
    runner = " with Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed@4efb479d)" if program == "pretrain_gpt.py" \
        else ": the ds_config goes with your training script (deepspeed.initialize(config=...))"
    text = "\n".join([comment_block([f"meshplan: {plan.label()} [{plan.to_string()}] for DeepSpeed {VERSION}{runner}",
                                     f"model {model.name}, {cluster.n_gpus} x {cluster.accelerator.name}",
                                     "add your data and tokenizer arguments (--data-path, --tokenizer-type ...)",
                                     "assumed (DeepSpeed decides these itself):"]),
                      comment_block(assumptions, "#   - "),
                      "cat > ds_config.json <<'EOF'", body, "EOF", shell_command(head, args)])
    return Export(stack=STACK, format=fmt, text=text + "\n", args=tuple(args), assumptions=tuple(assumptions))


def _assumptions(plan: Plan, b) -> list[str]:
    out = [f"data parallelism: DeepSpeed takes it from the GPUs, world / (tp x pp x Ulysses) = {plan.dp}; "
           f"train_batch_size = {b.mbs} x {b.microbatches} x {plan.dp}, as its config check requires"]
    stage = STAGES.get(plan.sharding, 0)
    if stage:
        out.append("ZeRO's bucket sizes (reduce_bucket_size, allgather_bucket_size, stage3_prefetch_bucket_size, "
                   "stage3_max_live_parameters): DeepSpeed's defaults; meshplan assumed the collectives overlap "
                   "compute (overlap_comm: true) and sized them per layer")
    else:
        out.append("ZeRO stage 0: plain data parallelism, gradients all-reduced once per step")
    out.append("the optimizer's hyper-parameters (lr, betas, weight decay) and gradient clipping are placeholders: "
               "meshplan's estimate does not depend on them")
    if not uses_megatron_deepspeed(plan):
        out.append("the model, its recomputation and its data come from your training script (the ds_config has no "
                   f"setting for them): meshplan assumed recompute={plan.recompute_label} and its own count of "
                   "the model's activations")
    out.append("collectives: NCCL's defaults (meshplan assumed rings over every NIC of a node)")
    return out


# ---- import ----------------------------------------------------------------------------------------------

_HEREDOC = re.compile(r"cat\s*>\s*(\S+)\s*<<\s*'?(\w+)'?\n(.*?)\n\2\s*$", re.S | re.M)


def read(source: str, world_size: int | None = None) -> Imported:
    """A ds_config JSON (a file or the text), or a Megatron-DeepSpeed launch script (its arguments, and the
    config it writes with a heredoc or names with --deepspeed_config), as a plan and a job."""
    text = read_source(source)
    args: list[str] = []
    world = world_size
    stripped = text.strip()
    if stripped.startswith("{"):
        cfg = _json(stripped)
    else:
        m = _HEREDOC.search(text)
        cmd = split_command(_HEREDOC.sub("", text), ("pretrain_gpt.py", "your_training_script.py"))
        args, world = cmd.program, cmd.world_size or world_size
        flags = dict(flag_pairs(args))
        if m:
            cfg = _json(m.group(3))
        elif flags.get("--deepspeed_config"):
            cfg = _json(read_source(flags["--deepspeed_config"][0]))
        else:
            raise SpecError("from.deepspeed", "the script neither writes a ds_config (cat > FILE <<EOF) nor names "
                                              "one with --deepspeed_config")
    return _imported(cfg, args, world)


def _json(text: str) -> dict:
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError("from.deepspeed", f"not a JSON ds_config ({exc})") from None
    if not isinstance(cfg, dict):
        raise SpecError("from.deepspeed", "a ds_config is one JSON object")
    return cfg


_READ_CONFIG = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                "communication_data_type", "zero_optimization", "optimizer", "gradient_clipping",
                "sequence_parallel_size"}
_READ_ZERO = {"stage", "overlap_comm", "contiguous_gradients"}
_READ_ARGS = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--ds-sequence-parallel-size",
              "--micro-batch-size", "--global-batch-size", "--seq-length", "--zero-stage", "--bf16",
              "--no-pipeline-parallel", "--sequence-parallel", "--recompute-granularity", "--recompute-method",
              "--recompute-num-layers", "--deepspeed", "--deepspeed_config", "--num-layers", "--hidden-size",
              "--ffn-hidden-size", "--num-attention-heads", "--num-key-value-heads", "--max-position-embeddings",
              "--normalization", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
              "--use-rotary-position-embeddings"}


def _imported(cfg: dict, args: list[str], world: int | None) -> Imported:
    from meshplan.specs.plan import parse_plan

    flags = {k: v for k, v in flag_pairs(args) if k}
    unsupported = [f"{k}: {json.dumps(v)}" for k, v in cfg.items() if k not in _READ_CONFIG]
    zero = cfg.get("zero_optimization") or {}
    unsupported += [f"zero_optimization.{k}: {json.dumps(v)}" for k, v in zero.items() if k not in _READ_ZERO]
    unsupported += [" ".join([k, *v]) for k, v in flags.items() if k not in _READ_ARGS]

    def arg(key: str, default: int) -> int:
        vals = flags.get(key)
        return int(vals[0]) if vals else default

    tp, pp = arg("--tensor-model-parallel-size", 1), arg("--pipeline-model-parallel-size", 1)
    cp = arg("--ds-sequence-parallel-size", int(cfg.get("sequence_parallel_size", 1)))
    stage = int(zero.get("stage", arg("--zero-stage", 0)))
    mbs = int(cfg.get("train_micro_batch_size_per_gpu", arg("--micro-batch-size", 1)))
    if world is None:
        gbs, acc = cfg.get("train_batch_size"), cfg.get("gradient_accumulation_steps", 1)
        if not gbs:
            raise SpecError("from.deepspeed", "needs the GPU count (--nodes / --gpus-per-node) or train_batch_size")
        world = int(gbs) // (mbs * int(acc)) * tp * pp * cp
    if world % (tp * pp * cp):
        raise SpecError("from.deepspeed", f"{world} GPUs is not a multiple of tp x pp x Ulysses = {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    items = [f"tp={tp}", f"pp={pp}", f"cp={cp}", f"mbs={mbs}"]
    items += [f"dp_shard={dp}", f"sharding=zero{stage}"] if stage else [f"dp_replicate={dp}"]
    if cp > 1:
        items.append("cp_impl=a2a")
    if tp > 1 and "--sequence-parallel" not in flags:
        items.append("sp=false")
    granularity = (flags.get("--recompute-granularity") or ["none"])[0]
    notes = []
    if not (tp > 1 or pp > 1 or cp > 1) and "--num-layers" not in flags:
        notes.append("the ds_config does not say how the model recomputes: evaluate chooses")
    elif granularity == "full" and (flags.get("--recompute-method") or ["uniform"])[0] == "block":
        items += ["recompute=full", f"recompute_layers={arg('--recompute-num-layers', 1)}"]
    else:
        items.append(f"recompute={granularity}")
    plan = parse_plan(",".join(items))
    seq = arg("--seq-length", 0) or None
    gbs = int(cfg.get("train_batch_size") or mbs * int(cfg.get("gradient_accumulation_steps", 1)) * dp)
    job: dict[str, object] = {"global_batch_seqs": gbs}
    if seq:
        job.update(global_batch_tokens=gbs * seq, seq_len=seq)
    notes += [] if seq else ["the ds_config says no sequence length: the scenario's is taken"]
    comm = cfg.get("communication_data_type")
    if comm in ("bf16", "fp16"):
        job["reduce_dtype_bytes"] = 2.0
    if tp > 1 or pp > 1 or cp > 1:
        job["software"] = "megatron"  # Megatron-DeepSpeed runs Megatron's layers
    return Imported(stack=STACK, plan=plan, job=job, world_size=world, unsupported=tuple(unsupported),
                    notes=tuple(notes))


def round_trip(plan: Plan) -> Plan:
    """The plan as DeepSpeed runs it (common.as_run), for comparing an import with its export; without
    Megatron-DeepSpeed the recomputation is the training script's, which the ds_config does not carry."""
    plan = as_run(plan, STACK)
    if not uses_megatron_deepspeed(plan):
        plan = replace(plan, recompute=None, recompute_layers=None)
    return plan


def launch_args(text: str) -> list[str]:
    """The program arguments of a launch script (for tests)."""
    return split_command(_HEREDOC.sub("", text), ("pretrain_gpt.py",)).program

