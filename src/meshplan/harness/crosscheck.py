"""Cross-check meshplan's communication ledger and model-state memory against PyTorch itself.

A plan's parallelism is applied to the reference model with PyTorch's public APIs, torchtitan style
[1]: a DeviceMesh in the axis order (pp, dp_replicate, dp_shard, cp, tp); ``parallelize_module`` with
torchtitan's llama3 layer plan (sequence parallel norms when SP is on, loss parallel on the output);
optional activation checkpointing per block; then ``fully_shard`` per block and at the root with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (HSDP on a 2-D (dp_replicate, dp_shard)
mesh). Forward, backward and an AdamW step over ``n_micro`` micro-batches (gradient accumulation) run
under a fake process group of the plan's world size: only rank 0 runs, nothing is sent, and every
collective is recorded at the dispatcher (:mod:`meshplan.harness.recorder`).

A plan without sharding (dp_shard = 1, dp_replicate > 1) runs PyTorch's DistributedDataParallel instead,
as torchtitan applies it (``replicate(model, bucket_cap_mb=100)``: fp32 parameters, bf16 autocast; pure
data parallelism only), with ``no_sync`` on all but the last micro-batch where the plan's gradient sync is
'last'. The fake process group's futures carry no tensor, which DDP's reducer needs, so a comm hook issues
each bucket's all-reduce itself (recorded like any other) and completes the future. Two synced warm-up
micro-batches, not recorded, let DDP rebuild its buckets in gradient-ready order (its first backward
reduces everything in one bucket), so the recorded step is a steady one.

Recorded and predicted traffic are compared per (collective, axis): calls per step and the sum of the
nccl-tests message bytes of those calls. Three differences are deliberate and accounted for exactly:

- FSDP2 pads each parameter's dim-0 shard to ceil(d0/N) rows ([2], ``FSDPParam._init_sharded_param``),
  so a unit's all-gather and reduce-scatter buffers are N·Σ ceil(d0/N)·rest elements, not Σ d0·rest. The
  padding is computed from the parameter shapes and reported; the rest must match exactly.
- DDP reduces per bucket, not per block: a bucket closes once it holds ``bucket_cap_mb`` MiB of
  gradients, taken in gradient-ready order (the parameters' reverse registration order in these blocks),
  so a matrix larger than the cap closes the bucket it joins ([4] ``_compute_bucket_assignment_by_size``).
  The calls are counted from the parameter sizes by that rule (:func:`ddp_bucket_count`); the bytes must
  match exactly.
- Collectives on the tp axis whose message is not an activation (T·D elements) are auxiliaries meshplan
  leaves out: loss-parallel reductions of per-token statistics and the all-reduce of sequence-parallel
  norm-weight gradients ([3], ``SequenceParallel``: replicated weights, Partial gradients). They are
  listed with their size.

References
----------
[1] pytorch/torchtitan, torchtitan/models/llama3/infra/parallelize.py (apply_tp, apply_ac, apply_fsdp).
[2] torch/distributed/fsdp/_fully_shard/_fsdp_param.py and _fsdp_collectives.py (torch 2.13).
[3] torch/distributed/tensor/parallel/style.py and loss.py (torch 2.13).
[4] torch/nn/parallel/distributed.py and the reducer (torch 2.13); torchtitan/models/llama3/parallelize.py
    ``apply_ddp`` (@01db32e9).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from meshplan.cost.comm import ACT_BYTES, PARAM_DTYPE_BYTES
from meshplan.errors import SpecError
from meshplan.harness.recorder import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    CollectiveRecord,
    CollectiveRecorder,
    axis_names_of_mesh,
)
from meshplan.harness.reference_model import build_model
from meshplan.specs import JobSpec, ModelSpec, Plan

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # torchtitan ParallelDims order, innermost last
REDUCE_BYTES = 4  # fp32 gradient reduction (MixedPrecisionPolicy.reduce_dtype; JobSpec.reduce_dtype_bytes)
STATE_BYTES = {"params": 4, "grads": 4, "optimizer_state": 8}  # per parameter, FSDP2 recipe: fp32 params, grads, m+v
ELEMENT_BYTES = 4  # every recorded state element is fp32 in the recipe
REL_TOL = 1e-9  # bytes and counts must match exactly once the FSDP2 padding is removed
CLUSTER = "h100-sxm"
DDP_BUCKET_CAP_MB = 100.0  # torchtitan's apply_ddp: replicate(model, bucket_cap_mb=100) [4]
DDP_WARMUP_MICRO = 2  # synced micro-batches before the recorded step: the second runs the rebuilt buckets


@dataclass(frozen=True, slots=True)
class Row:
    """Predicted against recorded traffic of one collective on one axis, summed over a step."""

    collective: str
    axis: str
    predicted_count: int
    recorded_count: int
    predicted_bytes: float
    """Σ message bytes of meshplan's calls [bytes]."""
    recorded_bytes: int
    """Σ message bytes of the recorded calls [bytes]."""
    padding_bytes: float = 0.0
    """Part of ``recorded_bytes`` that is FSDP2 dim-0 shard padding [bytes]."""
    modelled: bool = True
    """False for auxiliary collectives meshplan leaves out on purpose (then not checked)."""
    note: str = ""
    known_count_delta: int = 0
    """Recorded minus predicted calls explained by a documented difference (:func:`known_differences`)."""
    known_bytes_delta: float = 0.0
    """Recorded minus predicted bytes explained by that difference [bytes]."""

    def _matches(self, count_delta: int, bytes_delta: float) -> bool:
        err = abs(self.recorded_bytes - self.padding_bytes - bytes_delta - self.predicted_bytes)
        return (self.recorded_count - count_delta == self.predicted_count
                and err <= REL_TOL * max(1.0, self.predicted_bytes))

    @property
    def exact(self) -> bool:
        """Counts and bytes equal once the FSDP2 padding is removed."""
        return self._matches(0, 0.0)

    @property
    def ok(self) -> bool:
        """Exact, or exact once the documented difference is added to the prediction."""
        if not self.modelled:
            return True
        return self.exact or (bool(self.known_count_delta or self.known_bytes_delta)
                              and self._matches(self.known_count_delta, self.known_bytes_delta))


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """Model-state bytes on rank 0 after the optimizer step, against meshplan's memory term."""

    term: str
    predicted_bytes: float
    recorded_bytes: int
    """Rank 0's local shards, at the FSDP2 recipe's bytes per element (fp32; AdamW m and v) [bytes]."""
    padding_bytes: float
    """Rank 0 holds ceil(d0/N) rows of each parameter, more than the mean d0/N [bytes]."""
    known_bytes_delta: float = 0.0
    """Recorded minus predicted bytes explained by a documented difference [bytes]."""
    note: str = ""

    @property
    def ok(self) -> bool:
        err = self.recorded_bytes - self.padding_bytes - self.predicted_bytes
        tol = REL_TOL * max(1.0, self.predicted_bytes)
        return abs(err) <= tol or (self.known_bytes_delta != 0 and abs(err - self.known_bytes_delta) <= tol)


@dataclass(frozen=True, slots=True)
class CrosscheckResult:
    """Everything one cross-check run found."""

    model: str
    plan: str
    world_size: int
    n_micro: int
    mbs: int
    seq_len: int
    recompute: str
    rows: list[Row]
    memory: list[MemoryRow]
    n_records: int
    tolerance: str = "counts exact; bytes exact (rel 1e-9) after FSDP2 padding"
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.rows) and all(m.ok for m in self.memory)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        for row, obj in zip(d["rows"], self.rows, strict=True):
            row["ok"] = obj.ok
        for row, obj in zip(d["memory"], self.memory, strict=True):
            row["ok"] = obj.ok
        return d


# ---------------------------------------------------------------- what the run supports


def check_supported(model: ModelSpec, plan: Plan) -> None:
    """Raise SpecError for plans the harness does not apply (pipeline, context and expert parallelism,
    non-FSDP sharding semantics, TP of MoE, MLA or learned-position models)."""
    for axis in ("pp", "cp", "ep"):
        if getattr(plan, axis) > 1:
            raise SpecError(f"plan.{axis}", f"crosscheck applies dp_replicate, dp_shard and tp only; got {axis}="
                                            f"{getattr(plan, axis)}")
    if plan.sharding != "fsdp":
        raise SpecError("plan.sharding", f"crosscheck runs PyTorch FSDP2 and DDP only; got sharding={plan.sharding}")
    if plan.recompute not in (None, "none", "full"):
        raise SpecError("plan.recompute", f"crosscheck applies 'none' or 'full' (checkpoint per block); got "
                                          f"{plan.recompute}")
    if plan.grad_sync is not None and plan.grad_sync != plan.effective_grad_sync:
        raise SpecError("plan.grad_sync", "crosscheck runs each implementation's default gradient sync")
    if plan.is_ddp and plan.tp > 1:
        raise SpecError("plan.tp", "crosscheck runs DDP as torchtitan does, without other parallelism; got "
                                   f"tp={plan.tp} with dp_replicate={plan.dp_replicate}")
    if isinstance(plan.reshard_after_forward, int) and not isinstance(plan.reshard_after_forward, bool):
        raise SpecError("plan.reshard_after_forward", "crosscheck applies true or false")
    if plan.tp > 1:
        if model.is_moe or model.is_mla or model.learned_pos_emb:
            raise SpecError("plan.tp", "crosscheck applies TP to dense rotary GQA models only")
        if model.n_kv_heads % plan.tp or model.n_heads % plan.tp:
            raise SpecError("plan.tp", f"tp={plan.tp} must divide n_kv_heads={model.n_kv_heads}")


# ---------------------------------------------------------------- applying the plan


def _mesh(plan: Plan) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    axes = [(a, getattr(plan, a)) for a in MESH_AXES if getattr(plan, a) > 1]
    if not axes:
        return None
    return init_device_mesh("cpu", tuple(d for _, d in axes), mesh_dim_names=tuple(a for a, _ in axes))


def apply_tp(model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool) -> None:
    """torchtitan's llama3 ``apply_tp`` layer plan [1], loss parallel on; without SP the activations
    between blocks are replicated (Megatron TP: one all-reduce after wo and w2)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    act = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=act),
        "output": ColwiseParallel(input_layouts=act, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)
    for block in model.layers:
        layer_plan: dict[str, Any] = {
            "attention": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
            "feed_forward": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=act),
        }
        if block.feed_forward.w3 is not None:
            layer_plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            layer_plan["attention_norm"] = SequenceParallel()
            layer_plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, layer_plan)


def apply_ac(model: nn.Module, n_layers: int | None = None) -> None:
    """Full activation checkpointing: each block, or the first ``n_layers`` (plan.recompute_layers),
    wrapped by ``checkpoint_wrapper`` (torchtitan apply_ac)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        if n_layers is None or i < n_layers:
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_fsdp(model: nn.Module, dp_mesh: Any, *, reshard_after_forward: bool) -> None:
    """``fully_shard`` per block, then at the root (left at its default: not resharded after forward)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def _local_shapes(params: list[nn.Parameter]) -> list[tuple[int, ...]]:
    out = []
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        out.append(tuple(local.shape))
    return out


def _unit_shapes(model: nn.Module) -> dict[str, list[tuple[int, ...]]]:
    """Local (after TP) parameter shapes of each FSDP unit: each block, and the root (the rest)."""
    seen: set[int] = set()
    units: dict[str, list[tuple[int, ...]]] = {}
    for i, block in enumerate(model.layers):
        params = [p for p in block.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        units[f"block{i}"] = _local_shapes(params)
    units["root"] = _local_shapes([p for p in model.parameters() if id(p) not in seen])
    return units


def ddp_bucket_count(grad_bytes: list[int], cap_bytes: float) -> int:
    """DDP's buckets over gradients of ``grad_bytes`` in the order they become ready: each takes gradients
    until it holds at least ``cap_bytes`` [4]."""
    buckets, held = 0, 0
    for b in grad_bytes:
        held += b
        if held >= cap_bytes:
            buckets, held = buckets + 1, 0
    return buckets + (held > 0)


def padded_elements(shapes: list[tuple[int, ...]], n: int) -> tuple[int, int]:
    """(Σ numel, Σ ceil(d0/n)·rest) of parameters sharded n ways on dim 0 by FSDP2 [2] [elements]."""
    numel = padded = 0
    for shape in shapes:
        rest = math.prod(shape[1:])
        numel += shape[0] * rest if shape else 1
        padded += (-(-shape[0] // n) * rest) if shape else 1
    return numel, padded


# ---------------------------------------------------------------- running a step


@dataclass(frozen=True, slots=True)
class Recording:
    """What one parallel step did on rank 0."""

    records: list[CollectiveRecord]
    unit_shapes: dict[str, list[tuple[int, ...]]]
    state_elements: dict[str, int]
    """Local elements on rank 0 after the step: 'params', 'grads', 'optimizer_state' (m and v)."""
    ddp: DDPRecord | None = None
    """What DDP's reducer held and how it bucketed, where the plan ran DDP."""


@dataclass(frozen=True, slots=True)
class DDPRecord:
    """DDP's gradient buckets on rank 0."""

    bucket_bytes: int
    """Every bucket's buffer, as the comm hook saw them [bytes]."""
    ready_grad_bytes: tuple[int, ...]
    """Each parameter's gradient bytes in reverse registration order, DDP's ready order here [bytes]."""
    cap_bytes: float
    """The bucket cap (``bucket_cap_mb`` in MiB) [bytes]."""
    syncs: int
    """The recorded micro-batches that reduced (not under ``no_sync``)."""


def _reset_process_group(world_size: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def run_parallel_step(model_spec: ModelSpec, plan: Plan, *, seq_len: int = 64, mbs: int = 1, n_micro: int = 2,
                      seed: int = 0, ddp_bucket_cap_mb: float = DDP_BUCKET_CAP_MB) -> Recording:
    """Apply ``plan`` to the reference model under a fake process group of ``plan.world_size`` ranks and run
    one optimizer step of ``n_micro`` micro-batches of ``mbs`` sequences, recording every collective."""
    check_supported(model_spec, plan)
    _reset_process_group(plan.world_size)
    try:
        torch.manual_seed(seed)
        mesh = _mesh(plan)
        model = build_model(model_spec)
        if plan.tp > 1:
            apply_tp(model, mesh["tp"], sequence_parallel=plan.sequence_parallel)
        unit_shapes = _unit_shapes(model)
        if plan.recompute == "full":
            apply_ac(model, plan.recompute_layers)
        ddp = None
        if plan.dp_shard > 1:
            dp_axes = ("dp_replicate", "dp_shard") if plan.dp_replicate > 1 else ("dp_shard",)
            apply_fsdp(model, mesh[dp_axes], reshard_after_forward=bool(plan.effective_reshard_after_forward))
        elif plan.is_ddp:  # fp32 parameters under bf16 autocast, as torchtitan runs DDP
            ddp = _DDPRun(model, mesh["dp_replicate"].get_group(), ddp_bucket_cap_mb)
        else:
            model.to(torch.bfloat16)  # no FSDP mixed precision: run the bf16 activations meshplan assumes
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        gen = torch.Generator().manual_seed(seed)

        def reduces(i: int) -> bool:  # the plan's gradient sync: after every micro-batch, or the last
            return plan.effective_grad_sync == "every" or i == n_micro - 1

        def micro_batch(reduce: bool, recorder: CollectiveRecorder | None = None) -> None:
            tokens = torch.randint(0, model_spec.vocab, (mbs, seq_len + 1), generator=gen)
            if recorder:
                recorder.phase = "forward"
            with ddp.sync(reduce) if ddp else contextlib.nullcontext(), _loss_context(plan):
                with torch.autocast("cpu", dtype=torch.bfloat16) if ddp else contextlib.nullcontext():
                    logits = (ddp.module if ddp else model)(tokens[:, :-1])
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()) / n_micro
                if recorder:
                    recorder.phase = "backward"
                loss.backward()

        if ddp:
            for _ in range(DDP_WARMUP_MICRO):
                micro_batch(True)
            optimizer.zero_grad(set_to_none=False)
        recorder = CollectiveRecorder(axis_of_group=axis_names_of_mesh(mesh) if mesh is not None else {})
        with recorder:
            for i in range(n_micro):
                micro_batch(reduces(i), recorder)
            recorder.phase = "step"
            optimizer.step()
        state = {"params": _local_numel(model.parameters()),
                 "grads": _local_numel(p.grad for p in model.parameters() if p.grad is not None),
                 "optimizer_state": _local_numel(v for s in optimizer.state.values() for k, v in s.items()
                                                 if k in ("exp_avg", "exp_avg_sq"))}
        if not ddp:
            return Recording(recorder.records, unit_shapes, state)
        ready = tuple(p.numel() * p.element_size() for p in reversed(list(model.parameters())))
        return Recording(recorder.records, unit_shapes, state,
                         DDPRecord(ddp.bucket_bytes, ready, ddp_bucket_cap_mb * 1024 * 1024,
                                   sum(map(reduces, range(n_micro)))))
    finally:
        dist.destroy_process_group()


class _DDPRun:
    """``model`` under PyTorch's DDP on ``group``, its all-reduces issued by a comm hook (module docstring)."""

    def __init__(self, model: nn.Module, group: Any, bucket_cap_mb: float) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.module = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
        self.buffers: dict[int, int] = {}

        def all_reduce(state, bucket):  # unannotated: DDP rejects a hook annotated other than it expects
            del state
            buf = bucket.buffer()
            self.buffers[bucket.index()] = buf.numel() * buf.element_size()
            dist.all_reduce(buf, group=group)
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut

        self.module.register_comm_hook(None, all_reduce)

    @property
    def bucket_bytes(self) -> int:
        return sum(self.buffers.values())

    def sync(self, reduce: bool) -> Any:
        """A micro-batch's forward and backward context: ``no_sync`` unless it reduces."""
        return contextlib.nullcontext() if reduce else self.module.no_sync()


def _loss_context(plan: Plan) -> Any:
    if plan.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def _local_numel(tensors: Any) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


# ---------------------------------------------------------------- prediction and comparison


def predict(model_spec: ModelSpec, plan: Plan, *, seq_len: int, mbs: int, n_micro: int) -> Any:
    """meshplan's Estimate for exactly the run: same micro-batch size, count and recompute mode, and the
    model as the reference model builds it (without multi-token prediction)."""
    from meshplan.catalog import load_cluster
    from meshplan.cost.step import evaluate

    model_spec = replace(model_spec, mtp_layers=0)

    n = plan.world_size
    cluster = load_cluster(CLUSTER, nodes=max(1, n // 8), gpus_per_node=min(n, 8))
    job = JobSpec(global_batch_tokens=mbs * seq_len * plan.dp * n_micro, seq_len=seq_len,
                  reduce_dtype_bytes=REDUCE_BYTES)
    recompute = plan.recompute or ("full" if plan.recompute_layers else "none")  # partial recomputation is full's
    return evaluate(model_spec, cluster, job, replace(plan, mbs=mbs, recompute=recompute))


def _padding_by_key(plan: Plan, unit_shapes: dict[str, list[tuple[int, ...]]], n_micro: int
                    ) -> dict[tuple[str, str], float]:
    """FSDP2 padding bytes inside each (collective, axis) total of a step."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    n = plan.dp_shard
    if n <= 1:
        return out
    for name, shapes in unit_shapes.items():
        numel, padded = padded_elements(shapes, n)
        extra = n * padded - numel
        gathers = n_micro * (1 if name == "root" or plan.effective_reshard_after_forward is False else 2)
        out[ALL_GATHER, "dp_shard"] += gathers * extra * PARAM_DTYPE_BYTES
        out[REDUCE_SCATTER, "dp_shard"] += n_micro * extra * REDUCE_BYTES
        if plan.dp_replicate > 1:
            out[ALL_REDUCE, "dp_replicate"] += n_micro * (padded - numel / n) * REDUCE_BYTES
    return out


@dataclass(frozen=True, slots=True)
class KnownDifference:
    """A documented, exactly sized difference between what PyTorch issues and meshplan's ledger."""

    collective: str
    axis: str
    count_delta: int
    """Recorded minus predicted calls per step."""
    bytes_delta: float
    """Recorded minus predicted message bytes per step [bytes]."""
    reason: str
    verdict: str
    """'meshplan omits' (a ledger gap reported to the core) or 'implementation' (PyTorch differs on purpose)."""


def known_differences(model_spec: ModelSpec, plan: Plan, *, seq_len: int, mbs: int, n_micro: int
                      ) -> list[KnownDifference]:
    """Differences between what PyTorch issues and meshplan's ledger that are documented rather than
    modelled, sized for one run (docs/measure-and-crosscheck.md). None: both collectives PyTorch issues that a
    simpler ledger would miss are in meshplan's (meshplan.cost.comm):

    1. With sequence parallelism the vocab-parallel embedding's output reduce-scatter has an all-gather of
       the output gradient as its backward (torch ``Redistribute.backward`` of Partial->Shard(1); Megatron
       ``_ReduceScatterToSequenceParallelRegion.backward``): m calls of T·D·2 B.
    2. ``checkpoint_wrapper`` uses non-reentrant ``torch.utils.checkpoint``, which stops recomputing once every
       saved tensor is back (``set_checkpoint_early_stop``, on by default): the block's last TP collective
       (after w2) is not re-run, so PyTorch recomputes 1 TP collective per layer per micro-batch, not 2.
    """
    del model_spec, plan, seq_len, mbs, n_micro
    return []


def _ddp_buckets(ddp: DDPRecord, predicted_calls: float) -> KnownDifference:
    """DDP's all-reduces per bucket against the ledger's per block: the calls the run's reductions of the
    buckets ``ddp_bucket_count`` forms issue, less the ledger's; no bytes."""
    syncs = ddp.syncs
    calls = syncs * ddp_bucket_count(list(ddp.ready_grad_bytes), ddp.cap_bytes)
    return KnownDifference(ALL_REDUCE, "dp_replicate", calls - int(predicted_calls), 0.0,
                           f"DDP reduces per bucket of at least {ddp.cap_bytes / 2**20:g} MiB in gradient-ready "
                           f"order ({calls // syncs} per sync), the ledger one block per call: latency only",
                           "implementation")


def known_memory_differences(model_spec: ModelSpec, plan: Plan) -> dict[str, tuple[float, str]]:
    """Memory terms PyTorch holds differently, sized [bytes] with the reason (docs/measure-and-crosscheck.md)."""
    out: dict[str, tuple[float, str]] = {}
    if plan.tp > 1 and plan.dp_shard == 1:
        vd = model_spec.vocab * model_spec.hidden
        out["grads"] = ((vd - vd / plan.tp) * ELEMENT_BYTES,
                        "DTensor's embedding backward returns a Replicate (full V·D) weight gradient for the "
                        "Shard(0) vocab-parallel embedding; without FSDP nothing reduces it to a shard")
    return out


def compare(model_spec: ModelSpec, plan: Plan, estimate: Any, rec: Recording, *, seq_len: int, mbs: int,
            n_micro: int) -> CrosscheckResult:
    """Per (collective, axis) rows and model-state memory rows of one run."""
    act_msg = mbs * seq_len * model_spec.hidden * ACT_BYTES
    predicted: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for e in estimate.comm:
        predicted[e.collective, e.axis][0] += e.count
        predicted[e.collective, e.axis][1] += e.count * e.message_bytes
    recorded: dict[tuple[str, str, bool], list[int]] = defaultdict(lambda: [0, 0])
    for r in rec.records:
        if r.group_size <= 1:
            continue
        aux = r.axis == "tp" and r.message_bytes != act_msg
        recorded[r.collective, r.axis, aux][0] += 1
        recorded[r.collective, r.axis, aux][1] += r.message_bytes
    padding = _padding_by_key(plan, rec.unit_shapes, n_micro)
    known: dict[tuple[str, str], list[KnownDifference]] = defaultdict(list)
    differences = known_differences(model_spec, plan, seq_len=seq_len, mbs=mbs, n_micro=n_micro)
    if rec.ddp:
        differences.append(_ddp_buckets(rec.ddp, predicted[ALL_REDUCE, "dp_replicate"][0]))
    for k in differences:
        known[k.collective, k.axis].append(k)
    rows = []
    for key in sorted(set(predicted) | {(c, a) for c, a, aux in recorded if not aux}):
        (pc, pb), (rc, rb) = predicted.get(key, (0, 0.0)), recorded.get((*key, False), (0, 0))
        notes = ["FSDP2 pads dim-0 shards to ceil(d0/N) rows"] if padding.get(key) else []
        notes += [f"{k.verdict}: {k.reason}" for k in known[key]]
        rows.append(Row(key[0], key[1], int(pc), rc, pb, rb, padding.get(key, 0.0), True, "; ".join(notes),
                        sum(k.count_delta for k in known[key]), sum(k.bytes_delta for k in known[key])))
    for (c, a, aux), (rc, rb) in sorted(recorded.items()):
        if aux:
            rows.append(Row(c, a, 0, rc, 0.0, rb, 0.0, False,
                            "auxiliary, not in meshplan: loss-parallel per-token reductions and SP norm-weight "
                            "gradient all-reduces"))
    n_d = plan.dp_shard
    memory = []
    mem_known = known_memory_differences(model_spec, plan)
    numel = padded = 0
    for shapes in rec.unit_shapes.values():
        u_numel, u_padded = padded_elements(shapes, n_d)
        numel, padded = numel + u_numel, padded + u_padded
    for term, per_param in STATE_BYTES.items():
        delta, why = mem_known.get(term, (0.0, ""))
        predicted = estimate.memory.terms.get(term, 0.0) + estimate.memory.terms.get("expert_" + term, 0.0)
        memory.append(MemoryRow(term, predicted, rec.state_elements[term] * ELEMENT_BYTES,
                                (padded - numel / n_d) * per_param, delta, why))
    if rec.ddp:
        memory.append(MemoryRow("ddp_gradient_buckets", estimate.memory.terms.get("ddp_gradient_buckets", 0.0),
                                rec.ddp.bucket_bytes, 0.0))
    notes = []
    if rec.ddp:
        notes.append("DDP as torchtitan runs it: fp32 parameters under bf16 autocast, "
                     f"bucket_cap_mb={rec.ddp.cap_bytes / 2**20:g}, the step after two synced warm-up micro-batches")
    elif plan.dp_shard == 1:
        notes.append("no FSDP: the model ran in bf16; memory rows count elements at the FSDP2 recipe's fp32 bytes")
    return CrosscheckResult(model=model_spec.name, plan=plan.to_string(), world_size=plan.world_size,
                            n_micro=n_micro, mbs=mbs, seq_len=seq_len, recompute=plan.recompute or "none",
                            rows=rows, memory=memory, n_records=len(rec.records), notes=notes)


def crosscheck(model_spec: ModelSpec, plan: Plan, *, seq_len: int = 64, mbs: int = 1, n_micro: int = 2,
               ddp_bucket_cap_mb: float = DDP_BUCKET_CAP_MB) -> CrosscheckResult:
    """Run ``plan`` on the reference model under a fake process group and compare with meshplan; the plan's
    micro-batch size where it sets one."""
    check_supported(model_spec, plan)
    mbs = plan.mbs or mbs
    estimate = predict(model_spec, plan, seq_len=seq_len, mbs=mbs, n_micro=n_micro)
    rec = run_parallel_step(model_spec, plan, seq_len=seq_len, mbs=mbs, n_micro=n_micro,
                            ddp_bucket_cap_mb=ddp_bucket_cap_mb)
    return compare(model_spec, plan, estimate, rec, seq_len=seq_len, mbs=mbs, n_micro=n_micro)


# ---------------------------------------------------------------- FLOPs


def count_flops(model_spec: ModelSpec, *, batch: int = 2, seq_len: int = 64) -> int:
    """FLOPs of one forward and backward of the reference model, as ``FlopCounterMode`` counts them.

    Attention runs on SDPA's math backend: FlopCounterMode has no formula for the fused CPU kernel
    (``_scaled_dot_product_flash_attention_for_cpu``, torch 2.13 ``torch/utils/flop_counter.py``), and the
    math backend computes the full S×S score matrix even when causal, so the count is non-causal (PaLM).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = build_model(model_spec)
    tokens = torch.randint(0, model_spec.vocab, (batch, seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).float().sum().backward()
    return int(counter.get_total_flops())
