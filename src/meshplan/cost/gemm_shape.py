"""The dense GEMM's shape curve: efficiency and time of one ``[m, k] x [k, n]`` product.

.. math:: t = \\frac{2MNK}{P · e_{max} · \\prod_{d \\in \\{M,N,K\\}} \\frac{d}{d + d_{1/2}}}

(meshplan.cost.compute's docstring: P the dense peak, e_max the part's best measured matmul efficiency,
d_{1/2} the dimension at which one factor halves, calibrated). Its own module so that the expert GEMMs'
model (meshplan.cost.grouped_gemm) and the layer model (meshplan.cost.compute) share it.
"""

from __future__ import annotations


def gemm_efficiency(m: float, n: float, k: float, *, e_max: float, half_dim: float) -> float:
    """Efficiency of an M x K by K x N GEMM [0-1]."""
    f = 1.0
    for d in (m, n, k):
        f *= d / (d + half_dim)
    return e_max * f


def gemm_time_s(m: float, n: float, k: float, *, peak_flop_per_s: float, e_max: float, half_dim: float) -> float:
    """Time of one GEMM [s]."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    eff = gemm_efficiency(m, n, k, e_max=e_max, half_dim=half_dim)
    return 2.0 * m * n * k / (peak_flop_per_s * eff)
