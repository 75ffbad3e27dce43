"""The torch-free parts of `meshplan measure`: the alpha-beta fit, nccl-tests bandwidths, GEMM shapes,
exposed communication from a trace, and the profile file (merge, schema)."""

import pytest

from meshplan import load_model, parse_plan
from meshplan.harness.measure.fit import busbw_bytes_per_s, fit_alpha_beta
from meshplan.harness.measure.profile_io import check_profile, merge_profiles, new_profile
from meshplan.harness.measure.shapes import plan_gemm_shapes
from meshplan.harness.measure.trace import exposed_comm_s, union


def test_fit_alpha_beta_recovers_exact_model():
    """t = 50 us + S·2(n-1)/n / 10 GB/s for an all-reduce on 4 ranks is fitted back exactly."""
    sizes = [2**k for k in range(10, 27, 2)]
    times = [50e-6 + s * 2 * 3 / 4 / 10e9 for s in sizes]
    fit = fit_alpha_beta("all_reduce", 4, sizes, times)
    assert fit.alpha_s == pytest.approx(50e-6, rel=1e-9)
    assert fit.busbw_bytes_per_s == pytest.approx(10e9, rel=1e-9)
    assert fit.n_points == len(sizes) and fit.max_rel_error < 1e-9


def test_fit_alpha_beta_clamps_negative_alpha():
    sizes = [1e3, 1e6, 1e9]
    times = [1e-7, 1.2e-4, 0.1]  # a line through these has a negative intercept
    fit = fit_alpha_beta("all_gather", 2, sizes, times)
    assert fit.alpha_s == 0.0 and fit.busbw_bytes_per_s > 0


@pytest.mark.parametrize(("op", "n", "factor"), [("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8),
                                                 ("reduce_scatter", 4, 3 / 4), ("all_to_all", 2, 1 / 2),
                                                 ("send_recv", 2, 1.0)])
def test_busbw_nccl_tests_factors(op, n, factor):
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw · factor (formulas.md §1.1)."""
    assert busbw_bytes_per_s(op, n, 1e9, 0.5) == pytest.approx(2e9 * factor, rel=1e-12)


def test_plan_gemm_shapes_llama3_8b_tp2():
    """Llama-3-8B (D 4096, 32/8 heads of 128, F 14336, V 128256) under tp=2, cp=2, mbs=2 at S=4096:
    T = 2·4096/2 = 4096 tokens; qkv (4096+2·1024)/2 = 3072, out 4096/2, MLP 2·14336/2 and 14336/2."""
    shapes = plan_gemm_shapes(load_model("llama-3-8b"), parse_plan("tp=2,cp=2,mbs=2"), seq_len=4096)
    got = {s.name: (s.m, s.k, s.n) for s in shapes}
    assert got == {"attention.qkv": (4096, 4096, 3072), "attention.out": (4096, 2048, 4096),
                   "mlp.in": (4096, 4096, 14336), "mlp.out": (4096, 7168, 4096), "lm_head": (4096, 4096, 64128)}
    assert shapes[0].flop == 2 * 4096 * 4096 * 3072


def test_plan_gemm_shapes_rejects_indivisible_tp():
    with pytest.raises(ValueError, match="tp=3"):
        plan_gemm_shapes(load_model("llama-3-8b"), parse_plan("tp=3"), seq_len=128)


def _x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_exposed_comm_gpu_kernels():
    """NCCL kernel [0, 10] us against compute [5, 20] us: 5 us exposed out of 10."""
    trace = {"traceEvents": [_x("ncclDevKernel_AllGather_RING_LL", 0, 10, tid=7, cat="kernel"),
                             _x("sm90_gemm_bf16", 5, 15, tid=8, cat="kernel")]}
    exposed, total = exposed_comm_s(trace)
    assert exposed == {"all_gather": pytest.approx(5e-6)} and total == {"all_gather": pytest.approx(10e-6)}


def test_exposed_comm_gloo_threads_typed_by_launch():
    """gloo runs reduce-scatter as 'gloo:all_reduce' on its own thread; the launching c10d op names it.
    Compute is the leaf ops of the step thread: aten::mm [10, 40] and [45, 50] hide 35 of [2, 52] us."""
    trace = {"traceEvents": [
        _x("meshplan.step", 0, 100, cat="user_annotation"),
        _x("c10d::_reduce_scatter_base_", 0, 1),
        _x("gloo:all_reduce", 2, 50, tid=2, cat="user_annotation"),
        _x("aten::linear", 10, 30), _x("aten::mm", 10, 30),
        _x("aten::mm", 45, 5)]}
    exposed, total = exposed_comm_s(trace)
    assert total == {"reduce_scatter": pytest.approx(50e-6)}
    assert exposed == {"reduce_scatter": pytest.approx(15e-6)}


def test_union_merges_overlaps():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]


def _profile(**kw):
    p = new_profile(device="cpu", backend="gloo", world_size=2, nproc_per_node=2)
    p.update(kw)
    return p


def test_merge_profiles_replaces_remeasured_entries_and_keeps_the_rest():
    g1 = {"m": 1, "n": 2, "k": 3, "dtype": "bf16", "median_s": 1.0, "p10_s": 1.0, "p90_s": 1.0, "flop_per_s": 12.0}
    g2 = {**g1, "m": 4, "flop_per_s": 5.0}
    c = {"op": "all_reduce", "link": "intra_node", "group_size": 2, "message_bytes": 1024, "median_s": 1e-4,
         "algbw_bytes_per_s": 1.0, "busbw_bytes_per_s": 1.0}
    fit = {"alpha_s": 1e-4, "busbw_bytes_per_s": 1e9, "group_size": 2, "n_points": 9}
    old = _profile(gemm=[g1, g2], collectives=[c], collective_fits={"all_reduce@intra_node": fit})
    new = _profile(gemm=[{**g1, "flop_per_s": 20.0}])
    merged = merge_profiles(old, new)
    assert sorted(g["flop_per_s"] for g in merged["gemm"]) == [5.0, 20.0]
    assert merged["gemm_best_flop_per_s"] == 20.0
    assert merged["collectives"] == [c] and merged["collective_fits"] == {"all_reduce@intra_node": fit}
    assert check_profile(merged) == []


def test_check_profile_names_every_problem():
    bad = _profile(collective_fits={"all_reduce@nvlink": {"alpha_s": -1.0}})
    bad["backend"] = "mpi"
    errors = check_profile(bad)
    assert any("backend" in e for e in errors)
    assert any("all_reduce@nvlink" in e for e in errors)
