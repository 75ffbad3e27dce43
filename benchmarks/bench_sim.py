"""Timeline-simulator speed: one step of a Llama 3.1 405B plan with 16 pipeline stages and 32
micro-batches (goal: under 50 ms on one core).

    taskset -c 0 python benchmarks/bench_sim.py
"""

from __future__ import annotations

import statistics
import time

from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
from meshplan.calibration import compute_params_for
from meshplan.sim.simulate import simulate


def main() -> None:
    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-sxm", nodes=128)
    job = JobSpec(global_batch_tokens=8 * 32 * 8192, seq_len=8192)
    plan = parse_plan("tp=8,pp=16,dp_shard=8,mbs=1,recompute=full", cluster.n_gpus)
    for schedule in ("1f1b", "zb-h1", "zb-v"):  # the simulator runs interleaving as 1F1B, its bubble by v
        p = plan if schedule == "1f1b" else parse_plan(plan.to_string() + f",schedule={schedule}"
                                                       , 1024)
        est = evaluate(model, cluster, job, p)
        cp = compute_params_for(cluster.accelerator.name)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            r = simulate(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"405B, pp=16, m={est.n_microbatches}, {schedule:<11}: simulation {med * 1e3:6.1f} ms (median of 7; "
              f"goal 50 ms: {'met' if med < 0.05 else 'MISSED'}); step {r.step_time_s:.2f} s simulated, "
              f"{est.step_time_s:.2f} s closed form")


if __name__ == "__main__":
    main()
