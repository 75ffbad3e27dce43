"""Uncertainty of a prediction: the band of cross-validated residuals of similar published runs
(same accelerator family, software stack and kind of model, dense or MoE, then wider groups:
calibration.band_keys), from the calibration."""

from __future__ import annotations

from dataclasses import replace

from meshplan.calibration import uncertainty_band
from meshplan.cost.estimate import Estimate


def attach_band(est: Estimate, *, accelerator: str, software: str, moe: bool = False) -> Estimate:
    """``est`` with ``uncertainty`` set: the 10th-90th percentile of (measured step / predicted step - 1)."""
    band = uncertainty_band(accelerator, software, moe)
    return est if band is None else replace(est, uncertainty=band)
