"""A real training step of the reference model under a plan: FSDP2, tensor parallelism, profiler.

The plan is applied as torchtitan does (``torchtitan/models/llama3/infra/parallelize.py``):
tensor parallelism first (``parallelize_module`` with the Megatron column/row layer plan and sequence
parallelism on the norms), then optional full activation checkpointing per block, then FSDP2
(``fully_shard`` on every block and at the root) over the dp_shard axis, or HSDP over
(dp_replicate, dp_shard). Mixed precision: ``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)`` on GPUs and CPUs alike (PyTorch's CPU BF16 GEMMs and gloo's BF16 collectives
work in torch 2.13). FSDP2 shards over dp_shard even when it is 1: over one rank it sends nothing and
keeps the same mixed precision. Optimizer: AdamW (fp32 states), fused on GPUs (torchtitan's default).

One step = ``n_microbatches`` forward/backward passes of ``mbs`` sequences of ``seq_len`` tokens on
every data-parallel rank, then the optimizer step; FSDP2 reduce-scatters gradients after every
micro-batch (its default). Step time is the median over ``n_steps`` timed steps (after ``n_warmup``)
of the slowest rank's time; one further step runs under ``torch.profiler`` for the exposed
communication and the Chrome trace.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshplan.fileio import atomic_write_bytes
from meshplan.harness.measure.dist import RunContext
from meshplan.harness.measure.timing import percentile, sync
from meshplan.harness.measure.trace import STEP_ANNOTATION, exposed_comm_s, kernel_time_s
from meshplan.specs import ModelSpec, Plan

SUPPORTED_AXES = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepConfig:
    spec: ModelSpec
    plan: Plan
    seq_len: int
    """S. [tokens]"""
    mbs: int
    """Sequences per micro-batch per data-parallel rank."""
    n_microbatches: int = 1
    n_steps: int = 5
    n_warmup: int = 2
    trace_path: Path | None = None
    """Where rank 0 writes its Chrome trace of the profiled step."""


def check_plan(spec: ModelSpec, plan: Plan, world_size: int) -> None:
    """ValueError unless ``measure step`` can apply ``plan`` (dp_replicate, dp_shard, tp) to ``spec``."""
    unsupported = [f"{a}={getattr(plan, a)}" for a in ("pp", "cp", "ep") if getattr(plan, a) > 1]
    if unsupported:
        raise ValueError(f"measure step applies dp_replicate, dp_shard and tp; this plan also has "
                         f"{', '.join(unsupported)}")
    if plan.world_size != world_size:
        raise ValueError(f"plan {plan.to_string()} needs {plan.world_size} ranks; this run has {world_size}")
    if plan.recompute == "selective":
        raise ValueError("measure step runs recompute=none or recompute=full, not selective")
    if plan.sharding != "fsdp":
        raise ValueError(f"measure step runs FSDP2 (sharding=fsdp); got sharding={plan.sharding}")
    if plan.tp > 1:
        if spec.is_moe or spec.is_mla or spec.learned_pos_emb:
            raise ValueError("measure step applies tensor parallelism to dense models with rotary positions "
                             "and ordinary attention only (not MoE, MLA or learned position embeddings)")
        for name, width in (("n_heads", spec.n_heads), ("n_kv_heads", spec.n_kv_heads),
                            ("ffn_hidden", spec.ffn_hidden), ("vocab", spec.vocab)):
            if width % plan.tp:
                raise ValueError(f"tp={plan.tp} does not divide {name}={width}")


def _tp_plan(model: torch.nn.Module, tp_mesh) -> None:
    """torchtitan's Llama TP layer plan (``apply_tp``), with sequence parallelism and replicated logits."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def build_parallel_model(cfg: StepConfig, ctx: RunContext) -> tuple[torch.nn.Module, Any]:
    """The reference model with ``cfg.plan`` applied, initialised on this rank's device; and the mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from meshplan.harness.reference_model import build_model

    plan = cfg.plan
    mesh = init_device_mesh(ctx.device.type, tuple(getattr(plan, a) for a in SUPPORTED_AXES),
                            mesh_dim_names=SUPPORTED_AXES)
    with torch.device("meta"):
        model = build_model(cfg.spec, device="meta")
    if plan.tp > 1:
        _tp_plan(model, mesh["tp"])
    if plan.recompute == "full":
        from meshplan.harness.crosscheck import apply_ac

        apply_ac(model, plan.recompute_layers)
    # FSDP2 even over one data-parallel rank: its mixed precision (BF16 compute on FP32 parameters,
    # gradients and AdamW states) is what meshplan's memory and time model assume for every plan
    dp_mesh = mesh["dp_shard"] if plan.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raf = plan.effective_reshard_after_forward
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=raf)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=raf)
    model.to_empty(device=ctx.device)
    torch.manual_seed(0)
    with torch.no_grad():  # on the local shards: timing does not need DTensor's cross-rank RNG
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.ndim == 1:
                local.fill_(0.0 if name.endswith("bias") or name.split(".")[-1].startswith("b") else 1.0)
            else:
                local.normal_(0.0, 0.02)
    return model, mesh


def _peak_memory_bytes(ctx: RunContext) -> tuple[int, str]:
    if ctx.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(ctx.device)), "torch.cuda.max_memory_allocated"
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return (int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale,
            "resource.getrusage(RUSAGE_SELF).ru_maxrss: the process's resident-set high-water mark, which "
            "includes the Python interpreter and the torch libraries, not only tensors")


def run_step(cfg: StepConfig, ctx: RunContext, *, progress=None) -> dict[str, Any] | None:
    """Measure the step; the ``step`` section of the profile on rank 0, None elsewhere."""
    from torch.profiler import record_function

    check_plan(cfg.spec, cfg.plan, ctx.world_size)
    baseline_rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)
    model, _mesh = build_parallel_model(cfg, ctx)
    # torchtitan's default AdamW implementation, "fused" (one kernel over each parameter's states) on GPUs:
    # the foreach one makes several passes and holds parameter-sized temporaries (docs/measure.md)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ctx.device.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(1234)
    tokens = torch.randint(0, cfg.spec.vocab, (cfg.n_microbatches, cfg.mbs, cfg.seq_len + 1), generator=gen)
    tokens = tokens.to(ctx.device)

    def train_step() -> None:
        with record_function(STEP_ANNOTATION):
            for i in range(cfg.n_microbatches):
                logits = model(tokens[i, :, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[i, :, 1:].flatten())
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    times = []
    for i in range(cfg.n_warmup + cfg.n_steps):
        sync(ctx.device)
        t0 = time.perf_counter()
        train_step()
        sync(ctx.device)
        dt = time.perf_counter() - t0
        if i >= cfg.n_warmup:
            times.append(dt)
        if progress:
            progress(f"step {i + 1}/{cfg.n_warmup + cfg.n_steps}{' (warm-up)' if i < cfg.n_warmup else ''}: "
                     f"{dt * 1e3:.1f} ms")
    peak_bytes, peak_source = _peak_memory_bytes(ctx)
    trace = _profiled_step(cfg, ctx, train_step)
    exposed, comm_total = exposed_comm_s(trace)
    kernels = kernel_time_s(trace)
    reserved = int(torch.cuda.max_memory_reserved(ctx.device)) if ctx.device.type == "cuda" else None
    mine = {"times": times, "exposed": exposed, "comm": comm_total, "peak": peak_bytes, "baseline": baseline_rss,
            "reserved": reserved, "kernels": kernels}
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    if not ctx.is_main:
        return None
    return _step_section(cfg, ctx, everyone, peak_source)


def _profiled_step(cfg: StepConfig, ctx: RunContext, train_step: Any) -> dict[str, Any]:
    """One more step under torch.profiler: its Chrome trace (written to ``cfg.trace_path`` on rank 0)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        train_step()
        sync(ctx.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        if ctx.is_main and cfg.trace_path is not None:
            atomic_write_bytes(cfg.trace_path, path.read_bytes())
    return trace


def _step_section(cfg: StepConfig, ctx: RunContext, everyone: list[Any], peak_source: str) -> dict[str, Any]:
    """The profile's ``step`` section from every rank's timings, memory and trace figures (``everyone``)."""
    per_step = [max(r["times"][i] for r in everyone) for i in range(cfg.n_steps)]
    step_time = percentile(per_step, 0.5)
    medians = [percentile(r["times"], 0.5) for r in everyone]
    kinds = sorted({k for r in everyone for k in r["exposed"]})
    dp = cfg.plan.dp
    tokens_per_step = dp * cfg.mbs * cfg.seq_len * cfg.n_microbatches
    return {
        "plan": replace(cfg.plan, mbs=cfg.mbs, recompute=cfg.plan.recompute or "none").to_string(),
        "model": cfg.spec.name,
        "model_spec": asdict(cfg.spec),
        "seq_len": cfg.seq_len,
        "mbs": cfg.mbs,
        "n_microbatches": cfg.n_microbatches,
        "global_batch_tokens": tokens_per_step,
        "n_steps": cfg.n_steps,
        "n_warmup": cfg.n_warmup,
        "param_dtype": "bf16",
        "reduce_dtype": "fp32",
        "step_time_s": step_time,
        "step_time_p10_s": percentile(per_step, 0.1),
        "step_time_p90_s": percentile(per_step, 0.9),
        "tokens_per_s": tokens_per_step / step_time,
        "mfu": None,
        "peak_memory_bytes_per_rank": [r["peak"] for r in everyone],
        "peak_memory_source": peak_source,
        "peak_reserved_bytes_per_rank": ([r["reserved"] for r in everyone] if ctx.device.type == "cuda" else None),
        "baseline_memory_bytes_per_rank": ([r["baseline"] for r in everyone] if ctx.device.type == "cpu" else None),
        "exposed_comm_s_by_collective": {k: max(r["exposed"].get(k, 0.0) for r in everyone) for k in kinds},
        "comm_s_by_collective": {k: max(r["comm"].get(k, 0.0) for r in everyone) for k in kinds},
        "kernel_time_s_by_kind": everyone[0]["kernels"],
        "kernel_time_source": ("GPU kernel time of rank 0's profiled step by kind (gemm, attention, optimizer, "
                               "communication, other; busy = their union), meshplan.harness.measure.trace"
                               if everyone[0]["kernels"] else None),
        "exposed_comm_source": "torch.profiler trace of one step, max over ranks (meshplan.harness.measure.trace)",
        "rank_step_time_spread": {"median_s_by_rank": medians, "min_s": min(medians), "max_s": max(medians),
                                  "spread_frac": (max(medians) - min(medians)) / step_time},
        "trace": str(cfg.trace_path) if cfg.trace_path else None,
    }
