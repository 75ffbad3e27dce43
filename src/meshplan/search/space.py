"""The plan space: every factorisation of the GPU count into mesh degrees that the topology and the
model admit, times the options of each parallelism. Generators and flat products, no nested search.

Topology rules: tensor parallelism stays inside a node (its collectives are on the critical path);
context, expert, pipeline and data parallelism may span nodes. Micro-batch size and recompute mode are
not enumerated here: ``evaluate`` chooses them for each structural plan (memory is monotonic in the
micro-batch size, so the largest that fits is found without trying every value).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.plan import FRAMEWORK_CP, FRAMEWORK_SCHEDULES

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

    @classmethod
    def dp_tp(cls) -> Space:
        """The core family: DDP, FSDP, HSDP and TP x FSDP (PyTorch FSDP2 semantics)."""
        return cls(pipeline=False, context=False, experts=False, shardings=("fsdp",), schedules=("1f1b",))


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


def _pipeline_options(model: ModelSpec, pp: int, space: Space) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1
        return
    for schedule in space.schedules:
        if schedule == "interleaved":
            for v in range(2, space.max_vpp + 1):
                if model.n_layers % (pp * v) == 0:
                    yield schedule, v
        elif schedule == "zb-v":
            if model.n_layers % (2 * pp) == 0:
                yield schedule, 1
        else:
            yield schedule, 1


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space) -> Iterator[Plan]:
    """Every structurally valid plan of ``space`` (valid: passes meshplan.cost.validate.validate_plan)."""
    n = cluster.n_gpus
    heads = model.n_heads if model.is_mla else min(model.n_heads, model.n_kv_heads)
    max_tp = space.max_tp or cluster.gpus_per_node
    tps = [t for t in divisors(n) if t <= max_tp and model.n_heads % t == 0 and (model.is_mla or heads % t == 0)]
    pps = [p for p in divisors(n) if p <= model.n_layers] if space.pipeline else [1]
    cps = [c for c in divisors(n) if job.seq_len % (2 * c) == 0] if space.context else [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        eps = [1]
        if model.is_moe and space.experts:
            eps = [e for e in divisors(model.n_experts) if e == 1 or (tp * cp * dp) % e == 0]
        for dr, ep, (schedule, vpp) in itertools.product(divisors(dp), eps, _pipeline_options(model, pp, space)):
            ds = dp // dr
            if ep > 1 and (tp * cp * ds) % ep:
                continue
            shardings = space.shardings if ds * cp > 1 else ("fsdp",)
            for sharding in shardings:
                if pp > 1 and (sharding in ("zero2", "zero3") or schedule not in FRAMEWORK_SCHEDULES[sharding]):
                    continue  # each framework runs its own schedules; DeepSpeed pipelines with ZeRO-1 only
                cp_impl = FRAMEWORK_CP[sharding][0]
                if cp > 1 and cp_impl == "a2a" and (model.n_heads // tp % cp or
                                                    (not model.is_mla and model.n_kv_heads // tp % cp)):
                    continue
                yield Plan(dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, pp=pp, ep=ep, sharding=sharding,
                           schedule=schedule, vpp=vpp)
