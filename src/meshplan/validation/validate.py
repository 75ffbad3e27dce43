"""Predict every row of a published-runs file and compare with what was measured."""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate
from meshplan.cost.step import evaluate
from meshplan.errors import SpecError
from meshplan.fileio import MAX_DATA_BYTES, read_input_text
from meshplan.specs._validate import shown_list
from meshplan.validation.repeats import config_key, disagreeing_layouts, repeat_floor
from meshplan.validation.rows import RECOMPUTE_REPLACED, Scenario, Skip, impute_virtual_stages, scenario_from_row

REQUIRED_COLUMNS = ("model", "n_layers", "hidden", "n_heads", "vocab", "seq_len", "gpu_type", "n_gpus", "tp", "pp",
                    "source_group", "precision", "global_batch_size")
THROUGHPUT_COLUMNS = ("tokens_per_sec_per_gpu", "tflops_per_gpu")
"""What a row's throughput is read from: the file must have one of them."""


@dataclass(slots=True)
class RowResult:
    row: int
    source_group: str
    gpu: str
    model: str
    plan: str
    scenario: Scenario | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    predicted_step_time_s: float | None = None
    measured_step_time_s: float | None = None
    predicted_peak_memory_bytes: float | None = None
    measured_peak_memory_bytes: float | None = None
    predicted_feasible: bool | None = None
    skipped: str | None = None
    cv_predicted_tokens_per_s_per_gpu: float | None = None
    lso_predicted_tokens_per_s_per_gpu: float | None = None
    """Predicted by a fit that saw no row of this row's source group (validate --by-source)."""
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> float | None:
        """Signed relative error of tokens/s: predicted / measured - 1."""
        return _relative_error(self.predicted_tokens_per_s_per_gpu, self.measured_tokens_per_s_per_gpu)

    @property
    def cv_error(self) -> float | None:
        return _relative_error(self.cv_predicted_tokens_per_s_per_gpu, self.measured_tokens_per_s_per_gpu)

    @property
    def lso_error(self) -> float | None:
        return _relative_error(self.lso_predicted_tokens_per_s_per_gpu, self.measured_tokens_per_s_per_gpu)

    @property
    def memory_error(self) -> float | None:
        return _relative_error(self.predicted_peak_memory_bytes, self.measured_peak_memory_bytes)


def _relative_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1, or None where either is missing (or nothing was measured)."""
    if predicted is None or not measured:
        return None
    return predicted / measured - 1.0


def read_rows(path: str | Path) -> list[dict[str, str]]:
    text = read_input_text(path, "validate", max_bytes=MAX_DATA_BYTES, kind="CSV file")
    try:
        with io.StringIO(text, newline="") as fh:
            reader = csv.DictReader(fh)
            columns = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if not any(c in columns for c in THROUGHPUT_COLUMNS):
                missing.append(" or ".join(THROUGHPUT_COLUMNS))
            if missing:
                raise SpecError("validate", f"{path} lacks columns {shown_list(missing)} (see shared/data/README.md)")
            rows = list(reader)
            repeated = sorted({c for c in columns if columns.count(c) > 1})
            if repeated:
                raise SpecError("validate", f"{path} repeats columns {shown_list(repeated)}")
    except csv.Error as exc:
        raise SpecError("validate", f"{path} is not a CSV file: {str(exc)[:200]}") from None
    if not rows:
        raise SpecError("validate", f"{path} has a header but no data rows")
    return rows


def load_scenarios(rows: list[dict[str, str]]) -> list[RowResult]:
    out = []
    imputed = impute_virtual_stages(rows)
    for i, row in enumerate(rows):
        r = RowResult(row=i, source_group=row.get("source_group") or "", gpu=row.get("gpu_type") or "",
                      model=row.get("model") or "", plan="")
        try:
            if None in row:  # csv.DictReader files surplus cells under None, and fills missing ones with None
                raise Skip(f"{len(row) - 1 + len(row[None])} cells against {len(row) - 1} columns")  # type: ignore
            if None in row.values():
                raise Skip(f"{sum(v is not None for v in row.values())} cells against {len(row)} columns")
            sc = scenario_from_row(i, imputed.get(i, row))
        except Skip as exc:
            r.skipped = str(exc)
        else:
            r.scenario = sc
            r.plan = sc.plan.to_string()
            r.measured_tokens_per_s_per_gpu = sc.measured_tokens_per_s_per_gpu
            r.measured_step_time_s = sc.measured_step_time_s
            r.measured_peak_memory_bytes = sc.measured_peak_memory_bytes
        out.append(r)
    return out


def predict(sc: Scenario, compute: ComputeParams) -> Estimate:
    return evaluate(sc.model, sc.cluster, sc.job, sc.plan, compute=compute)


def run(results: Iterable[RowResult], compute_for) -> None:
    """Fill in predictions for every modelled row, with the compute parameters of its accelerator and stack."""
    for r in results:
        if r.scenario is None:
            continue
        try:
            est = predict(r.scenario, compute_for(r.scenario.cluster.accelerator.name, r.scenario.job.software))
        except SpecError as exc:
            r.skipped = f"plan rejected: {exc}"
            r.scenario = None
            continue
        r.predicted_tokens_per_s_per_gpu = est.tokens_per_s_per_gpu
        r.predicted_step_time_s = est.step_time_s
        r.predicted_peak_memory_bytes = est.memory.peak_bytes
        r.predicted_feasible = est.feasible


def summarise(errors: list[float]) -> dict[str, float | int | None]:
    a = sorted(abs(e) for e in errors)
    if not a:
        return {"count": 0, "mape": None, "median_ape": None, "p90_ape": None, "worst_ape": None, "bias": None}
    return {"count": len(a), "mape": statistics.fmean(a), "median_ape": statistics.median(a),
            "p90_ape": a[min(len(a) - 1, int(0.9 * len(a)))], "worst_ape": a[-1], "bias": statistics.fmean(errors)}


def summary(results: list[RowResult], *, use_cv: bool, use_lso: bool = False) -> dict[str, object]:
    """Error summaries of the fitted predictions, the cross-validated ones (``use_cv``) or the
    leave-one-source-out ones (``use_lso``)."""
    def predicted(r: RowResult) -> float | None:
        if use_lso:
            return r.lso_predicted_tokens_per_s_per_gpu
        return r.cv_predicted_tokens_per_s_per_gpu if use_cv else r.predicted_tokens_per_s_per_gpu

    def err(r: RowResult) -> float | None:
        return _relative_error(predicted(r), r.measured_tokens_per_s_per_gpu)

    modelled = [r for r in results if r.scenario is not None and err(r) is not None]
    by_group: dict[str, list[float]] = defaultdict(list)
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for r in modelled:
        by_group[r.source_group].append(err(r))  # type: ignore[arg-type]
        by_gpu[r.scenario.cluster.accelerator.name].append(err(r))  # type: ignore[union-attr, arg-type]
    mem = [r.memory_error for r in results if r.memory_error is not None]
    repeats = repeat_floor((r.source_group, config_key(r.scenario), r.measured_tokens_per_s_per_gpu,  # type: ignore[arg-type]
                            predicted(r))
                           for r in modelled)
    disagree = disagreeing_layouts((r.scenario, r.measured_tokens_per_s_per_gpu, predicted(r))  # type: ignore[misc]
                                   for r in modelled)
    return {
        "rows": len(results),
        "modelled": len(modelled),
        "skipped": sum(1 for r in results if r.skipped),
        "tokens_per_s_per_gpu": summarise([err(r) for r in modelled]),  # type: ignore[misc]
        "by_source_group": {k: summarise(v) for k, v in sorted(by_group.items())},
        "by_gpu": {k: summarise(v) for k, v in sorted(by_gpu.items())},
        "repeated_configurations": repeats,
        "disagreeing_layouts": [d.as_dict() for d in disagree],
        "peak_memory": summarise(mem),
        "predicted_not_to_fit": [r.row for r in results if r.predicted_feasible is False],
        "recipe_recompute_over_memory": [r.row for r in results if r.scenario is not None and any(
            n.startswith(RECOMPUTE_REPLACED) for n in r.scenario.imputed)],
    }
