"""Validated, frozen value objects describing what is trained, on what, and how."""

from meshplan.specs.hardware import AcceleratorSpec, ClusterSpec, InterNodeLink, IntraNodeLink
from meshplan.specs.job import JobSpec, RuntimeOverheads
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan, parse_plan

__all__ = [
    "AcceleratorSpec",
    "ClusterSpec",
    "InterNodeLink",
    "IntraNodeLink",
    "JobSpec",
    "ModelSpec",
    "Plan",
    "RuntimeOverheads",
    "parse_plan",
]
