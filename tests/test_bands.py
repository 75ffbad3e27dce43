"""The uncertainty band and its leave-one-out coverage (validation.calibrate)."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import stub_row as _row

from meshplan.validation.calibrate import BAND_MIN_ROWS, band_coverage, uncertainty_bands


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
