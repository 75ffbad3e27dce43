"""Time to train, cost, energy and goodput: pure functions of base units (seconds, bytes, watts, joules,
dollars, GPU-hours as named).

Symbols: T_s the failure-free training time (steps x step time), n GPUs, r failures per GPU-hour, M the
job's mean time between interruptions, δ the time to write one checkpoint, R the time to restart from it
(re-launch, re-load, warm-up), τ the compute time between checkpoints, P the board power of one GPU, PUE
the facility's power usage effectiveness.

References
----------
[young1974] J. W. Young, "A first order approximation to the optimum checkpoint interval," Commun. ACM
    17(9):530-531, 1974: τ = sqrt(2 δ M).
[daly2006] J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps,"
    Future Generation Computer Systems 22(3):303-312, 2006, doi:10.1016/j.future.2004.11.016: the expected
    wall time under Poisson failures that may strike during computation, checkpoint and restart alike,
    T_w = M e^{R/M} (e^{(τ+δ)/M} - 1) T_s / τ, and its optimum to higher order,
    τ = sqrt(2δM) [1 + (1/3) sqrt(δ/(2M)) + (1/9) δ/(2M)] - δ for δ < 2M, τ = M otherwise. The paper's
    Figures 3-5 give τ = 117, 57 and 9.1 min for δ = 5 min, R = 10 min and M = 24 h, 6 h and 15 min.
"""

from __future__ import annotations

import math

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
JOULES_PER_KWH = 3.6e6


def train_steps(train_tokens: int, global_batch_tokens: int) -> int:
    """Optimizer steps to train on ``train_tokens`` tokens in batches of ``global_batch_tokens`` [steps]:
    ceil(D / B), the last batch a whole one."""
    return -(-train_tokens // global_batch_tokens)


def train_time_s(steps: int, step_time_s: float) -> float:
    """Failure-free training time T_s = steps x step time [s]."""
    return steps * step_time_s


def gpu_hours(time_s: float, n_gpus: int) -> float:
    """GPU-hours of ``n_gpus`` held for ``time_s`` seconds [GPU-h]."""
    return time_s * n_gpus / SECONDS_PER_HOUR


def cost_usd(gpu_hours_: float, price_usd_per_gpu_hour: float) -> float:
    """What the GPU-hours cost at a price per GPU-hour [USD]."""
    return gpu_hours_ * price_usd_per_gpu_hour


def energy_j(time_s: float, n_gpus: int, board_power_w: float, pue: float) -> float:
    """Facility energy of ``n_gpus`` boards drawing ``board_power_w`` for ``time_s`` [J]:
    E = t · n · P · PUE. PUE (total facility power over IT power, ISO/IEC 30134-2) carries cooling and power
    conversion; the hosts' CPUs, memory and network are not in P (they are inside the node's measured
    power, which the H100's datasheet TDP understates: see the catalog's board_power_w sources)."""
    return time_s * n_gpus * board_power_w * pue


def job_mtbf_s(failures_per_gpu_hour: float, n_gpus: int) -> float:
    """The job's mean time between interruptions M [s]: independent GPUs failing at r per GPU-hour each
    interrupt a synchronous job at n·r per hour, M = 3600 / (n r). Infinite where r = 0."""
    rate_per_s = failures_per_gpu_hour * n_gpus / SECONDS_PER_HOUR
    return math.inf if rate_per_s == 0 else 1.0 / rate_per_s


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints [s] [young1974]:
    τ = sqrt(2 δ M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints [s] [daly2006]:

    .. math:: τ = \\sqrt{2δM}\\,[1 + \\tfrac13 \\sqrt{δ/(2M)} + \\tfrac19\\, δ/(2M)] - δ \\quad (δ < 2M),
              \\qquad τ = M \\quad (δ ≥ 2M)

    It minimises ``expected_wall_time_s`` to within 0.5 % of the minimum wall time for δ/M up to 2
    (tests/test_economics.py checks it numerically)."""
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s


def _log_expm1(x: float) -> float:
    """log(e^x - 1), without overflow for large x."""
    return math.log(math.expm1(x)) if x < 30.0 else x + math.log1p(-math.exp(-x))


def goodput_fraction(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The share of wall time that trains the model, T_s / T_w [daly2006]:

    .. math:: G = \\frac{τ}{M\\, e^{R/M}\\,(e^{(τ+δ)/M} - 1)}

    Failures arrive as a Poisson process of mean interval M and may strike during computation, checkpoint
    writes and restarts alike; each loses the work since the last checkpoint and costs a restart. As M
    grows G tends to τ/(τ+δ) (the checkpoints alone), and to 1 with no failures and no checkpoints
    (M infinite). Computed in log space: where the job can make no progress (M far below R + τ + δ) G
    underflows to 0 rather than overflowing."""
    if math.isinf(mtbf_s):
        return 1.0 if math.isinf(interval_s) else interval_s / (interval_s + checkpoint_s)
    log_g = (math.log(interval_s / mtbf_s) - restart_s / mtbf_s
             - _log_expm1((interval_s + checkpoint_s) / mtbf_s))
    return math.exp(min(log_g, 0.0))


def expected_wall_time_s(solve_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                         mtbf_s: float) -> float:
    """Expected wall time to complete ``solve_s`` seconds of failure-free training [s] [daly2006]:
    T_w = T_s / G (``goodput_fraction``); infinite where G underflows to 0."""
    g = goodput_fraction(interval_s, checkpoint_s, restart_s, mtbf_s)
    return math.inf if g == 0.0 else solve_s / g
