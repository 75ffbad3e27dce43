"""A scenario as the web page sends it: checked field by field, turned into specs, keyed for the cache.

A request names catalog entries by name only (a name is checked against the catalog's list before it is
looked up, so no request can make the server read a path), and sends its own model or job spec as the
text of a TOML or JSON document, parsed in memory. Every field error is a :class:`SpecError` naming the
field, which the app answers with a 4xx and the message. No third-party import: this runs in the worker
processes too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec

DEFAULTS: dict[str, Any] = {
    "model": "seed-70b", "model_spec": None, "accelerator": "h100-sxm", "nodes": 8, "gpus_per_node": None,
    "inter_node_gb_per_s": None, "batch_tokens": 4_194_304, "seq_len": 4096, "optimizer": "adamw",
    "precision": "bf16", "software": "generic", "job_spec": None, "space": "full", "train_tokens": None,
}
"""The worked example, as ``meshplan plan`` takes it without flags. ``None``: the accelerator's usual node
(GPUs per node, NIC bandwidth), or no spec document; ``train_tokens`` (the token budget of the time-to-train
and cost panel, where ``meshplan.economics`` is installed): None leaves it to the job."""

MAX_SPEC_CHARS = 64 * 1024
"""The longest spec document a request may carry (a catalog model is about 1,500 characters)."""

MAX_NODES = 1 << 16
MAX_GPUS_PER_NODE = 1024
SPACES = ("full", "dp-tp")
SPEC_FORMATS = ("toml", "json")


@dataclass(frozen=True, slots=True)
class Built:
    """A scenario's specs, ready for the search."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    space: str


def _shown(value: Any) -> str:
    """A value as a message quotes it: its repr (one line), cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _choice(field: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}; got {_shown(value)}")
    return value


def _whole(field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(field, f"must be a whole number from {lo:,} to {hi:,}; got {_shown(value)}")
    return value


def _rate(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0.001 <= value <= 1e5:
        raise SpecError(field, f"must be a number of GB/s per GPU per direction from 0.001 to 100,000; "
                               f"got {_shown(value)}")
    return float(value)


def _document(field: str, value: Any) -> dict[str, Any] | None:
    """A spec document: ``{"format": "toml"|"json", "text": ..., "name": optional file name}``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"format", "text", "name"} or "text" not in value:
        raise SpecError(field, "must be an object with 'text' (the spec document), 'format' (toml or json) "
                               "and optionally 'name' (the file's name)")
    fmt = _choice(f"{field}.format", value.get("format", "toml"), SPEC_FORMATS)
    text, name = value["text"], value.get("name") or f"uploaded.{fmt}"
    if not isinstance(text, str):
        raise SpecError(f"{field}.text", "must be the document's text")
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"{field}.text", f"is {len(text):,} characters; at most {MAX_SPEC_CHARS:,} are accepted")
    if not isinstance(name, str) or len(name) > 200 or any(c in name for c in "\r\n\x00"):
        raise SpecError(f"{field}.name", "must be a file name of at most 200 characters on one line")
    return {"format": fmt, "text": text, "name": name}


def normalise(raw: Any) -> dict[str, Any]:
    """The request's scenario with every field checked and defaults filled in (``DEFAULTS``' keys, no
    others). Catalog names are checked against the catalog here."""
    from meshplan.catalog import list_accelerators, list_models
    from meshplan.specs.job import OPTIMIZERS, PRECISIONS, SOFTWARE

    if not isinstance(raw, dict):
        raise SpecError("scenario", f"must be an object with keys among {', '.join(DEFAULTS)}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise SpecError("scenario", f"unknown keys {', '.join(_shown(k) for k in unknown[:5])}; allowed: "
                                    f"{', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    s["model_spec"] = _document("model_spec", s["model_spec"])
    s["job_spec"] = _document("job_spec", s["job_spec"])
    s["model"] = None if s["model_spec"] else _choice("model", s["model"], list_models())
    s["accelerator"] = _choice("accelerator", s["accelerator"], list_accelerators())
    s["nodes"] = _whole("nodes", s["nodes"], 1, MAX_NODES)
    if s["gpus_per_node"] is not None:
        s["gpus_per_node"] = _whole("gpus_per_node", s["gpus_per_node"], 1, MAX_GPUS_PER_NODE)
    if s["inter_node_gb_per_s"] is not None:
        s["inter_node_gb_per_s"] = _rate("inter_node_gb_per_s", s["inter_node_gb_per_s"])
    s["batch_tokens"] = _whole("batch_tokens", s["batch_tokens"], 1, 1 << 40)
    s["seq_len"] = _whole("seq_len", s["seq_len"], 1, 1 << 32)
    s["optimizer"] = _choice("optimizer", s["optimizer"], OPTIMIZERS)
    s["precision"] = _choice("precision", s["precision"], PRECISIONS)
    s["software"] = _choice("software", s["software"], SOFTWARE)
    s["space"] = _choice("space", s["space"], SPACES)
    if s["train_tokens"] is not None:
        s["train_tokens"] = _whole("train_tokens", s["train_tokens"], 1, 1 << 50)
    return s


def cache_key(s: dict[str, Any]) -> str:
    """One string per normalised scenario (``normalise``): equal scenarios, equal keys."""
    return json.dumps(s, sort_keys=True, separators=(",", ":"))


def _parse(field: str, doc: dict[str, Any]) -> Any:
    """A spec document's text parsed as its format says (TOML as spec files are read: catalog.parse_toml)."""
    from meshplan.catalog import parse_toml

    text, fmt, name = doc["text"], doc["format"], doc["name"]
    if fmt == "toml":
        try:
            return parse_toml(text, field, name)
        except SpecError as exc:
            hint = " (it looks like JSON: choose the json format)" if text.lstrip().startswith("{") else ""
            raise SpecError(field, exc.message.replace(" (spec files are TOML, not JSON)", "") + hint) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(field, f"malformed JSON in {name}: {exc}") from None
    except RecursionError:
        raise SpecError(field, f"malformed JSON in {name}: nested too deeply") from None
    except ValueError:  # Python's limit on the digits of an integer it converts (4,300)
        raise SpecError(field, f"malformed JSON in {name}: a number of thousands of digits") from None


def _no_constant(name: str) -> None:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def model_from_document(doc: dict[str, Any]) -> ModelSpec:
    """The model of an uploaded spec document: meshplan's model keys, or a Hugging Face ``config.json`` (a
    JSON document with ``model_type``, read as catalog.hf reads one)."""
    from meshplan.catalog import model_from_data
    from meshplan.catalog.hf import model_from_hf

    data = _parse("model_spec", doc)
    if isinstance(data, dict) and "model_type" in data and "n_layers" not in data:
        stem = doc["name"].rsplit(".", 1)[0] if doc["name"] != "config.json" else "hf-model"
        return model_from_hf(data, name=stem, source=f"Hugging Face config.json uploaded as {doc['name']}")
    return model_from_data(data, f"uploaded spec {doc['name']}")


def build(s: dict[str, Any]) -> Built:
    """The specs of a normalised scenario. Raises SpecError for any value the specs refuse (the uploaded
    documents' included)."""
    from meshplan.catalog import job_from_data, load_cluster, load_model

    try:
        if s["model_spec"]:
            model = model_from_document(s["model_spec"])
        else:
            model = load_model(s["model"])  # a name checked against the catalog by normalise
        cluster = load_cluster(s["accelerator"], nodes=s["nodes"], gpus_per_node=s["gpus_per_node"],
                               inter_node_gb_per_s=s["inter_node_gb_per_s"])
        job_doc = _parse("job_spec", s["job_spec"]) if s["job_spec"] else {}
        if job_doc:  # the document's own values are checked, though the page's controls replace five of them
            job_from_data(job_doc, global_batch_tokens=s["batch_tokens"], seq_len=s["seq_len"])
        job = job_from_data(job_doc, global_batch_tokens=s["batch_tokens"], seq_len=s["seq_len"],
                            optimizer=s["optimizer"], precision=s["precision"], software=s["software"])
    except SpecError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError) as exc:
        # a value of a type the spec's checks did not foresee (a list where a number belongs)
        raise SpecError("scenario", f"a spec value could not be used: {str(exc)[:200]}") from None
    return Built(model, cluster, job, s["space"])
