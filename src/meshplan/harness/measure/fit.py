"""Fit the planner's latency-bandwidth model to a collective sweep (pure Python, no torch).

.. math:: t(S) = \\alpha + \\frac{S · f(op, n)}{busbw}

with S the nccl-tests payload and f the bus-bandwidth factor (``meshplan.cost.collectives.busbw_factor``):
2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv
(formulas.md §1.1; nccl-tests doc/PERFORMANCE.md).

The fit is least squares on the *relative* residual (t_fit - t)/t, i.e. weighted least squares with
weights 1/t²: an unweighted fit of a sweep spanning 1 KiB to 1 GiB is decided by the largest messages
alone and leaves alpha meaningless (often negative). If the best alpha is negative it is set to 0
and the slope refitted. The planner's own model adds a size efficiency η(S) = S/(S + S_½); in the
affine fit its effect at small sizes is absorbed into alpha.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshplan.cost.collectives import busbw_factor


@dataclass(frozen=True, slots=True, kw_only=True)
class AlphaBetaFit:
    """Result of :func:`fit_alpha_beta`."""

    alpha_s: float
    """Latency per call. [s]"""
    busbw_bytes_per_s: float
    """Asymptotic bus bandwidth, 1/slope. [bytes/s]"""
    n_points: int
    max_rel_error: float
    """Largest |t_fit - t|/t over the points. [dimensionless]"""


def algbw_bytes_per_s(message_bytes: float, time_s: float) -> float:
    """nccl-tests algorithm bandwidth S/t [bytes/s] (S: full buffer for AG/RS, per-rank buffer for a2a)."""
    return message_bytes / time_s


def busbw_bytes_per_s(op: str, n: int, message_bytes: float, time_s: float) -> float:
    """nccl-tests bus bandwidth algbw·f(op, n) [bytes/s] (formulas.md §1.1)."""
    return algbw_bytes_per_s(message_bytes, time_s) * busbw_factor(op, n)


def fit_alpha_beta(op: str, n: int, message_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBetaFit:
    """Fit t = alpha + S·f(op, n)/busbw to measured (S, t) points by relative least squares.

    Parameters
    ----------
    op : str
        'all_gather', 'reduce_scatter', 'all_reduce', 'all_to_all' or 'send_recv'.
    n : int
        Ranks in the group.
    message_bytes : sequence of float
        Payload S of each point, as nccl-tests defines it. [bytes]
    times_s : sequence of float
        Measured time of one call at each S (median). [s]

    Returns
    -------
    AlphaBetaFit
        busbw is +inf if the points show no growth with size (slope <= 0).
    """
    if len(message_bytes) != len(times_s) or len(times_s) < 2:
        raise ValueError(f"need at least two (size, time) points of equal count; got {len(message_bytes)} sizes "
                         f"and {len(times_s)} times")
    if any(t <= 0 for t in times_s):
        raise ValueError("times must be positive")
    f = busbw_factor(op, n)
    xs = [s * f for s in message_bytes]
    # Weighted normal equations for t = a + b·x with weights w = 1/t².
    w = [1.0 / (t * t) for t in times_s]
    sw = sum(w)
    swx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    swy = sum(wi * t for wi, t in zip(w, times_s, strict=True))
    swxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    swxy = sum(wi * x * t for wi, x, t in zip(w, xs, times_s, strict=True))
    det = sw * swxx - swx * swx
    if det > 0:
        b = (sw * swxy - swx * swy) / det
        a = (swy - b * swx) / sw
    else:
        a, b = swy / sw, 0.0
    if a < 0:
        a, b = 0.0, swxy / swxx if swxx > 0 else 0.0
    if b < 0:
        a, b = swy / sw, 0.0
    busbw = 1.0 / b if b > 0 else float("inf")
    max_rel = max(abs(a + b * x - t) / t for x, t in zip(xs, times_s, strict=True))
    return AlphaBetaFit(alpha_s=a, busbw_bytes_per_s=busbw, n_points=len(xs), max_rel_error=max_rel)
