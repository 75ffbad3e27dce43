"""Predicted (``meshplan.evaluate``) against measured (``meshplan measure step``), figure by figure.

Pure Python: a saved profile is compared without torch (``meshplan measure compare --profile FILE``).
The prediction uses the step's own model spec, plan (with the measured micro-batch size and
recompute), batch and sequence length, on ``--cluster`` sized to the measured run (nodes x ranks per
node), with the profile's measured figures applied (``meshplan.profile.apply_profile``) when it holds
collective fits or GEMM throughput.

MFU = model FLOPs per step / (step time · ranks · dense peak of the cluster's accelerator) (Chowdhery
et al., "PaLM," arXiv:2204.02311, App. B); on a CPU there is no meaningful peak and MFU is null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from meshplan.calibration import compute_params_for
from meshplan.catalog import load_cluster
from meshplan.cost.compute import flash_attention_time_s, gemm_curve, gemm_time_s
from meshplan.cost.estimate import Estimate
from meshplan.cost.grouped_gemm import grouped_gemm_time_s
from meshplan.cost.step import evaluate
from meshplan.errors import SpecError
from meshplan.harness.measure.shapes import BACKWARD_OVER_FORWARD, AttentionShape
from meshplan.profile import apply_profile
from meshplan.specs import AcceleratorSpec, ClusterSpec, JobSpec, ModelSpec, parse_plan
from meshplan.units import GiB, format_seconds


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    unit: str
    """'s', 'tokens/s', 'bytes' or '' (a fraction)."""
    predicted: float | None
    measured: float | None

    @property
    def ratio(self) -> float | None:
        if self.predicted and self.measured is not None:
            return self.measured / self.predicted
        return None


def prediction_cluster(profile: dict[str, Any], cluster_name: str) -> tuple[ClusterSpec, list[str]]:
    """``cluster_name`` sized like the measured run, with the profile's figures applied."""
    per_node = int(profile["nproc_per_node"])
    nodes = max(1, int(profile["world_size"]) // per_node)
    cluster = load_cluster(cluster_name, nodes=nodes, gpus_per_node=per_node)
    if profile.get("collective_fits") or profile.get("gemm_best_flop_per_s"):
        return apply_profile(cluster, profile)
    return cluster, []


def predict(profile: dict[str, Any], cluster_name: str) -> tuple[Estimate, ClusterSpec, list[str]]:
    """meshplan's estimate of the step recorded in ``profile['step']``, timed as ``meshplan evaluate`` times
    it (the closed form re-timed by the timeline simulator where the plan fits)."""
    from meshplan.sim.simulate import refine_fitted

    step = profile["step"]
    try:
        spec = ModelSpec(**step["model_spec"])
    except TypeError as exc:
        raise SpecError("profile.step.model_spec", f"is not a model spec: {exc}") from None
    cluster, notes = prediction_cluster(profile, cluster_name)
    job = JobSpec(global_batch_tokens=int(step["global_batch_tokens"]), seq_len=int(step["seq_len"]))
    plan = parse_plan(step["plan"], world_size=cluster.n_gpus)
    return refine_fitted(evaluate(spec, cluster, job, plan), cluster.accelerator.name, job.software), cluster, notes


def measured_mfu(step: dict[str, Any], est: Estimate, cluster: ClusterSpec, device: str) -> tuple[float | None, str]:
    """(MFU of the measured step, how it was taken)."""
    if device.lower() == "cpu":
        return None, "MFU: null on a CPU (no meaningful peak FLOP/s to divide by)"
    peak = cluster.accelerator.bf16_flop_per_s
    mfu = est.flops.model_flop_per_step / (float(step["step_time_s"]) * cluster.n_gpus * peak)
    return mfu, (f"MFU against the {cluster.accelerator.name} dense BF16 peak {peak / 1e12:.0f} TFLOP/s "
                 f"(catalog; --cluster) on device {device!r}")


def compare_rows(est: Estimate, step: dict[str, Any]) -> list[Row]:
    rows = [Row("step time", "s", est.step_time_s, step["step_time_s"]),
            Row("tokens/s", "tokens/s", est.tokens_per_s, step["tokens_per_s"]),
            Row("MFU", "", est.mfu, step.get("mfu"))]
    predicted_exposed: dict[str, float] = {}
    for e in est.comm:
        predicted_exposed[e.collective] = predicted_exposed.get(e.collective, 0.0) + e.exposed_s
    measured_exposed = step.get("exposed_comm_s_by_collective") or {}
    for op in sorted(set(predicted_exposed) | set(measured_exposed)):
        rows.append(Row(f"exposed {op}", "s", predicted_exposed.get(op), measured_exposed.get(op)))
    kernels = step.get("kernel_time_s_by_kind") or {}
    if "optimizer" in kernels and "optimizer step" in est.time_breakdown:  # GPU runs: the profiled step's kernels
        rows.append(Row("optimizer step (kernels)", "s", est.time_breakdown["optimizer step"], kernels["optimizer"]))
    peaks = step.get("peak_memory_bytes_per_rank") or []
    rows.append(Row("peak memory (max rank)", "bytes", est.memory.peak_bytes, max(peaks) if peaks else None))
    reserved = step.get("peak_reserved_bytes_per_rank") or []
    if reserved:  # the caching allocator's high-water mark: tensors plus its cached, fragmented blocks
        rows.append(Row("peak reserved (max rank)", "bytes", est.memory.peak_bytes, max(reserved)))
    return rows


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return format_seconds(v)
    if unit == "bytes":
        return f"{v / GiB:.3f} GiB"
    if unit == "tokens/s":
        return f"{v:,.0f}"
    return f"{v:.1%}"


def compare_text(rows: list[Row], *, title: str, notes: list[str]) -> str:
    lines = [title, f"  {'figure':<28}{'predicted':>14}{'measured':>14}{'measured/predicted':>20}"]
    for r in rows:
        ratio = f"{r.ratio:.3g}" if r.ratio is not None else "-"
        lines.append(f"  {r.figure:<28}{_fmt(r.predicted, r.unit):>14}{_fmt(r.measured, r.unit):>14}{ratio:>20}")
    if notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines)


def comparison(profile: dict[str, Any], cluster_name: str | None = None) -> tuple[list[Row], str, list[str]]:
    """Rows, the report text and its notes for the step of ``profile``, predicted on ``cluster_name``
    (default: the cluster the step recorded)."""
    step = profile.get("step")
    if not step:
        raise ValueError("the profile holds no step measurement; run `meshplan measure step ... --out FILE` first")
    name = cluster_name or step.get("cluster") or "h100-sxm"
    est, cluster, notes = predict(profile, name)
    rows = compare_rows(est, step)
    device = str(profile.get("device", "?"))
    title = (f"measured step against meshplan's prediction: {step['model']}, plan {step['plan']}, "
             f"{profile['world_size']} x {device} ({profile['backend']}); predicted for {cluster.name} "
             f"({cluster.n_nodes} x {cluster.gpus_per_node})")
    extra = [*notes]
    if device.lower() == "cpu" and notes:
        extra.append(f"the run was on a CPU: the prediction uses the profile's measured figures above; memory and "
                     f"anything the profile does not measure still describe {cluster.accelerator.name}")
    elif device.lower() == "cpu":
        extra.append(f"the run was on a CPU: predictions describe {cluster.accelerator.name}, so ratios measure "
                     "the CPU against that accelerator, not the model's accuracy (measure collectives and gemm "
                     "into the same --out file first to predict with this machine's figures)")
    if step.get("trace"):
        extra.append(f"measured trace (rank 0): {step['trace']}")
    return rows, compare_text(rows, title=title, notes=extra), extra


_DEVICE_ACCELERATORS = (("GB300", "gb300"), ("B300", "b300"), ("GB200", "gb200"), ("B200", "b200"),
                        ("GH200", None), ("H200", "h200"), ("H100 PCIE", None), ("H100 NVL", None),
                        ("H100", "h100-sxm"), ("A100-SXM4-40GB", "a100-40gb"), ("A100-SXM4-80GB", "a100-80gb"),
                        ("MI300X", "mi300x"))
"""Substrings of ``torch.cuda.get_device_name`` and the catalog accelerator they name, most specific first;
None for parts the catalog lacks (GH200, H100 PCIe and NVL: other memory, clocks or power)."""


def accelerator_for_device(device: str) -> str | None:
    """The catalog accelerator a measured device is, e.g. 'NVIDIA H200' -> 'h200'; None if unknown (a CPU)."""
    name = device.upper()
    return next((acc for key, acc in _DEVICE_ACCELERATORS if key in name), None)


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One measured kernel against the compute model's time for it on the catalog accelerator."""

    kernel: str
    """e.g. 'gemm bf16 8192x8192x8192' or 'attention fwd+bwd b=2 s=4096 h=32 d=128'."""
    predicted_s: float
    measured_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


KERNEL_SOFTWARE = "generic"
"""The software stack whose calibrated parameters the kernel comparison uses (the reference model is
plain PyTorch; no published stack's overheads apply to single kernels)."""


def kernel_rows(profile: dict[str, Any], accel: AcceleratorSpec, software: str = KERNEL_SOFTWARE) -> list[KernelRow]:
    """The profile's GEMM, attention and MoE kernel timings against ``meshplan.cost.compute``'s times for them
    on ``accel`` with the calibrated parameters of (``accel``, ``software``): the GEMM efficiency curve
    (gemm_curve, gemm_time_s), the FlashAttention model (flash_attention_time_s, backward 2.5x) and the
    expert GEMMs' and MoE passes' (moe_kernel_rows)."""
    params = compute_params_for(accel.name, software)
    rows = []
    for g in profile.get("gemm") or []:
        peak, e_max, hd = gemm_curve(accel, params, g["dtype"])
        pred = gemm_time_s(g["m"], g["n"], g["k"], peak_flop_per_s=peak, e_max=e_max, half_dim=hd)
        rows.append(KernelRow(f"gemm {g['dtype']} {g['m']}x{g['n']}x{g['k']}", pred, float(g["median_s"])))
    for a in profile.get("attention") or []:
        shape = AttentionShape(b=a["b"], s=a["s"], heads=a["heads"], head_dim=a["head_dim"])
        fwd = flash_attention_time_s(shape.flop_fwd_unmasked, seq_len=a["s"], block_len=a["s"],
                                     causal=bool(a["causal"]), accel=accel, params=params)
        name = f"b={a['b']} s={a['s']} h={a['heads']} d={a['head_dim']}"
        rows.append(KernelRow(f"attention fwd {name}", fwd, float(a["fwd_median_s"])))
        rows.append(KernelRow(f"attention fwd+bwd {name}", fwd * (1 + BACKWARD_OVER_FORWARD),
                              float(a["fwd_bwd_median_s"])))
    return rows + moe_kernel_rows(profile.get("moe") or {}, accel, params)


def moe_kernel_rows(moe: dict[str, Any], accel: AcceleratorSpec, params: Any) -> list[KernelRow]:
    """A ``measure moe`` section's expert GEMMs against ``meshplan.cost.grouped_gemm``'s analytic time for
    their launch (over the calibrated ``moe_gemm_efficiency``), and its memory-bound passes against their
    bytes at the calibrated memory-bound rate."""
    rows = []
    hbm = accel.hbm_bytes_per_s * params.memory_efficiency
    for e in moe.get("expert_gemm") or []:
        peak, e_max, hd = gemm_curve(accel, params, e["dtype"])
        pred = grouped_gemm_time_s(e["m"], e["groups"], e["n"], e["k"], kernel=e["kernel"], peak_flop_per_s=peak,
                                   e_max=e_max, half_dim=hd, hbm_bytes_per_s=hbm,
                                   operand_bytes=1.0 if e["dtype"] == "fp8" else 2.0) / params.moe_gemm_efficiency
        rows.append(KernelRow(f"experts {e['kernel']} {e['dtype']} {e['groups']}x{e['m']}x{e['n']}x{e['k']}", pred,
                              float(e["median_s"])))
    for p in moe.get("passes") or []:
        rows.append(KernelRow(f"moe {p['pass']} {p['tokens']} tokens top-{p['top_k']}", float(p["bytes"]) / hbm,
                              float(p["median_s"])))
    return rows


def kernel_comparison(profile: dict[str, Any], cluster: str | None
                      ) -> tuple[AcceleratorSpec, list[KernelRow], str | None] | None:
    """(accelerator, kernel rows, note) for the profile's GEMM and attention timings, or None without any.
    The accelerator is ``cluster``'s, else the measured device's; the note (or None) says when neither
    names one and the comparison falls back to the step's cluster or h100-sxm."""
    if not profile.get("gemm") and not profile.get("attention") and not (profile.get("moe") or {}).get("expert_gemm"):
        return None
    device = str(profile.get("device", ""))
    name = cluster or accelerator_for_device(device)
    note = None
    if name is None:
        name = (profile.get("step") or {}).get("cluster") or "h100-sxm"
        note = (f"device {device!r} is not a catalog accelerator: its kernels are compared with {name}'s model, "
                "so the ratios measure the device against that accelerator (pass --cluster to choose)")
    accel = load_cluster(name).accelerator
    return accel, kernel_rows(profile, accel), note


def kernel_text(rows: list[KernelRow], accel: AcceleratorSpec, note: str | None = None) -> str:
    lines = [f"kernels measured against meshplan's compute model ({accel.name}, software {KERNEL_SOFTWARE}, "
             "calibrated parameters):",
             f"  {'kernel':<44}{'predicted':>12}{'measured':>12}{'measured/predicted':>20}"]
    lines += [f"  {r.kernel:<44}{format_seconds(r.predicted_s):>12}{format_seconds(r.measured_s):>12}{r.ratio:>20.3g}"
              for r in rows]
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def predicted_dict(rows: list[Row], cluster_name: str, notes: list[str] | None = None) -> dict[str, Any]:
    """The prediction as stored in the profile's step section (a figure that is not finite: null)."""
    def finite(v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    return {"cluster": cluster_name, "notes": list(notes or []),
            "figures": [{"figure": r.figure, "unit": r.unit, "predicted": finite(r.predicted),
                         "measured": finite(r.measured)} for r in rows]}
