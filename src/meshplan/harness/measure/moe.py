"""An MoE layer's kernels at a plan's shapes: the expert GEMMs, the router and the token permutation.

Expert GEMMs (``ExpertShape``, BF16), in both launch styles ``meshplan.cost.grouped_gemm`` models:

- ``per_expert``: one ``torch.mm`` per expert, in turn (Transformer Engine's ``GroupedLinear`` launches one
  cuBLAS GEMM per expert, on 4 streams);
- ``grouped``: one ``torch._grouped_mm`` over every expert's rows (the CUTLASS grouped GEMM that PyTorch
  ships, which torchtitan's MoE runs; on a CPU PyTorch's reference loop), where this torch has it and it
  accepts the shape on this device (otherwise skipped, with a note).

Each is timed as ``2·groups·m·n·k / t_median`` FLOP/s and reported beside a reference dense GEMM timed in
the same run (``reference_gemm``), whose rate the model's asymptote stands for: the ratio is the curve
``evaluate --profile`` applies (``meshplan.profile.apply_profile``).

Memory-bound passes (``RoutingShape``; tokens routed to k experts drawn uniformly at random, as Megatron-core's
forced balancing does): the router (FP32 softmax over E scores, top-k, the dense probabilities and routing
map), the permutation (each token's row copied to its k expert slots, in expert order: ``index_select``)
and the un-permutation (the k expert outputs weighted by their probabilities and summed back:
``index_add_``). Each reports the bytes ``meshplan.cost.moe_passes`` counts for it and the rate that
gives; PyTorch's eager kernels are not Transformer Engine's fused ones, so on a GPU the rates are a
lower bound on what a fused dispatcher reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from meshplan.cost.moe_passes import ACT_BYTES, ROUTER_FWD_BYTES_PER_EXPERT
from meshplan.harness.measure.shapes import ExpertShape, GemmShape, RoutingShape
from meshplan.harness.measure.timing import Timing, reps_for, summarize, sync, time_calls

PASSES = ("router", "permute", "unpermute")


@dataclass(frozen=True, slots=True)
class ExpertGemmResult:
    shape: ExpertShape
    kernel: str
    """'per_expert' or 'grouped'."""
    dtype: str
    timing: Timing

    @property
    def flop_per_s(self) -> float:
        return self.shape.flop / self.timing.median_s

    def as_profile_entry(self, reference_flop_per_s: float) -> dict:
        return {"kernel": self.kernel, "dtype": self.dtype, "groups": self.shape.groups, "m": self.shape.m,
                "n": self.shape.n, "k": self.shape.k, "median_s": self.timing.median_s, "p10_s": self.timing.p10_s,
                "p90_s": self.timing.p90_s, "flop_per_s": self.flop_per_s,
                "relative_efficiency": self.flop_per_s / reference_flop_per_s}


@dataclass(frozen=True, slots=True)
class PassResult:
    name: str
    """'router', 'permute' or 'unpermute'."""
    shape: RoutingShape
    bytes_moved: float
    timing: Timing

    def as_profile_entry(self) -> dict:
        s = self.shape
        return {"pass": self.name, "tokens": s.tokens, "hidden": s.hidden, "top_k": s.top_k,
                "n_experts": s.n_experts, "bytes": self.bytes_moved, "median_s": self.timing.median_s,
                "p10_s": self.timing.p10_s, "p90_s": self.timing.p90_s,
                "bytes_per_s": self.bytes_moved / self.timing.median_s}


def _timed(op: Callable[[], object], device: torch.device, budget_s: float) -> Timing:
    est = time_calls(op, device=device, reps=2)[-1]
    sync(device)
    reps = reps_for(est, budget_s=budget_s, min_reps=5, max_reps=100)
    return summarize(time_calls(op, device=device, reps=reps))


def reference_gemm(device: torch.device) -> GemmShape:
    """The dense BF16 GEMM the expert GEMMs are measured against: large enough to reach the device's
    asymptote (8192³ on a GPU, 1024³ on a CPU, where larger ones take seconds)."""
    s = 8192 if device.type == "cuda" else 1024
    return GemmShape(name="reference", m=s, n=s, k=s)


def time_reference(shape: GemmShape, device: torch.device, *, budget_s: float) -> Timing:
    a = torch.randn(shape.m, shape.k, device=device, dtype=torch.bfloat16)
    b = torch.randn(shape.k, shape.n, device=device, dtype=torch.bfloat16)
    c = torch.empty(shape.m, shape.n, device=device, dtype=torch.bfloat16)
    return _timed(lambda: torch.mm(a, b, out=c), device, budget_s)


def grouped_supported(shape: ExpertShape, device: torch.device) -> tuple[bool, str]:
    """(whether ``torch._grouped_mm`` runs this shape here, why not)."""
    if not hasattr(torch, "_grouped_mm"):
        return False, "grouped expert GEMMs skipped: this torch has no torch._grouped_mm"
    try:
        a = torch.zeros(2 * 16, shape.k, device=device, dtype=torch.bfloat16)
        b = torch.zeros(2, shape.k, shape.n, device=device, dtype=torch.bfloat16)
        torch._grouped_mm(a, b, offs=torch.tensor([16, 32], device=device, dtype=torch.int32))
    except (RuntimeError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return False, f"grouped expert GEMMs skipped: torch._grouped_mm refused on {device.type} ({first})"
    return True, ""


def time_expert_gemm(shape: ExpertShape, kernel: str, device: torch.device, *, budget_s: float) -> ExpertGemmResult:
    """Time ``shape`` launched as ``kernel`` in BF16."""
    g, m, n, k = shape.groups, shape.m, shape.n, shape.k
    if kernel == "per_expert":
        xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for _ in range(g)]
        ws = [torch.randn(k, n, device=device, dtype=torch.bfloat16) for _ in range(g)]
        outs = [torch.empty(m, n, device=device, dtype=torch.bfloat16) for _ in range(g)]

        def op() -> None:
            for x, w, o in zip(xs, ws, outs, strict=True):
                torch.mm(x, w, out=o)
    elif kernel == "grouped":
        x = torch.randn(g * m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(g, k, n, device=device, dtype=torch.bfloat16)
        offs = torch.arange(m, g * m + 1, m, device=device, dtype=torch.int32)

        def op() -> None:
            torch._grouped_mm(x, w, offs=offs)
    else:
        raise ValueError(f"kernel must be 'per_expert' or 'grouped', got {kernel!r}")
    return ExpertGemmResult(shape=shape, kernel=kernel, dtype="bf16", timing=_timed(op, device, budget_s))


def _routing(shape: RoutingShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token of each routed copy in expert order, its probability, the expert order) for random routing."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    scores = torch.rand(shape.tokens, shape.n_experts, generator=gen).to(device)
    probs, experts = scores.topk(shape.top_k, dim=-1)
    order = experts.flatten().argsort(stable=True)
    token_of_copy = order // shape.top_k
    return token_of_copy, probs.flatten()[order].to(torch.bfloat16), order


def time_passes(shape: RoutingShape, device: torch.device, *, budget_s: float) -> list[PassResult]:
    """Time the router, the permutation and the un-permutation of ``shape`` (module docstring)."""
    t, d, k, e = shape.tokens, shape.hidden, shape.top_k, shape.n_experts
    token_of_copy, probs, _ = _routing(shape, device)
    x = torch.randn(t, d, device=device, dtype=torch.bfloat16)
    y = torch.randn(t * k, d, device=device, dtype=torch.bfloat16)
    logits = torch.randn(t, e, device=device, dtype=torch.float32)
    out = torch.empty(t, d, device=device, dtype=torch.bfloat16)

    def router() -> None:
        p = torch.softmax(logits, dim=-1)
        top, idx = p.topk(k, dim=-1)
        torch.zeros_like(p).scatter_(1, idx, top)
        torch.zeros(t, e, device=device, dtype=torch.bool).scatter_(1, idx, True)

    def permute() -> None:
        x.index_select(0, token_of_copy)

    def unpermute() -> None:
        out.zero_()
        out.index_add_(0, token_of_copy, y * probs.unsqueeze(1))

    bytes_moved = {"router": ROUTER_FWD_BYTES_PER_EXPERT * e * t,
                   "permute": ACT_BYTES * (t * d + t * k * d),
                   "unpermute": ACT_BYTES * (t * k * d + t * d)}
    ops = {"router": router, "permute": permute, "unpermute": unpermute}
    return [PassResult(name, shape, bytes_moved[name], _timed(ops[name], device, budget_s)) for name in PASSES]
