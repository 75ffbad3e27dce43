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
from meshplan.specs.arguments import check_scenario
from meshplan.specs.plan import stack_defaults


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None = None,
             compute: ComputeParams | None = None, time_infeasible: bool = True) -> Estimate:
    """Evaluate ``plan``. A micro-batch size or recompute mode left as None is chosen: the fastest
    feasible combination (the number of micro-batches follows from memory); if none fits, the one
    that needs the least memory, reported infeasible with its reasons, and timed as if it fitted
    unless ``time_infeasible`` is False (the search lists such plans by memory, not time)."""
    check_scenario("evaluate", model, cluster, job, plan=plan, mfu=mfu, with_plan=True)
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


def evaluate_within_fitting(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, cutoff_s: float,
                            compute: ComputeParams) -> tuple[Estimate | None, bool]:
    """``evaluate_within``, and whether some micro-batch size and recomputation of ``plan`` fits in memory
    (``fits_at_all``), read off the same memory probes: a search that meets the plan again in a scenario
    that differs only in what memory does not depend on (search.leading) can skip it where nothing fits."""
    est, choice = _chosen(model, cluster, job, plan, mfu=None, compute=compute, cutoff_s=cutoff_s)
    return est, est is not None or choice.fits_at_all()


def fits_at_all(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                compute: ComputeParams) -> bool:
    """Whether some micro-batch size and recomputation (or offloading) of ``plan`` fits in memory and splits the
    batch, as ``evaluate(...).feasible`` has it, from its memory probes alone: no timing. ``plan`` must be
    valid (``validate_plan``)."""
    return Choice(model, cluster, job, stack_defaults(job.software, plan), compute, None, None).fits_at_all()


def _evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None,
              compute: ComputeParams | None, cutoff_s: float | None, time_infeasible: bool = True
              ) -> Estimate | None:
    return _chosen(model, cluster, job, plan, mfu=mfu, compute=compute, cutoff_s=cutoff_s,
                   time_infeasible=time_infeasible)[0]


def _chosen(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, *, mfu: float | None,
            compute: ComputeParams | None, cutoff_s: float | None, time_infeasible: bool = True
            ) -> tuple[Estimate | None, Choice]:
    """``_evaluate``'s estimate, and the choice of micro-batch size and recomputation that made it (its
    memory probes)."""
    validate_plan(model, cluster, job, plan)
    if compute is None:
        from meshplan.calibration import compute_params_for  # catalog data, loaded lazily once

        compute = compute_params_for(cluster.accelerator.name, job.software)
    runs = stack_defaults(job.software, plan)
    choice = Choice(model, cluster, job, runs, compute, mfu, cutoff_s)
    est = choice.choose(time_infeasible=time_infeasible)
    if est is None or runs is plan:
        return est, choice
    # the stack's default is not an option the plan chose: the estimate names the plan as given (its
    # labels, layout key and tie-break), and says what ran
    return replace(est, plan=replace(est.plan, grad_sync=plan.grad_sync), stack_grad_sync=runs.grad_sync), choice
