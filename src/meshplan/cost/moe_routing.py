"""Per-micro-batch expert load: the routed token copies the busiest expert-parallel rank processes.

The ep ranks of an expert-parallel group route N tokens per micro-batch between them (each rank's own
T tokens: N = ep·T); every token picks k distinct experts of E, and a rank holds g = E/ep consecutive
experts (Megatron-core's placement). On average a rank receives N·k/ep copies. The slowest rank sets the
pace: the all-to-all waits for it, and so does every rank's next layer.

**Sampling floor.** A router that balances its experts' *expected* loads (an auxiliary loss, or DeepSeek's
auxiliary-loss-free bias) balances over a step, not within a micro-batch: each micro-batch is a finite
sample, and its loads spread. The least spread any router can have is that of routing every token to k
experts drawn uniformly at random, and that is exactly what Megatron-core does under
``moe_router_force_load_balancing`` (random normal logits per token and rank, ``RandomSTE`` in
``megatron/core/transformer/moe/moe_utils.py``; applied in ``router.py`` before the top-k, "only for
benchmark"). NVIDIA's Megatron-Bridge performance recipes set it for every MoE model they publish
(``set_gpt_oss_common_configs`` and the Qwen3, DeepSeek and Kimi configs of
``scripts/performance/configs/*/*_llm_pretrain.py``, Nov 2025 - Jul 2026; ``perf_recipes/*`` since), and
their performance tables say so ("MoE runs force-balance tokens across experts"). For those runs the load
statistics below are not an approximation of the router but its definition.

A token's copies on one rank follow a hypergeometric law (k draws without replacement from E, g of them
on the rank): mean k·g/E, variance k·(g/E)·(1 - g/E)·(E - k)/(E - 1). With group-limited routing
(DeepSeek-V3: experts in G groups, a token's from ``topk_groups`` of them, arXiv:2412.19437 §2.1.2) the
draws come from the chosen groups' pool, and the variance follows by total variance over which of the
rank's groups were chosen (``copies_on_rank_moments``). The N tokens route independently, so a rank's
load has mean N·k·g/E and variance N times the token's. The ep loads sum to exactly N·k, so they are
exchangeable with correlation -1/(ep - 1); in the normal approximation (N·k·g/E copies per rank is in the
thousands in any training run) the busiest rank's expected load is

.. math:: \\mu + \\sigma \\sqrt{\\tfrac{ep}{ep-1}}\\, z_{ep},\\qquad z_n = E[\\max_{i \\le n} Y_i],\\ Y_i \\sim N(0, 1)

(``expected_max_std_normal``). For the published MoE layouts this is 0.5-1.5 % above the mean (GPT-OSS-120B
at EP=8, 16,384 tokens per rank: +0.55 %; DeepSeek-V3 at EP=64, 4,096 tokens per rank: +1.3 %): sampling
alone does not make routing imbalance large. A learned router adds a systematic skew on top
(``JobSpec.moe_routing_imbalance``, the busiest rank's expected load over the mean; 1.0 where the
expected loads are equal, as under forced balance): meshplan does not estimate it, since no public
measurement gives it per micro-batch for a router and a layout (docs/moe.md, Sources).

**Capacity.** Megatron-core's token dropping (``moe_expert_capacity_factor`` c) caps each expert at c
times its balanced share; with ``moe_pad_expert_input_to_capacity`` every expert is padded up to it, so
every rank processes exactly c times the mean, whatever the routing (Megatron-Bridge 25.09's "tokendrop"
runs: c = 1.0, padded, ``apply_moe_token_drop``). Dropped but not padded, the busiest rank processes the
smaller of its dropless load and the cap (an upper bound: experts of one rank cap separately).
"""

from __future__ import annotations

import functools
import math

from meshplan.specs import JobSpec, ModelSpec
from meshplan.specs.job import TOKEN_DROPS


@functools.cache
def expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normal variables] [dimensionless]: 0 for n = 1, 1/sqrt(pi) for 2,
    about 1.424 for 8, 2.070 for 32, 2.344 for 64.

    Computed as the integral of x·n·phi(x)·Phi(x)^(n-1) by the trapezoidal rule on [-8, 8] (exact to about
    1e-9 for n up to 10^6; the tail beyond 8 standard deviations holds less than n·6e-16 of the mass)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if n == 1:
        return 0.0
    steps, lo, hi = 4000, -8.0, 8.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        f = x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)
        total += f * (0.5 if i in (0, steps) else 1.0)
    return total * h


def _hypergeometric_moments(pool: float, on_rank: float, k: int) -> tuple[float, float]:
    """Mean and variance of how many of k distinct draws from ``pool`` experts fall among ``on_rank``."""
    if on_rank <= 0 or pool <= 0:
        return 0.0, 0.0
    p = on_rank / pool
    finite = (pool - k) / (pool - 1) if pool > 1 else 0.0
    return k * p, k * p * (1.0 - p) * finite


def copies_on_rank_moments(n_experts: int, top_k: int, local_experts: float, n_groups: int = 0,
                           topk_groups: int = 0) -> tuple[float, float]:
    """Mean and variance of the number of one token's ``top_k`` routed copies that land on a rank holding
    ``local_experts`` consecutive experts of ``n_experts`` [copies], experts drawn uniformly.

    With group-limited routing (``n_groups`` G equal groups of consecutive experts, ``topk_groups`` of them
    chosen uniformly, the k experts then drawn from their pool P = topk_groups·E/G): a rank inside one group
    holds its experts only when that group is chosen (probability topk_groups/G); a rank holding j whole
    groups (hypergeometric in the groups chosen) holds J·E/G of the pool. Group layouts that do not nest
    with the ranks are taken as ungrouped (the variance of uniform draws over all E)."""
    E, k, g, G, tg = n_experts, top_k, float(local_experts), n_groups, topk_groups
    if E <= 0 or k <= 0 or g <= 0:
        return 0.0, 0.0
    if not (G and tg):
        return _hypergeometric_moments(E, g, k)
    per_group = E / G
    inside_one = g <= per_group and per_group % g == 0
    whole_groups = g >= per_group and g % per_group == 0
    if not (inside_one or whole_groups):
        return _hypergeometric_moments(E, g, k)
    pool = tg * per_group
    if g <= per_group:  # the rank lies inside one group: chosen or not
        cases = [(tg / G, g), (1.0 - tg / G, 0.0)]
    else:  # the rank holds j whole groups, J of them chosen
        j = round(g / per_group)
        cases = [(math.comb(j, i) * math.comb(G - j, tg - i) / math.comb(G, tg), i * per_group)
                 for i in range(min(j, tg) + 1)]
    mean = second = 0.0
    for prob, share in cases:
        m, v = _hypergeometric_moments(pool, share, k)
        mean += prob * m
        second += prob * (v + m * m)
    return mean, max(0.0, second - mean * mean)


def sampling_load_factor(group_tokens: float, n_experts: int, top_k: int, ep: int, n_groups: int = 0,
                         topk_groups: int = 0) -> float:
    """The busiest of ``ep`` ranks' expected routed copies over the mean, for ``group_tokens`` tokens
    routed uniformly at random in one micro-batch (module docstring) [dimensionless, >= 1]."""
    if ep <= 1 or group_tokens <= 0 or n_experts <= 0:
        return 1.0
    mean, var = copies_on_rank_moments(n_experts, top_k, n_experts / ep, n_groups, topk_groups)
    if mean <= 0:
        return 1.0
    cv = math.sqrt(var / group_tokens) / mean  # of one rank's load: sqrt(N·var) / (N·mean)
    return 1.0 + cv * math.sqrt(ep / (ep - 1)) * expected_max_std_normal(ep)


def busiest_rank_load_factor(group_tokens: float, n_experts: int, top_k: int, ep: int, *,
                             token_drop: str = "dropless", capacity_factor: float = 1.0,
                             router_skew: float = 1.0, n_groups: int = 0, topk_groups: int = 0) -> float:
    """Routed copies the busiest expert-parallel rank processes, over the balanced mean N·k/ep
    [dimensionless].

    'dropless': the sampling floor (``sampling_load_factor``) times the router's systematic skew
    (``router_skew``, JobSpec.moe_routing_imbalance). 'pad': exactly ``capacity_factor`` on every rank.
    'drop': the smaller of the dropless load and the cap."""
    if token_drop not in TOKEN_DROPS:
        raise ValueError(f"token_drop must be one of {TOKEN_DROPS}, got {token_drop!r}")
    if token_drop == "pad":
        return capacity_factor
    dropless = router_skew * sampling_load_factor(group_tokens, n_experts, top_k, ep, n_groups, topk_groups)
    return min(dropless, capacity_factor) if token_drop == "drop" else dropless


def rank_load(model: ModelSpec, job: JobSpec, tokens_per_rank: float, ep: int) -> tuple[float, float]:
    """(what every rank sends and computes, what the busiest one receives and computes) in routed copies per
    routed token [copies / (token·k)], for ``model`` and ``job`` at ``tokens_per_rank`` routed tokens per
    rank on ``ep`` ranks.

    Padded to a capacity, every rank's experts take exactly the capacity (the first, also the second);
    otherwise each rank sends its own k copies per token (1) and the busiest receives
    ``busiest_rank_load_factor`` of the mean (dropped tokens are dropped by the router, before the
    dispatch)."""
    busiest = busiest_rank_load_factor(tokens_per_rank * ep, model.n_experts, model.top_k, ep,
                                       token_drop=job.moe_token_drop, capacity_factor=job.moe_capacity_factor,
                                       router_skew=job.moe_routing_imbalance, n_groups=model.n_expert_groups,
                                       topk_groups=model.topk_groups)
    return (job.moe_capacity_factor if job.moe_token_drop == "pad" else 1.0), busiest


def static_load_factor(job: JobSpec) -> float:
    """The busiest rank's routed copies over the mean that do not depend on the micro-batch: the padded
    capacity, or the router's skew (capped by the capacity where tokens are dropped) [dimensionless]. What
    the memory model holds activations for (the sampling spread, 0.5-1.5 % on the published layouts, is
    left to the timing)."""
    if job.moe_token_drop == "pad":
        return job.moe_capacity_factor
    if job.moe_token_drop == "drop":
        return min(job.moe_routing_imbalance, job.moe_capacity_factor)
    return job.moe_routing_imbalance
