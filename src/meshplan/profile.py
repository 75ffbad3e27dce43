"""Measured profiles (``meshplan measure``) fed back into the planner (``--profile FILE``).

Schema ``meshplan.profile/1`` (JSON; all base units):

.. code-block:: text

    schema            "meshplan.profile/1"
    created           ISO-8601 time of the measurement
    device            what ran it, e.g. "NVIDIA H200" or "cpu"
    backend           "nccl" or "gloo"
    world_size, nproc_per_node
    gemm              list of {m, n, k, dtype, median_s, p10_s, p90_s, flop_per_s}
    gemm_best_flop_per_s   the best measured throughput for dtype bf16 (or null)
    attention         optional: list of {b, s, heads, head_dim, causal, dtype, fwd_median_s, fwd_bwd_median_s,
                           fwd_flop_per_s, fwd_bwd_flop_per_s}   (causal SDPA of the plan's shape; not
                           applied to the planner, compared by `meshplan measure compare`)
    collectives       list of {op, link, group_size, message_bytes, median_s, algbw_bytes_per_s,
                           busbw_bytes_per_s}      (op: all_gather | reduce_scatter | all_reduce |
                           all_to_all | send_recv; link: intra_node | inter_node)
    collective_fits   {"<op>@<link>": {alpha_s, busbw_bytes_per_s, group_size, n_points}}
                      the alpha-beta fit t = alpha + S·f(op, n)/busbw of the sweep
                      (each fit may carry ranks_per_node: the group's ranks in one node)
    notes             list of strings (what a figure means on this machine, what was skipped)
    moe               optional: {reference_gemm: {m, n, k, dtype, median_s, flop_per_s},
                           expert_gemm: list of {kernel, dtype, groups, m, n, k, median_s, p10_s, p90_s,
                                                 flop_per_s, relative_efficiency},
                           passes: list of {pass, tokens, hidden, top_k, n_experts, bytes, median_s, p10_s,
                                            p90_s, bytes_per_s}}   (`meshplan measure moe`; kernel:
                           per_expert | grouped; pass: router | permute | unpermute)
    step              optional: {plan, model, model_spec, cluster, seq_len, mbs, global_batch_tokens,
                           step_time_s, tokens_per_s, mfu, mfu_note, peak_memory_bytes_per_rank,
                           peak_memory_source, exposed_comm_s_by_collective, comm_s_by_collective,
                           rank_step_time_spread, trace, predicted}

How a profile changes the planner: the fitted bus bandwidth and latency of each link replace the
catalog's. Intra-node: all-gather and reduce-scatter fits set the ring bus bandwidth (the slower of the
two when both were measured), all-reduce the NVLS figure where the node has NVLS, send/recv the
point-to-point rate. Inter-node: the NIC rate per GPU at efficiency 1 (the slowest fit). The fitted
latency already contains the small-message penalty, so the size-efficiency constant of a replaced link
is set to 0. The best measured BF16 GEMM throughput sets the accelerator's GEMM efficiency (measured /
catalog peak). The measured expert GEMMs (their rate over the reference dense GEMM's) replace the analytic
expert-GEMM curve for the shapes measured, and the permutation passes' rate the memory-bound rate of an
MoE layer's permutation (meshplan.cost.grouped_gemm, docs/moe.md). Each replaced value is listed in the
estimate's notes.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshplan.cost.collectives import COLLECTIVES
from meshplan.errors import SpecError
from meshplan.fileio import MAX_DATA_BYTES, read_input_text
from meshplan.specs import AcceleratorSpec, ClusterSpec
from meshplan.specs._validate import MAX_FLOP_PER_S, MIN_EFFICIENCY
from meshplan.specs.hardware import MAX_LATENCY_S
from meshplan.units import GB, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S

SCHEMA = "meshplan.profile/1"


def load_profile(path: str | Path) -> dict[str, Any]:
    text = read_input_text(path, "profile", max_bytes=MAX_DATA_BYTES)
    try:
        data = json.loads(text)  # NaN and Infinity parse; the fields that hold them are named when checked
    except json.JSONDecodeError as exc:
        raise SpecError("profile", f"malformed JSON in {path}: {str(exc)[:200]}") from None
    except RecursionError:
        raise SpecError("profile", f"malformed JSON in {path}: nested too deeply") from None
    except ValueError as exc:  # a number of thousands of digits
        raise SpecError("profile", f"malformed JSON in {path}: {str(exc)[:120]}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else None
        raise SpecError("profile.schema", f"must be {SCHEMA!r}; got {got!r}")
    return data


def apply_profile(cluster: ClusterSpec, profile: dict[str, Any]) -> tuple[ClusterSpec, list[str]]:
    """The cluster with measured figures in place of catalog ones, and a note per replaced value."""
    notes: list[str] = []
    intra, inter, accel = cluster.intra, cluster.inter, cluster.accelerator
    fits = profile.get("collective_fits") or {}
    if not isinstance(fits, dict):
        raise SpecError("profile.collective_fits", f"must be an object of 'op@link' fits; got {fits!r}")
    ring: list[tuple[float, float]] = []
    nic: list[tuple[float, float]] = []
    for key, fit in sorted(fits.items()):
        op, link, busbw, alpha, ranks_per_node = _collective_fit(key, fit)
        if busbw <= 0:
            continue
        if link == "intra_node":
            if op == "all_reduce" and intra.nvls_busbw_bytes_per_s:
                intra = replace(intra, nvls_busbw_bytes_per_s=busbw)
            elif op == "send_recv":
                intra = replace(intra, p2p_bytes_per_s=busbw)
            elif op in ("all_gather", "reduce_scatter"):
                ring.append((busbw, alpha))
            else:
                continue
        elif link == "inter_node" and op in ("all_gather", "reduce_scatter", "send_recv"):
            per_gpu = busbw if op == "send_recv" else busbw / ranks_per_node
            nic.append((per_gpu, alpha))
        else:
            continue
        notes.append(f"profile: {op} on {link} measured at {busbw / GB:.3g} GB/s busbw, alpha {alpha * 1e6:.0f} us")
    applied = len(notes)
    device, backend = str(profile.get("device", "") or "an unknown device"), profile.get("backend")
    if applied and (device.lower() == "cpu" or backend == "gloo"):
        notes.append(f"profile: the collective fits were measured with {backend or '?'} on {device}: they replace "
                     f"{cluster.name}'s NVLink and network rates with that machine's, so the plan describes it; "
                     "measure on the cluster you plan for")
    if ring:
        busbw, alpha = min(ring)
        intra = replace(intra, ring_busbw_bytes_per_s=busbw, half_size_bytes=0.0, p2p_half_size_bytes=0.0,
                        latency_s=alpha if alpha > 0 else intra.latency_s)
    elif fits:
        intra = replace(intra, half_size_bytes=0.0, p2p_half_size_bytes=0.0)
    if nic:
        per_gpu, alpha = min(nic)
        inter = replace(inter, nic_bytes_per_s=per_gpu, efficiency=1.0, half_size_bytes=0.0,
                        p2p_half_size_bytes=0.0, latency_s=alpha or inter.latency_s)
    accel = _apply_gemm(accel, profile, notes)
    if profile.get("moe"):
        accel = _apply_moe(accel, profile["moe"], str(profile.get("device", "") or "?"), notes)
    if not notes:
        notes.append("profile: nothing in it applies to the planner (no collective fit over two or more message "
                     "sizes, no BF16 GEMM figure, no MoE kernel): the catalog's figures stand")
    return replace(cluster, intra=intra, inter=inter, accelerator=accel), notes


MOE_RATE_PASSES = ("permute", "unpermute")
"""The measured passes whose rate replaces the memory-bound rate of an MoE layer's permutation traffic."""


def _apply_moe(accel: AcceleratorSpec, moe: Any, device: str, notes: list[str]) -> AcceleratorSpec:
    """``accel`` with the expert-GEMM points and the permutation rate of a ``meshplan measure moe`` section."""
    from meshplan.specs.hardware import ExpertGemmPoint

    if not isinstance(moe, dict):
        raise SpecError("profile.moe", f"must be an object of expert_gemm and passes lists; got {moe!r}")
    points, skipped = [], 0
    for i, e in enumerate(moe.get("expert_gemm") or []):
        try:
            rel = float(e["relative_efficiency"])
            if rel > 2.0:  # a grouped GEMM at over twice the device's best dense rate: the reference ran slow
                skipped += 1
                continue
            points.append(ExpertGemmPoint(kernel=e["kernel"], dtype=e["dtype"], n=int(e["n"]), k=int(e["k"]),
                                          tokens_per_expert=float(e["m"]), relative_efficiency=rel))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SpecError(f"profile.moe.expert_gemm[{i}]", "needs kernel, dtype, m, n, k and a relative_efficiency "
                                                            "number") from None
    passes = [p for p in moe.get("passes") or [] if isinstance(p, dict) and p.get("pass") in MOE_RATE_PASSES]
    rate = None
    try:
        if passes:
            rate = sum(float(p["bytes"]) for p in passes) / sum(float(p["median_s"]) for p in passes)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise SpecError("profile.moe.passes", "needs bytes and median_s numbers for each pass") from None
    if rate is not None and not (math.isfinite(rate) and rate >= MIN_LINK_BYTES_PER_S):
        raise SpecError("profile.moe.passes", f"the measured rate must be at least 1 MB/s; got {rate:g} B/s")
    if points:
        shapes = sorted({(p.kernel, p.n, p.k) for p in points})
        notes.append(f"profile: {len(points)} measured expert-GEMM points on {device} replace the analytic curve for "
                     f"{len(shapes)} expert shape(s) and launch(es)"
                     + (f" ({skipped} above twice the reference GEMM's rate left out)" if skipped else ""))
    if rate is not None:
        notes.append(f"profile: MoE permutation passes measured at {rate / GB:.3g} GB/s on {device}")
    if not points and rate is None:
        return accel
    return replace(accel, expert_gemm_curve=tuple(points) or accel.expert_gemm_curve,
                   moe_pass_bytes_per_s=rate if rate is not None else accel.moe_pass_bytes_per_s)


def _collective_fit(key: str, fit: Any) -> tuple[str, str, float, float, int]:
    """One entry of a profile's collective_fits, checked: (op, link, bus bandwidth [B/s], latency [s],
    ranks per node)."""
    try:
        op, link = key.split("@")
        busbw = float(fit["busbw_bytes_per_s"])
        alpha = float(fit["alpha_s"])
        ranks_per_node = max(1, int(fit.get("ranks_per_node", 1)))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        raise SpecError(f"profile.collective_fits.{key}", "needs 'op@link' keys with alpha_s and "
                                                          "busbw_bytes_per_s numbers (and a whole "
                                                          "ranks_per_node)") from None
    if op not in COLLECTIVES or link not in ("intra_node", "inter_node"):
        raise SpecError(f"profile.collective_fits.{key}", f"op must be one of {', '.join(COLLECTIVES)} and "
                                                          "link intra_node or inter_node")
    if not (math.isfinite(busbw) and math.isfinite(alpha)) or (busbw != 0 and not MIN_LINK_BYTES_PER_S <= busbw
                                                               <= MAX_LINK_BYTES_PER_S):
        raise SpecError(f"profile.collective_fits.{key}", "alpha_s and busbw_bytes_per_s must be finite, and "
                                                          "a bus bandwidth from 1 MB/s to 100 TB/s (or 0: "
                                                          "unmeasured)")
    if not 0 <= alpha <= MAX_LATENCY_S:
        raise SpecError(f"profile.collective_fits.{key}", f"alpha_s must be from 0 to {MAX_LATENCY_S:g} s (a "
                                                          f"collective's fixed latency; measure's fit writes 0 "
                                                          f"where the best one is negative); got {alpha:g}")
    return op, link, busbw, alpha, ranks_per_node


def _apply_gemm(accel: AcceleratorSpec, profile: dict[str, Any], notes: list[str]) -> AcceleratorSpec:
    """``accel`` with the profile's best BF16 GEMM rate as its GEMM efficiency (a note added to ``notes``),
    or as it is where the profile has none."""
    best = profile.get("gemm_best_flop_per_s")
    if best is None:
        return accel
    try:
        best = float(best)
    except (TypeError, ValueError):
        raise SpecError("profile.gemm_best_flop_per_s", f"must be a number of FLOP/s; got {best!r}") from None
    if not 1e9 <= best <= MAX_FLOP_PER_S:
        raise SpecError("profile.gemm_best_flop_per_s", f"must be from 1e9 to {MAX_FLOP_PER_S:g} FLOP/s; got "
                                                        f"{best!r}")
    # as the catalog's MAMF figure, the best measured rate is the efficiency curve's asymptote, so that
    # the calibrated gemm_scale (fitted with MAMF taken that way) applies unchanged
    if best < MIN_EFFICIENCY * accel.bf16_flop_per_s:
        raise SpecError("profile.gemm_best_flop_per_s", f"{best:g} FLOP/s is below a millionth of the "
                                                        f"{accel.name} peak: not a measurement of this part")
    eff = min(1.0, best / accel.bf16_flop_per_s)
    accel = replace(accel, gemm_efficiency=eff)
    notes.append(f"profile: best BF16 GEMM {best / 1e12:.3g} TFLOP/s measured on "
                 f"{profile.get('device', '?')} = {eff:.1%} of the {accel.name} peak")
    if str(profile.get("device", "")).lower() in ("cpu", ""):
        notes.append("profile: GEMM figures were measured on a CPU; they describe that machine, not "
                     f"{accel.name}")
    return accel
