"""Compute-model parameters per accelerator and software stack, from the catalog's calibration files.

``catalog/calibration/default.toml`` holds stated defaults with sources. ``fitted.toml``, written by
``meshplan validate --calibrate``, holds parameters fitted on published runs with their provenance
(procedure, rows, cross-validated error): a ``[global]`` table, ``[accelerator.<name>]`` tables
(``gemm_scale``), ``[software.<name>]`` tables (overheads), ``[stack."<software>/<family>"]`` tables
(``kernel_scale``, ``attention_kernel_scale``), ``[uncertainty]`` bands (band_keys, unseen_stack_keys) and
``[rows_by_stack]``, the fitted rows of each stack on each GPU family by kind of model.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib import resources
from typing import Any

from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Band

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


_HEADER_AFTER_BREAK = re.compile(r'\n\[\s*("[^"]*"|[^\s.\]]+)')
"""A table header after a line break, and the first part of its key ('global' of ``[global]``, 'fold' of
``[fold.1.global]``): matched in the text with a line break put before it, so that the first line starts after
one too and the pattern begins with a literal, which the engine scans for quickly."""


@cache
def _sections(name: str) -> dict[str, str]:
    """The text of calibration file ``name`` by the first part of its tables' keys ('' for the keys before
    the first table), each part holding every table under that key, in the file's order."""
    entry = resources.files("meshplan.catalog").joinpath("calibration", f"{name}.toml")
    if not entry.is_file():
        return {}
    text = entry.read_text()  # (a match's start in '\n' + text is where its '[' is in the text)
    starts = [(m.start(), m.group(1)) for m in _HEADER_AFTER_BREAK.finditer("\n" + text)]
    parts: dict[str, list[str]] = {}
    for (begin, key), end in zip([(0, ""), *starts], [*(b for b, _ in starts), len(text)], strict=True):
        parts.setdefault(key, []).append(text[begin:end])
    return {key: "".join(chunks) for key, chunks in parts.items()}


@cache
def _table(name: str, key: str) -> dict[str, Any]:
    """``_load(name)[key]`` (``key`` '': the keys before the first table), parsing only that part of the
    file: a prediction reads the parameters, the bands and the rows of each stack, not the stored fold fits
    that make up most of fitted.toml (meshplan.validation.fold_store), so that the first evaluation in a
    process does not wait for them. ``tests/test_calibration_load.py`` checks the parts against the whole."""
    text = _sections(name).get(key)
    if text is None:
        return {}
    tables = flat_toml(text)
    if tables is None:
        tables = tomllib.loads(text)
    return tables if key == "" else tables.get(key.strip('"'), {})


_KEY = r'(?:[A-Za-z0-9_-]+|"[^"\\\x00-\x1f\x7f]*")'
_TABLE_LINE = re.compile(rf"\[[ \t]*({_KEY}(?:[ \t]*\.[ \t]*{_KEY})*)[ \t]*\]")
_KEY_PART = re.compile(_KEY)
_PAIR_LINE = re.compile(rf"({_KEY})[ \t]*=[ \t]*(?:([+-]?(?:0|[1-9][0-9]*))"  # an integer
                        r"|([+-]?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+))"  # a float
                        r"|'([^'\x00-\x08\x0a-\x1f\x7f]*)'"  # a literal string
                        r'|"([^"\\\x00-\x08\x0a-\x1f\x7f]*)")')  # a basic string without escapes
"""``key = value`` with a value of the subset ``flat_toml`` reads (no underscores in numbers, no inf or nan)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]|\r(?!\n)")
"""Characters TOML allows nowhere but in multi-line strings, but a tab and the line break '\\n' or '\\r\\n': a
text holding one is left to tomllib."""


def flat_toml(text: str) -> dict[str, Any] | None:
    """``tomllib.loads(text)`` for the subset the calibration files are written in (comments, table headers,
    and bare keys set to a number or to a string without escapes), read without the general parser, which
    takes about as long as the rest of a first evaluation; None where ``text`` holds anything else (or a
    key twice), for ``tomllib`` to read or reject. Lines end at '\\n' (or '\\r\\n') and space is ' ' or a
    tab, as in TOML, not wherever Python's ``str.splitlines`` and ``str.strip`` would have them."""
    if _CONTROL.search(text):
        return None
    root: dict[str, Any] = {}
    table, seen = root, set()
    for raw in text.split("\n"):
        line = raw.strip(" \t")
        if line.endswith("\r"):  # of '\r\n'
            line = line[:-1].rstrip(" \t")
        if not line or line[0] == "#":
            continue
        header = _TABLE_LINE.fullmatch(line) if line[0] == "[" else None
        if header:
            path = tuple(k.strip('"') for k in _KEY_PART.findall(header.group(1)))
            if path in seen:
                return None
            seen.add(path)
            table = root
            for part in path:
                table = table.setdefault(part, {})
                if not isinstance(table, dict):
                    return None
            continue
        pair = _PAIR_LINE.fullmatch(line)
        if pair is None:
            return None
        key, integer, real, literal, basic = pair.groups()
        key = key.strip('"')
        if key in table:
            return None
        table[key] = (int(integer) if integer is not None else float(real) if real is not None
                      else literal if literal is not None else basic)
    return root


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
    defaults = _table("default", "")
    tables = [defaults]
    source = str(defaults.get("source", "defaults"))
    if _sections("fitted"):
        tables += [_table("fitted", "global"), _table("fitted", "accelerator").get(family(accelerator), {}),
                   _table("fitted", "software").get(software, {}),
                   _table("fitted", "stack").get(stack_key(software, accelerator), {})]
        source = str(_table("fitted", "").get("source", "fitted"))
    return params_from(tables, source)


def seen_key(software: str, accelerator: str, moe: bool) -> str:
    """The key of fitted.toml's ``[rows_by_stack]``: a stack on a GPU family running one kind of model
    ('torchtitan/h100-sxm/dense')."""
    return f"{stack_key(software, accelerator)}/{'moe' if moe else 'dense'}"


def band_keys(accelerator: str, software: str, moe: bool) -> tuple[str, ...]:
    """The uncertainty tables a prediction looks up, most similar rows first: the same GPU family, stack
    and kind of model (dense or MoE), the family and kind, every row of that kind, every row. The kind
    is kept to the end because MoE predictions are far less certain than dense ones: a family's band
    mixing both would understate one and overstate the other. The calibration adds each row's residual
    to every table of its chain and keeps those with at least 8 rows."""
    fam, kind = family(accelerator), "moe" if moe else "dense"
    return f"{fam}/{software}/{kind}", f"{fam}/{kind}", f"all/{kind}", "all"


UNSEEN_STACK = "unseen-stack"
"""The uncertainty tables for a software stack the fit has no tables for ('generic'): built from the
leave-one-source-out residuals of the rows whose stack no other source group ran, each predicted by a fit
that had seen no run of its stack (validation.calibrate.unseen_stack_bands)."""


def unseen_stack_keys(moe: bool) -> tuple[str, ...]:
    """The unseen-stack tables a prediction looks up: its kind of model, then every kind."""
    return f"{UNSEEN_STACK}/{'moe' if moe else 'dense'}", UNSEEN_STACK


def _first_band(bands: dict[str, Any], keys: tuple[str, ...], basis: str) -> Band | None:
    for key in keys:
        if key in bands:
            b = bands[key]
            rows = int(b.get("rows", 0))
            return Band(float(b["low"]), float(b["high"]), rows, basis.format(rows=rows, key=key))
    return None


def uncertainty_band(accelerator: str, software: str, moe: bool = False) -> Band | None:
    """Where measured steps fell against predictions like this one, from the calibration's bands: those of
    similar rows (band_keys: cross-validated residuals) where the fit had runs of this stack on this GPU
    family and kind of model (``[rows_by_stack]``, seen_key). Otherwise ('generic', or a stack on a family
    or a kind of model it has no runs of) the stack's overheads or kernel scales there are defaults, or
    were fitted on other runs, much as a source group's runs met when leave-one-source-out hid the only
    stack they ran: the unseen-stack band (unseen_stack_keys), widened at either end to the similar rows'
    band where that is wider. None where the catalog has no band."""
    bands = _table("fitted", "uncertainty")
    similar = _first_band(bands, band_keys(accelerator, software, moe),
                          "{rows} similar published runs ({key}; cross-validated residuals)")
    seen = _table("fitted", "rows_by_stack")
    if seen_key(software, accelerator, moe) in seen:
        return similar
    kind = "MoE " if moe and seen_key(software, accelerator, False) in seen else ""
    why = (f"job.software '{software}' has no fitted tables" if software not in _table("fitted", "software")
           else f"the fit has no {kind}runs of '{software}' on {accelerator}"
           + (f" or other {family(accelerator)}-family GPUs" if family(accelerator) != accelerator else ""))
    unseen = _first_band(bands, unseen_stack_keys(moe),
                         "{rows} published runs on a software stack the fit had not seen ({key}; leave-one-source-out "
                         f"residuals: {why})")
    if unseen is None or similar is None:
        return unseen or similar
    low, high = min(unseen.low, similar.low), max(unseen.high, similar.high)
    if (low, high) == (unseen.low, unseen.high):
        return unseen
    return Band(low, high, unseen.rows, f"{unseen.basis}, widened to the band of {similar.basis}")
