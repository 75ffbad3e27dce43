"""GEMM throughput of given shapes: BF16 everywhere, FP8 on GPUs that have it (compute capability >= 8.9).

Throughput is 2·m·n·k / t_median [FLOP/s]. BF16 runs ``torch.mm``; FP8 runs ``torch._scaled_mm`` on
e4m3 operands with unit scales and a BF16 output (the path of torchao's float8 linears), with B
column-major as cuBLASLt requires. FP8 is skipped on a CPU (no FP8 GEMM kernels) with a note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from meshplan.harness.measure.shapes import GemmShape
from meshplan.harness.measure.timing import Timing, reps_for, summarize, sync, time_calls


@dataclass(frozen=True, slots=True)
class GemmResult:
    shape: GemmShape
    dtype: str
    """'bf16' or 'fp8'."""
    timing: Timing

    @property
    def flop_per_s(self) -> float:
        return self.shape.flop / self.timing.median_s

    def as_profile_entry(self) -> dict:
        return {"m": self.shape.m, "n": self.shape.n, "k": self.shape.k, "dtype": self.dtype,
                "median_s": self.timing.median_s, "p10_s": self.timing.p10_s, "p90_s": self.timing.p90_s,
                "flop_per_s": self.flop_per_s}


def fp8_supported(device: torch.device) -> tuple[bool, str]:
    """(whether FP8 GEMMs can run here, why not)."""
    if device.type != "cuda":
        return False, "FP8 GEMMs skipped: no FP8 kernels on a CPU"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return False, "FP8 GEMMs skipped: this torch has no float8 / _scaled_mm"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return False, f"FP8 GEMMs skipped: compute capability {cap[0]}.{cap[1]} < 8.9"
    return True, ""


def _operation(shape: GemmShape, dtype: str, device: torch.device) -> Callable[[], object]:
    m, n, k = shape.m, shape.n, shape.k
    if dtype == "bf16":
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        return lambda: torch.mm(a, b, out=c)
    a8 = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b8 = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major [k, n]
    one = torch.ones((), device=device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def time_gemm(shape: GemmShape, dtype: str, device: torch.device, *, budget_s: float, warmup: int = 2,
              min_reps: int = 5, max_reps: int = 100) -> GemmResult:
    """Warm up, then time ``reps`` products of ``shape`` in ``dtype``; reps fit ``budget_s``."""
    op = _operation(shape, dtype, device)
    est = time_calls(op, device=device, reps=warmup)[-1]
    sync(device)
    reps = reps_for(est, budget_s=budget_s, min_reps=min_reps, max_reps=max_reps)
    return GemmResult(shape=shape, dtype=dtype, timing=summarize(time_calls(op, device=device, reps=reps)))
