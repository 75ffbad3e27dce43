"""Throughput of the fused attention core a plan runs: PyTorch's ``scaled_dot_product_attention``.

One call is causal self-attention of ``b`` sequences of ``s`` tokens over ``heads`` query heads of
``head_dim`` (BF16, layout [b, heads, s, head_dim], as the reference model calls it after its
``repeat_kv``). Timed: the forward alone, and the forward plus backward (``out.backward(grad)``,
gradients of q, k and v).

FLOPs follow meshplan's convention (``meshplan.cost.flops``): the forward multiplies every query with
every key twice (QKᵀ and A·V), 4·b·s²·heads·head_dim, half of it under a causal mask; the backward is
2.5 times the forward (it recomputes QKᵀ: FlashAttention-2, Dao 2023, arXiv:2307.08691, §3.1.2).
Throughput is those FLOPs over the median time. It is not meshplan's ``attention_efficiency``
itself, whose causal term is a calibrated fraction (``causal_time_fraction``), not one half;
``meshplan measure compare`` sets the measured times against the model's times for the same calls.
Which kernel SDPA ran (FlashAttention, cuDNN, memory-efficient) depends on the torch build and GPU;
the profile's kernel trace of a step names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshplan.harness.measure.shapes import AttentionShape
from meshplan.harness.measure.timing import Timing, reps_for, summarize, sync, time_calls


@dataclass(frozen=True, slots=True)
class AttentionResult:
    shape: AttentionShape
    fwd: Timing
    fwd_bwd: Timing

    def as_profile_entry(self) -> dict:
        s = self.shape
        return {"b": s.b, "s": s.s, "heads": s.heads, "head_dim": s.head_dim, "causal": True, "dtype": "bf16",
                "fwd_median_s": self.fwd.median_s, "fwd_bwd_median_s": self.fwd_bwd.median_s,
                "fwd_flop_per_s": s.flop_fwd / self.fwd.median_s,
                "fwd_bwd_flop_per_s": s.flop_fwd_bwd / self.fwd_bwd.median_s}


def time_attention(shape: AttentionShape, device: torch.device, *, budget_s: float, warmup: int = 2,
                   min_reps: int = 5, max_reps: int = 50) -> AttentionResult:
    """Median forward and forward+backward times of causal SDPA on ``shape`` (BF16)."""
    dims = (shape.b, shape.heads, shape.s, shape.head_dim)
    q, k, v = (torch.randn(dims, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(dims, device=device, dtype=torch.bfloat16)

    def fwd() -> object:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd() -> object:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        q.grad = k.grad = v.grad = None
        return out

    timings = []
    for op in (fwd, fwd_bwd):
        est = time_calls(op, device=device, reps=warmup)[-1]
        sync(device)
        reps = reps_for(est, budget_s=budget_s, min_reps=min_reps, max_reps=max_reps)
        timings.append(summarize(time_calls(op, device=device, reps=reps)))
    return AttentionResult(shape=shape, fwd=timings[0], fwd_bwd=timings[1])
