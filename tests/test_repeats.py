"""Rows that repeat a configuration: the least error any rescaling of the predictions can reach on them."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.validation.repeats import best_scale_error_sum, config_key, repeat_floor

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "published_runs.csv")


def test_a_pair_measured_apart_cannot_both_be_met():
    # 100 and 120 tokens/s measured, both predicted 110: the best single factor meets the faster one and
    # misses the slower by 1/6; the mean over the two rows is 1/12
    rep = repeat_floor([("g", "a", 100.0, 110.0), ("g", "a", 120.0, 110.0), ("g", "b", 50.0, 40.0)])
    assert rep["g"]["rows"] == 2 and rep["g"]["configurations"] == 1  # a configuration seen once is left out
    assert rep["g"]["floor_mape"] == pytest.approx((120 - 100) / 120 / 2)
    assert rep["g"]["mape"] == pytest.approx((0.1 + 1 / 12) / 2)
    assert rep["all"] == rep["g"]


def test_the_model_predicting_how_repeats_differ_leaves_no_floor():
    # a larger global batch measured 20 % faster, and predicted 20 % faster: one factor fits both
    assert best_scale_error_sum([(100.0, 80.0), (120.0, 96.0)]) == pytest.approx(0.0)


pairs = st.lists(st.tuples(st.floats(1.0, 1e5), st.floats(1.0, 1e5)), min_size=2, max_size=6)


@settings(max_examples=100, deadline=None)
@given(pairs=pairs, k=st.floats(0.1, 10.0))
def test_floor_is_at_most_the_model_error_and_ignores_a_common_factor(pairs, k):
    floor = best_scale_error_sum(pairs)
    assert floor <= sum(abs(p / m - 1.0) for m, p in pairs) + 1e-9  # k = 1 is a candidate
    assert best_scale_error_sum([(m, k * p) for m, p in pairs]) == pytest.approx(floor, rel=1e-9, abs=1e-9)
    grid = [0.5 + i / 100 for i in range(200)]  # no factor on a grid does better than the minimum found
    ratios = [m / p for m, p in pairs]
    scale = min(ratios)
    assert all(sum(abs(g * scale * p / m - 1.0) for m, p in pairs) >= floor - 1e-9 for g in grid)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not present")
def test_published_repeats_group_only_identical_configurations():
    from meshplan.validation.validate import load_scenarios, read_rows

    res = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    sets: dict = {}
    for r in res:
        sets.setdefault(config_key(r.scenario), []).append(r.scenario)
    repeated = [v for v in sets.values() if len(v) > 1]
    assert len(repeated) >= 20
    for v in repeated:
        a = v[0]
        for b in v[1:]:
            assert (a.model.name, a.cluster.accelerator.name, a.cluster.n_gpus, a.plan) == \
                   (b.model.name, b.cluster.accelerator.name, b.cluster.n_gpus, b.plan)
            assert (a.job.precision, a.job.seq_len, a.job.cuda_graphs) == (b.job.precision, b.job.seq_len,
                                                                           b.job.cuda_graphs)


def _scenario(row, release, mbs, measured):
    from meshplan import load_cluster, load_model, parse_plan
    from meshplan.specs import JobSpec
    from meshplan.validation.rows import Scenario

    return Scenario(row=row, source_group="g", gpu="B300", model=load_model("mixtral-8x7b"),
                    cluster=load_cluster("b300", nodes=8), job=JobSpec(global_batch_tokens=2**22, seq_len=4096),
                    plan=parse_plan(f"ep=8,dp_shard=64,mbs={mbs}", world_size=64),
                    measured_tokens_per_s_per_gpu=measured,
                    measured_from="tokens_per_sec_per_gpu", measured_step_time_s=None, measured_peak_memory_bytes=None,
                    flops_counting="", precision_label="bf16", release=release)


def test_a_layout_measured_apart_beyond_the_model_is_named_with_what_differs():
    from meshplan.validation.repeats import DISAGREEMENT, disagreeing_layouts

    a, b, c = (_scenario(1, "26.02", 1, 2644.0), _scenario(2, "26.04", 2, 5936.0), _scenario(3, "26.04", 2, 5900.0))
    # the model predicts the micro-batch 2 rows 1.35x faster; they ran 2.25x faster
    found = disagreeing_layouts([(a, 2644.0, 3000.0), (b, 5936.0, 4050.0), (c, 5900.0, 4050.0)])
    assert len(found) == 1
    d = found[0]
    assert (d.rows, d.slower_row, d.faster_row) == ((1, 2, 3), 1, 2)
    assert d.measured_ratio == pytest.approx(5936 / 2644) and d.predicted_ratio == pytest.approx(1.35)
    assert d.unexplained == pytest.approx(5936 / 2644 / 1.35)
    assert d.differs == ("release: 26.02 -> 26.04", "mbs: 1 -> 2")
    # what the model predicts of the difference is not a disagreement
    assert disagreeing_layouts([(a, 2644.0, 3000.0), (b, 5936.0, 3000.0 * 5936 / 2644)]) == []
    near = 2644.0 * DISAGREEMENT * 0.99
    assert disagreeing_layouts([(a, 2644.0, 3000.0), (b, near, 3000.0)]) == []
