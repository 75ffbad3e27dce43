"""The cross-validation's fold fits, stored beside the catalog's own fit so that checking the
cross-validated error need not refit them.

``meshplan validate --calibrate`` fits the parameters on every row and, for cross-validation, once per
fold on the other folds' rows (calibrate.cross_validate). It writes each fold's parameters to
fitted.toml as ``[fold.<i>]`` tables, with the rows the fold held out, and records the number of folds,
the rounds and a digest of the data the folds were fitted on. ``meshplan validate`` then predicts every
held-out row with its stored fold fit under the current code: seconds, against some 35 minutes for five
fits on two cores. It refits when the data, the folds or the rounds differ from those stored, or when
asked (``--cv-refit``).

What this does and does not check: every cross-validated prediction still comes from parameters fitted
without its row. As with the catalog's own fit, a change to the cost model is judged with parameters
fitted before the change, so a change that needs a refit shows as a regression until ``validate
--calibrate`` is rerun, which rewrites the full fit and the fold fits together.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from meshplan.validation.calibrate import FoldFit, State, folds, state_toml
from meshplan.validation.validate import RowResult

TABLE = "fold"
"""The top-level TOML table the fold fits live under: ``[fold.1.global]``, ``[fold.1.accelerator.b200]``."""


def data_digest(raw_rows: list[dict[str, str]], rows: list[RowResult]) -> str:
    """SHA-256 of the CSV fields of ``rows`` (by row index, in row order): a fold fit applies only to the
    data it was fitted on."""
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: r.row):
        h.update(json.dumps([r.row, raw_rows[r.row]], sort_keys=True).encode())
    return h.hexdigest()


def to_toml(fits: list[FoldFit], *, rounds: int, digest: str) -> str:
    """The fold fits as TOML, to follow the full fit in fitted.toml."""
    lines = ["", "# Cross-validation: each fold's parameters, fitted without the rows it lists "
             "(meshplan.validation.folds).", f"[{TABLE}]", f"folds = {len(fits)}", f"rounds = {rounds}",
             f"data_sha256 = {digest!r}"]
    for i, f in enumerate(fits, start=1):
        lines += ["", f"[{TABLE}.{i}]", f"held_out_rows = {list(f.held_out_rows)}"]
        lines += state_toml(f.state, prefix=f"{TABLE}.{i}.")
    return "\n".join(lines) + "\n"


def stored(fitted: dict[str, Any], raw_rows: list[dict[str, str]], rows: list[RowResult], *, k: int,
           rounds: int) -> tuple[list[FoldFit] | None, str]:
    """The fold fits stored in ``fitted`` (fitted.toml's tables) if they were made by ``k`` folds of at
    most ``rounds`` rounds on exactly these rows (``rows``: those cross-validation predicts); otherwise
    None. The second item says which, or why not."""
    table = fitted.get(TABLE)
    if not table:
        return None, "the catalog stores no fold fits"
    if table.get("folds") != k or table.get("rounds") != rounds:
        return None, (f"the stored fold fits are {table.get('folds')} folds of at most {table.get('rounds')} "
                      f"rounds, not {k} of {rounds}")
    if table.get("data_sha256") != data_digest(raw_rows, rows):
        return None, "the stored fold fits were fitted on other data"
    parts = [tuple(sorted(r.row for r in part)) for part in folds(rows, k)]
    held = [tuple(table.get(str(i), {}).get("held_out_rows", ())) for i in range(1, k + 1)]
    if held != parts:
        return None, "the stored fold fits held out other rows than these folds do"
    fits = []
    for i, rows_held in enumerate(held, start=1):
        t = table[str(i)]
        state: State = {kind: t.get(kind, {}) for kind in ("global", "accelerator", "software", "stack")}
        fits.append(FoldFit(rows_held, state))
    return fits, f"the catalog's {k} fold fits (fitted.toml [{TABLE}], written by validate --calibrate)"
