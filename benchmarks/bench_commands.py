"""Wall time of the whole answer, command by command, against the last release installed side by side.

    python benchmarks/bench_commands.py --baseline /path/to/venv-0.2.0/bin/python [--repeat 3] [--only NAME,...]

Each command runs as a fresh process (``python -c 'from meshplan.cli import main; ...'``) of this checkout's
interpreter (the one running this script, with meshplan importable) and of ``--baseline`` (an interpreter with
the last release installed, matplotlib too for ``report``), the two alternating so that both see the same load
on a shared machine; the table gives the median of ``--repeat`` runs of each, their ratio (release / now) and
the target of issue 45. ``cold-evaluate`` times one ``evaluate`` in-process in a fresh process (the catalog
loaded, no evaluation run before it), as the median over ``--repeat`` x 5 processes. To install the release:

    git worktree add /tmp/meshplan-src-0.2.0 v0.2.0
    python3 -m venv /tmp/meshplan-0.2.0
    /tmp/meshplan-0.2.0/bin/pip install "/tmp/meshplan-src-0.2.0[plot]"

(``v0.1.0`` likewise for the first release.)

Without ``--baseline`` only this checkout is measured. docs/performance.md has the figures and their machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

B405 = ["--model", "llama-3.1-405b", "--nodes", "2048", "--batch-tokens", "16M", "--seq-len", "8192"]
COMMANDS = {
    # name: (meshplan arguments, target seconds (issue 45))
    "plan-default": (["plan"], 3.0),
    "plan-405b": (["plan", *B405], 10.0),
    "sweep-405b": (["sweep", *B405, "--vary", "inter-node-bandwidth=12.5..50", "--points", "20"], 10.0),
    "report-405b": (["report", *B405, "--out", "{tmp}"], 20.0),
    "compare-405b": (["compare", *B405, "--cluster", "h100-sxm,h200,b200"], None),
}
COLD = """
import sys, time
from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
model, cluster = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
job = JobSpec(global_batch_tokens=4194304, seq_len=4096)
plan = parse_plan("tp=4,pp=16,mbs=2,recompute=none,async_tp=true", 64)
t = time.perf_counter(); evaluate(model, cluster, job, plan); first = time.perf_counter() - t
t = time.perf_counter(); evaluate(model, cluster, job, plan); second = time.perf_counter() - t
print(first, second)
"""
COLD_TARGET_S = 1e-3
CLI = "import sys; from meshplan.cli import main; sys.exit(main(sys.argv[1:]))"


def run_command(python: str, argv: list[str]) -> float:
    """Seconds one ``meshplan ARGV`` takes in a fresh process of ``python`` (its output discarded)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [a.replace("{tmp}", tmp) for a in argv]
        t0 = time.perf_counter()
        done = subprocess.run([python, "-c", CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, cwd=tmp)
        elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{python} meshplan {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return elapsed


def cold_evaluation(python: str) -> tuple[float, float]:
    """(first, second) ``evaluate`` in a fresh process of ``python`` [s]."""
    out = subprocess.run([python, "-c", COLD], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def measure(pythons: dict[str, str], names: list[str], repeat: int) -> list[dict]:
    rows = []
    for name in names:
        times: dict[str, list[float]] = {label: [] for label in pythons}
        for _ in range(repeat):
            for label, python in pythons.items():  # alternating: both see the same load
                if name == "cold-evaluate":
                    times[label] += [cold_evaluation(python)[0] for _ in range(5)]
                else:
                    times[label].append(run_command(python, COMMANDS[name][0]))
        target = COLD_TARGET_S if name == "cold-evaluate" else COMMANDS[name][1]
        row = {"command": name, "argv": "evaluate (in-process)" if name == "cold-evaluate"
               else "meshplan " + " ".join(COMMANDS[name][0]), "target_s": target,
               **{f"{label}_s": statistics.median(t) for label, t in times.items()},
               **{f"{label}_runs_s": t for label, t in times.items()}}
        if "release" in times:
            row["ratio"] = row["release_s"] / row["now_s"]
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _fmt(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s:.1f} s"


def _line(row: dict) -> str:
    target = row["target_s"]
    met = "" if target is None else (" met" if row["now_s"] <= target else " MISSED")
    ratio = f"{row['ratio']:5.2f}x" if "ratio" in row else "     -"
    return (f"{row['command']:<14} release {_fmt(row.get('release_s')):>9}  now {_fmt(row['now_s']):>9}  {ratio}  "
            f"target {_fmt(target)}{met}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default=os.environ.get("MESHPLAN_BASELINE_PYTHON"),
                    help="python of a venv with the last release installed (env MESHPLAN_BASELINE_PYTHON)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each command per version; the median is shown")
    ap.add_argument("--only", default=None, help=f"comma-separated, of: cold-evaluate, {', '.join(COMMANDS)}")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else ["cold-evaluate", *COMMANDS]
    unknown = [n for n in names if n != "cold-evaluate" and n not in COMMANDS]
    if unknown:
        raise SystemExit(f"unknown command {unknown[0]!r}; allowed: cold-evaluate, {', '.join(COMMANDS)}")
    pythons = {"now": sys.executable}
    if args.baseline:
        pythons = {"release": args.baseline, **pythons}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; medians of {args.repeat} "
          "runs (cold-evaluate: of 5 processes per run)", flush=True)
    rows = measure(pythons, names, max(1, args.repeat))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        from meshplan.fileio import write_json

        write_json(args.json, {"python": sys.version.split()[0], "cpus": os.cpu_count(), "rows": rows})


if __name__ == "__main__":
    main()
