"""Pipeline bubble and in-flight micro-batches (Narayanan et al. 2021 §2.2; Qi et al. 2024)."""

import pytest

from meshplan.cost.pipeline import bubble_fraction, bubble_time_s, in_flight_microbatches


def _rate(schedule, p, m, v=1):
    """Bubble over ideal compute, t_F = t_B = t_W = 1 (formulas.md §3.9 'bubble rate')."""
    return bubble_time_s(schedule=schedule, pp=p, vpp=v, t_f_s=1, t_b_s=1, t_w_s=1) / (3 * m)


def test_1f1b_bubble_p8_m32():
    """formulas.md §7 #6: (p-1)/m = 21.9 % of ideal; (p-1)/(m+p-1) = 17.9 % of wall time."""
    assert _rate("1f1b", 8, 32) == pytest.approx(7 / 32)
    assert bubble_fraction(schedule="1f1b", pp=8, m=32, vpp=1) == pytest.approx(7 / 39)


def test_interleaved_divides_by_v():
    assert _rate("interleaved", 8, 32, 4) == pytest.approx(7 / 32 / 4)


def test_zb_h1_is_a_third_of_1f1b():
    assert _rate("zb-h1", 8, 32) == pytest.approx(7 / 32 / 3)


def test_zb_v_zero_when_times_equal():
    assert _rate("zb-v", 8, 32) == 0.0


def test_first_stage_holds_p_microbatches():
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=32, vpp=1, stage=0, layers=10) == 8
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=32, vpp=1, stage=7, layers=10) == 1
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=4, vpp=1, stage=0, layers=10) == 4
    assert in_flight_microbatches(schedule="interleaved", pp=8, m=32, vpp=2, stage=0, layers=10) == pytest.approx(
        8 * (1 + 7 / 16))
    assert in_flight_microbatches(schedule="gpipe", pp=8, m=32, vpp=1, stage=0, layers=10) == 32


def test_moe_all_to_all_overlap_holds_one_micro_batch_and_one_layer_without_a_pipeline():
    """Megatron's combined 1F1B pairs forward layer i with backward layer N-1-i and releases the latter:
    one micro-batch and one layer are alive, not two micro-batches."""
    base = in_flight_microbatches(schedule="1f1b", pp=1, m=16, vpp=1, stage=0, layers=10)
    overlap = in_flight_microbatches(schedule="1f1b", pp=1, m=16, vpp=1, stage=0, ep_overlap=True, layers=48)
    assert base == 1.0 and overlap == pytest.approx(1 + 1 / 48)
