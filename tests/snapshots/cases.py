"""What the behaviour snapshot records, and how each part is produced.

Each case runs a ``meshplan`` command in this process (``meshplan.cli.main``) and keeps its output with
what varies from run to run taken out (the search's wall-clock time); floats are kept as JSON writes them
(``repr``: exact), so comparing the parsed values compares every float exactly. The crosscheck cases keep
meshplan's side of the torch cross-checks (tests/torch/test_crosscheck.py): the estimate each run is
compared with, whose ledger those tests match call for call and byte for byte (rel 1e-9) against PyTorch.

The stored outputs live beside this file, one gzip'd JSON (or text) file per case; ``python -m
tests.snapshots.regen`` rewrites them (README.md in this folder says when that is legitimate).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSV_NAME = "published_runs.csv"


def published_runs_csv() -> Path | None:
    """``../shared/data/published_runs.csv`` beside the checkout, as .ci/run finds it; in a git worktree,
    also beside the main checkout the worktree belongs to. None where neither exists."""
    candidates = [ROOT.parent / "shared" / "data" / CSV_NAME]
    dot_git = ROOT / ".git"
    if dot_git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        text = dot_git.read_text().strip()
        if text.startswith("gitdir:"):
            main = Path(text.split(":", 1)[1].strip()).parents[2]
            candidates.append(main.parent / "shared" / "data" / CSV_NAME)
    return next((p for p in candidates if p.is_file()), None)


def run_cli(argv: list[str]) -> str:
    """``meshplan ARGV``'s standard output (exit status 0 required)."""
    from meshplan.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    if status != 0:
        raise AssertionError(f"meshplan {' '.join(argv)} exited {status}")
    return out.getvalue()


ELAPSED_TEXT = re.compile(r"(configurations with micro-batch sizes and recompute modes\)) in [0-9.]+ s:")


def plan_text(argv: list[str]) -> str:
    """``meshplan plan`` as text, the search's wall-clock time replaced by ``<elapsed>``."""
    text, n = ELAPSED_TEXT.subn(r"\1 in <elapsed> s:", run_cli(argv))
    assert n == 1, "the search-time phrase of `meshplan plan` changed: update tests/snapshots/cases.py"
    return text


FULL_PLANS = 10
"""Plans of a ``plan --json`` output kept whole; the others are condensed (``condense_plan``)."""


def plan_json(argv: list[str]) -> dict[str, Any]:
    """``meshplan plan --json`` without ``search_elapsed_s``; its ``plans`` past the first FULL_PLANS
    condensed (``condense_plan``), and the SHA-256 of the whole output (``output_sha256``), so that the
    stored file stays small and still changes with any field of any plan."""
    out = json.loads(run_cli([*argv, "--json"]))
    del out["search_elapsed_s"]
    out["output_sha256"] = hashlib.sha256(canonical(out)).hexdigest()
    out["plans"] = out["plans"][:FULL_PLANS] + [condense_plan(p) for p in out["plans"][FULL_PLANS:]]
    return out


def condense_plan(p: dict[str, Any]) -> list[Any]:
    """A plan of ``plan --json`` as [plan string, feasible, step time [s], peak memory [bytes], the first
    16 hex digits of the SHA-256 of all its fields]."""
    return [p["plan"]["string"], p["feasible"], p["step_time_s"], p["memory"]["peak_bytes"],
            hashlib.sha256(canonical(p)).hexdigest()[:16]]


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, allow_nan=False).encode()


def cli_json(argv: list[str]) -> dict[str, Any]:
    return json.loads(run_cli([*argv, "--json"]))


def validate_json(_: list[str]) -> dict[str, Any] | str:
    """``meshplan validate published_runs.csv --json --by-source`` with the catalog's stored fold and
    source-group fits, or why it cannot run here without a refit (a string: the test skips)."""
    csv = published_runs_csv()
    if csv is None:
        return f"no ../shared/data/{CSV_NAME} beside the checkout"
    from meshplan.calibration import catalog_fit
    from meshplan.validation import calibrate as cal
    from meshplan.validation import fold_store
    from meshplan.validation.validate import load_scenarios, read_rows

    rows = cal.cv_rows(load_scenarios(read_rows(str(csv))))
    for by_source in (False, True):
        fits, why = fold_store.load_fits(catalog_fit(), rows, rounds=cal.MAX_ROUNDS, k=5, by_source=by_source)
        if fits is None:
            return f"validate would refit (half an hour): {why}"
    return cli_json(["validate", str(csv), "--by-source"])


CROSSCHECK_N_MICRO = 2
CROSSCHECK_RUNS = (
    # (model, plan) as tests/torch/test_crosscheck.py runs them
    *[("seed-70b", f"{p},recompute={r}")
      for p in ("dp_shard=8", "dp_shard=64", "dp_replicate=8,dp_shard=8", "tp=8", "tp=8,sp=false",
                "tp=4,dp_shard=16") for r in ("none", "full")],
    ("seed-70b", "dp_shard=8"), ("seed-70b", "dp_replicate=8,dp_shard=8"),
    ("seed-70b", "tp=8,sp=false,recompute=full"),
    ("seed-70b", "tp=4,dp_shard=2,recompute=full,recompute_layers=HALF"),
    ("seed-70b", "dp_shard=8,recompute=full,recompute_layers=HALF"),
    ("seed-70b", "dp_replicate=8"), ("seed-70b", "dp_replicate=8,grad_sync=every"),
    ("seed-70b", "dp_replicate=4,recompute=full"),
    *[(m, p) for m in ("mixtral-8x7b", "deepseek-v3")
      for p in ("dp_shard=4", "dp_replicate=2,dp_shard=2,recompute=full", "dp_replicate=4,mbs=2")],
)


def crosscheck_predictions(_: list[str]) -> dict[str, Any] | str:
    """meshplan's estimate for every run of tests/torch/test_crosscheck.py (``crosscheck.predict``, on the
    scaled-down model), as ``evaluate --json`` writes an estimate; needs the torch extra (the harness
    imports torch), else why not (a string: the test skips)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "needs the torch extra (pip install torch==2.13.0)"
    import meshplan
    from meshplan.harness.crosscheck import predict
    from meshplan.harness.reference_model import scale_down
    from meshplan.report.json import estimate_dict

    out = {}
    for model, text in CROSSCHECK_RUNS:
        spec = scale_down(meshplan.load_model(model))
        plan = meshplan.parse_plan(text.replace("HALF", str(spec.n_layers // 2)))
        est = predict(spec, plan, seq_len=64, mbs=plan.mbs or 1, n_micro=CROSSCHECK_N_MICRO)
        out[f"{model} {text}"] = json.loads(json.dumps(estimate_dict(est)))
    return out


@dataclass(frozen=True)
class Case:
    name: str
    """The stored file's stem."""
    argv: list[str]
    make: Callable[[list[str]], Any]
    slow: bool = False

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.{'txt' if self.make is plan_text else 'json'}.gz"


NO_CONDITIONS = ["--no-conditions"]
DEEPSEEK = ["evaluate", "--model", "deepseek-v3", "--nodes", "32", "--batch-tokens", "16M"]
CASES = (
    Case("validate_published_runs", [], validate_json),
    Case("crosscheck_predictions", [], crosscheck_predictions),
    Case("evaluate_default_fsdp", ["evaluate", "--plan", "dp_shard=64"], cli_json),
    Case("evaluate_interleaved", ["evaluate", "--plan", "tp=8,pp=4,dp_shard=2,schedule=interleaved,vpp=2"], cli_json),
    Case("evaluate_zbv", ["evaluate", "--plan", "tp=4,pp=4,dp_shard=4,schedule=zb-v"], cli_json),
    Case("evaluate_offload", ["evaluate", "--plan", "tp=8,dp_shard=8,sharding=megatron,offload_layers=auto"], cli_json),
    Case("evaluate_partial_recompute", ["evaluate", "--plan", "tp=8,dp_shard=8,recompute=full,recompute_layers=20"],
         cli_json),
    Case("evaluate_hsdp_infeasible", ["evaluate", "--plan", "dp_replicate=8,dp_shard=8,mbs=1"], cli_json),
    Case("evaluate_mixtral_ep", ["evaluate", "--model", "mixtral-8x7b", "--nodes", "4", "--plan", "ep=8,dp_shard=32"],
         cli_json),
    Case("evaluate_405b_cp_pp", ["evaluate", "--model", "llama-3.1-405b", "--nodes", "2048", "--batch-tokens",
                                 "16777216", "--seq-len", "131072", "--plan", "tp=8,cp=16,pp=16,dp_shard=8"], cli_json),
    Case("evaluate_deepseek_v3", [*DEEPSEEK, "--plan",
                                  "dp_shard=16,pp=16,ep=16,mbs=2,recompute=full,sharding=megatron,ep_dispatch=deepep"],
         cli_json),
    Case("evaluate_deepseek_v3_overlap", [*DEEPSEEK, "--plan", "dp_shard=16,pp=16,ep=16,mbs=1,sharding=megatron,"
                                          "schedule=interleaved,vpp=2,ep_overlap=true"], cli_json),
    Case("plan_default_text", ["plan"], plan_text, slow=True),
    Case("plan_default_json", ["plan"], plan_json, slow=True),
    Case("plan_mixtral", ["plan", "--model", "mixtral-8x7b", "--nodes", "4", *NO_CONDITIONS], plan_json, slow=True),
    Case("plan_gpt_oss", ["plan", "--model", "gpt-oss-120b", "--nodes", "4", "--batch-tokens", "2M", *NO_CONDITIONS],
         plan_json, slow=True),
    Case("plan_405b_pipelines", ["plan", "--model", "llama-3.1-405b", "--nodes", "64", "--batch-tokens", "16M",
                                 *NO_CONDITIONS], plan_json, slow=True),
)


def plan_counts(out: dict[str, Any]) -> dict[str, int]:
    """The search's plan counts in a ``plan --json`` output: enumerated = evaluated + pruned."""
    return {"enumerated": out["n_plans"] + out["n_pruned"], "evaluated": out["n_plans"], "pruned": out["n_pruned"],
            "configurations": out["n_configurations"]}


def dumps(value: Any) -> bytes:
    """The stored form: text as is, JSON with sorted keys (floats as ``repr`` writes them), gzip'd without
    a timestamp so that the same output gives the same bytes."""
    text = value if isinstance(value, str) else json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n"
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def load(case: Case) -> Any:
    text = gzip.decompress(case.path.read_bytes()).decode()
    return text if case.path.name.endswith(".txt.gz") else json.loads(text)


def differences(stored: Any, now: Any, path: str = "", limit: int = 20) -> list[str]:
    """Up to ``limit`` places where ``now`` differs from ``stored`` (JSON paths, or text lines)."""
    if isinstance(stored, str) and isinstance(now, str) and "\n" in stored + now:
        a, b = stored.splitlines(), now.splitlines()
        out = [f"line {i + 1}:\n  stored: {x}\n  now:    {y}"
               for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        if len(a) != len(b):
            out.append(f"{len(a)} lines stored, {len(b)} now")
        return out[:limit]
    if isinstance(stored, dict) and isinstance(now, dict):
        out = [f"{path}/{k}: only {'stored' if k in stored else 'now'}" for k in sorted(stored.keys() ^ now.keys())]
        for k in sorted(stored.keys() & now.keys()):
            if len(out) >= limit:
                break
            out += differences(stored[k], now[k], f"{path}/{k}", limit - len(out))
        return out[:limit]
    if isinstance(stored, list) and isinstance(now, list):
        out = [f"{path}: {len(stored)} items stored, {len(now)} now"] if len(stored) != len(now) else []
        for i, (x, y) in enumerate(zip(stored, now, strict=False)):
            if len(out) >= limit:
                break
            out += differences(x, y, f"{path}[{i}]", limit - len(out))
        return out[:limit]
    if type(stored) is not type(now) or stored != now:
        return [f"{path}: stored {stored!r}, now {now!r}"]
    return []
