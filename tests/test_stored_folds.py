"""Stored fold fits (validation.folds): written with the catalog's fit, used only for the data, folds and
rounds they were made for, and giving the same out-of-fold predictions as refitting."""

import csv
import json
import os
import tomllib

import pytest
from tests.helpers import stub_row

from meshplan.cli import main
from meshplan.validation import calibrate, command, folds

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "published_runs.csv")


def _fits(rows, k):
    """Made-up fold fits over ``folds(rows, k)``: each fold's own GEMM scale, so a mix-up shows."""
    out = []
    for i, part in enumerate(calibrate.folds(rows, k)):
        state = calibrate.empty_state()
        state["global"]["gemm_half_dim"] = 100.0 + i
        state["accelerator"]["h100"] = {"gemm_scale": 0.5 + i / 10}
        state["stack"]["llm-foundry/h100"] = {"kernel_scale": 0.9}
        out.append(calibrate.FoldFit(tuple(sorted(r.row for r in part)), state))
    return out


def _data(n):
    rows = [stub_row(row=i, moe=i % 4 == 0) for i in range(n)]
    raw = [{"model": f"m{i}", "tp": str(1 + i % 3)} for i in range(n)]
    return rows, raw


def test_fold_fits_round_trip_through_toml():
    rows, raw = _data(23)
    fits = _fits(rows, 4)
    stored = tomllib.loads(folds.to_toml(fits, rounds=8, digest=folds.data_digest(raw, rows)))
    back, why = folds.stored(stored, raw, rows, k=4, rounds=8)
    assert back is not None, why
    assert [f.held_out_rows for f in back] == [f.held_out_rows for f in fits]
    assert [f.state for f in back] == [f.state for f in fits]  # values chosen to survive six digits


@pytest.mark.parametrize("change, reason", [
    ({"k": 5}, "not 5 of 8"),
    ({"rounds": 3}, "not 4 of 3"),
    ({"edit": True}, "other data"),
    ({"drop": True}, "other data"),
])
def test_fold_fits_serve_only_the_data_folds_and_rounds_they_were_made_for(change, reason):
    rows, raw = _data(23)
    stored = tomllib.loads(folds.to_toml(_fits(rows, 4), rounds=8, digest=folds.data_digest(raw, rows)))
    if change.get("edit"):
        raw = [dict(r) for r in raw]
        raw[7]["tp"] = "8"
    if change.get("drop"):
        rows = rows[:-1]
    back, why = folds.stored(stored, raw, rows, k=change.get("k", 4), rounds=change.get("rounds", 8))
    assert back is None and reason in why


def test_fold_fits_that_held_out_other_rows_are_not_used():
    rows, raw = _data(23)
    fits = _fits(rows, 4)
    fits[0], fits[1] = fits[1], fits[0]
    stored = tomllib.loads(folds.to_toml(fits, rounds=8, digest=folds.data_digest(raw, rows)))
    back, why = folds.stored(stored, raw, rows, k=4, rounds=8)
    assert back is None and "held out other rows" in why
    assert folds.stored({}, raw, rows, k=4, rounds=8) == (None, "the catalog stores no fold fits")


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared/data/published_runs.csv not beside the checkout")
def test_stored_fold_fits_predict_what_refitting_does(tmp_path, capsys, monkeypatch):
    """validate --calibrate on a few published rows writes the fold fits; validate then uses them, not
    refitting, and its out-of-fold predictions are the refit's (to the six digits the TOML keeps)."""
    with open(SHARED, newline="") as fh:
        reader = csv.DictReader(fh)
        picked = [r for r in reader if r["source_group"].startswith("torchtitan")][:8]
        assert len(picked) == 8
    small = tmp_path / "small.csv"
    with small.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(picked[0]))
        w.writeheader()
        w.writerows(picked)
    toml = tmp_path / "fitted.toml"
    args = [str(small), "--json", "--cv", "2", "--cv-rounds", "1"]
    assert main(["validate", *args, "--calibrate", str(toml)]) == 0
    refit = json.loads(capsys.readouterr().out)
    assert refit["summary"]["cross_validated"]["fold_fits"].startswith("refitted")

    monkeypatch.setattr(command, "_load", lambda name: tomllib.loads(toml.read_text()))
    assert main(["validate", *args]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["summary"]["cross_validated"]["fold_fits"].startswith("the catalog's 2 fold fits")
    for a, b in zip(again["rows"], refit["rows"], strict=True):
        assert a["cv_predicted_tokens_per_s_per_gpu"] == pytest.approx(b["cv_predicted_tokens_per_s_per_gpu"],
                                                                      rel=1e-4)
    assert main(["validate", *args, "--cv-refit"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["summary"]["cross_validated"]["fold_fits"] == "refitted (--cv-refit)"
    assert [r["cv_error"] for r in forced["rows"]] == [r["cv_error"] for r in refit["rows"]]
