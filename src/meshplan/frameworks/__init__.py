"""From plan to launch: a plan as the settings of the framework that runs it (torchtitan, Megatron-LM and
Megatron-Bridge, DeepSpeed), an existing configuration of those frameworks read back as a plan and a job, and
a Hugging Face ``config.json`` read as a model spec.

Pure Python: exporting writes plain text and reading a config.json needs only the json module. The
frameworks' own parsers check the exports in tests (the ``frameworks-check`` extra); meshplan never imports
them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshplan.errors import SpecError
from meshplan.frameworks.common import FORMATS, STACKS, Export, Imported
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

_SOFTWARE = {"torchtitan": "torchtitan", "megatron": "megatron", "deepspeed": "deepspeed"}
"""The meshplan software stack (JobSpec.software) each framework's plans are searched and timed as."""


def export(stack: str, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, fmt: str | None = None,
           *, exact_model: bool = False) -> Export:
    """``plan`` as ``stack``'s settings in format ``fmt`` (the stack's first format by default); SpecError naming
    what the framework lacks where it cannot run the plan. Where the framework names its model by a registered
    config (torchtitan) and none is this model, the closest one is exported with a warning
    (``Export.warnings``), or refused where ``exact_model``."""
    if stack not in STACKS:
        raise SpecError("export", f"unknown framework {stack!r}; allowed: {', '.join(STACKS)}")
    fmt = fmt or FORMATS[stack][0]
    if fmt not in FORMATS[stack]:
        raise SpecError("export --format", f"{stack} exports as {', '.join(FORMATS[stack])}; got {fmt!r}")
    module = _module(stack)
    if stack == "torchtitan":
        return module.export(model, cluster, job, plan, fmt, exact_model=exact_model)
    return module.export(model, cluster, job, plan, fmt)


def read(stack: str, source: str, *, world_size: int | None, n_layers: int | None = None) -> Imported:
    """An existing configuration of ``stack`` (a file, or the command line as text) as a plan and a job."""
    if stack not in STACKS:
        raise SpecError("from", f"unknown framework {stack!r}; allowed: {', '.join(STACKS)}")
    module = _module(stack)
    if stack == "torchtitan":
        return module.read(source, world_size=world_size, n_layers=n_layers)
    return module.read(source, world_size=world_size)


def _module(stack: str) -> Any:
    import importlib

    return importlib.import_module(f"meshplan.frameworks.{stack}")


def stack_job(stack: str, job: JobSpec) -> JobSpec:
    """The job as the framework runs it: a job that names no stack is timed on the framework's."""
    if job.software == "generic" and stack in _SOFTWARE:
        return replace(job, software=_SOFTWARE[stack])
    return job


__all__ = ["FORMATS", "STACKS", "Export", "Imported", "export", "read", "stack_job"]
