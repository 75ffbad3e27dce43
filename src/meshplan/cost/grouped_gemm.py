"""Time of the routed experts' GEMMs: G experts on a rank, each over its own tokens, as the kernels run them.

An MoE layer's expert GEMMs are G = E/ep products ``[m, K] x [K, N]`` of one shape (K = D, N = 2F or F for
the first, K = F, N = D for the second), m the tokens routed to each expert in the micro-batch: small,
skinny GEMMs where experts are many and tokens per expert few. How much of the GPU they reach depends on
how they are launched (``GROUPED_KERNELS``):

- ``'per_expert'``: one dense GEMM per expert. Transformer Engine's ``GroupedLinear``, which Megatron-core
  runs for ``moe_grouped_gemm`` (the NeMo / Megatron-Bridge MoE recipes), calls
  ``nvte_multi_tensor_gemm``, which launches one cuBLAS GEMM per expert on 4 compute streams
  (``multi_stream_cublas_gemm`` in ``transformer_engine/common/gemm/cublaslt_gemm.cu``, ``num_compute_streams
  = 4`` in ``util/multi_stream.cpp``; a CUTLASS grouped kernel only on Hopper, in BF16, with
  ``NVTE_USE_CUTLASS_GROUPED_GEMM=1``). Each expert's GEMM then runs at a dense GEMM's efficiency for its
  own shape, m rows: the dense shape curve (``gemm_shape.gemm_efficiency``). The 4 streams let small GEMMs share
  the GPU; no overlap is credited here (the calibrated ``ComputeParams.moe_gemm_efficiency`` holds what
  the published runs show of it, docs/moe.md).
- ``'grouped'``: one kernel over every expert's rows (CUTLASS grouped GEMM, DeepGEMM's M-grouped
  contiguous layout, PyTorch's ``torch._grouped_mm``, Transformer Engine's CuTe DSL fused grouped MLP,
  JobSpec.fused_grouped_mlp). Each expert's segment is aligned to the kernel's M tile, on average half a
  tile of padding per expert (DeepGEMM: "each expert segment must be aligned to the GEMM M block size"),
  and the kernel's tiles fill the GPU from all experts together, so its size efficiency is that of the
  whole G·m rows. DeepGEMM's published H800 figures show the difference (README @55ab91f, FP8, 2025-03):
  4 groups of 256 tokens at N = 4096, K = 7168 reach 932 TFLOP/s in one kernel, where a lone GEMM of 128
  tokens of the same N and K reaches 533 and one of 4,096 tokens 1,265; 8 groups of 4,096 reach 1,346.

Both are held to a memory floor (a roofline): every expert's weights and its activations in and out must
pass through HBM once, so a few tokens per expert make the GEMMs memory-bound (DeepGEMM's masked-layout
decode shapes, 64 tokens: 2.1-2.7 TB/s of the H800's 3.35).

Sources: TransformerEngine @d0067d0 (files above); DeepSeek-AI, DeepGEMM README @55ab91f
("Performance" tables, H800 SXM5, NVCC 12.8); T. Gale et al., "MegaBlocks: Efficient Sparse Training with
Mixture-of-Experts," MLSys 2023, arXiv:2211.15841 (block-sparse expert GEMMs in 128-row blocks).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from meshplan.cost.gemm_shape import gemm_efficiency

GROUPED_KERNELS = ("per_expert", "grouped")
"""How a rank's expert GEMMs are launched: one dense GEMM per expert, or one grouped kernel (module
docstring)."""

GROUPED_TILE_M = 128
"""Rows of the M tile a grouped kernel aligns each expert's segment to [tokens] (DeepGEMM's
``get_mk_alignment_for_contiguous_layout``, 128 on SM90; CUTLASS grouped GEMMs' usual 128-row tiles;
MegaBlocks' 128-row blocks)."""


def grouped_gemm_rows(tokens_per_expert: float, n_groups: float, kernel: str) -> float:
    """Rows a rank's expert GEMMs compute over [rows]: G·m for per-expert GEMMs (each runs its own
    rows), G·(m + tile/2) for a grouped kernel (each segment aligned to the M tile: half a tile of padding
    per expert on average, none for an empty expert)."""
    if kernel not in GROUPED_KERNELS:
        raise ValueError(f"kernel must be one of {GROUPED_KERNELS}, got {kernel!r}")
    if tokens_per_expert <= 0 or n_groups <= 0:
        return 0.0
    if kernel == "per_expert":
        return n_groups * tokens_per_expert
    return n_groups * (tokens_per_expert + GROUPED_TILE_M / 2)


def grouped_gemm_efficiency(tokens_per_expert: float, n_groups: float, n: float, k: float, *, kernel: str,
                            e_max: float, half_dim: float) -> float:
    """Share of peak the expert GEMMs reach on their rows [0-1] (before the memory floor): the dense shape
    curve (``gemm_shape.gemm_efficiency``) at each expert's m for per-expert GEMMs, at the whole G·m rows of
    a grouped kernel."""
    m = tokens_per_expert if kernel == "per_expert" else grouped_gemm_rows(tokens_per_expert, n_groups, kernel)
    return gemm_efficiency(m, n, k, e_max=e_max, half_dim=half_dim)


def grouped_gemm_time_s(tokens_per_expert: float, n_groups: float, n: float, k: float, *, kernel: str,
                        peak_flop_per_s: float, e_max: float, half_dim: float, hbm_bytes_per_s: float,
                        operand_bytes: float = 2.0, measured: Sequence[tuple[float, float]] = ()) -> float:
    """Time of one forward expert GEMM ``[m, k] x [k, n]`` on each of ``n_groups`` experts [s].

    Compute: 2·rows·n·k FLOP (``grouped_gemm_rows``) at ``peak_flop_per_s`` times the efficiency: the
    analytic shape curve (``grouped_gemm_efficiency``), or where ``measured`` holds (tokens per expert,
    efficiency) points of this shape (a ``meshplan measure moe`` profile: achieved FLOP/s over the best
    dense GEMM's, times ``e_max``), their interpolation in log m (``interpolate_log``). Memory floor: the G
    weight matrices and the activations in and out, ``operand_bytes`` per element, through
    ``hbm_bytes_per_s``. The larger of the two."""
    rows = grouped_gemm_rows(tokens_per_expert, n_groups, kernel)
    if rows <= 0 or n <= 0 or k <= 0:
        return 0.0
    if measured:  # measured as 2·G·m·n·k over the time, padding included in the time
        rows = n_groups * tokens_per_expert
        eff = e_max * interpolate_log(measured, tokens_per_expert)
    else:
        eff = grouped_gemm_efficiency(tokens_per_expert, n_groups, n, k, kernel=kernel, e_max=e_max,
                                      half_dim=half_dim)
    compute_s = 2.0 * rows * n * k / (peak_flop_per_s * eff)
    memory_s = operand_bytes * (n_groups * n * k + rows * (n + k)) / hbm_bytes_per_s
    return max(compute_s, memory_s)


def measured_points(curve: Sequence[Any], kernel: str, dtype: str, n: float, k: float
                    ) -> tuple[tuple[float, float], ...]:
    """(tokens per expert, relative efficiency) of the points of ``curve`` (AcceleratorSpec.expert_gemm_curve)
    measured at this launch, dtype and shape."""
    return tuple((p.tokens_per_expert, p.relative_efficiency) for p in curve
                 if p.kernel == kernel and p.dtype == dtype and p.n == round(n) and p.k == round(k))


def interpolate_log(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of (x, y) ``points`` in log x, held constant beyond the ends."""
    pts = sorted(points)
    xs = [p[0] for p in pts]
    if x <= xs[0]:
        return pts[0][1]
    if x >= xs[-1]:
        return pts[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + t * (y1 - y0)
