"""The MoE cost terms: routing load statistics, grouped GEMMs, router and permutation passes."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost.compute import gemm_time_s
from meshplan.cost.grouped_gemm import (
    GROUPED_TILE_M,
    grouped_gemm_rows,
    grouped_gemm_time_s,
    interpolate_log,
)
from meshplan.cost.moe_passes import passes_over_copies, permute_elements_per_token, router_bytes_per_token
from meshplan.cost.moe_routing import (
    busiest_rank_load_factor,
    copies_on_rank_moments,
    expected_max_std_normal,
    sampling_load_factor,
)


def test_expected_max_of_normals_matches_closed_forms_and_tables():
    # n = 2: 1/sqrt(pi); n = 3: 3/(2 sqrt(pi)); n = 8, 64: Harter's (1961) table of normal order statistics
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-7)
    assert expected_max_std_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-7)
    assert expected_max_std_normal(8) == pytest.approx(1.42360, abs=1e-4)
    assert expected_max_std_normal(64) == pytest.approx(2.34373, abs=1e-4)
    with pytest.raises(ValueError):
        expected_max_std_normal(0)


def _enumerated_moments(n_experts, top_k, local, n_groups=0, topk_groups=0):
    """Exact mean and variance of a token's copies on rank 0 (experts 0..local-1), by enumerating every
    equally likely choice: groups first (uniform), then k experts of their pool (uniform)."""
    group_sets = ([tuple(range(n_experts))] if not n_groups else
                  [tuple(e for g in gs for e in range(g * n_experts // n_groups, (g + 1) * n_experts // n_groups))
                   for gs in itertools.combinations(range(n_groups), topk_groups)])
    xs = []
    for pool in group_sets:
        picks = list(itertools.combinations(pool, top_k))
        xs += [(sum(e < local for e in p), 1 / (len(group_sets) * len(picks))) for p in picks]
    mean = sum(x * w for x, w in xs)
    return mean, sum((x - mean) ** 2 * w for x, w in xs)


@pytest.mark.parametrize(("experts", "k", "local", "groups", "topk_groups"), [
    (8, 2, 2, 0, 0), (12, 3, 4, 0, 0), (16, 4, 2, 4, 2), (16, 4, 8, 4, 2), (16, 2, 4, 4, 2), (16, 3, 1, 4, 2),
])
def test_copies_on_a_rank_match_exact_enumeration(experts, k, local, groups, topk_groups):
    mean, var = copies_on_rank_moments(experts, k, local, groups, topk_groups)
    exact_mean, exact_var = _enumerated_moments(experts, k, local, groups, topk_groups)
    assert mean == pytest.approx(exact_mean, rel=1e-12)
    assert var == pytest.approx(exact_var, rel=1e-12)


def test_sampling_load_factor_matches_a_simulated_random_router():
    """Tokens routed to k experts uniformly at random (Megatron-core's forced balancing): the busiest of 8
    ranks' mean load, simulated, against the normal-approximation formula."""
    experts, k, ep, tokens, trials = 32, 4, 8, 2000, 400
    rng = random.Random(7)
    local = experts // ep
    total = 0.0
    for _ in range(trials):
        loads = [0] * ep
        for _ in range(tokens):
            for e in rng.sample(range(experts), k):
                loads[e // local] += 1
        total += max(loads) / (tokens * k / ep)
    assert sampling_load_factor(tokens, experts, k, ep) == pytest.approx(total / trials, abs=0.004)


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(64, 10**6), ep=st.sampled_from([2, 4, 8, 16, 32, 64]),
       k=st.sampled_from([1, 2, 4, 8]))
def test_sampling_load_factor_shrinks_with_more_tokens(tokens, ep, k):
    experts = 256
    f = sampling_load_factor(tokens, experts, k, ep)
    assert f >= 1.0
    assert sampling_load_factor(4 * tokens, experts, k, ep) < f
    assert sampling_load_factor(tokens, experts, k, 1) == 1.0


def test_capacity_drops_and_pads():
    dropless = busiest_rank_load_factor(4096, 64, 2, 8)
    assert dropless > 1.0
    assert busiest_rank_load_factor(4096, 64, 2, 8, token_drop="pad", capacity_factor=1.0) == 1.0
    assert busiest_rank_load_factor(4096, 64, 2, 8, token_drop="pad", capacity_factor=1.25) == 1.25
    assert busiest_rank_load_factor(4096, 64, 2, 8, token_drop="drop", capacity_factor=1.0) == 1.0
    assert busiest_rank_load_factor(4096, 64, 2, 8, token_drop="drop", capacity_factor=2.0) == dropless
    assert busiest_rank_load_factor(4096, 64, 2, 8, router_skew=1.2) == pytest.approx(1.2 * dropless)
    with pytest.raises(ValueError):
        busiest_rank_load_factor(4096, 64, 2, 8, token_drop="none")


PEAK, E_MAX, HALF = 989e12, 0.7, 500.0
HBM = 3.35e12


def test_per_expert_gemms_cost_the_sum_of_dense_gemms_when_compute_bound():
    t = grouped_gemm_time_s(2048, 16, 4096, 7168, kernel="per_expert", peak_flop_per_s=PEAK, e_max=E_MAX,
                            half_dim=HALF, hbm_bytes_per_s=HBM)
    one = gemm_time_s(2048, 4096, 7168, peak_flop_per_s=PEAK, e_max=E_MAX, half_dim=HALF)
    assert t == pytest.approx(16 * one, rel=1e-12)


def test_a_grouped_kernel_pools_rows_and_pads_each_segment():
    assert grouped_gemm_rows(300, 4, "grouped") == 4 * (300 + GROUPED_TILE_M / 2)
    assert grouped_gemm_rows(300, 4, "per_expert") == 1200
    # few tokens per expert, many experts: the pooled kernel is faster than one GEMM per expert ...
    kw = dict(peak_flop_per_s=PEAK, e_max=E_MAX, half_dim=HALF, hbm_bytes_per_s=HBM)
    pooled = grouped_gemm_time_s(256, 32, 4096, 7168, kernel="grouped", **kw)
    alone = grouped_gemm_time_s(256, 32, 4096, 7168, kernel="per_expert", **kw)
    assert pooled < alone
    # ... and as DeepGEMM's H800 table has it (README @55ab91f: 4 x 256 tokens at 932 TFLOP/s, a lone GEMM
    # of 128 at 533 and of 4,096 at 1,265), its rate lies between a lone small GEMM's and a large one's
    def rate(m, g, kernel):
        return 2 * m * g * 4096 * 7168 / grouped_gemm_time_s(m, g, 4096, 7168, kernel=kernel, **kw)
    assert rate(128, 1, "per_expert") < rate(256, 4, "grouped") < rate(4096, 1, "per_expert")


def test_few_tokens_per_expert_are_held_to_the_memory_floor():
    # a shape curve that forgives small m (half-dimension 16 elements) would put one token per expert
    # above the GPU's memory bandwidth; the weights must still be read
    kw = dict(peak_flop_per_s=PEAK, e_max=E_MAX, half_dim=16.0, hbm_bytes_per_s=HBM)
    t = grouped_gemm_time_s(1, 32, 4096, 7168, kernel="per_expert", **kw)
    weights_s = 2.0 * 32 * 4096 * 7168 / HBM
    assert t == pytest.approx(weights_s, rel=0.01)
    assert grouped_gemm_time_s(4096, 32, 4096, 7168, kernel="per_expert", **kw) > 10 * weights_s  # compute-bound


def test_measured_points_replace_the_analytic_curve():
    kw = dict(peak_flop_per_s=PEAK, e_max=E_MAX, half_dim=HALF, hbm_bytes_per_s=HBM)
    measured = ((128.0, 0.5), (2048.0, 0.9))
    t = grouped_gemm_time_s(512, 8, 4096, 4096, kernel="per_expert", measured=measured, **kw)
    eff = E_MAX * interpolate_log(measured, 512)
    assert t == pytest.approx(2 * 512 * 8 * 4096 * 4096 / (PEAK * eff))
    assert interpolate_log(measured, 512) == pytest.approx(0.5 + 0.4 * 2 / 4)
    assert interpolate_log(measured, 1) == 0.5 and interpolate_log(measured, 10**6) == 0.9


def test_router_and_permutation_passes():
    assert router_bytes_per_token(256) == (17 * 256, 12 * 256)
    # one token row read, k copies written; k outputs read, one sum written (forward); the backward's
    # transposes and the probabilities' gradient (k more)
    assert permute_elements_per_token(8, 10, local_experts=1, ep=8) == (2 * 10 + 2 * 80, 2 * 10 + 3 * 80)
    # several experts on a rank: the chunk sort and unsort, each a read and a write of every copy
    fwd, bwd = permute_elements_per_token(8, 10, local_experts=4, ep=8)
    assert (fwd, bwd) == (2 * 10 + 6 * 80, 2 * 10 + 7 * 80)
    assert permute_elements_per_token(8, 10, local_experts=4, ep=8, dispatcher="flex")[0] == 2 * 10 + 2 * 80
    assert passes_over_copies(2, local_experts=1, ep=8) == (3.0, 4.0)
    with pytest.raises(ValueError):
        permute_elements_per_token(8, 10, local_experts=4, ep=8, dispatcher="deepep")


def test_an_all_to_all_across_nodes_slows_as_its_transfers_shrink():
    """The same per-rank buffer spread over more ranks: n - 1 smaller point-to-point transfers, each at its
    own size efficiency (the fan-out of a large expert-parallel all-to-all)."""
    from meshplan.catalog import load_cluster
    from meshplan.cost.collectives import ALL_TO_ALL, all_to_all_peer_efficiency, collective_time_s
    from meshplan.cost.mesh import Group

    assert all_to_all_peer_efficiency(64 * 2**20, 8, 2 * 2**20) == pytest.approx(8 / 10)
    assert all_to_all_peer_efficiency(64 * 2**20, 1, 2 * 2**20) == 1.0
    cluster = load_cluster("h100-sxm", nodes=64)
    buffer = 128 * 2**20
    per_byte = [collective_time_s(ALL_TO_ALL, buffer, Group("ep", n, 8), cluster) for n in (16, 64, 256)]
    assert per_byte[0] < per_byte[1] < per_byte[2]


def test_the_busiest_rank_sets_the_all_to_all_and_padding_sends_the_capacity():
    from meshplan import load_model
    from meshplan.cost.moe_routing import rank_load, static_load_factor
    from meshplan.specs import JobSpec

    model = load_model("deepseek-v3")
    dropless = JobSpec(global_batch_tokens=2**24, seq_len=4096)
    sent, busiest = rank_load(model, dropless, 4096, 8)
    assert sent == 1.0
    assert busiest == pytest.approx(sampling_load_factor(8 * 4096, 256, 8, 8, 8, 4))
    assert 1.0 < busiest < 1.02
    padded = JobSpec(global_batch_tokens=2**24, seq_len=4096, moe_token_drop="pad", moe_capacity_factor=1.25)
    assert rank_load(model, padded, 4096, 8) == (1.25, 1.25)
    skewed = JobSpec(global_batch_tokens=2**24, seq_len=4096, moe_routing_imbalance=1.3)
    assert rank_load(model, skewed, 4096, 8)[1] == pytest.approx(1.3 * busiest)
    assert static_load_factor(skewed) == 1.3 and static_load_factor(padded) == 1.25
    dropped = JobSpec(global_batch_tokens=2**24, seq_len=4096, moe_token_drop="drop", moe_capacity_factor=1.1,
                      moe_routing_imbalance=1.3)
    assert static_load_factor(dropped) == 1.1 and rank_load(model, dropped, 4096, 8) == (1.0, 1.1)


def test_a_dropless_job_has_no_capacity():
    from meshplan.errors import SpecError
    from meshplan.specs import JobSpec

    with pytest.raises(SpecError, match=r"job\.moe_capacity_factor"):
        JobSpec(global_batch_tokens=2**24, seq_len=4096, moe_capacity_factor=1.25)
    with pytest.raises(SpecError, match=r"job\.moe_token_drop"):
        JobSpec(global_batch_tokens=2**24, seq_len=4096, moe_token_drop="none")


def test_a_measured_expert_curve_reaches_evaluate():
    """A profile's expert-GEMM points at a plan's shapes replace the analytic curve in the step: a slower
    measured curve, a slower step; and a permutation rate, the permutation's time."""
    from dataclasses import replace

    from meshplan import load_cluster, load_model, parse_plan
    from meshplan.cost.step import evaluate
    from meshplan.specs import JobSpec
    from meshplan.specs.hardware import ExpertGemmPoint

    model = load_model("mixtral-8x7b")
    cluster = load_cluster("h100-sxm", nodes=4)
    job = JobSpec(global_batch_tokens=2**22, seq_len=4096)
    plan = parse_plan("ep=8,dp_shard=32,mbs=1,recompute=none", world_size=32)
    base = evaluate(model, cluster, job, plan)
    m = 4096 * 8 * 2 / 8  # tokens per expert at EP=8: ep·T·k/E
    points = tuple(ExpertGemmPoint(kernel="per_expert", dtype="bf16", n=n, k=k, tokens_per_expert=x,
                                   relative_efficiency=0.3)
                   for n, k in ((2 * 14336, 4096), (4096, 14336)) for x in (m / 2, 2 * m))
    slow = replace(cluster, accelerator=replace(cluster.accelerator, expert_gemm_curve=points))
    assert evaluate(model, slow, job, plan).step_time_s > 1.2 * base.step_time_s
    other = tuple(replace(p, n=p.n + 1) for p in points)  # another shape: the analytic curve stands
    elsewhere = replace(cluster, accelerator=replace(cluster.accelerator, expert_gemm_curve=other))
    assert evaluate(model, elsewhere, job, plan).step_time_s == pytest.approx(base.step_time_s)
    crawl = replace(cluster, accelerator=replace(cluster.accelerator, moe_pass_bytes_per_s=1e10))
    assert evaluate(model, crawl, job, plan).step_time_s > base.step_time_s


def test_the_fused_grouped_mlp_runs_as_one_grouped_kernel():
    from meshplan import load_accelerator, load_model
    from meshplan.calibration import compute_params_for
    from meshplan.cost.compute import layer_times

    model, accel = load_model("deepseek-v3"), load_accelerator("gb300")
    params = compute_params_for("gb300", "megatron")
    kw = dict(tokens=4096, seq_len=4096, cp=1, tp=1, precision="fp8", moe=True, expert_tokens=512.0,
              local_experts=32.0)
    per_expert = layer_times(model, accel, params, **kw)
    grouped = layer_times(model, accel, params, **kw, moe_kernel="grouped")
    assert grouped.gemm_fwd_s < per_expert.gemm_fwd_s
