"""Compute-model parameters per accelerator and software stack, from the catalog's calibration files.

``catalog/calibration/default.toml`` holds stated defaults with sources. ``fitted.toml``, written by
``meshplan validate --calibrate``, holds parameters fitted on published runs with their provenance
(procedure, rows, cross-validated error): a ``[global]`` table, ``[accelerator.<name>]`` tables
(``gemm_scale``), ``[software.<name>]`` tables (overheads), ``[stack."<software>/<family>"]`` tables
(``kernel_scale``, ``attention_kernel_scale``) and ``[uncertainty]`` bands.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any

from meshplan.cost.compute import ComputeParams

FIELDS = ("gemm_scale", "kernel_scale", "attention_kernel_scale", "gemm_half_dim", "fp8_half_dim_ratio",
          "fp8_gemm_efficiency", "attention_efficiency", "attention_half_len", "memory_efficiency",
          "overlap_efficiency", "comm_slowdown", "step_overhead_s", "layer_overhead_s", "elementwise_passes",
          "moe_gemm_efficiency", "moe_permute_passes", "causal_attention_fraction", "zero3_overlap_efficiency",
          "zero3_collective_efficiency", "moe_layer_overhead_s", "moe_layer_host_s",
          "moe_expert_host_s")
# accelerators that share a calibration: the same GPU silicon with different memory, power or node
# (A100 40/80 GB; Hopper H100/H200; Blackwell B200/GB200; Blackwell Ultra B300/GB300)
FAMILY = {"h200": "h100-sxm", "a100-40gb": "a100-80gb", "gb200": "b200", "b300": "gb300"}


@cache
def _load(name: str) -> dict[str, Any]:
    entry = resources.files("meshplan.catalog").joinpath("calibration", f"{name}.toml")
    return tomllib.loads(entry.read_text()) if entry.is_file() else {}


def catalog_fit() -> dict[str, Any]:
    """The catalog's fitted.toml as tables (empty where there is none)."""
    return _load("fitted")


def family(accelerator: str) -> str:
    return FAMILY.get(accelerator, accelerator)


def stack_key(software: str, accelerator: str) -> str:
    """The key of a (software stack, GPU family) table: 'llm-foundry/h100-sxm'."""
    return f"{software}/{family(accelerator)}"


def params_from(tables: list[dict[str, Any]], source: str) -> ComputeParams:
    merged: dict[str, Any] = {}
    for t in tables:
        merged.update({k: v for k, v in t.items() if k in FIELDS})
    return ComputeParams(**{k: float(v) for k, v in merged.items()}, source=source)


def compute_params_for(accelerator: str, software: str = "generic") -> ComputeParams:
    """Fitted compute parameters for ``accelerator`` and ``software``; stated defaults where none were fitted."""
    fitted = _load("fitted")
    tables = [_load("default")]
    source = str(_load("default").get("source", "defaults"))
    if fitted:
        tables += [fitted.get("global", {}), fitted.get("accelerator", {}).get(family(accelerator), {}),
                   fitted.get("software", {}).get(software, {}),
                   fitted.get("stack", {}).get(stack_key(software, accelerator), {})]
        source = str(fitted.get("source", "fitted"))
    return params_from(tables, source)


def band_keys(accelerator: str, software: str, moe: bool) -> tuple[str, ...]:
    """The uncertainty tables a prediction looks up, most similar rows first: the same GPU family, stack
    and kind of model (dense or MoE), the family and kind, every row of that kind, every row. The kind
    is kept to the end because MoE predictions are far less certain than dense ones: a family's band
    mixing both would understate one and overstate the other. The calibration adds each row's residual
    to every table of its chain and keeps those with at least 8 rows."""
    fam, kind = family(accelerator), "moe" if moe else "dense"
    return f"{fam}/{software}/{kind}", f"{fam}/{kind}", f"all/{kind}", "all"


def uncertainty_band(accelerator: str, software: str, moe: bool = False) -> tuple[float, float] | None:
    """(low, high) relative step-time band from cross-validated residuals of similar rows, or None."""
    bands = _load("fitted").get("uncertainty", {})
    for key in band_keys(accelerator, software, moe):
        if key in bands:
            b = bands[key]
            return float(b["low"]), float(b["high"])
    return None
