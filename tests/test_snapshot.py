"""No unintended change of behaviour: every published row's prediction, the plans, counts and text of the
search, a set of evaluations and meshplan's side of the torch cross-checks, compared exactly (floats
included) with the outputs stored in tests/snapshots/ (tests/snapshots/README.md: what they are and when
regenerating them is legitimate)."""

import pytest
from tests.snapshots.cases import CASES, differences, load, plan_counts, plan_json


def _params() -> list:
    params = []
    for case in CASES:
        marks = [pytest.mark.slow] if case.slow else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_output_matches_the_snapshot(case):
    assert case.path.exists(), f"no stored {case.path.name}: run python -m tests.snapshots.regen {case.name}"
    now = case.make(case.argv)
    if isinstance(now, str) and not case.path.name.endswith(".txt.gz"):
        pytest.skip(now)
    stored = load(case)
    if case.make is plan_json:
        assert plan_counts(now) == plan_counts(stored), "the search's plan counts changed"
    diff = differences(stored, now)
    assert not diff, (f"meshplan {' '.join(case.argv) or case.name} differs from {case.path.name} "
                      f"(first {len(diff)} differences):\n" + "\n".join(diff))
