"""Warm-up, then repeated timing: median and p10/p90 of the repetitions.

On a GPU each repetition is bracketed by CUDA events (``torch.cuda.Event(enable_timing=True)``) and
read after one ``torch.cuda.synchronize()``; on a CPU by ``time.perf_counter``. The burn-in idea is
nanoGPT's ``bench.py`` (karpathy/nanoGPT); the percentiles are linear interpolation between order
statistics (numpy's default, "linear" method).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Timing:
    """Spread of repeated measurements of one operation. [s]"""

    median_s: float
    p10_s: float
    p90_s: float
    n_reps: int


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of ``values`` by linear interpolation."""
    s = sorted(values)
    if not s:
        raise ValueError("no values")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_s: Sequence[float]) -> Timing:
    return Timing(median_s=percentile(samples_s, 0.5), p10_s=percentile(samples_s, 0.1),
                  p90_s=percentile(samples_s, 0.9), n_reps=len(samples_s))


def time_calls(fn: Callable[[], object], *, device: torch.device, reps: int) -> list[float]:
    """Run ``fn`` ``reps`` times; the time of each call [s]."""
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reps_for(estimate_s: float, *, budget_s: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fit ``budget_s`` at ``estimate_s`` each, within [min_reps, max_reps]."""
    if estimate_s <= 0:
        return max_reps
    return max(min_reps, min(max_reps, int(budget_s / estimate_s)))
