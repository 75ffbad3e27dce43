"""The worked example's simplified arithmetic (``--assumptions worked-example``).

Its shortcuts, each of which the faithful mode (meshplan.cost.step) replaces:
- the nominal parameter count Ψ (70e9 for seed-70b) instead of the exact count;
- 16 bytes per parameter of model state (ZeRO's mixed-precision Adam), sharded over every GPU of the
  data-parallel group, and nothing else in memory;
- FLOPs = 6·Ψ per token (no attention, no LM head distinction), step time at an assumed MFU; for a
  mixture of experts, Ψ of the active parameters (each token runs top-k of the experts), the usual 6·N_active;
- one pass of FSDP traffic per step, 3·(N-1)/N·2 bytes·Ψ per GPU (two all-gathers and one
  reduce-scatter, all in bf16), at the NIC's spec rate when the group spans nodes;
- four tensor-parallel all-reduces per layer of the whole replica batch (tokens·D·2 bytes), each
  sending 2·(t-1)/t of it per GPU, at the NVLink spec rate.

References: worked_example, rajbhandari2020, shoeybi2019.
"""

from __future__ import annotations

from meshplan.cost.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from meshplan.cost.estimate import CommEntry, Estimate, FlopReport, MemoryReport
from meshplan.cost.mesh import INTER_NODE, INTRA_NODE, axis_groups
from meshplan.cost.params import param_counts
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.arguments import check_scenario

STATE_BYTES_PER_PARAM = 16.0
NOTES = [
    "assumptions: worked-example (nominal parameters, 16 B/param, 6·Ψ FLOPs per token, one FSDP pass per "
    "step in bf16, four TP all-reduces per layer, spec link rates, assumed MFU)",
]


def unmodelled_settings(plan: Plan) -> list[str]:
    """The plan's settings the simplified arithmetic has no term for (it times data parallelism and TP at
    an assumed MFU): a pipeline, context or expert parallelism, a micro-batch size, recomputation or
    offloading, each as 'field=value'."""
    out = [f"{k}={v}" for k, v in (("pp", plan.pp), ("cp", plan.cp), ("ep", plan.ep)) if v > 1]
    out += [f"{k}={v}" for k, v in (("mbs", plan.mbs), ("recompute", plan.recompute)) if v is not None]
    if plan.offload_layers:
        out.append(f"offload_layers={plan.offload_layers}")
    return out


def _entry(op: str, axis: str, purpose: str, count: int, message: float, n: int, link: str, rate: float,
           sent: float, exposed: float | None = None) -> CommEntry:
    t = sent / rate
    return CommEntry(collective=op, axis=axis, purpose=purpose, phase="step", count=count, message_bytes=message,
                     group_size=n, link=link, bytes_per_gpu=sent,
                     inter_node_bytes_per_gpu=sent if link == INTER_NODE else 0.0, time_s=t,
                     window="none" if exposed is None else "forward", exposed_s=t if exposed is None else exposed)


def evaluate_simplified(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float
                        ) -> Estimate:
    """The worked example's figures for ``plan`` (see module docstring)."""
    check_scenario("evaluate_simplified", model, cluster, job, plan=plan, mfu=mfu, with_plan=True)
    if mfu is None:
        raise SpecError("evaluate_simplified.mfu", "is required: the simplified arithmetic assumes an MFU")
    counts = param_counts(model)
    psi = model.nominal_params or float(counts.total)
    psi_active = psi * counts.active / counts.total if model.is_moe else psi  # nominal, scaled to the active share
    n = cluster.n_gpus
    groups = axis_groups(plan, cluster)
    shard = plan.shard_degree
    static = STATE_BYTES_PER_PARAM * psi / (plan.tp * plan.pp * (shard if shard > 1 else 1))
    flop = 6.0 * psi_active * job.global_batch_tokens
    peak = cluster.accelerator.peak_flop_per_s(job.precision)
    step = flop / (n * peak * mfu)
    comm: list[CommEntry] = []
    psi_local = psi / (plan.tp * plan.pp)
    intra_rate, inter_rate = cluster.intra.link_bytes_per_s, cluster.inter.nic_bytes_per_s

    def rate(link: str) -> float:
        return inter_rate if link == INTER_NODE else intra_rate

    if shard > 1:
        g = groups["dp_shard"]
        per_pass = (shard - 1) / shard * 2.0 * psi_local
        t_total = 3 * per_pass / rate(g.link)
        hidden_exposed = max(0.0, t_total - step)
        for op, purpose in ((ALL_GATHER, "params all-gather (forward)"), (ALL_GATHER, "params all-gather (backward)"),
                            (REDUCE_SCATTER, "grads reduce-scatter")):
            comm.append(_entry(op, "dp_shard", purpose, 1, 2.0 * psi_local, shard, g.link, rate(g.link), per_pass,
                               exposed=hidden_exposed / 3))
    if plan.dp_replicate > 1:
        g = groups["dp_replicate"]
        r = plan.dp_replicate
        msg = 2.0 * psi_local / (shard if shard > 1 else 1)
        sent = 2 * (r - 1) / r * msg
        comm.append(_entry(ALL_REDUCE, "dp_replicate", "grads all-reduce", 1, msg, r, g.link, rate(g.link), sent,
                           exposed=max(0.0, sent / rate(g.link) - step)))
    if plan.tp > 1:
        g = groups["tp"]
        tokens_per_replica = job.global_batch_tokens / plan.dp
        msg = tokens_per_replica * model.hidden * 2.0
        count = 4 * model.n_layers
        sent = count * 2 * (plan.tp - 1) / plan.tp * msg
        comm.append(_entry(ALL_REDUCE, "tp", "TP all-reduces, 2 forward + 2 backward per layer", count, msg, plan.tp,
                           g.link if g.link == INTRA_NODE else INTER_NODE, rate(g.link), sent))
    capacity = cluster.accelerator.hbm_capacity_bytes
    reasons = []
    if static > capacity:
        split = plan.tp * plan.pp * (shard if shard > 1 else 1)
        reasons.append(f"model states {static / 1e9:,.0f} GB per GPU (16 B x {psi:.3g} parameters / {split}) "
                       f"exceed the {capacity / 2**30:.0f} GiB of HBM")
    mem_report = MemoryReport(terms={"model_states": static}, static_bytes=static, activation_bytes=0.0,
                              transient_bytes=0.0, runtime_bytes=0.0, peak_bytes=static, capacity_bytes=capacity,
                              stage=0)
    flops = FlopReport(model_flop_per_step=flop, hardware_flop_per_step=flop, model_flop_per_token=6.0 * psi_active,
                       convention="6N (nominal, active)" if model.is_moe else "6N (nominal)",
                       model_flop_per_step_palm=flop, model_flop_per_step_causal=flop)
    return Estimate(
        model=model.name, cluster=cluster.name, n_gpus=n, plan=plan, n_microbatches=1,
        global_batch_tokens=job.global_batch_tokens, seq_len=job.seq_len, feasible=not reasons,
        infeasible_reasons=reasons, memory=mem_report, flops=flops, step_time_s=step,
        time_breakdown={"compute": step}, mfu=mfu, hfu=mfu, comm=comm, mode="worked-example",
        notes=list(NOTES), compute_source=f"assumed MFU {mfu:.0%}",
    )
