"""The cross-validation's fold fits, stored beside the catalog's own fit so that checking the
cross-validated error need not refit them.

``meshplan validate --calibrate`` fits the parameters on every row and, for cross-validation, once per
fold on the other folds' rows (calibrate.cross_validate). It writes each fold's parameters to
fitted.toml as ``[fold.<i>]`` tables, with the rows the fold held out, and records the number of folds,
the rounds and a digest of what the fits were made from: every cross-validated row as meshplan modelled
it (its scenario: model, cluster, job, plan and the measurement, after the recipes, imputations and any
``--profile``) and the fitting procedure (the parameters, their bounds, the measured ones, the stopping
rule). It does the same for leave-one-source-out, one fit per source group, under ``[source_fold.<i>]``;
their residuals also give the band of a stack the fit has no tables for (calibrate.unseen_stack_bands).
``meshplan validate`` then predicts every held-out row with its stored fit under the current code: about
a second, against some 35 minutes for five fits on two cores. It refits when the folds, the rounds or the
digest differ from those stored, or when asked (``--cv-refit``).

What this does and does not check: every cross-validated prediction still comes from parameters fitted
without its row, on the rows as they are modelled now. A change to the cost model's arithmetic (how a
scenario is timed, not what it is) is judged with parameters fitted before the change, as the catalog's
own fit is. ``validate --calibrate`` always refits on every row; it keeps the stored fold fits only where,
besides the digest, its new full fit reproduces the catalog's to the digits stored
(matches_catalog_fit), which a change to the arithmetic that moves any fitted parameter breaks. That is
necessary, not sufficient (a fold's fit could move where the full fit does not); ``--cv-refit`` refits.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from meshplan.validation.calibrate import (
    MEASURED,
    STATE_KINDS,
    TOLERANCE,
    FoldFit,
    folds,
    held_out_ids,
    parameter_space,
    source_groups,
    state_toml,
    toml_line,
)
from meshplan.validation.validate import RowResult

TABLE = "fold"
"""The top-level TOML table the k-fold fits live under: ``[fold.1.global]``, ``[fold.1.accelerator.b200]``."""
SOURCE_TABLE = "source_fold"
"""The table of the leave-one-source-out fits (``--by-source``), one per source group in name order."""


def inputs_digest(rows: list[RowResult]) -> str:
    """SHA-256 of what fold fits of ``rows`` are made from: each row's scenario (row order) and the
    fitting procedure's parameters, bounds, measured values and stopping tolerance. The release a row names
    (a label for validate's report of disagreeing rows, not an input to the model) and a scenario's notes on
    what was imputed are left out: their effect is in its fields, and their wording quotes the cost model
    (a recomputation chosen because the recipe's puts the row 23.1 GiB over the GPU's memory), which
    changed the digest, and forced half an hour's refit, whenever a memory term moved."""
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: r.row):
        sc = r.scenario
        label_free = dataclasses.replace(sc, imputed=(), release="") if dataclasses.is_dataclass(sc) else sc
        h.update(canonical(label_free).encode())
    h.update(repr((parameter_space(rows), sorted(MEASURED.items()), TOLERANCE)).encode())
    return h.hexdigest()


def canonical(value: Any) -> str:
    """``value`` as text for the digest: a dataclass as its type and the fields that differ from their
    defaults (recursively), anything else as its repr. A field added to a spec with a default that keeps
    every prediction as it was leaves the digest, and the stored fits, as they were."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = []
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            default = (f.default if f.default is not dataclasses.MISSING else
                       f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or v != default:
                parts.append(f"{f.name}={canonical(v)}")
        return f"{type(value).__name__}({', '.join(parts)})"
    if isinstance(value, tuple | list):
        return ("(" if isinstance(value, tuple) else "[") + ", ".join(canonical(v) for v in value) + \
            (")" if isinstance(value, tuple) else "]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{canonical(k)}: {canonical(v)}" for k, v in value.items()) + "}"
    return repr(value)


def to_toml(fits: list[FoldFit], *, rounds: int, digest: str, by_source: bool = False) -> str:
    """The fold fits (``by_source``: the leave-one-source-out fits) as TOML, to follow the full fit in
    fitted.toml."""
    table = SOURCE_TABLE if by_source else TABLE
    what = "Leave-one-source-out: each source group's" if by_source else "Cross-validation: each fold's"
    lines = ["", f"# {what} parameters, fitted without the rows it lists (meshplan.validation.fold_store).",
             f"[{table}]", f"folds = {len(fits)}", f"rounds = {rounds}", toml_line("inputs_sha256", digest)]
    for i, f in enumerate(fits, start=1):
        lines += ["", f"[{table}.{i}]", f"held_out_rows = {list(f.held_out_rows)}"]
        lines += state_toml(f.state, prefix=f"{table}.{i}.")
    return "\n".join(lines) + "\n"


def load_fits(fitted: dict[str, Any], rows: list[RowResult], *, rounds: int, k: int = 0,
              by_source: bool = False) -> tuple[list[FoldFit] | None, str]:
    """The fold fits stored in ``fitted`` (fitted.toml's tables) if they were made by ``k`` folds of at
    most ``rounds`` rounds from exactly these rows (``rows``: those cross-validation predicts, as modelled
    now) and this procedure; otherwise None. The second item says which, or why not. ``by_source``: the
    leave-one-source-out fits, one per source group (``k`` is then the number of groups, and need not be
    given)."""
    parts = [held_out_ids(part) for part in (source_groups(rows) if by_source else folds(rows, k))]
    k = len(parts)
    name = SOURCE_TABLE if by_source else TABLE
    table = fitted.get(name)
    if not table:
        return None, f"the catalog stores no {'leave-one-source-out' if by_source else 'fold'} fits"
    if table.get("folds") != k or table.get("rounds") != rounds:
        return None, (f"the stored fold fits are {table.get('folds')} folds of at most {table.get('rounds')} "
                      f"rounds, not {k} of {rounds}")
    if table.get("inputs_sha256") != inputs_digest(rows):
        return None, "the stored fold fits were made from other rows, scenarios or fitting procedure"
    held = [tuple(table.get(str(i), {}).get("held_out_rows", ())) for i in range(1, k + 1)]
    if held != parts:
        return None, "the stored fold fits held out other rows than these folds do"
    fits = [FoldFit(ids, {kind: table[str(i)].get(kind, {}) for kind in STATE_KINDS})
            for i, ids in enumerate(held, start=1)]
    kind = "source-group" if by_source else "fold"
    return fits, f"the catalog's {k} {kind} fits (fitted.toml [{name}], written by validate --calibrate)"


def matches_catalog_fit(state: dict[str, dict], fitted: dict[str, Any]) -> bool:
    """Whether a fit on every row (``state``) is the catalog's own (``fitted``, fitted.toml's tables) to
    the six significant digits fitted.toml keeps: the procedure, run on the same rows under the current
    code, reproduced what the stored fold fits were made beside."""
    return state_toml(state) == state_toml({kind: fitted.get(kind, {}) for kind in STATE_KINDS})
