"""Evaluate one plan: memory, FLOPs, communication ledger, step time and MFU (the faithful mode).

The step time is a closed form over the ledger and a per-operation compute model:

.. math:: t_{step} = \\max_{stage} \\big[ m(t_F + t_B + t_W + t_R) + \\sum exposed + contention
          + bubble + t_{opt} \\big] + overhead

This module is the entry point (``evaluate``, ``evaluate_within``); the parts, each in its own module:

- ``cost.stage``: one stage's context (its layers, units, recomputed layers) and the stages that bound
  the step;
- ``cost.stage_memory``: a stage's peak memory; ``cost.stage_compute``: its compute per micro-batch;
- ``cost.exposure``: what of each collective compute hides; ``cost.stage_time``: a stage's step time
  and breakdown, and the pipeline bubbles; ``cost.offload``: activation offloading's waits and limits;
- ``cost.batch``: how the batch splits into micro-batches;
- ``cost.fixed_plan``: the estimate of a plan whose micro-batch size and recomputation are set;
- ``cost.choice``: choosing the micro-batch size, recomputation and offloading; ``cost.bounds``: the lower
  bounds that prune that choice and the search.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.choice import Choice
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate
from meshplan.cost.validate import validate_plan
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.plan import stack_defaults


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None = None,
             compute: ComputeParams | None = None, time_infeasible: bool = True) -> Estimate:
    """Evaluate ``plan``. A micro-batch size or recompute mode left as None is chosen: the fastest
    feasible combination (the number of micro-batches follows from memory); if none fits, the one
    that needs the least memory, reported infeasible with its reasons, and timed as if it fitted
    unless ``time_infeasible`` is False (the search lists such plans by memory, not time)."""
    est = _evaluate(model, cluster, job, plan, mfu=mfu, compute=compute, cutoff_s=None,
                    time_infeasible=time_infeasible)
    assert est is not None
    return est


def evaluate_within(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, cutoff_s: float,
                    compute: ComputeParams | None = None) -> Estimate | None:
    """``evaluate``, for a search that only needs plans faster than ``cutoff_s``: None when nothing fits
    in memory, or when every combination that fits has a compute bound (``bounds.compute_bound_s``, plus the
    contention its traffic must add) or a busiest link (``bounds.traffic_floors``) above ``cutoff_s``, so that
    its step time is too. The memory probes still run; the communication
    ledgers of the pruned combinations do not."""
    return _evaluate(model, cluster, job, plan, mfu=None, compute=compute, cutoff_s=cutoff_s)


def _evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None,
              compute: ComputeParams | None, cutoff_s: float | None, time_infeasible: bool = True
              ) -> Estimate | None:
    validate_plan(model, cluster, job, plan)
    if compute is None:
        from meshplan.calibration import compute_params_for  # catalog data, loaded lazily once

        compute = compute_params_for(cluster.accelerator.name, job.software)
    runs = stack_defaults(job.software, plan)
    est = Choice(model, cluster, job, runs, compute, mfu, cutoff_s).choose(time_infeasible=time_infeasible)
    if est is None or runs is plan:
        return est
    # the stack's default is not an option the plan chose: the estimate names the plan as given (its
    # labels, layout key and tie-break), and says what ran
    return replace(est, plan=replace(est.plan, grad_sync=plan.grad_sync), stack_grad_sync=runs.grad_sync)
