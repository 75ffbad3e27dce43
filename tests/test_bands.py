"""The uncertainty band and its leave-one-out coverage (validation.calibrate)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import stub_row as _row

from meshplan.validation.calibrate import (
    BAND_MIN_ROWS,
    band_coverage,
    uncertainty_bands,
    unseen_stack_bands,
    unseen_stack_coverage,
    unseen_stack_rows,
)


def test_errors_drawn_alike_land_in_the_band_about_as_often_as_it_claims():
    rng = random.Random(7)
    rows = [_row(rng.gauss(0, 0.05)) for _ in range(300)] + [_row(rng.gauss(0, 0.2), moe=True) for _ in range(300)]
    c = band_coverage(rows)
    assert c is not None and c["nominal"] == 0.8
    assert c["all"]["rows"] == 600 and c["dense"]["rows"] == 300 and c["moe"]["rows"] == 300
    for kind in ("dense", "moe"):
        assert 0.74 <= c[kind]["inside"] <= 0.86, c
    # the MoE band is the wider one, because the kinds are kept apart
    bands = uncertainty_bands(rows)
    assert bands["h100/megatron/moe"]["high"] - bands["h100/megatron/moe"]["low"] > \
        2 * (bands["h100/megatron/dense"]["high"] - bands["h100/megatron/dense"]["low"])


def test_a_band_mixing_two_populations_misses_the_outliers():
    """A table that mixes close rows and a few far ones: the far ones fall outside a band built from the
    others, so coverage reports what the band cannot promise."""
    rows = [_row(0.01 * (i % 5 - 2)) for i in range(20)] + [_row(0.5), _row(-0.4)]
    c = band_coverage(rows)
    assert c is not None and c["all"]["rows"] == 22
    assert c["all"]["inside"] <= 20 / 22


def test_a_row_is_checked_only_against_a_band_that_has_enough_rows_without_it():
    assert band_coverage([_row(0.01 * i) for i in range(BAND_MIN_ROWS)]) is None
    assert band_coverage([_row(0.01 * i) for i in range(BAND_MIN_ROWS + 1)]) is not None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-0.5, 1.0), min_size=9, max_size=60), st.booleans())
def test_coverage_is_a_fraction_of_the_rows_with_a_band(errors, moe):
    c = band_coverage([_row(e, moe=moe) for e in errors])
    assert c is not None
    assert c["all"]["rows"] == len(errors) and 0.0 <= c["all"]["inside"] <= 1.0
    assert set(c) == {"nominal", "all", "moe" if moe else "dense"}


def test_the_unseen_stack_band_comes_from_the_rows_whose_stack_only_their_own_source_ran():
    """A stack two source groups ran (megatron) was seen by every leave-one-source-out fit: its rows stay
    out of the band of a stack the fit has no tables for; a stack one group ran was not seen when that
    group was left out, so its rows' leave-one-source-out residuals are what such a stack meets."""
    rng = random.Random(3)
    shared = [_row(0.0, software="megatron", source_group=g, lso_error=0.9) for g in ("a", "b") for _ in range(10)]
    own = [_row(0.0, software=s, source_group=s, lso_error=rng.gauss(0, 0.2)) for s in ("x", "y") for _ in range(20)]
    no_lso = [_row(0.0, software="z", source_group="z")]
    assert unseen_stack_rows(shared + own + no_lso) == own
    bands = unseen_stack_bands(shared + own + no_lso)
    assert set(bands) == {"unseen-stack", "unseen-stack/dense"} and bands["unseen-stack"]["rows"] == 40
    assert bands["unseen-stack"]["low"] < 0 < bands["unseen-stack"]["high"]


def test_a_stack_unlike_the_others_falls_outside_their_band():
    """Leave-one-stack-out coverage: each stack's rows against the band of the other stacks' rows."""
    alike = [_row(0.0, software=s, source_group=s, lso_error=0.01 * (i % 9 - 4)) for s in "xy" for i in range(18)]
    slow = [_row(0.0, software="t", source_group="t", lso_error=0.6 + 0.01 * i) for i in range(9)]
    c = unseen_stack_coverage(alike + slow)
    assert c is not None and c["rows"] == 45 and set(c["by_stack"]) == {"t", "x", "y"}
    assert c["by_stack"]["t"]["inside"] == 0.0 and c["by_stack"]["x"]["inside"] >= 0.75, c
    assert unseen_stack_coverage(alike[:18]) is None  # one stack: nothing to carry it to


def test_runs_slower_than_predicted_widen_the_band_above():
    """Every left-out run over-predicted (tokens/s too high, as torchtitan's were): measured steps are longer
    than predicted, so the band reaches further above zero than below it."""
    slow = [_row(0.0, software="t", source_group="t", lso_error=0.2 + 0.02 * i) for i in range(10)]
    b = unseen_stack_bands(slow)["unseen-stack"]
    assert 0 < b["low"] < b["high"]  # measured / predicted step - 1: every run slower than predicted
    assert b["high"] == pytest.approx(1.38 - 1, abs=0.02) and b["low"] == pytest.approx(1.2 - 1, abs=0.02)
