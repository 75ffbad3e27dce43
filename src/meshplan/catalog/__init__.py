"""The catalog: accelerators (with their usual node) and models as TOML data, a source per number.

Keys carry their unit (``_gib``, ``_gb_per_s``, ``_tflop_per_s``, ``_us``); this module converts them
to base units once. Unknown keys are rejected with the list of allowed keys. A model or cluster can
also be given as a spec file path with the same keys.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fileio import read_input_text
from meshplan.specs import (
    AcceleratorSpec,
    ClusterSpec,
    InterNodeLink,
    IntraNodeLink,
    JobSpec,
    ModelSpec,
    RuntimeOverheads,
)
from meshplan.specs._validate import (
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_FLOP_PER_S,
    efficiency,
    positive_int,
    positive_number,
    shown_list,
)
from meshplan.specs.hardware import MAX_LATENCY_S, MIN_FLOP_PER_S, MIN_HBM_BYTES, ExpertGemmPoint
from meshplan.units import (
    GB,
    MAX_LINK_BYTES_PER_S,
    MICRO,
    MIN_LINK_BYTES_PER_S,
    TERA,
    GiB,
    parse_size,
    parse_token_count,
)

_ACCEL_KEYS = {"name", "description", "bf16_dense_tflop_per_s", "fp8_dense_tflop_per_s", "hbm_capacity_gib",
               "hbm_bandwidth_tb_per_s", "gemm_efficiency", "node", "sources", "expert_gemm",
               "moe_pass_bandwidth_gb_per_s"}
_EXPERT_GEMM_KEYS = {"kernel", "dtype", "n", "k", "tokens_per_expert", "relative_efficiency", "source"}
_NODE_KEYS = {"gpus_per_node", "intra_kind", "intra_link_gb_per_s", "ring_busbw_gb_per_s",
              "nvls_busbw_gb_per_s", "nvls_min_gpus", "p2p_gb_per_s", "intra_latency_us", "nic_gb_per_s",
              "nic_efficiency", "inter_latency_us", "host_gb_per_s",
              "host_memory_gib", "storage_gb_per_s"}
_CLUSTER_FILE_KEYS = {"name", "accelerator", "nodes", "node"}


def _catalog_dir(kind: str) -> Any:
    return resources.files("meshplan.catalog").joinpath(kind)


def _names(kind: str) -> list[str]:
    return sorted(p.name[:-5] for p in _catalog_dir(kind).iterdir() if p.name.endswith(".toml"))


def list_accelerators() -> list[str]:
    return _names("accelerators")


def list_models() -> list[str]:
    return _names("models")


MAX_KEY_PARTS = 16
"""The most parts a dotted TOML key of a spec file may have (``a.b.c`` has 3; real spec files have 2):
Python's TOML parser takes time quadratic in a key's parts, minutes for a 200 KB key."""
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\n]{0,200}"|'[^'\n]{0,200}')[ \t]*\.[ \t]*"""
_DEEP_KEY = re.compile(f"(?:{_KEY_PART}){{{MAX_KEY_PARTS},}}")


def parse_toml(text: str, what: str, origin: str) -> dict[str, Any]:
    """``text`` as TOML, or SpecError naming ``what``: malformed, keys of more than MAX_KEY_PARTS dotted
    parts, nested too deeply, or a number beyond what Python reads."""
    if _DEEP_KEY.search(text):
        raise SpecError(what, f"malformed TOML in {origin}: a dotted key of more than {MAX_KEY_PARTS} parts")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        hint = " (spec files are TOML, not JSON)" if text.lstrip().startswith("{") else ""
        raise SpecError(what, f"malformed TOML in {origin}: {str(exc)[:200]}{hint}") from None
    except RecursionError:
        raise SpecError(what, f"malformed TOML in {origin}: nested too deeply") from None
    except ValueError:  # Python's limit on the digits of an integer it converts (4,300)
        raise SpecError(what, f"malformed TOML in {origin}: a number of thousands of digits") from None


def _read_toml(what: str, ref: str, kind: str) -> tuple[dict[str, Any], str]:
    """Load a catalog entry by name, or a spec file by path. Returns (data, origin)."""
    if not isinstance(ref, str) or not ref:
        raise SpecError(what, f"must be a catalog name or a .toml spec file path, got {ref!r}")
    path = Path(ref)
    if ref.endswith(".toml") or path.exists():
        hint = "; give a .toml spec file" if kind == "jobs" else "; give a .toml spec file or a catalog name"
        try:
            text, origin = read_input_text(path, what, kind="spec file"), str(path)
        except SpecError as exc:
            raise SpecError(what, exc.message + (hint if "not found" in exc.message or "folder" in exc.message
                                                  or "regular" in exc.message else "")) from None
    else:
        entry = _catalog_dir(kind).joinpath(f"{ref}.toml")
        if len(ref) > 100 or not entry.is_file():
            raise SpecError(what, f"unknown name {ref[:60]!r}; catalog has: {', '.join(_names(kind))} "
                                  + ("(or give a path to a .toml spec file or a Hugging Face config.json)"
                                     if kind == "models" else "(or give a path to a .toml spec file)"))
        text, origin = entry.read_text(), f"catalog:{kind}/{ref}"
    return parse_toml(text, what, origin), origin


def load_job(path: str | None, *, defaults: dict[str, Any] | None = None, **overrides: Any) -> JobSpec:
    """A job from a TOML spec file with JobSpec's field names (a ``[runtime]`` table for RuntimeOverheads).
    The file wins over ``defaults``; ``overrides`` that are not None win over the file."""
    data: dict[str, Any] = dict(defaults or {})
    if path is not None:
        if not path.endswith(".toml") and not Path(path).exists():
            raise SpecError("job", f"spec file {path!r} not found")
        spec, _ = _read_toml("job", path, "jobs")
        data.update(_job_fields(spec))
    data.update({k: v for k, v in overrides.items() if v is not None})
    return _spec(JobSpec, "job", **data)


def job_from_data(spec: Any, *, defaults: dict[str, Any] | None = None, **overrides: Any) -> JobSpec:
    """``load_job`` on a document already parsed (a TOML or JSON table with JobSpec's field names), as a
    spec sent to ``meshplan serve`` is: no file is read."""
    data: dict[str, Any] = {**(defaults or {}), **_job_fields(spec)}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return _spec(JobSpec, "job", **data)


def _job_fields(spec: Any) -> dict[str, Any]:
    """A job document's fields, checked and converted (its ``[runtime]`` table, ``'4M'`` token counts)."""
    _reject_unknown("job", spec, {f.name for f in fields(JobSpec)})
    spec = dict(spec)
    if "runtime" in spec:
        _reject_unknown("job.runtime", spec["runtime"], {f.name for f in fields(RuntimeOverheads)})
        spec["runtime"] = _spec(RuntimeOverheads, "job.runtime", **spec["runtime"])
    for key in ("global_batch_tokens", "seq_len"):  # '4M', as the command line takes them
        if isinstance(spec.get(key), str):
            try:
                spec[key] = parse_size(spec[key])
            except ValueError:
                raise SpecError(f"job.{key}", f"must be a whole number of tokens (e.g. 4194304 or '4M'), "
                                              f"got {spec[key]!r}") from None
    if isinstance(spec.get("train_tokens"), str | float):  # '15.6T' or 1.56e13, decimal as datasets are
        try:
            spec["train_tokens"] = parse_token_count(str(spec["train_tokens"]))
        except ValueError:
            raise SpecError("job.train_tokens", f"must be a whole number of tokens (e.g. '15.6T' or 1e12), got "
                                                f"{spec['train_tokens']!r}") from None
    return spec


def _reject_unknown(what: str, data: Any, allowed: set[str]) -> None:
    if not isinstance(data, dict):
        raise SpecError(what, f"must be a table with keys among {', '.join(sorted(allowed))}; got "
                              f"{shown_list([data], 1)}")
    extra = sorted(set(data) - allowed)
    if extra:
        raise SpecError(what, f"unknown key{'s' if len(extra) > 1 else ''} {shown_list(extra)}; allowed: "
                              f"{', '.join(sorted(allowed))}")


def _require(what: str, data: dict[str, Any], key: str) -> Any:
    if key not in data:
        raise SpecError(f"{what}.{key}", "is missing")
    return data[key]


_ABSENT = object()


def _number(what: str, data: dict[str, Any], key: str, scale: float = 1.0, default: Any = _ABSENT, *,
            check: Any = positive_number, least: float = 0.0, most: float = math.inf) -> Any:
    """``data[key]`` (a number as the file writes it, checked under the file's own key) times ``scale``;
    ``default`` where absent (required where no default is given). ``least`` and ``most`` bound the scaled
    value (the specs' physical ranges, specs.hardware), said in the file's units; they take the place of
    ``check``, so give them only with the default one."""
    if key not in data:
        if default is _ABSENT:
            raise SpecError(f"{what}.{key}", "is missing")
        return default
    value = data[key]
    if least or most < math.inf:  # the default check, bounded
        positive_number(f"{what}.{key}", value, least=least / scale, most=most / scale)
    else:
        check(f"{what}.{key}", value)
    return value * scale if check is positive_int else float(value) * scale


def _link(what: str, data: dict[str, Any], key: str, default: Any = _ABSENT) -> Any:
    """A link rate in decimal GB/s from the file, in bytes/s: 1 MB/s to 100 TB/s."""
    return _number(what, data, key, GB, default, least=MIN_LINK_BYTES_PER_S, most=MAX_LINK_BYTES_PER_S)


def _spec(cls: type, what: str, **kwargs: Any) -> Any:
    try:
        return cls(**kwargs)
    except TypeError as exc:  # wrong type of a value that the dataclass could not catch
        raise SpecError(what, str(exc)) from None


def load_model(ref: str) -> ModelSpec:
    """A model from the catalog by name, from a TOML spec file with ModelSpec's field names, or from a Hugging
    Face ``config.json`` (a path ending in .json: meshplan.catalog.hf)."""
    if not isinstance(ref, str) or not ref:
        raise SpecError("model", f"must be a catalog name, a .toml spec file or a config.json path, got {ref!r}")
    if ref.endswith(".json"):
        from meshplan.catalog.hf import load_hf_config

        return load_hf_config(ref)
    data, origin = _read_toml("model", ref, "models")
    return model_from_data(data, origin)


def model_from_data(data: Any, origin: str) -> ModelSpec:
    """A model from a document already parsed (a TOML or JSON table with ModelSpec's field names), as
    ``load_model`` reads one; ``origin`` is its ``source`` where the document gives none."""
    _reject_unknown("model", data, {f.name for f in fields(ModelSpec)})
    for key in ("name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab"):
        _require("model", data, key)
    return _spec(ModelSpec, "model", **{"source": origin, **data})


def _table(field: str, data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]``, a TOML table (empty where absent), as a new dict; SpecError naming ``field`` otherwise."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(field, f"must be a table ([{key}] or {key} = {{...}}), got {value!r}")
    return dict(value)


def _accelerator(data: dict[str, Any], origin: str) -> AcceleratorSpec:
    _reject_unknown("accelerator", data, _ACCEL_KEYS)
    sources = _table("accelerator.sources", data, "sources")
    numeric = [k for k in data if k not in ("name", "description", "node", "sources", "expert_gemm")]
    numeric += [k for k in _table("accelerator.node", data, "node") if k != "intra_kind"]
    missing = [k for k in numeric if k not in sources]
    if missing:
        raise SpecError("accelerator.sources", f"{origin}: every number needs a source; missing: {missing}")
    return _spec(
        AcceleratorSpec, "accelerator",
        name=_require("accelerator", data, "name"),
        description=data.get("description", ""),
        bf16_flop_per_s=_number("accelerator", data, "bf16_dense_tflop_per_s", TERA, least=MIN_FLOP_PER_S,
                                most=MAX_FLOP_PER_S),
        fp8_flop_per_s=_number("accelerator", data, "fp8_dense_tflop_per_s", TERA, None,
                               least=MIN_FLOP_PER_S, most=MAX_FLOP_PER_S),
        hbm_capacity_bytes=_number("accelerator", data, "hbm_capacity_gib", GiB, least=MIN_HBM_BYTES,
                                   most=MAX_BYTES),
        hbm_bytes_per_s=_number("accelerator", data, "hbm_bandwidth_tb_per_s", 1e12, least=MIN_LINK_BYTES_PER_S,
                                most=MAX_BYTES_PER_S),
        gemm_efficiency=_number("accelerator", data, "gemm_efficiency", check=efficiency),
        expert_gemm_curve=_expert_gemm_curve(data.get("expert_gemm", []), origin),
        moe_pass_bytes_per_s=_link("accelerator", data, "moe_pass_bandwidth_gb_per_s", None),
        sources=sources,
    )


def _expert_gemm_curve(points: Any, origin: str) -> tuple[ExpertGemmPoint, ...]:
    """``[[expert_gemm]]`` tables: measured expert-GEMM points, each with its own ``source`` (the GPU, its
    driver and library versions, the command and the date it was measured with)."""
    if not isinstance(points, list):
        raise SpecError("accelerator.expert_gemm", f"{origin}: must be an array of tables ([[expert_gemm]])")
    out = []
    for i, p in enumerate(points):
        field = f"accelerator.expert_gemm[{i}]"
        if not isinstance(p, dict):
            raise SpecError(field, f"{origin}: must be a table")
        _reject_unknown(field, p, _EXPERT_GEMM_KEYS)
        if not isinstance(p.get("source"), str) or not p["source"].strip():
            raise SpecError(f"{field}.source", f"{origin}: every measured point needs a source (GPU, driver and "
                                               "library versions, command, date)")
        out.append(_spec(ExpertGemmPoint, field, **{k: v for k, v in p.items() if k != "source"}))
    return tuple(out)


def _links(node: dict[str, Any]) -> tuple[IntraNodeLink, InterNodeLink]:
    _reject_unknown("cluster.node", node, _NODE_KEYS)
    w = "cluster.node"
    intra = _spec(
        IntraNodeLink, w,
        kind=_require(w, node, "intra_kind"),
        link_bytes_per_s=_link(w, node, "intra_link_gb_per_s"),
        ring_busbw_bytes_per_s=_link(w, node, "ring_busbw_gb_per_s"),
        nvls_busbw_bytes_per_s=_link(w, node, "nvls_busbw_gb_per_s", None),
        nvls_min_gpus=_number(w, node, "nvls_min_gpus", 1, 5, check=positive_int),
        p2p_bytes_per_s=_link(w, node, "p2p_gb_per_s", None),
        latency_s=_number(w, node, "intra_latency_us", MICRO, 20 * MICRO, most=MAX_LATENCY_S),
    )
    inter = _spec(
        InterNodeLink, w,
        nic_bytes_per_s=_link(w, node, "nic_gb_per_s"),
        efficiency=_number(w, node, "nic_efficiency", 1.0, 0.92, check=efficiency),
        latency_s=_number(w, node, "inter_latency_us", MICRO, 40 * MICRO, most=MAX_LATENCY_S),
    )
    return intra, inter


def load_accelerator(ref: str) -> AcceleratorSpec:
    data, origin = _read_toml("cluster", ref, "accelerators")
    return _accelerator(data, origin)


def load_cluster(ref: str, *, nodes: int | None = None, gpus_per_node: int | None = None,
                 inter_node_gb_per_s: float | None = None, default_nodes: int = 1) -> ClusterSpec:
    """A cluster of ``nodes`` nodes of a catalog accelerator's usual node, or from a cluster spec file
    (``accelerator = NAME``, ``nodes = N`` and a ``[node]`` table overriding any node key); where neither
    says, ``default_nodes``. Command-line overrides win over both."""
    data, origin = _read_toml("cluster", ref, "accelerators")
    if "accelerator" in data:  # a cluster spec file that names its accelerator
        _reject_unknown("cluster", data, _CLUSTER_FILE_KEYS)
        accel_data, accel_origin = _read_toml("cluster.accelerator", str(data["accelerator"]), "accelerators")
        node = {**_table("accelerator.node", accel_data, "node"), **_table("cluster.node", data, "node")}
        accel = _accelerator({k: v for k, v in accel_data.items() if k != "node"}, accel_origin)
        name = str(data.get("name", Path(origin).stem))
        nodes = nodes if nodes is not None else data.get("nodes")
    else:
        if "bf16_dense_tflop_per_s" not in data and set(data) <= _CLUSTER_FILE_KEYS:
            raise SpecError("cluster.accelerator", f"is missing in {origin}: a cluster spec file names its "
                                                   f"accelerator (one of {', '.join(_names('accelerators'))}, "
                                                   "or an accelerator spec file)")
        node = _table("cluster.node", data, "node")
        accel = _accelerator({k: v for k, v in data.items() if k != "node"}, origin)
        name = accel.name
    if inter_node_gb_per_s is not None:
        node["nic_gb_per_s"] = inter_node_gb_per_s
    intra, inter = _links(node)
    return _spec(
        ClusterSpec, "cluster",
        name=name, accelerator=accel,
        n_nodes=default_nodes if nodes is None else nodes,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else _require("cluster.node", node,
                                                                             "gpus_per_node"),
        intra=intra, inter=inter,
        host_bytes_per_s=_link("cluster.node", node, "host_gb_per_s", None),
        host_memory_bytes=_number("cluster.node", node, "host_memory_gib", GiB, None, most=MAX_BYTES),
        storage_bytes_per_s=_link("cluster.node", node, "storage_gb_per_s", None),
        sources=_table("cluster.sources", data, "sources"),
    )
