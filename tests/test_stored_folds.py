"""Stored fold fits (validation.fold_store): written with the catalog's fit, used only for the rows, folds and
rounds they were made for, and giving the same out-of-fold predictions as refitting."""

import csv
import json
import os
import tomllib

import pytest
from tests.helpers import stub_row

from meshplan.cli import main
from meshplan.validation import calibrate, command, fold_store

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "published_runs.csv")


def _fits(rows, k):
    """Made-up fold fits over ``folds(rows, k)``: each fold's own GEMM scale, so a mix-up shows."""
    out = []
    for i, part in enumerate(calibrate.folds(rows, k)):
        state = calibrate.empty_state()
        state["global"]["gemm_half_dim"] = 100.0 + i
        state["accelerator"]["h100"] = {"gemm_scale": 0.5 + i / 10}
        state["stack"]["llm-foundry/h100"] = {"kernel_scale": 0.9}
        out.append(calibrate.FoldFit(calibrate.held_out_ids(part), state))
    return out


def _flat(tables: dict) -> dict:
    return {f"{name}.{k}": v for name, t in tables.items() for k, v in t.items()}


def _rows(n):
    return [stub_row(row=i, moe=i % 4 == 0) for i in range(n)]


def _stored(fits, rows, rounds=8):
    return tomllib.loads(fold_store.to_toml(fits, rounds=rounds, digest=fold_store.inputs_digest(rows)))


def test_fold_fits_round_trip_through_toml():
    rows = _rows(23)
    fits = _fits(rows, 4)
    back, why = fold_store.load_fits(_stored(fits, rows), rows, k=4, rounds=8)
    assert back is not None, why
    assert [f.held_out_rows for f in back] == [f.held_out_rows for f in fits]
    assert [f.state for f in back] == [f.state for f in fits]  # values chosen to survive six digits


@pytest.mark.parametrize("change, reason", [
    ({"k": 5}, "not 5 of 8"),
    ({"rounds": 3}, "not 4 of 3"),
    ({"edit": True}, "made from other rows"),
    ({"drop": True}, "made from other rows"),
])
def test_fold_fits_serve_only_the_rows_folds_and_rounds_they_were_made_for(change, reason):
    rows = _rows(23)
    stored = _stored(_fits(rows, 4), rows)
    if change.get("edit"):  # one row modelled otherwise (a recipe, an imputation, a profile)
        rows[7] = stub_row(row=7, moe=False, software="nemo")
    if change.get("drop"):
        rows = rows[:-1]
    back, why = fold_store.load_fits(stored, rows, k=change.get("k", 4), rounds=change.get("rounds", 8))
    assert back is None and reason in why


def test_fold_fits_that_held_out_other_rows_are_not_used():
    rows = _rows(23)
    fits = _fits(rows, 4)
    fits[0], fits[1] = fits[1], fits[0]
    back, why = fold_store.load_fits(_stored(fits, rows), rows, k=4, rounds=8)
    assert back is None and "held out other rows" in why
    assert fold_store.load_fits({}, rows, k=4, rounds=8) == (None, "the catalog stores no fold fits")


def test_source_group_fits_serve_only_the_groups_they_held_out():
    rows = _rows(12)
    for r in rows:
        r.source_group = "a" if r.row < 5 else "b"
    fits = [calibrate.FoldFit(calibrate.held_out_ids(part), calibrate.empty_state())
            for part in calibrate.source_groups(rows)]
    stored = tomllib.loads(fold_store.to_toml(fits, rounds=8, digest=fold_store.inputs_digest(rows), by_source=True))
    back, why = fold_store.load_fits(stored, rows, k=2, rounds=8, by_source=True)
    assert back is not None and [f.held_out_rows for f in back] == [tuple(range(5)), tuple(range(5, 12))], why
    assert fold_store.load_fits(stored, rows, k=2, rounds=8)[0] is None  # not the k-fold table
    rows[5].source_group = "a"  # a row changes group: another partition, and the scenario digest holds
    back, why = fold_store.load_fits(stored, rows, k=2, rounds=8, by_source=True)
    assert back is None and "held out other rows" in why


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared/data/published_runs.csv not beside the checkout")
def test_stored_fold_fits_predict_what_refitting_does(tmp_path, capsys, monkeypatch):
    """validate --calibrate on a few published rows of two sources writes the fold fits, the
    leave-one-source-out fits and the unseen-stack band (each source ran its own stack); validate then uses
    the fits, not refitting, and its out-of-fold predictions are the refit's (to the six digits the TOML
    keeps). Calibrating again keeps the stored fits, since the full fit reproduces the stored one."""
    with open(SHARED, newline="") as fh:
        reader = csv.DictReader(fh)
        every = list(reader)
        picked = ([r for r in every if r["source_group"].startswith("torchtitan")][:5]
                  + [r for r in every if r["source_group"].startswith("MosaicML")][:5])
        assert len(picked) == 10
    small = tmp_path / "small.csv"
    with small.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(picked[0]))
        w.writeheader()
        w.writerows(picked)
    toml = tmp_path / "fitted.toml"
    args = [str(small), "--json", "--cv", "2", "--cv-rounds", "1", "--by-source"]
    assert main(["validate", *args, "--calibrate", str(toml)]) == 0
    refit = json.loads(capsys.readouterr().out)
    assert refit["summary"]["cross_validated"]["fold_fits_source"].startswith("refitted")
    written = tomllib.loads(toml.read_text())
    assert {"unseen-stack", "unseen-stack/dense"} <= set(written["uncertainty"])
    assert written["uncertainty"]["unseen-stack"]["rows"] == 10 and sum(written["rows_by_stack"].values()) == 10
    assert refit["summary"]["leave_one_source_out"]["unseen_stack_band"]["coverage"] is None  # 5 rows a stack

    monkeypatch.setattr(command, "catalog_fit", lambda: tomllib.loads(toml.read_text()))
    again_toml = tmp_path / "again.toml"
    assert main(["validate", *args, "--calibrate", str(again_toml)]) == 0
    recal = json.loads(capsys.readouterr().out)
    assert recal["summary"]["cross_validated"]["fold_fits_source"].startswith("the catalog's 2 fold fits")
    assert recal["summary"]["leave_one_source_out"]["fold_fits_source"].startswith("the catalog's 2 source-group")
    first, second = tomllib.loads(toml.read_text()), tomllib.loads(again_toml.read_text())
    for table in ("global", "accelerator", "software", "stack", "rows_by_stack", "fold", "source_fold"):
        assert second.get(table) == first.get(table)  # the full fit, the kept fold fits, as written
    # the summary and the bands of out-of-fold residuals: the stored fits predict to their six digits
    assert _flat(second["uncertainty"]) == pytest.approx(_flat(first["uncertainty"]), abs=2e-4)
    assert second["cv_mape"] == pytest.approx(first["cv_mape"], rel=1e-4)
    # the same rows and procedure (the digest holds), but a catalog fit the code no longer reproduces
    moved = toml.read_text().replace("\n[global]\n", "\n[global]\nmoved_for_the_test = 1\n", 1)
    monkeypatch.setattr(command, "catalog_fit", lambda: tomllib.loads(moved))
    assert main(["validate", *args, "--calibrate", str(again_toml)]) == 0
    stale = json.loads(capsys.readouterr().out)["summary"]
    for name in ("cross_validated", "leave_one_source_out"):
        assert stale[name]["fold_fits_source"].startswith("refitted (the full fit differs from the catalog's")
    assert main(["validate", *args]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["summary"]["cross_validated"]["fold_fits_source"].startswith("the catalog's 2 fold fits")
    assert again["summary"]["leave_one_source_out"]["fold_fits_source"].startswith(
        "the catalog's 2 source-group fits (fitted.toml [source_fold]")
    for a, b in zip(again["rows"], refit["rows"], strict=True):
        for key in ("cv_predicted_tokens_per_s_per_gpu", "leave_one_source_out_predicted_tokens_per_s_per_gpu"):
            assert a[key] == pytest.approx(b[key], rel=1e-4)
        assert a["cv_predicted_tokens_per_s_per_gpu"] != a["leave_one_source_out_predicted_tokens_per_s_per_gpu"]
    assert main(["validate", *args, "--cv-refit"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["summary"]["cross_validated"]["fold_fits_source"] == "refitted (--cv-refit)"
    assert forced["summary"]["leave_one_source_out"]["fold_fits_source"] == "refitted (--cv-refit)"
    for key in ("cv_error", "leave_one_source_out_error"):
        assert [r[key] for r in forced["rows"]] == [r[key] for r in refit["rows"]]


def test_a_full_fit_matches_the_catalog_only_to_every_stored_digit():
    """calibrate keeps stored fold fits only beside a full fit that reproduces the catalog's
    (fold_store.matches_catalog_fit): a parameter moved in its sixth digit, or one more table, breaks it."""
    state = _fits(_rows(8), 2)[0].state
    stored = tomllib.loads("\n".join(calibrate.state_toml(state)))
    assert fold_store.matches_catalog_fit(state, stored)
    moved = {**state, "global": {**state["global"], "gemm_half_dim": 100.001}}
    assert not fold_store.matches_catalog_fit(moved, stored)
    more = {**state, "software": {"megatron": {"step_overhead_s": 0.02}}}
    assert not fold_store.matches_catalog_fit(more, stored)
