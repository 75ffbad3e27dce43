"""`meshplan validate`: predict published runs, compare, calibrate, cross-validate."""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path
from typing import Any

from meshplan.argtypes import output_file, whole_in
from meshplan.calibration import UNSEEN_STACK, catalog_fit, compute_params_for
from meshplan.errors import SpecError
from meshplan.fileio import atomic_write_bytes, atomic_write_text, strict_json
from meshplan.validation import calibrate as cal
from meshplan.validation import fold_store
from meshplan.validation.calibrate import MAX_ROUNDS, TOLERANCE
from meshplan.validation.validate import RowResult, load_scenarios, read_rows, run, summary

BINS = (0.02, 0.05, 0.10, 0.20, 0.50)


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="predict published training runs and compare with the measurements")
    p.add_argument("path", help="CSV with the columns of shared/data/published_runs.csv")
    p.add_argument("--json", action="store_true", help="one record per row and summaries")
    p.add_argument("--plot", type=output_file(*PLOT_FORMATS), metavar="FILE",
                   help="write predicted against measured tokens/s (.png, .pdf or .svg)")
    p.add_argument("--cv", type=int, default=5, metavar="K",
                   help="k-fold cross-validation: fit on k-1 folds, predict the k-th (0: skip; default 5); the "
                        "catalog's stored fold fits serve where they were made for this data, k and rounds")
    p.add_argument("--cv-rounds", type=whole_in(1, 50), default=MAX_ROUNDS,
                   help=f"most coordinate-descent rounds per fold; each fit stops earlier once a round gains "
                        f"less than {TOLERANCE * 100:.1f} %% (default {MAX_ROUNDS})")
    p.add_argument("--cv-refit", action="store_true",
                   help="refit every fold (and, with --by-source or --calibrate, every source group) even where the "
                        "catalog stores fits made for these rows (validation.fold_store)")
    p.add_argument("--by-source", action="store_true", help="also leave one source group out at a time")
    p.add_argument("--calibrate", metavar="TOML", type=output_file(".toml"),
                   help="fit on every row and write to TOML the parameters, the uncertainty bands and the fits of "
                        "k-fold and of leave-one-source-out cross-validation (the catalog's stored ones where they "
                        "were made for these rows and the full fit reproduces the catalog's, unless --cv-refit)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="measured profile (meshplan measure --out) applied to every row's cluster")
    p.add_argument("--max-cv-mape", type=float, default=None,
                   help="exit 1 if the cross-validated MAPE of tokens/s per GPU exceeds this fraction")
    p.add_argument("--max-memory-mape", type=float, default=None,
                   help="exit 1 if the MAPE of peak memory (rows that report it) exceeds this fraction")
    p.add_argument("--require-fit", action="store_true",
                   help="exit 1 if any measured run is predicted not to fit in memory")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="fit the folds and source groups on Ray (pip install 'meshplan[ray]'): a local instance, or "
                        "the cluster at ADDRESS ('auto', 'ray://HOST:10001'); docs/performance.md")
    p.set_defaults(func=cmd_validate)


def _progress(msg: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{msg:<80}", end="", file=sys.stderr, flush=True)


def _record(r: RowResult) -> dict[str, Any]:
    if r.scenario is None:
        return {"row": r.row, "source_group": r.source_group, "model": r.model, "skipped": r.skipped}
    d = {
        "row": r.row, "source_group": r.source_group, "model": r.model, "gpu": r.gpu, "plan": r.plan,
        "software": r.scenario.job.software,
        "predicted_tokens_per_s_per_gpu": r.predicted_tokens_per_s_per_gpu,
        "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
        "measured_from": r.scenario.measured_from,
        "error": r.error,
        "cv_predicted_tokens_per_s_per_gpu": r.cv_predicted_tokens_per_s_per_gpu,
        "cv_error": r.cv_error,
        "predicted_step_time_s": r.predicted_step_time_s,
        "measured_step_time_s": r.measured_step_time_s,
        "predicted_fits_in_memory": r.predicted_feasible,
    }
    if r.lso_predicted_tokens_per_s_per_gpu is not None:
        d["leave_one_source_out_predicted_tokens_per_s_per_gpu"] = r.lso_predicted_tokens_per_s_per_gpu
        d["leave_one_source_out_error"] = r.lso_error
    if r.scenario.imputed:
        d["imputed"] = list(r.scenario.imputed)
    if r.measured_peak_memory_bytes:
        d["predicted_peak_memory_bytes"] = r.predicted_peak_memory_bytes
        d["measured_peak_memory_bytes"] = r.measured_peak_memory_bytes
        d["memory_error"] = r.memory_error
    return d


def _histogram(errors: list[float]) -> list[str]:
    out = []
    lo = 0.0
    for hi in (*BINS, float("inf")):
        n = sum(1 for e in errors if lo <= abs(e) < hi)
        label = f"{lo:>4.0%}-{hi:<4.0%}" if hi != float("inf") else f"  >{lo:.0%}    "
        out.append(f"  {label} {n:>4} {'#' * round(60 * n / max(1, len(errors)))}")
        lo = hi
    return out


def _fmt(s: dict) -> str:
    if not s.get("count"):
        return "no rows"
    return (f"n={s['count']:<4} MAPE {s['mape']:6.1%}  median {s['median_ape']:6.1%}  p90 {s['p90_ape']:6.1%}  "
            f"worst {s['worst_ape']:7.1%}  bias {s['bias']:+6.1%}")


def _rows(rows: list[int]) -> str:
    return "rows " + ", ".join(map(str, rows))


def _repeats(rep: dict, cv: bool) -> list[str]:
    """The rows that repeat a configuration (validation.repeats): the model's error on them against the
    least any rescaling of its predictions per configuration could reach."""
    if not rep:
        return []
    out = ["", "rows that repeat a configuration (another release, date, global batch or FP8 scaling recipe)"
           + (", cross-validated" if cv else "") + ":",
           f"  {'':<28} {'rows':>4} {'configs':>7}  {'MAPE':>6}  {'floor':>6}  (floor: the best one factor per "
           "configuration can do)"]
    out += [f"  {g:<28} {v['rows']:>4} {v['configurations']:>7}  {v['mape']:6.1%}  {v['floor_mape']:6.1%}"
            for g, v in rep.items()]
    return out


def _disagreements(found: list[dict], cv: bool) -> list[str]:
    """The layouts whose rows ran further apart than the model says their differences make them."""
    if not found:
        return []
    out = ["", "layouts measured more than once whose rows disagree beyond what meshplan predicts of their "
               "differences" + (" (cross-validated)" if cv else "") + ":"]
    for d in found:
        out.append(f"  rows {d['slower_row']} and {d['faster_row']} (of rows {', '.join(map(str, d['rows']))}): "
                   f"measured {d['measured_ratio']:.2f}x apart, predicted {d['predicted_ratio']:.2f}x; "
                   f"{d['unexplained_ratio']:.2f}x unexplained")
        out.append(f"    differ in {'; '.join(d['differs']) or 'nothing meshplan models (the same configuration)'}")
    return out


def _coverage(c: dict) -> str:
    parts = [f"{k} {c[k]['inside']:.0%} of {c[k]['rows']}" for k in ("all", "dense", "moe") if k in c]
    return (f"  uncertainty band, rows inside their band built without them: {'; '.join(parts)} "
            f"(nominal {c['nominal']:.0%})")


def _unseen_stack(u: dict) -> list[str]:
    b, c = u.get("bands", {}).get(UNSEEN_STACK), u.get("coverage")
    if not b:
        return []
    lines = ["", f"a stack the fit has no tables for ('generic'): measured steps of {b['rows']} runs whose stack "
                 f"the fit had not seen fell within {b['low']:+.0%} .. {b['high']:+.0%} of the prediction"]
    if c:
        parts = [f"{k} {v['inside']:.0%} of {v['rows']}" for k, v in c["by_stack"].items()]
        lines.append(f"  each stack's rows inside the band of the other stacks: {'; '.join(parts)} "
                     f"(nominal {c['nominal']:.0%})")
    return lines


def text_report(results: list[RowResult], fit: dict, cv: dict | None, group_cv: dict | None) -> str:
    lines = [f"meshplan validate: {fit['rows']} rows, {fit['modelled']} modelled, {fit['skipped']} skipped",
             "", "tokens/s per GPU, predicted against measured (error = predicted/measured - 1):",
             f"  fit (catalog parameters)      {_fmt(fit['tokens_per_s_per_gpu'])}"]
    if cv:
        lines.append(f"  cross-validated (k-fold)      {_fmt(cv['tokens_per_s_per_gpu'])}")
    if group_cv:
        lines.append(f"  leave-one-source-group-out    {_fmt(group_cv['tokens_per_s_per_gpu'])}")
    if cv and cv.get("fold_fits_source"):
        lines.append(f"  fold fits: {cv['fold_fits_source']}")
    if group_cv and group_cv.get("fold_fits_source"):
        lines.append(f"  source-group fits: {group_cv['fold_fits_source']}")
    if cv and cv.get("band_coverage"):
        lines.append(_coverage(cv["band_coverage"]))
    main = cv or fit
    lines += ["", "by source group" + (" (cross-validated)" if cv else "") + ":"]
    lines += [f"  {k:<28} {_fmt(v)}" for k, v in main["by_source_group"].items()]
    if group_cv:
        lines += ["", "by source group, each predicted by a fit that saw no row of it (leave-one-source-out):"]
        lines += [f"  {k:<28} {_fmt(v)}" for k, v in group_cv["by_source_group"].items()]
        lines += _unseen_stack(group_cv.get("unseen_stack_band") or {})
    lines += ["", "by accelerator" + (" (cross-validated)" if cv else "") + ":"]
    lines += [f"  {k:<28} {_fmt(v)}" for k, v in main["by_gpu"].items()]
    lines += _repeats(main["repeated_configurations"], cv is not None)
    lines += _disagreements(main.get("disagreeing_layouts") or [], cv is not None)
    errs = [r.cv_error if cv else r.error for r in results]
    errs = [e for e in errs if e is not None]
    lines += ["", "absolute error histogram:", *_histogram(errs)]
    lines += ["", f"peak memory (GiB as reported, torchtitan rows): {_fmt(fit['peak_memory'])}"]
    unfit = fit["predicted_not_to_fit"]
    lines.append(f"measured runs predicted not to fit in memory: {len(unfit)}"
                 + (f" ({_rows(unfit)})" if unfit else ""))
    over = fit.get("recipe_recompute_over_memory") or []
    if over:
        lines.append(f"measured runs whose recipe's recomputation the memory model puts over the GPU (timed with "
                     f"meshplan's own; see their imputed notes): {len(over)} ({_rows(over)})")
    worst = sorted((r for r in results if r.error is not None), key=lambda r: -abs(r.cv_error or r.error or 0))[:12]
    lines += ["", "largest errors" + (" (cross-validated)" if cv else "") + " (row: the data row, from 0):"]
    for r in worst:
        e = r.cv_error if r.cv_error is not None else r.error
        lines.append(f"  row {r.row:>3} {e:+7.1%}  {r.source_group[:22]:<22} {r.model[:26]:<26} {r.gpu[:16]:<16} "
                     f"{r.plan}")
    skipped = [r for r in results if r.skipped]
    if skipped:
        lines += ["", f"skipped ({len(skipped)}):"]
        reasons: dict[str, list[int]] = {}
        for r in skipped:
            reasons.setdefault(r.skipped or "", []).append(r.row)
        for reason, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            more = " ..." if len(ids) > 8 else ""
            noun = "row" if len(ids) == 1 else "rows"
            lines.append(f"  {len(ids):>3} {noun}: {reason} ({noun} {', '.join(map(str, ids[:8]))}{more})")
    return "\n".join(lines)


def _plot(results: list[RowResult], path: str, use_cv: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    groups = sorted({r.source_group for r in results if r.error is not None})
    seen: list[float] = []
    for g in groups:
        rs = [r for r in results if r.source_group == g and r.error is not None]
        pred = [(r.cv_predicted_tokens_per_s_per_gpu if use_cv else r.predicted_tokens_per_s_per_gpu) for r in rs]
        meas = [r.measured_tokens_per_s_per_gpu for r in rs]
        ax.scatter(meas, pred, s=12, label=g, alpha=0.75)
        seen += [v for v in (*meas, *pred) if v]
    lo, hi = (min(seen) / 1.5, max(seen) * 1.5) if seen else (5.0, 1e5)  # the diagonals span every point
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.8, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="measured tokens/s per GPU",
           ylabel=("cross-validated " if use_cv else "") + "predicted tokens/s per GPU",
           title="meshplan against published runs (dotted: ±20-25 %)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".").lower())
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _set_cv(results: list[RowResult], preds: dict[int, float]) -> None:
    for r in results:
        r.cv_predicted_tokens_per_s_per_gpu = preds.get(r.row)


def _out_of_fold(results: list[RowResult], args: argparse.Namespace, *, k: int | None = None,
                 refit: str | None = None) -> tuple[dict[int, float], str, list[cal.FoldFit]]:
    """Out-of-fold predictions of ``k``-fold cross-validation (``k`` None: of leaving each source group
    out) from the catalog's stored fits where they were made for these rows, k and rounds, else refitted
    (always where ``refit`` gives a reason or --cv-refit is set); which it was; and the fits."""
    rows = cal.cv_rows(results)
    by_source = k is None
    k = len(cal.source_groups(rows)) if k is None else k
    what = "source groups" if by_source else "folds"
    stored = catalog_fit()
    refit = "--cv-refit" if args.cv_refit else refit
    fits, source = (None, refit) if refit else fold_store.load_fits(
        stored, rows, k=k, rounds=args.cv_rounds, by_source=by_source)
    if fits is None:
        print(f"meshplan: validate: refitting {k} {what} ({source}); on all published rows this takes about half "
              f"an hour on two cores, and validate --calibrate stores the fits", file=sys.stderr)
        fits = cal.cross_validate(results, k=k, by_group=by_source, rounds=args.cv_rounds, progress=_progress)
        source = f"refitted ({source})"
    elif not by_source and stored.get("cv_mape") is not None:
        source += f"; cross-validated MAPE {float(stored['cv_mape']):.2%} when fitted"
    return cal.out_of_fold(results, fits), source, fits


def _set_lso(results: list[RowResult], preds: dict[int, float]) -> None:
    for r in results:
        r.lso_predicted_tokens_per_s_per_gpu = preds.get(r.row)


PLOT_FORMATS = (".png", ".pdf", ".svg")


def _check_args(args: argparse.Namespace) -> None:
    """Reject options that could only fail after the work (or pass a gate that means nothing)."""
    if args.cv < 0 or args.cv == 1:
        raise SpecError("validate --cv", f"must be 0 (no cross-validation) or at least 2 folds, got {args.cv}")
    for flag, value in (("--max-cv-mape", args.max_cv_mape), ("--max-memory-mape", args.max_memory_mape)):
        if value is not None and not 0 < value <= 1:
            raise SpecError(f"validate {flag}", f"a fraction in (0, 1] (0.062 is 6.2 %), got {value}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            raise SpecError("validate --plot", "needs matplotlib: pip install 'meshplan[plot]'") from None


def cmd_validate(args: argparse.Namespace) -> int:
    _check_args(args)
    results = _load_results(args)
    if args.calibrate:
        compute_for, fold_fits_source, lso_source = _calibrate(args, results)
    else:
        compute_for = compute_params_for
        fold_fits_source = lso_source = None
        if args.cv:
            preds, fold_fits_source, _ = _out_of_fold(results, args, k=args.cv)
            _set_cv(results, preds)
        if args.by_source:
            lso, lso_source, _ = _out_of_fold(results, args)
            _set_lso(results, lso)
    run(results, compute_for)
    fit_sum = summary(results, use_cv=False)
    cv_sum = summary(results, use_cv=True) if (args.cv or args.calibrate) else None
    if cv_sum is not None:
        cv_sum["band_coverage"] = cal.band_coverage(results)
        cv_sum["fold_fits_source"] = fold_fits_source
    group_sum = None
    if args.by_source:
        group_sum = summary(results, use_cv=False, use_lso=True)
        group_sum["fold_fits_source"] = lso_source
        group_sum["unseen_stack_band"] = {"bands": cal.unseen_stack_bands(results),
                                          "coverage": cal.unseen_stack_coverage(results)}
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.plot:
        _plot(results, args.plot, use_cv=cv_sum is not None)
    if args.json:
        print(strict_json({"schema": "meshplan.validate/1", "summary": {"fit": fit_sum, "cross_validated": cv_sum,
                                                                        "leave_one_source_out": group_sum},
                          "rows": [_record(r) for r in results]}, indent=1))
    else:
        print(text_report(results, fit_sum, cv_sum, group_sum))
    return _gates(args, fit_sum, cv_sum)


def _load_results(args: argparse.Namespace) -> list[RowResult]:
    """The rows of ``args.path`` as scenarios (with the measured profile's figures where ``--profile``);
    SpecError where none can be modelled or too few for the folds."""
    results = load_scenarios(read_rows(args.path))
    folds = max(2, args.cv or 5) if args.calibrate else args.cv
    n_modelled = sum(r.scenario is not None for r in results)
    if not n_modelled:
        reasons = sorted({r.skipped for r in results if r.skipped})[:3]
        raise SpecError("validate PATH", f"{args.path} has no row meshplan can model ({len(results)} rows, all "
                                         f"skipped" + (f"; e.g. {'; '.join(reasons)}" if reasons else "") + ")")
    if folds and folds > n_modelled:
        raise SpecError("validate --cv", f"{folds} folds need at least as many modelled rows; {args.path} has "
                                         f"{n_modelled} (--cv 0 skips cross-validation)")
    if args.profile:
        from dataclasses import replace

        from meshplan.profile import apply_profile, load_profile

        profile = load_profile(args.profile)
        for r in results:
            if r.scenario is not None:
                cluster, notes = apply_profile(r.scenario.cluster, profile)
                r.scenario = replace(r.scenario, cluster=cluster)
                r.notes = notes
    return results


def _calibrate(args: argparse.Namespace, results: list[RowResult]) -> tuple[Any, str, str]:
    """``--calibrate``: fit on every row, cross-validate by folds and by source group, and write the fit,
    the bands and the fold fits to ``args.calibrate``. Returns the fitted compute parameters (a function of
    accelerator and software) and where the fold and source-group fits came from."""
    modelled = [r for r in results if r.scenario is not None]
    # The fold fits are reused where the catalog stores them for exactly these rows and procedure
    # (fold_store.load_fits) and the full fit reproduces the catalog's (the code fits as it did then).
    digest = fold_store.inputs_digest(cal.cv_rows(results))
    state = cal.fit(modelled, progress=_progress)
    same = fold_store.matches_catalog_fit(state, catalog_fit())
    refit = None if same else "the full fit differs from the catalog's, or it has none"
    preds, fold_fits_source, fits = _out_of_fold(results, args, k=max(2, args.cv or 5), refit=refit)
    _set_cv(results, preds)
    lso, lso_source, source_fits = _out_of_fold(results, args, refit=refit)
    _set_lso(results, lso)
    bands = cal.uncertainty_bands(results) | cal.unseen_stack_bands(results)
    cv_sum = summary(results, use_cv=True)["tokens_per_s_per_gpu"]
    text = cal.to_toml(state, source=f"fitted on {len(modelled)} rows of {Path(args.path).name} by "
                                     "meshplan validate --calibrate (docs/validation.md)",
                       summary={"rows": float(len(modelled)), "cv_mape": cv_sum["mape"] or 0.0,
                                "cv_median_ape": cv_sum["median_ape"] or 0.0}, bands=bands,
                       stack_rows=cal.rows_by_stack(modelled))
    text += fold_store.to_toml(fits, rounds=args.cv_rounds, digest=digest)
    text += fold_store.to_toml(source_fits, rounds=args.cv_rounds, digest=digest, by_source=True)
    atomic_write_text(args.calibrate, text)
    print(f"wrote {args.calibrate}", file=sys.stderr)

    def compute_for(a: str, s: str):
        return cal.params_for(state, a, s)

    return (compute_for, fold_fits_source + f", written to {args.calibrate}",
            lso_source + f", written to {args.calibrate}")


def _gates(args: argparse.Namespace, fit_sum: dict, cv_sum: dict | None) -> int:
    """Exit status 1 where a threshold (--max-cv-mape, --max-memory-mape, --require-fit) fails, each
    checked on stderr; else 0."""
    cv_name = "cross-validated MAPE" if cv_sum else "MAPE of the fit (no cross-validation: --cv 0)"
    gates = ((args.max_cv_mape, cv_name, (cv_sum or fit_sum)["tokens_per_s_per_gpu"]),
             (args.max_memory_mape, "peak-memory MAPE", fit_sum["peak_memory"]))
    for threshold, name, errors in gates:
        if threshold is None:
            continue
        mape = errors["mape"]  # type: ignore[index]
        if mape is None or not math.isfinite(mape) or mape > threshold:
            what = f"{name} {mape:.2%} exceeds" if mape is not None else f"no {name} (no row to judge) against"
            print(f"meshplan: validate: {what} the threshold {threshold:.2%}", file=sys.stderr)
            return 1
        print(f"{name} {mape:.2%} <= threshold {threshold:.2%}", file=sys.stderr)
    unfit = fit_sum["predicted_not_to_fit"]
    if args.require_fit and unfit:
        print(f"meshplan: validate: {len(unfit)} measured runs predicted not to fit in memory "
              f"({_rows(unfit)})", file=sys.stderr)  # type: ignore[arg-type]
        return 1
    return 0
