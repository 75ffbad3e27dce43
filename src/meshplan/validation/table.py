"""Write the generated tables of docs/validation.md: the results of ``meshplan validate PATH --json
--by-source`` and the catalog's calibration (``fitted.toml``), between marker comments.

Run from the repository root, with the published runs beside it::

    python -m meshplan.validation.table                 # rewrite docs/validation.md's tables
    python -m meshplan.validation.table --check         # exit 1 if they are out of date

Each table sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``; the text around
them is left as it is. The tables use the catalog's stored fold and source-group fits, as a plain
``validate`` does; where those no longer match the rows (``validate --calibrate`` has to be rerun, an
hour of refitting), this refuses rather than refit.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshplan.calibration import catalog_fit
from meshplan.errors import SpecError
from meshplan.fileio import atomic_write_text, read_input_text

DEFAULT_DATA = "../shared/data/published_runs.csv"
DEFAULT_DOC = "docs/validation.md"
MOE_DOC = "docs/moe.md"
"""docs/moe.md holds one generated table (``moe-curve``): the expert-GEMM model at DeepGEMM's published shapes,
with the catalog's fitted parameters."""
README = "README.md"
"""The README holds one generated table (``trust``): how far to trust the figures, in a few rows."""
LARGEST_ERROR = 0.20
"""Rows whose cross-validated error is at least this large are listed one by one."""
MEGATRON_GROUPS = ("Megatron-LM", "Megatron-LM papers", "NVIDIA dgxc-benchmarking", "NeMo / Megatron-Bridge")
"""The source groups of Megatron-core and NeMo runs (the Megatron-LM group is Megatron-Core's README)."""
UNEXPLAINED_MODELS = ("GPT-OSS-120B",)
"""Models over-predicted by a per-step excess that no physical term checked explains (docs/validation.md)."""
DISAGREEING_ROWS = {138: "measured at half the throughput the next release measured on the same GPUs"}
"""Rows whose measurement disagrees with a repeat of the same configuration, by data row (from 0)."""

PARAMETER_MEANING = {
    "attention_half_len": "FlashAttention's block-length constant L½ [tokens]: blocks of L tokens run at "
                          "(L / (L + L½))² of the long-block rate",
    "gemm_half_dim": "GEMM shape constant d½ [elements]: each dimension d of a GEMM scales its rate by d / (d + d½)",
    "fp8_half_dim_ratio": "d½ of FP8 GEMMs over that of BF16 ones: FP8 GEMMs need larger shapes to reach "
                          "their peak",
    "overlap_efficiency": "share of a compute window that collectives can hide behind",
    "comm_slowdown": "compute slowdown per second of communication it hides (NCCL kernels take SMs and HBM "
                     "bandwidth)",
    "moe_gemm_efficiency": "expert GEMMs against the model of their launch (one GEMM per expert or one grouped "
                           "kernel, cost.grouped_gemm)",
    "causal_attention_fraction": "time of a causal attention kernel over the non-causal one, on long sequences",
    "moe_permute_passes": "HBM passes over each routed token copy (permutation, unpermutation, their gradients)",
    "zero3_overlap_efficiency": "share of DeepSpeed ZeRO-3's parameter fetches that compute hides",
    "zero3_collective_efficiency": "share of NCCL's bus bandwidth that DeepSpeed ZeRO-3's (2021) gathers and "
                                   "reductions reach",
    "moe_layer_overhead_s": "fixed time per MoE layer forward and micro-batch: router and token bookkeeping "
                            "kernels and their gaps (none under a whole-iteration CUDA graph) [ms]",
    "moe_layer_host_s": "host launch time per MoE layer and micro-batch, forward and backward: a floor on the "
                        "layers' time outside CUDA graphs [ms]",
    "moe_expert_host_s": "host launch time added per local expert [ms]",
    "gemm_scale": "training GEMM kernels over the best-case matmul throughput (MAMF) of the part, on "
                  "Megatron-core",
    "attention_efficiency": "FlashAttention forward and backward throughput over the BF16 peak, on long "
                            "blocks, on Megatron-core",
    "fp8_gemm_efficiency": "best FP8 matmul throughput over the FP8 peak",
    "layer_overhead_s": "fixed time per layer and micro-batch, forward and backward [ms]",
    "step_overhead_s": "fixed time per step [ms]",
    "elementwise_passes": "elementwise memory traffic over the fused minimum the model counts",
    "kernel_scale": "the stack's GEMM kernels against Megatron-core's on the same GPU family",
    "attention_kernel_scale": "the stack's attention kernel against Megatron-core's on the same GPU family",
}
FAMILY_NAME = {"a100-80gb": "A100", "h100-sxm": "Hopper", "b200": "Blackwell", "gb300": "Blackwell Ultra"}
"""The GPU families of calibration.FAMILY (A100 40 and 80 GB; H100, H200; B200, GB200; B300, GB300), by the
accelerator that names them in fitted.toml."""


DEEPGEMM_FP8 = [
    # (GEMM, experts, tokens per expert, TFLOP/s): deepseek-ai/DeepGEMM README @55ab91f (tables of 2025-03),
    # FP8 on an H800 SXM5, N = 4096, K = 7168
    ("dense", 1, 128, 533.0), ("dense", 1, 4096, 1265.0), ("grouped, masked, 4 experts", 4, 256, 932.0),
    ("grouped, masked, 1 expert", 1, 1024, 1233.0), ("grouped, contiguous, 8 experts", 8, 4096, 1346.0),
]
DEEPGEMM_N, DEEPGEMM_K = 4096, 7168
H800_FP8_PEAK_FLOP_PER_S = 1979e12
"""The H800 SXM5's dense FP8 peak, the H100 SXM's (NVIDIA H100 datasheet, as meshplan's catalog has it)."""


class StaleFits(Exception):
    """The catalog's stored fold or source-group fits were not made for these rows."""


def _pct(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x * 100:.{digits}f} %"


def _signed(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.1f} %"


def _table(header: list[str], rows: list[list[str]], right: int = 0) -> str:
    """A Markdown table, its last ``right`` columns right-aligned; a ``|`` inside a cell (a pipeline layout) is
    escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * (len(header) - right) + "---:|" * right]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows])


def _mape(errors: list[float]) -> float | None:
    return sum(abs(e) for e in errors) / len(errors) if errors else None


def check_stored_fits(data: str) -> tuple[set[int], dict[tuple[str, str, str], tuple[float, float]]]:
    """The MoE rows of ``data`` (data rows from 0) and the fit's bounds of every parameter, by (kind, name,
    key) as fitted.toml files them; StaleFits where the catalog's stored 5-fold or source-group fits were not
    made for its rows, so that ``validate`` would refit them."""
    from meshplan.validation import calibrate as cal
    from meshplan.validation import fold_store
    from meshplan.validation.validate import load_scenarios, read_rows

    results = load_scenarios(read_rows(data))
    rows = cal.cv_rows(results)
    for by_source in (False, True):
        fits, why = fold_store.load_fits(catalog_fit(), rows, k=5, rounds=cal.MAX_ROUNDS, by_source=by_source)
        if fits is None:
            raise StaleFits(f"the catalog's {'source-group' if by_source else 'fold'} fits do not serve {data}: "
                            f"{why}; rerun meshplan validate --calibrate")
    bounds = {}
    for p in cal.parameter_space(rows):
        kind, _, name = p.scope.partition(":")
        bounds[(kind, name, p.key)] = (p.lo, p.hi)
    return {r.row for r in results if r.scenario is not None and r.scenario.model.is_moe}, bounds


def run_validate(data: str) -> dict[str, Any]:
    """``meshplan validate DATA --json --by-source``, parsed."""
    cmd = [sys.executable, "-m", "meshplan.cli", "validate", data, "--json", "--by-source"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SpecError("validate", f"{' '.join(cmd[2:])} exited {done.returncode}: {done.stderr.strip()[:400]}")
    return json.loads(done.stdout)


def _summary(report: dict[str, Any]) -> str:
    s = report["summary"]
    fit, cv, lso = s["fit"], s["cross_validated"], s["leave_one_source_out"]
    rows = [r for r in report["rows"] if "skipped" not in r]
    steps = [r["predicted_step_time_s"] / r["measured_step_time_s"] - 1 for r in rows
             if r.get("measured_step_time_s")]

    def line(name: str, st: dict[str, Any]) -> list[str]:
        return [name, f"{st['count']:,}", _pct(st["mape"], 2), _pct(st["median_ape"]), _pct(st["p90_ape"]),
                _signed(st["bias"])]

    table = _table(["tokens/s per GPU, predicted against measured", "rows", "MAPE", "median", "p90", "bias"], [
        line("fit (the catalog's parameters)", fit["tokens_per_s_per_gpu"]),
        line("**5-fold cross-validated**", cv["tokens_per_s_per_gpu"]),
        line("leave one source group out", lso["tokens_per_s_per_gpu"]),
        line("step time, rows that publish it (fit)", _stats(steps)),
        line("**peak memory**, rows that report it (fit)", fit["peak_memory"]),
    ])
    over = fit.get("recipe_recompute_over_memory") or []
    unfit = fit["predicted_not_to_fit"]
    return "\n".join([
        f"{fit['rows']:,} rows read, {fit['modelled']:,} modelled ({_pct(fit['modelled'] / fit['rows'])}), "
        f"{fit['skipped']:,} skipped with their reason. Error = predicted / measured tokens/s per GPU - 1; "
        "MAPE is the mean of its absolute value, median and p90 its percentiles, bias its mean.", "", table, "",
        f"- Measured runs predicted not to fit in memory: {len(unfit)}"
        + (f" (rows {', '.join(map(str, unfit))})" if unfit else "") + ".",
        f"- Measured runs whose recipe's recomputation the memory model puts over the GPU, and which are "
        f"timed with meshplan's own choice instead: {len(over)}" + (f" (rows {', '.join(map(str, over))})"
                                                                    if over else "") + ".",
        f"- The cross-validated figures come from {cv['fold_fits_source']}.",
    ])


def _stats(errors: list[float]) -> dict[str, Any]:
    a = sorted(abs(e) for e in errors)
    n = len(a)
    if not n:
        return {"count": 0, "mape": None, "median_ape": None, "p90_ape": None, "bias": None}
    median = a[n // 2] if n % 2 else (a[n // 2 - 1] + a[n // 2]) / 2
    p90 = a[min(n - 1, int(0.9 * (n - 1) + 0.5))]
    return {"count": n, "mape": sum(a) / n, "median_ape": median, "p90_ape": p90, "bias": sum(errors) / n}


def _by_source(report: dict[str, Any]) -> str:
    s = report["summary"]
    fit, cv, lso = (s[k]["by_source_group"] for k in ("fit", "cross_validated", "leave_one_source_out"))
    rows = [[g, f"{v['count']:,}", _pct(fit[g]["mape"]), _pct(v["mape"]), _pct(v["median_ape"]),
             _pct(v["p90_ape"]), _signed(v["bias"]), _pct(lso[g]["mape"])] for g, v in cv.items()]
    return _table(["source group", "rows", "fit MAPE", "CV MAPE", "CV median", "CV p90", "CV bias",
                   "left out: MAPE"], rows)


def _by_gpu(report: dict[str, Any]) -> str:
    cv = report["summary"]["cross_validated"]["by_gpu"]
    rows = [[g, f"{v['count']:,}", _pct(v["mape"]), _pct(v["median_ape"]), _pct(v["p90_ape"]), _signed(v["bias"])]
            for g, v in cv.items()]
    return _table(["accelerator", "rows", "CV MAPE", "CV median", "CV p90", "CV bias"], rows)


def _by_kind(report: dict[str, Any], moe: set[int]) -> str:
    rows = [r for r in report["rows"] if "skipped" not in r]
    groups: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        ("every source", lambda r: True),
        ("Megatron-LM and NeMo (four groups)", lambda r: r["source_group"] in MEGATRON_GROUPS),
        ("NeMo / Megatron-Bridge", lambda r: r["source_group"] == "NeMo / Megatron-Bridge")]
    out = []
    for name, keep in groups:
        sel = [r for r in rows if keep(r)]
        cells = [name]
        for kind in (lambda r: r["row"] not in moe, lambda r: r["row"] in moe, lambda r: True):
            errs = [r["cv_error"] for r in sel if kind(r)]
            cells.append(f"{len(errs):,}: {_pct(_mape(errs))}" if errs else "-")
        out.append(cells)
    table = _table(["rows (CV MAPE)", "dense", "MoE", "all"], out)
    mn = [r for r in rows if r["source_group"] in MEGATRON_GROUPS]
    named = [r for r in mn if r["model"] in UNEXPLAINED_MODELS or r["row"] in DISAGREEING_ROWS]
    rest = [r for r in mn if r not in named]
    perfect = sum(abs(r["cv_error"]) for r in rest) / len(mn) if mn else None
    errs = ", ".join(_signed(r["cv_error"]) for r in sorted(named, key=lambda r: abs(r["cv_error"])))
    return "\n".join([table, "", f"The {len(named)} Megatron and NeMo rows of {', '.join(UNEXPLAINED_MODELS)} and "
                      f"row{'s' if len(DISAGREEING_ROWS) > 1 else ''} {', '.join(map(str, DISAGREEING_ROWS))} "
                      f"(below) have cross-validated errors of {errs}. Without them the other {len(rest):,} "
                      f"Megatron and NeMo rows have a cross-validated MAPE of "
                      f"{_pct(_mape([r['cv_error'] for r in rest]), 2)}; predicted perfectly, they would bring "
                      f"all {len(mn):,} to {_pct(perfect, 2)}."])


def _median(xs: list[float]) -> float | None:
    a = sorted(xs)
    n = len(a)
    return None if not n else a[n // 2] if n % 2 else (a[n // 2 - 1] + a[n // 2]) / 2


def _bands(report: dict[str, Any], fitted: dict[str, Any]) -> str:
    s = report["summary"]
    cov = s["cross_validated"]["band_coverage"]
    unseen = s["leave_one_source_out"]["unseen_stack_band"]
    parts = [f"{label} {_pct(cov[k]['inside'])} of {cov[k]['rows']:,}"
             for k, label in (("all", "all"), ("dense", "dense"), ("moe", "MoE")) if k in cov]
    bands = fitted.get("uncertainty", {})
    rows = [[k, _signed(v["low"]), _signed(v["high"]), f"{int(v['rows']):,}"] for k, v in sorted(bands.items())]
    b = unseen["bands"].get("unseen-stack", {})
    c = unseen.get("coverage") or {}
    records = [r for r in report["rows"] if "skipped" not in r]
    stacks = []
    for stack, v in c.get("by_stack", {}).items():
        errs = [r["leave_one_source_out_error"] for r in records if r["software"] == stack
                and r.get("leave_one_source_out_error") is not None]
        stacks.append([stack, f"{v['rows']:,}", _signed(_median(errs)), _pct(v['inside'], 0)])
    return "\n".join([
        f"- Leave-one-out coverage of the similar-runs band (nominal {_pct(cov['nominal'], 0)}): {'; '.join(parts)}.",
        f"- The unseen-stack band: measured steps of {b.get('rows', 0):,} runs whose stack the fit had not seen "
        f"fell within {_signed(b.get('low'))} .. {_signed(b.get('high'))} of the prediction (10th to 90th "
        f"percentile). Each stack's rows against the band built from the other stacks' (nominal "
        f"{_pct(c.get('nominal', 0.8), 0)}):", "",
        _table(["stack left out", "rows", "median error (predicted / measured tokens/s - 1)",
                "inside the others' band"], stacks), "",
        "The bands by stratum (family / stack / kind; measured / predicted step - 1), as `fitted.toml` stores "
        "them:", "",
        _table(["stratum", "10th percentile", "90th percentile", "rows"], rows)])


def _repeats(report: dict[str, Any]) -> str:
    rep = report["summary"]["cross_validated"]["repeated_configurations"]
    rows = [[g, f"{v['rows']:,}", f"{v['configurations']:,}", _pct(v["mape"]), _pct(v["floor_mape"])]
            for g, v in rep.items()]
    return _table(["source group", "rows", "configurations", "meshplan CV MAPE", "floor"], rows)


def _largest(report: dict[str, Any]) -> str:
    rows = [r for r in report["rows"] if "skipped" not in r and abs(r["cv_error"]) >= LARGEST_ERROR]
    rows.sort(key=lambda r: -abs(r["cv_error"]))
    return _table(["row", "source group", "model", "GPU", "plan", "CV error", "left out"],
                  [[str(r["row"]), r["source_group"], r["model"], r["gpu"], f"`{r['plan']}`", _signed(r["cv_error"]),
                    _signed(r.get("leave_one_source_out_error"))] for r in rows])


def _value(key: str, v: float) -> str:
    """A parameter's value as the table shows it: times in ms, three significant digits."""
    x = v * 1e3 if key.endswith("_s") else v
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _scope(kind: str, name: str) -> str:
    if kind == "global":
        return "global"
    if kind == "stack":
        stack, _, fam = name.partition("/")
        return f"{stack} on {FAMILY_NAME.get(fam, fam)}"
    return FAMILY_NAME.get(name, name)


def _parameters(fitted: dict[str, Any], bounds: dict[tuple[str, str, str], tuple[float, float]]) -> str:
    from meshplan.validation.calibrate import MEASURED

    measured = {(scope.split(":")[0], scope.split(":")[1], key) for scope, key in MEASURED}
    rows = []
    for kind in ("global", "accelerator", "software", "stack"):
        tables = {"": fitted.get("global", {})} if kind == "global" else fitted.get(kind, {})
        for name, table in tables.items():
            where = _scope(kind, name)
            for key, v in sorted(table.items()):
                lo, hi = bounds.get((kind, name, key), (None, None))
                status = ("measured" if (kind, name, key) in measured else
                          "at its bound" if lo is not None and v in (lo, hi) else "")
                span = "" if lo is None else f"{_value(key, lo)} .. {_value(key, hi)}"
                rows.append([where, f"`{key}`", _value(key, v), span, status, PARAMETER_MEANING.get(key, "")])
    return _table(["scope", "parameter", "value", "bounds", "", "meaning"], rows)


def blocks(report: dict[str, Any], moe: set[int], fitted: dict[str, Any],
           bounds: dict[tuple[str, str, str], tuple[float, float]]) -> dict[str, str]:
    """Every generated table of docs/validation.md, by marker name."""
    return {"summary": _summary(report), "by-source": _by_source(report), "by-gpu": _by_gpu(report),
            "by-kind": _by_kind(report, moe), "bands": _bands(report, fitted), "repeats": _repeats(report),
            "largest": _largest(report), "parameters": _parameters(fitted, bounds)}


def readme_blocks(report: dict[str, Any], moe: set[int]) -> dict[str, str]:
    """The README's one table: cross-validated errors of tokens/s per GPU by kind of run, and peak memory."""
    rows = [r for r in report["rows"] if "skipped" not in r]
    fit = report["summary"]["fit"]
    groups: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        ("every modelled run", lambda r: True),
        ("dense models", lambda r: r["row"] not in moe),
        ("mixture-of-experts models", lambda r: r["row"] in moe),
        ("Megatron-LM and NeMo runs", lambda r: r["source_group"] in MEGATRON_GROUPS),
        ("torchtitan runs", lambda r: r.get("software") == "torchtitan"),
        ("llm-foundry runs", lambda r: r.get("software") == "llm-foundry"),
    ]
    out = []
    for name, keep in groups:
        errs = [r["cv_error"] for r in rows if keep(r) and r.get("cv_error") is not None]
        st = _stats(errs)
        out.append([name, f"{st['count']:,}", _pct(st["mape"]), _pct(st["median_ape"]), _pct(st["p90_ape"])])
    mem = fit["peak_memory"]
    out.append(["peak memory (rows that report it)", f"{mem['count']:,}", _pct(mem["mape"]), _pct(mem["median_ape"]),
                _pct(mem["p90_ape"])])
    note = (f"Error of the prediction against {fit['modelled']:,} published, measured runs ("
            f"{_pct(fit['modelled'] / fit['rows'])} of {fit['rows']:,} rows; docs/validation.md): tokens/s per GPU "
            "predicted by fits that had not seen the run (5-fold cross-validation); peak memory by the catalog's fit.")
    return {"trust": "\n".join([note, "", _table(["runs", "rows", "MAPE", "median", "p90"], out)])}


def moe_blocks() -> dict[str, str]:
    """docs/moe.md's one table: meshplan's FP8 expert-GEMM model (cost.grouped_gemm, per-expert launches and
    one grouped kernel) on an H100 SXM with the Megatron stack's fitted parameters, at the shapes of
    DeepGEMM's published figures, as a share of the FP8 peak."""
    from meshplan.calibration import compute_params_for
    from meshplan.catalog import load_cluster
    from meshplan.cost.compute import gemm_curve
    from meshplan.cost.grouped_gemm import grouped_gemm_time_s

    accel = load_cluster("h100-sxm", nodes=1).accelerator
    params = compute_params_for(accel.name, "megatron")
    peak, e_max, half_dim = gemm_curve(accel, params, "fp8")

    def share(g: int, m: int, kernel: str) -> float:
        t = grouped_gemm_time_s(m, g, DEEPGEMM_N, DEEPGEMM_K, kernel=kernel, peak_flop_per_s=peak, e_max=e_max,
                                half_dim=half_dim, hbm_bytes_per_s=accel.hbm_bytes_per_s, operand_bytes=1.0)
        return 2 * g * m * DEEPGEMM_N * DEEPGEMM_K / t / peak

    rows = [[name, f"{m:,}{' each' if g > 1 else ''}", f"{tflops * 1e12 / H800_FP8_PEAK_FLOP_PER_S:.0%}",
             f"{share(g, m, 'per_expert'):.0%}", "" if name == "dense" else f"{share(g, m, 'grouped'):.0%}"]
            for name, g, m, tflops in DEEPGEMM_FP8]
    note = (f"meshplan's model at the same shapes, on an H100 SXM with the Megatron stack's fitted parameters (FP8: "
            f"e_max {e_max:.3f}, d½ {half_dim:.0f}; moe_gemm_efficiency {params.moe_gemm_efficiency:.3g}), as a "
            "share of the FP8 peak:")
    return {"moe-curve": "\n".join([note, "", _table(
        ["GEMM", "tokens", "DeepGEMM", "meshplan, one GEMM per expert", "meshplan, one grouped kernel"], rows,
        right=3)])}


def render(doc: str, tables: dict[str, str]) -> str:
    """``doc`` with the text between each pair of markers replaced by its table; SpecError for a table whose
    markers are missing."""
    for name, text in tables.items():
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
        if not pattern.search(doc):
            raise SpecError("docs", f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> markers")
        doc = pattern.sub(lambda m, t=text: m.group(1) + t + "\n" + m.group(2), doc)
    return doc


def _is_moe_doc(path: str) -> bool:
    """Whether ``path`` is docs/moe.md, whose table needs no published runs."""
    return Path(path).name == Path(MOE_DOC).name


def generate(doc_path: str, data: str, report: dict[str, Any] | None = None) -> tuple[str, str]:
    """(the document as it is, the document with its tables regenerated: the README's own table where
    ``doc_path`` is the README, docs/moe.md's where it is that, docs/validation.md's otherwise)."""
    doc = read_input_text(Path(doc_path), "docs", kind="document")
    if _is_moe_doc(doc_path):
        return doc, render(doc, moe_blocks())
    moe, bounds = check_stored_fits(data)
    report = report if report is not None else run_validate(data)
    if Path(doc_path).name == README:
        return doc, render(doc, readme_blocks(report, moe))
    return doc, render(doc, blocks(report, moe, catalog_fit(), bounds))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meshplan.validation.table", description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help=f"published runs CSV (default {DEFAULT_DATA})")
    ap.add_argument("--doc", action="append", default=None,
                    help=f"a document to update (default {DEFAULT_DOC}, {MOE_DOC} and {README}); may be repeated")
    ap.add_argument("--check", action="store_true", help="exit 1 if the tables are out of date; write nothing")
    args = ap.parse_args(argv)
    paths = args.doc or [DEFAULT_DOC, MOE_DOC, README]
    try:  # docs/moe.md's table reads the catalog alone; the others the published runs' validation
        needs_runs = not all(_is_moe_doc(path) for path in paths)
        report = run_validate(args.data) if needs_runs and check_stored_fits(args.data) else None
        docs = [(path, *generate(path, args.data, report)) for path in paths]
    except (SpecError, StaleFits) as exc:
        print(f"meshplan.validation.table: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, old, new in docs if old != new]
    if args.check:
        for path in stale:
            print(f"{path}: generated tables are out of date; run python -m meshplan.validation.table",
                  file=sys.stderr)
        return 1 if stale else 0
    for path, _, new in docs:
        if path in stale:
            atomic_write_text(path, new)
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
