"""The measured profile file, schema ``meshplan.profile/1`` (defined in ``meshplan.profile``).

Build, merge, check and write the file. Pure Python: the core reads these files without torch.
Keys beyond the schema: ``notes`` (top level, a list of strings saying what was skipped or how a
figure was taken), ``ranks_per_node`` in each collective fit (``apply_profile`` reads it for
inter-node fits) and the open-ended ``step`` section.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from meshplan.cost.collectives import COLLECTIVES
from meshplan.fileio import write_json
from meshplan.profile import SCHEMA
from meshplan.specs._validate import MAX_INT

OPS = COLLECTIVES  # the ledger's collective names (meshplan.cost.collectives)
LINKS = ("intra_node", "inter_node")
GEMM_KEYS = ("m", "n", "k", "dtype", "median_s", "p10_s", "p90_s", "flop_per_s")
ATTENTION_SHAPE_KEYS = ("b", "s", "heads", "head_dim", "causal")
ATTENTION_KEYS = (*ATTENTION_SHAPE_KEYS, "fwd_median_s", "fwd_bwd_median_s")
COLLECTIVE_KEYS = ("op", "link", "group_size", "message_bytes", "median_s", "algbw_bytes_per_s",
                   "busbw_bytes_per_s")
FIT_KEYS = ("alpha_s", "busbw_bytes_per_s", "group_size", "n_points")
EXPERT_GEMM_SHAPE_KEYS = ("kernel", "dtype", "groups", "m", "n", "k")
EXPERT_GEMM_KEYS = (*EXPERT_GEMM_SHAPE_KEYS, "median_s", "flop_per_s", "relative_efficiency")
MOE_PASS_SHAPE_KEYS = ("pass", "tokens", "hidden", "top_k", "n_experts")
MOE_PASS_KEYS = (*MOE_PASS_SHAPE_KEYS, "bytes", "median_s", "bytes_per_s")


def new_profile(*, device: str, backend: str, world_size: int, nproc_per_node: int) -> dict[str, Any]:
    """An empty profile of this run."""
    return {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"), "device": device,
            "backend": backend, "world_size": world_size, "nproc_per_node": nproc_per_node, "gemm": [],
            "gemm_best_flop_per_s": None, "attention": [], "collectives": [], "collective_fits": {}, "step": None,
            "moe": None, "notes": []}


def best_bf16_flop_per_s(gemm: list[dict[str, Any]]) -> float | None:
    """The highest measured BF16 GEMM throughput [FLOP/s], or None without BF16 entries."""
    rates = [float(g["flop_per_s"]) for g in gemm if g["dtype"] == "bf16"]
    return max(rates) if rates else None


def merge_profiles(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` laid over ``old``: entries measured again replace the old ones, the rest are kept.

    GEMM entries are keyed by (m, n, k, dtype), attention entries by their shape, collective points by
    (op, link, group_size, message_bytes), fits by "op@link"; a new step section replaces the old one. A
    note records a change of device, backend or world size between the two.
    """
    out = dict(old)
    for key in ("created", "device", "backend", "world_size", "nproc_per_node"):
        if old.get(key) != new.get(key) and key != "created" and old.get(key) is not None:
            out.setdefault("notes", [])
            out["notes"] = [*out["notes"], f"merged measurements with different {key}: {old.get(key)!r} "
                                           f"(earlier) and {new.get(key)!r} (now)"]
        out[key] = new[key]

    def keyed(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
        return {tuple(e[f] for f in fields): e for e in entries}

    gemm = keyed(old.get("gemm") or [], ("m", "n", "k", "dtype")) | keyed(new["gemm"], ("m", "n", "k", "dtype"))
    coll_fields = ("op", "link", "group_size", "message_bytes")
    coll = keyed(old.get("collectives") or [], coll_fields) | keyed(new["collectives"], coll_fields)
    attn = (keyed(old.get("attention") or [], ATTENTION_SHAPE_KEYS)
            | keyed(new.get("attention") or [], ATTENTION_SHAPE_KEYS))
    out["gemm"] = list(gemm.values())
    out["attention"] = list(attn.values())
    out["gemm_best_flop_per_s"] = best_bf16_flop_per_s(out["gemm"])
    out["collectives"] = list(coll.values())
    out["collective_fits"] = {**(old.get("collective_fits") or {}), **new["collective_fits"]}
    if new.get("step") is not None:
        out["step"] = new["step"]
    if new.get("moe") is not None:
        out["moe"] = merge_moe(old.get("moe"), new["moe"])
    notes = [*(out.get("notes") or []), *(new.get("notes") or [])]
    out["notes"] = list(dict.fromkeys(notes))
    return out


def merge_moe(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A new ``moe`` section laid over an old one: expert GEMMs keyed by their shape and kernel, passes by
    their shape; the reference GEMM is the new one's (the relative efficiencies of old entries keep the
    reference they were measured against)."""
    if not old:
        return new

    def keyed(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
        return {tuple(e.get(f) for f in fields): e for e in entries}

    gemms = (keyed(old.get("expert_gemm") or [], EXPERT_GEMM_SHAPE_KEYS)
             | keyed(new.get("expert_gemm") or [], EXPERT_GEMM_SHAPE_KEYS))
    passes = keyed(old.get("passes") or [], MOE_PASS_SHAPE_KEYS) | keyed(new.get("passes") or [], MOE_PASS_SHAPE_KEYS)
    return {**old, **new, "expert_gemm": list(gemms.values()), "passes": list(passes.values())}


def _moe_errors(moe: Any) -> list[str]:
    """How a ``moe`` section departs from the schema (meshplan.profile)."""
    if not isinstance(moe, dict):
        return ["moe must be an object or null"]
    errors = []
    for key, required in (("expert_gemm", EXPERT_GEMM_KEYS), ("passes", MOE_PASS_KEYS)):
        entries = moe.get(key, [])
        if not isinstance(entries, list):
            errors.append(f"moe.{key} must be a list")
            continue
        for i, e in enumerate(entries):
            missing = [k for k in required if k not in e] if isinstance(e, dict) else list(required)
            if missing:
                errors.append(f"moe.{key}[{i}] lacks {', '.join(missing)}")
            elif not all(_positive(e[k]) for k in required[-3:]):
                errors.append(f"moe.{key}[{i}]: {', '.join(required[-3:])} must be positive numbers")
            elif key == "expert_gemm" and (e["kernel"] not in ("per_expert", "grouped")
                                           or not all(_whole(e[k]) for k in ("groups", "m", "n", "k"))):
                errors.append(f"moe.expert_gemm[{i}]: kernel must be 'per_expert' or 'grouped', groups, m, n, k "
                              "positive integers")
    return errors


def check_profile(data: dict[str, Any]) -> list[str]:
    """Every way ``data`` departs from ``meshplan.profile/1``; an empty list when it conforms."""
    errors: list[str] = []
    if data.get("schema") != SCHEMA:
        errors.append(f"schema must be {SCHEMA!r}")
    for key in ("created", "device", "backend"):
        if not isinstance(data.get(key), str):
            errors.append(f"{key} must be a string")
    if data.get("backend") not in ("nccl", "gloo"):
        errors.append("backend must be 'nccl' or 'gloo'")
    for key in ("world_size", "nproc_per_node"):
        if not isinstance(data.get(key), int) or data[key] < 1:
            errors.append(f"{key} must be a positive integer")
    for i, g in enumerate(data.get("gemm") if isinstance(data.get("gemm"), list) else []):
        missing = [k for k in GEMM_KEYS if k not in g] if isinstance(g, dict) else list(GEMM_KEYS)
        if missing:
            errors.append(f"gemm[{i}] lacks {', '.join(missing)}")
    if not isinstance(data.get("gemm"), list):
        errors.append("gemm must be a list")
    attention = data.get("attention", [])
    if not isinstance(attention, list):
        errors.append("attention must be a list")
    for i, a in enumerate(attention if isinstance(attention, list) else []):
        missing = [k for k in ATTENTION_KEYS if k not in a] if isinstance(a, dict) else list(ATTENTION_KEYS)
        if missing:
            errors.append(f"attention[{i}] lacks {', '.join(missing)}")
        elif not (all(_whole(a[k]) for k in ("b", "s", "heads", "head_dim"))
                  and _positive(a["fwd_median_s"]) and _positive(a["fwd_bwd_median_s"])):
            errors.append(f"attention[{i}]: b, s, heads, head_dim must be whole numbers from 1 to {MAX_INT:,}, "
                          "fwd_median_s and fwd_bwd_median_s positive numbers")
    best = data.get("gemm_best_flop_per_s")
    if best is not None and not (isinstance(best, int | float) and best > 0):
        errors.append("gemm_best_flop_per_s must be a positive number or null")
    if not isinstance(data.get("collectives"), list):
        errors.append("collectives must be a list")
    for i, c in enumerate(data.get("collectives") if isinstance(data.get("collectives"), list) else []):
        missing = [k for k in COLLECTIVE_KEYS if k not in c] if isinstance(c, dict) else list(COLLECTIVE_KEYS)
        if missing:
            errors.append(f"collectives[{i}] lacks {', '.join(missing)}")
        elif c["op"] not in OPS or c["link"] not in LINKS:
            errors.append(f"collectives[{i}]: op must be one of {OPS}, link one of {LINKS}")
    fits = data.get("collective_fits")
    if not isinstance(fits, dict):
        errors.append("collective_fits must be an object")
    for key, fit in (fits if isinstance(fits, dict) else {}).items():
        op, _, link = key.partition("@")
        if op not in OPS or link not in LINKS:
            errors.append(f"collective_fits key {key!r} is not 'op@link'")
        missing = [k for k in FIT_KEYS if k not in fit] if isinstance(fit, dict) else list(FIT_KEYS)
        if missing:
            errors.append(f"collective_fits[{key}] lacks {', '.join(missing)}")
        elif not _positive(fit["busbw_bytes_per_s"]) or not (_positive(fit["alpha_s"]) or fit["alpha_s"] == 0):
            errors.append(f"collective_fits[{key}]: busbw must be positive and alpha non-negative")
    for i, g in enumerate(data.get("gemm") if isinstance(data.get("gemm"), list) else []):
        if isinstance(g, dict) and not all(k in g for k in GEMM_KEYS):
            continue  # reported above
        if not isinstance(g, dict) or not all(_whole(g[k]) for k in "mnk") or not isinstance(g["dtype"], str) \
                or not _positive(g["median_s"]):
            errors.append(f"gemm[{i}]: m, n, k must be whole numbers from 1 to {MAX_INT:,}, dtype a string, "
                          "median_s a positive number")
    if data.get("moe") is not None:
        errors += _moe_errors(data["moe"])
    step = data.get("step")
    if step is not None and not isinstance(step, dict):
        errors.append("step must be an object or null")
    elif step is not None:
        for key in ("plan", "model", "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes_per_rank",
                    "exposed_comm_s_by_collective", "rank_step_time_spread"):
            if key not in step:
                errors.append(f"step lacks {key}")
        errors += _step_errors(step)
    return errors


def _positive(v: Any) -> bool:
    """A positive number a float holds finitely (an int of 400 digits is not one)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    try:
        return 0 < float(v) < float("inf")
    except OverflowError:
        return False


def _whole(v: Any) -> bool:
    """A positive whole number within the specs' range (a GEMM dimension, a batch, a head count)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_INT


def _step_errors(step: dict[str, Any]) -> list[str]:
    """What ``measure compare`` needs of a step section and it lacks (types and ranges; each error names its
    field)."""
    errors = []
    if not isinstance(step.get("plan", ""), str) or not isinstance(step.get("model", ""), str):
        errors.append("step.plan and step.model must be strings")
    if not isinstance(step.get("cluster", ""), str):
        errors.append("step.cluster must be a string (an accelerator name or a cluster .toml)")
    if "mbs" in step and not _whole(step["mbs"]):
        errors.append("step.mbs must be a positive integer")
    if not isinstance(step.get("model_spec"), dict):
        errors.append("step.model_spec must be an object (the measured model's spec)")
    for key in ("global_batch_tokens", "seq_len"):
        if not _whole(step.get(key)):
            errors.append(f"step.{key} must be a positive integer")
    for key in ("step_time_s", "tokens_per_s"):
        if key in step and not _positive(step[key]):
            errors.append(f"step.{key} must be a positive finite number")
    mfu = step.get("mfu")
    if mfu is not None and not _positive(mfu):
        errors.append("step.mfu must be a positive finite number or null")
    for key in ("exposed_comm_s_by_collective", "comm_s_by_collective", "kernel_time_s_by_kind"):
        v = step.get(key)
        if v is not None and not (isinstance(v, dict) and all(
                isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < float("inf") for x in v.values())):
            errors.append(f"step.{key} must map names to finite non-negative seconds")
    for key in ("peak_memory_bytes_per_rank", "peak_reserved_bytes_per_rank"):
        v = step.get(key)
        if v is not None and not (isinstance(v, list) and all(_positive(x) for x in v)):
            errors.append(f"step.{key} must be a list of positive byte counts")
    return errors


def read_existing(path: str | Path) -> dict[str, Any] | None:
    """The profile already in ``path``, None if there is no file; ValueError if it holds something else."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} exists and is not JSON ({exc}); refusing to overwrite it") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path} exists and is not a {SCHEMA} profile; refusing to overwrite it")
    return data


def write_profile(path: str | Path, profile: dict[str, Any]) -> dict[str, Any]:
    """Merge ``profile`` into the one already at ``path`` (if any), check it, write it atomically."""
    old = read_existing(path)
    data = merge_profiles(old, profile) if old is not None else profile
    errors = check_profile(data)
    if errors:
        raise ValueError("profile does not match the schema: " + "; ".join(errors))
    write_json(path, data)
    return data
