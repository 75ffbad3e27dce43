"""Search-speed benchmark (issue: the search must stay interactive). Run on one core:

    taskset -c 0 python benchmarks/bench_search.py [--quick]

Records, for three scenarios, the plans enumerated (structures with their default options, and option
variants), how many were evaluated and how many the bound pruned, the configurations covered (with
micro-batch sizes, recompute modes and partial recomputation), and the wall time of the full closed-form
search, best of ``--repeat`` runs (the first run also fills the kernel-time caches). Timing goals are
checked here, not in unit tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from meshplan import JobSpec, Space, load_cluster, load_model, search

SCENARIOS = [
    # name, model, accelerator, nodes, batch tokens, seq, target seconds
    ("worked example: seed-70b on 64 H100", "seed-70b", "h100-sxm", 8, 4_194_304, 4096, 1.0),
    ("GPT-3 175B on 1,024 A100", "gpt3-175b", "a100-80gb", 128, 1536 * 2048, 2048, 10.0),
    ("Llama 3.1 405B on 16,384 H100", "llama-3.1-405b", "h100-sxm", 2048, 16 * 2**20, 8192, 30.0),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the first scenario")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario; the fastest is reported")
    args = ap.parse_args()
    out = []
    for name, model, accel, nodes, batch, seq, target in SCENARIOS[:1] if args.quick else SCENARIOS:
        m, c, j = load_model(model), load_cluster(accel, nodes=nodes), JobSpec(global_batch_tokens=batch, seq_len=seq)
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            r = search(m, c, j, Space())
            times.append(time.perf_counter() - t0)
        elapsed, first = min(times), times[0]
        best = r.recommended
        enumerated = r.n_plans + r.n_pruned
        out.append({"scenario": name, "plans_enumerated": enumerated, "plans_evaluated": r.n_plans,
                    "plans_pruned": r.n_pruned, "configurations": r.n_configurations, "feasible": len(r.feasible),
                    "elapsed_s": elapsed, "first_run_s": first, "target_s": target, "met": elapsed <= target,
                    "best": best.plan.to_string() if best else None,
                    "best_step_s": best.step_time_s if best else None})
        print(f"{name:<36} {enumerated:>7,} plans ({r.n_plans:,} evaluated, {r.n_pruned:,} pruned) "
              f"{r.n_configurations:>11,} configurations {elapsed:6.2f} s (first run {first:.2f} s; target "
              f"{target:g} s: {'met' if elapsed <= target else 'MISSED'}) best: {best.plan.label() if best else '-'}",
              flush=True)
    if args.json:
        print(json.dumps({"python": platform.python_version(), "machine": platform.machine(), "results": out},
                         indent=2))


if __name__ == "__main__":
    main()
