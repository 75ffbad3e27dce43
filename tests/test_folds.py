"""The cross-validation's folds and the fit's pattern move (validation.calibrate)."""

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import stub_row

from meshplan.validation import calibrate
from meshplan.validation.calibrate import Param, folds

KINDS = [("h100", "megatron", False), ("h100", "megatron", True), ("b200", "megatron", True),
         ("a100", "llm-foundry", False), ("gb300", "megatron", True)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(KINDS))), min_size=1, max_size=120), st.integers(2, 7))
def test_folds_partition_the_rows_and_spread_every_stratum_evenly(kinds, k):
    rows = [stub_row(row=i, accelerator=KINDS[j][0], software=KINDS[j][1], moe=KINDS[j][2])
            for i, j in enumerate(kinds)]
    parts = folds(rows, k)
    assert len(parts) == k
    assert sorted(r.row for p in parts for r in p) == list(range(len(rows)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= len(set(kinds))  # each stratum adds at most one row's difference
    for j in set(kinds):
        per_fold = [sum(1 for r in p if kinds[r.row] == j) for p in parts]
        assert max(per_fold) - min(per_fold) <= 1, (j, per_fold)


def test_folds_do_not_depend_on_the_order_rows_come_in():
    rows = [stub_row(row=i, moe=i % 3 == 0, accelerator="h100" if i % 2 else "b200") for i in range(50)]
    a = [sorted(r.row for r in p) for p in folds(rows, 5)]
    b = [sorted(r.row for r in p) for p in folds(rows[::-1], 5)]
    assert a == b


def test_a_row_dropped_moves_only_rows_of_its_own_stratum():
    rows = [stub_row(row=i, accelerator=KINDS[i % 5][0], software=KINDS[i % 5][1], moe=KINDS[i % 5][2])
            for i in range(200)]
    before = {r.row: f for f, p in enumerate(folds(rows, 5)) for r in p}
    after = {r.row: f for f, p in enumerate(folds(rows[:37] + rows[38:], 5)) for r in p}
    moved = {i for i in after if after[i] != before[i]}
    assert moved and all(i % 5 == 37 % 5 for i in moved)


def test_a_small_stratum_is_not_left_to_one_fold():
    """Five MoE rows among a hundred dense ones: each fold holds out one of them and trains on four."""
    rows = [stub_row(row=i) for i in range(100)] + [stub_row(row=100 + i, moe=True) for i in range(5)]
    held = Counter(sum(1 for r in p if r.scenario.model.is_moe) for p in folds(rows, 5))
    assert held == Counter({1: 5})


def test_the_pattern_move_runs_down_a_valley_and_never_climbs(monkeypatch):
    """Two parameters that trade off (the loss depends on x - y, and weakly on x + y): coordinate steps
    creep along the valley; the move extrapolates the round's step and must not raise the loss."""
    space = [Param("x", "global", -10.0, 10.0), Param("y", "global", -10.0, 10.0)]
    state = calibrate.empty_state()

    def valley(rows, st) -> float:
        x, y = st["global"]["x"], st["global"]["y"]
        return 100 * (x - y) ** 2 + (x + y - 6) ** 2

    monkeypatch.setattr(calibrate, "total_loss", valley)
    state["global"].update(x=1.0, y=1.0)
    before = valley(None, state)
    calibrate._pattern_move([], state, space, [0.0, 0.0], [1.0, 1.0])
    after = valley(None, state)
    assert after < before
    assert math.isclose(state["global"]["x"], 3.0, abs_tol=0.05) and math.isclose(state["global"]["y"], 3.0,
                                                                                     abs_tol=0.05)
    # a step that led uphill is not extrapolated further
    state["global"].update(x=3.0, y=3.0)
    calibrate._pattern_move([], state, space, [2.0, 2.0], [3.0, 3.0])
    assert (state["global"]["x"], state["global"]["y"]) == (3.0, 3.0)  # the round's end, exactly


def test_the_pattern_move_steps_log_parameters_by_ratios_within_their_bounds(monkeypatch):
    """A log-scaled parameter that went 2 -> 4 in a round is extrapolated to 8, 16, ... (the same ratio per
    step), never past its upper bound."""
    space = [Param("x", "global", 1.0, 10.0, log=True)]
    state = calibrate.empty_state()
    monkeypatch.setattr(calibrate, "total_loss", lambda rows, st: (math.log(st["global"]["x"]) - math.log(8)) ** 2)
    state["global"]["x"] = 4.0
    calibrate._pattern_move([], state, space, [2.0], [4.0])
    assert math.isclose(state["global"]["x"], 8.0, rel_tol=0.02)
    # towards a target beyond the bound: stops at the bound
    monkeypatch.setattr(calibrate, "total_loss", lambda rows, st: -st["global"]["x"])
    state["global"]["x"] = 4.0
    calibrate._pattern_move([], state, space, [2.0], [4.0])
    assert state["global"]["x"] == 10.0
