"""Uncertainty of a prediction: the band of out-of-fold residuals of published runs, from the calibration:
cross-validated residuals of similar runs (same accelerator family, software stack and kind of model,
dense or MoE, then wider groups: calibration.band_keys), or for a software stack the fit has no tables
for, leave-one-source-out residuals of runs whose stack the fit had not seen
(calibration.uncertainty_band)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.calibration import uncertainty_band
from meshplan.cost.estimate import Estimate


def attach_band(est: Estimate, *, accelerator: str, software: str, moe: bool = False) -> Estimate:
    """``est`` with ``uncertainty`` set: the 10th-90th percentile of (measured step / predicted step - 1),
    where the catalog has a band."""
    band = uncertainty_band(accelerator, software, moe)
    return est if band is None else replace(est, uncertainty=band)
