"""Uncertainty of a prediction: the band of out-of-fold residuals of published runs, from the calibration:
cross-validated residuals of similar runs (same accelerator family, software stack and kind of model,
dense or MoE, then wider groups: calibration.band_keys), or for a software stack the fit has no tables
for, leave-one-source-out residuals of runs whose stack the fit had not seen
(calibration.uncertainty_band)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.calibration import uncertainty_band
from meshplan.cost.estimate import Estimate
from meshplan.specs import Plan


def attach_band(est: Estimate, *, accelerator: str, software: str, moe: bool = False) -> Estimate:
    """``est`` with ``uncertainty`` set: the 10th-90th percentile of (measured step / predicted step - 1),
    where the catalog has a band."""
    band = uncertainty_band(accelerator, software, moe)
    return est if band is None else replace(est, uncertainty=band)


UNVALIDATED = (
    ("schedule", ("zb-h1", "zb-v", "gpipe"), "the {v} pipeline schedule"),
    ("sharding", ("zero1", "zero2"), "DeepSpeed {v}"),
    ("cp_impl", ("allgather",), "context parallelism by all-gather"),
)
"""Plan options no published run of the calibration data used (the rows of docs/validation.md): a band from
runs without them says nothing of how well meshplan predicts them."""


def unvalidated_features(plan: Plan, software: str) -> list[str]:
    """What ``plan`` (on ``software``) runs that no published run of the calibration used."""
    out = [text.format(v=getattr(plan, field)) for field, values, text in UNVALIDATED
           if getattr(plan, field) in values and (field != "schedule" or plan.pp > 1)]
    if software == "deepspeed":
        out.append("the DeepSpeed stack")
    if plan.offload_layers and plan.sharding == "fsdp":
        out.append("activation offloading with Megatron-FSDP")
    elif plan.sharding == "fsdp" and software == "megatron" and plan.shard_degree > 1 and plan.pp > 1:
        out.append("Megatron-FSDP under a pipeline")
    return out
