"""Compute-model parameters per accelerator, from the catalog's calibration files.

``catalog/calibration/<accelerator>.toml`` holds parameters fitted on published runs (with their
provenance: procedure, rows, cross-validated error); ``default.toml`` holds stated defaults.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from meshplan.cost.compute import ComputeParams

_FIELDS = ("gemm_half_dim", "fp8_gemm_efficiency", "attention_efficiency", "attention_half_len", "memory_efficiency",
           "overlap_efficiency", "comm_slowdown", "step_overhead_s")


@cache
def _load(name: str) -> dict[str, object] | None:
    entry = resources.files("meshplan.catalog").joinpath("calibration", f"{name}.toml")
    if not entry.is_file():
        return None
    return tomllib.loads(entry.read_text())


def compute_params_for(accelerator: str) -> ComputeParams:
    """Calibrated compute parameters for ``accelerator``; the defaults where none were fitted."""
    base = _load("default") or {}
    data = {**base, **(_load(accelerator) or {})}
    kwargs = {k: float(data[k]) for k in _FIELDS if k in data}  # type: ignore[arg-type]
    return ComputeParams(**kwargs, source=str(data.get("source", "defaults")))
