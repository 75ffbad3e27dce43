"""Golden values: the worked example's figures, reproduced by --assumptions worked-example to three
significant digits. Source: shared/seed/worked-example.md (quoted in docs/worked_example.md)."""

import pytest
from tests.helpers import worked_example

from meshplan import Plan, evaluate_simplified

REL = 5e-3  # three significant digits


def _sum(est, axis, field="bytes_per_gpu"):
    return sum(getattr(e, field) for e in est.comm if e.axis == axis)


def test_static_memory_ddp_is_1120_gb():
    m, c, j = worked_example()
    est = evaluate_simplified(m, c, j, Plan(dp_replicate=64), mfu=0.4)
    assert est.memory.static_bytes == pytest.approx(1120e9, rel=REL)
    assert not est.feasible


def test_static_memory_full_shard_is_17_5_gb():
    m, c, j = worked_example()
    est = evaluate_simplified(m, c, j, Plan(dp_shard=64), mfu=0.4)
    assert est.memory.static_bytes == pytest.approx(17.5e9, rel=REL)


def test_flops_per_step_1_76e18():
    m, c, j = worked_example()
    est = evaluate_simplified(m, c, j, Plan(dp_shard=64), mfu=0.4)
    assert est.flops.model_flop_per_step == pytest.approx(1.76e18, rel=REL)


@pytest.mark.parametrize(("mfu", "step_s"), [(0.4, 69.6), (1.0, 27.8)])
def test_step_time_at_mfu(mfu, step_s):
    m, c, j = worked_example()
    assert evaluate_simplified(m, c, j, Plan(dp_shard=64), mfu=mfu).step_time_s == pytest.approx(step_s, rel=REL)


def test_fsdp_traffic_413_gb_and_8_3_s():
    m, c, j = worked_example()
    est = evaluate_simplified(m, c, j, Plan(dp_shard=64), mfu=0.4)
    assert _sum(est, "dp_shard") == pytest.approx(413e9, rel=REL)
    assert _sum(est, "dp_shard", "time_s") == pytest.approx(8.27, rel=REL)


def test_one_million_token_batch_step_17_4_s():
    m, c, j = worked_example(batch_tokens=1_048_576)
    est = evaluate_simplified(m, c, j, Plan(dp_shard=64), mfu=0.4)
    assert est.step_time_s == pytest.approx(17.4, rel=REL)
    assert _sum(est, "dp_shard", "time_s") / est.step_time_s == pytest.approx(0.48, abs=0.005)


def test_tp8_fsdp8_traffic():
    m, c, j = worked_example()
    est = evaluate_simplified(m, c, j, Plan(tp=8, dp_shard=8), mfu=0.4)
    assert _sum(est, "dp_shard") == pytest.approx(45.9e9, rel=REL)
    assert _sum(est, "dp_shard", "time_s") == pytest.approx(0.919, rel=REL)
    tp = [e for e in est.comm if e.axis == "tp"]
    assert len(tp) == 1
    assert tp[0].message_bytes == pytest.approx(8.6e9, rel=REL)
    assert tp[0].bytes_per_gpu / tp[0].count == pytest.approx(15.0e9, rel=REL)
    assert tp[0].bytes_per_gpu == pytest.approx(4.8e12, rel=REL)
    assert tp[0].time_s == pytest.approx(10.7, rel=REL)
    assert tp[0].link == "intra_node"
    assert [e.link for e in est.comm if e.axis == "dp_shard"] == ["inter_node"] * 3
