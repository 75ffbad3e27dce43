"""The arguments of the library's entry points (evaluate, search, analyse, ...), checked as the command line
checks its flags: each wrong type or value raises SpecError naming the argument and what is allowed, never
a TypeError, an AttributeError or a division by zero deep in the cost model."""

from __future__ import annotations

from meshplan.specs._validate import fraction, instance
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.job import JobSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

MIN_MFU = 1e-3
"""The lowest MFU an assumed-MFU call takes (0.1 %), as --mfu."""


def check_scenario(where: str, model: object, cluster: object, job: object, *, plan: object = None,
                   mfu: object = None, with_plan: bool = False) -> None:
    """``model``, ``cluster``, ``job`` (and ``plan`` where ``with_plan``) are meshplan's specs, and ``mfu`` is
    None or a fraction of at least MIN_MFU; SpecError naming ``where``'s argument otherwise."""
    instance(f"{where}.model", model, ModelSpec, "a ModelSpec (meshplan.load_model)")
    instance(f"{where}.cluster", cluster, ClusterSpec, "a ClusterSpec (meshplan.load_cluster)")
    instance(f"{where}.job", job, JobSpec, "a JobSpec")
    if with_plan:
        instance(f"{where}.plan", plan, Plan, "a Plan (meshplan.parse_plan)")
    if mfu is not None:
        fraction(f"{where}.mfu", mfu, least=MIN_MFU)
