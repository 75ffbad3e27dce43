"""The assumptions behind time to train, cost, energy and goodput, each with its source: the catalog's
defaults (``catalog/economics.toml``, loaded as strictly as the other catalog files: every number needs a
source) and the overrides a user gives (``Settings.override``)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from functools import cache
from importlib import resources
from typing import Any

from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec
from meshplan.specs._validate import positive_number
from meshplan.units import GB

CATALOG = "economics.toml"
MAX_PRICE_USD_PER_GPU_HOUR = 1e4
MAX_PUE = 5.0
MAX_FAILURES_PER_GPU_HOUR = 1.0
"""One failure per GPU-hour: far beyond any fleet report (1e-5 to 1e-4), still a number the formulas hold."""
MAX_RESTART_S = 7 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Economic and reliability assumptions for one accelerator, in base units, with a source per field."""

    price_usd_per_gpu_hour: float | None
    """On-demand price of one GPU for one hour [USD]; None where the catalog has no public list price."""
    board_power_w: float | None
    """Board power of one GPU under training load [W] (the datasheet's TDP); None where the catalog does not
    list the accelerator (then no energy)."""
    pue: float
    """Power usage effectiveness of the facility (total power / IT power), at least 1."""
    failures_per_gpu_hour: float
    """Unexpected job interruptions per GPU-hour [1/(GPU·h)]; 0 for none."""
    storage_bytes_per_s_per_gpu: float
    """Checkpoint write bandwidth per GPU, every GPU writing at once [bytes/s]."""
    restart_s: float
    """Time from an interruption to training again: re-launch, re-load, warm-up [s]."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each field's value comes from, by field name."""

    def __post_init__(self) -> None:
        if self.price_usd_per_gpu_hour is not None:
            positive_number("economics.price_usd_per_gpu_hour", self.price_usd_per_gpu_hour,
                            most=MAX_PRICE_USD_PER_GPU_HOUR)
        if self.board_power_w is not None:
            positive_number("economics.board_power_w", self.board_power_w, least=1.0, most=1e5)
        positive_number("economics.pue", self.pue, least=1.0, most=MAX_PUE)
        _non_negative("economics.failures_per_gpu_hour", self.failures_per_gpu_hour, MAX_FAILURES_PER_GPU_HOUR)
        positive_number("economics.storage_bytes_per_s_per_gpu", self.storage_bytes_per_s_per_gpu, least=1e3)
        _non_negative("economics.restart_s", self.restart_s, MAX_RESTART_S)
        missing = [f.name for f in fields(self) if f.name != "sources" and f.name not in self.sources
                   and getattr(self, f.name) is not None]
        if missing:
            raise SpecError("economics.sources", f"every number needs a source; missing: {missing}")

    def override(self, sources: dict[str, str] | None = None, **values: Any) -> Settings:
        """These settings with each value that is not None replaced, its source taken from ``sources``
        where given, else 'given by the user'."""
        given = {k: v for k, v in values.items() if v is not None}
        named = {k: (sources or {}).get(k, "given by the user") for k in given}
        return replace(self, **given, sources={**self.sources, **named})

    @property
    def failure_source(self) -> str:
        return self.sources.get("failures_per_gpu_hour", "")


def _non_negative(name: str, value: object, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise SpecError(name, f"must be a number from 0 to {most:g}, got {value!r}")


@cache
def _raw() -> dict[str, Any]:
    return tomllib.loads(resources.files("meshplan.catalog").joinpath(CATALOG).read_text())


@cache
def catalog() -> dict[str, Any]:
    """The economics catalog as tables, checked (check_catalog)."""
    data = _raw()
    check_catalog(data)
    failure_rates()
    return data


def check_catalog(data: dict[str, Any]) -> None:
    """SpecError unless every number of the catalog's tables carries its source: ``pue``, ``storage`` and
    ``restart`` a ``source`` each, every accelerator table a ``sources`` entry per number."""
    for key in ("pue", "storage", "restart"):
        table = data.get(key)
        if not isinstance(table, dict) or not isinstance(table.get("source"), str) or not table["source"]:
            raise SpecError(f"economics.{key}", f"catalog:{CATALOG}: needs a value and its source")
    for name, table in data.get("accelerator", {}).items():
        sources = table.get("sources", {})
        missing = [k for k in table if k != "sources" and not sources.get(k)]
        if missing:
            raise SpecError(f"economics.accelerator.{name}.sources",
                            f"catalog:{CATALOG}: every number needs a source; missing: {missing}")


@cache
def failure_rates() -> dict[str, tuple[float, str]]:
    """Named published failure rates: name -> (interruptions per GPU-hour, source), each
    interruptions / (days x 24 h x GPUs) of the report it names."""
    out = {}
    for name, entry in _raw().get("failure_rate", {}).items():
        if name == "default":
            continue
        for key in ("interruptions", "days", "gpus"):
            positive_number(f"economics.failure_rate.{name}.{key}", entry.get(key))
        if not entry.get("source"):
            raise SpecError(f"economics.failure_rate.{name}.source", f"catalog:{CATALOG}: is missing")
        rate = entry["interruptions"] / (entry["days"] * 24.0 * entry["gpus"])
        out[name] = (rate, f"{name}: {entry['source']}")
    if default_failure_rate() not in out:
        raise SpecError("economics.failure_rate.default", f"must name one of {', '.join(out)}")
    return out


def default_failure_rate() -> str:
    """The name of the catalog's default failure rate."""
    return str(_raw().get("failure_rate", {}).get("default"))


def failure_rate(text: str) -> tuple[float, str]:
    """A failure rate as a user gives it: a catalog name (llama3-405b, meta-rsc1, ...) or a number of
    interruptions per GPU-hour (2e-5). SpecError naming what is allowed otherwise."""
    rates = failure_rates()
    if text in rates:
        return rates[text]
    try:
        value = float(text)
    except ValueError:
        raise SpecError("--failure-rate", f"expected interruptions per GPU-hour (e.g. 2e-5) or one of "
                                          f"{', '.join(rates)}; got {text!r}") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_FAILURES_PER_GPU_HOUR):
        raise SpecError("--failure-rate", f"must be from 0 to {MAX_FAILURES_PER_GPU_HOUR:g} interruptions per "
                                          f"GPU-hour, got {text!r}")
    return value, "given by the user"


def defaults_for(cluster: ClusterSpec) -> Settings:
    """The catalog's assumptions for ``cluster``'s accelerator, and the cluster spec's own checkpoint
    bandwidth (``storage_gb_per_s`` in its node table) where it gives one. An accelerator the economics
    catalog does not list (an accelerator spec file) has no price and no board power: no cost and no energy
    unless given."""
    data = catalog()
    name = cluster.accelerator.name
    accel = data.get("accelerator", {}).get(name, {"sources": {}})
    rate, rate_source = failure_rates()[default_failure_rate()]
    sources = {"pue": data["pue"]["source"], "failures_per_gpu_hour": rate_source,
               "restart_s": data["restart"]["source"], "storage_bytes_per_s_per_gpu": data["storage"]["source"]}
    for key in ("price_usd_per_gpu_hour", "board_power_w"):
        if key in accel:
            sources[key] = f"{name}: {accel['sources'][key]}"
    storage = data["storage"]["write_gb_per_s_per_gpu"] * GB
    if cluster.storage_bytes_per_s is not None:
        storage = cluster.storage_bytes_per_s
        sources["storage_bytes_per_s_per_gpu"] = cluster.sources.get("storage_gb_per_s", "the cluster spec file")
    power = accel.get("board_power_w")
    return Settings(price_usd_per_gpu_hour=accel.get("price_usd_per_gpu_hour"),
                    board_power_w=None if power is None else float(power), pue=float(data["pue"]["value"]),
                    failures_per_gpu_hour=rate, storage_bytes_per_s_per_gpu=storage,
                    restart_s=float(data["restart"]["seconds"]), sources=sources)
