"""What the published tables leave out and the recipe files of the same release state: the MoE token
dispatcher, the expert-parallel overlap, full-iteration CUDA graphs, FP8 attention, fused grouped MLPs, the
activation recomputation and the activation offloading of NeMo / Megatron-Bridge runs (moe_recipes.toml,
each entry with the file and commit it was read from), and the layout a run had where its table row
disagrees with every version of its preset. A row takes an entry only when its model, GPU, release,
precision and layout all match the entry's; every other row keeps meshplan's defaults.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from typing import Any, NamedTuple

_LAYOUT_KEYS = ("pp", "vpp", "ep", "mbs")


class RecipeSettings(NamedTuple):
    ep_dispatch: str | None
    """None where the recipe file leaves the dispatcher to the library default (not read)."""
    ep_overlap: bool
    cuda_graphs: bool
    """The recipe captures the whole iteration in a CUDA graph (JobSpec.cuda_graphs); False where the file
    does not say so."""
    fp8_attention: bool
    """The recipe runs attention in FP8 (fp8_dot_product_attention; JobSpec.fp8_attention)."""
    fused_grouped_mlp: bool
    """The recipe runs its experts as TE's CuTe DSL fused grouped MLP (JobSpec.fused_grouped_mlp)."""
    source: str


@functools.cache
def _tables() -> dict[str, tuple[dict[str, Any], ...]]:
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    data = tomllib.loads(text)
    return {name: tuple(data.get(name, ())) for name in ("recipe", "recompute", "offload", "layout")}


def _release(software: str) -> str:
    m = re.search(r"NeMo\s+([\d.]+)", software)
    return m.group(1) if m else ""


def precision_family(precision: str) -> str:
    """'mxfp8', 'fp8' or 'bf16' from a row's precision text."""
    p = precision.lower()
    return "mxfp8" if "mxfp8" in p else "fp8" if "fp8" in p else "bf16"


def _match(table: str, row: dict[str, str], layout: dict[str, int]) -> dict[str, Any] | None:
    """The first entry of moe_recipes.toml's ``table`` that a NeMo / Megatron-Bridge row matches: its model,
    GPU, release, precision (where the entry names one) and layout keys (where the entry names them)."""
    if row.get("source_group") != "NeMo / Megatron-Bridge":
        return None
    release, precision = _release(row.get("software", "")), precision_family(row.get("precision") or "")
    for r in _tables()[table]:
        if (row.get("model") == r["model"] and row.get("gpu_type", "").startswith(r["gpu"])
                and release in r["releases"] and r.get("precision", precision) == precision
                and all(layout.get(k) == r[k] for k in _LAYOUT_KEYS if k in r)):
            return r
    return None


def moe_recipe(row: dict[str, str], layout: dict[str, int]) -> RecipeSettings | None:
    """The recipe settings of a NeMo / Megatron-Bridge MoE row, or None where no read recipe matches.
    ``layout`` holds the row's pp, vpp (0 without interleaving), ep and mbs."""
    r = _match("recipe", row, layout)
    if r is None:
        return None
    return RecipeSettings(r.get("ep_dispatch"), bool(r["ep_overlap"]), bool(r.get("cuda_graphs", False)),
                          bool(r.get("fp8_attention", False)), bool(r.get("fused_grouped_mlp", False)), r["source"])


class RecomputeSettings(NamedTuple):
    recompute: str
    """'none' or 'selective' (Plan.recompute)."""
    modules: str
    """Megatron's --recompute-modules with 'selective' (Plan.recompute_modules), '+'-separated."""
    source: str


def recipe_recompute(row: dict[str, str], layout: dict[str, int]) -> RecomputeSettings | None:
    """The activation recomputation a NeMo / Megatron-Bridge MoE row's recipe file sets (moe_recipes.toml,
    [[recompute]]), or None where none was read for it."""
    r = _match("recompute", row, layout)
    if r is None:
        return None
    modules = r.get("modules", "")
    return RecomputeSettings("selective" if modules else "none", modules, r["source"])


class OffloadSettings(NamedTuple):
    layers: int
    """Megatron-core's cpu_offloading_num_layers (Plan.offload_layers); the recipe runs no recomputation."""
    source: str


def recipe_offload(row: dict[str, str], layout: dict[str, int]) -> OffloadSettings | None:
    """The activation offloading a NeMo / Megatron-Bridge row's recipe file sets (moe_recipes.toml,
    [[offload]]), or None where none was read for it."""
    r = _match("offload", row, layout)
    return None if r is None else OffloadSettings(int(r["layers"]), r["source"])


class LayoutCorrection(NamedTuple):
    values: dict[str, str]
    """The row's columns as the preset ran them (published_runs.csv names: virtual_pp, micro_batch_size)."""
    source: str


def recipe_layout(row: dict[str, str]) -> LayoutCorrection | None:
    """The layout a NeMo / Megatron-Bridge row's preset ran, where the published table states another
    (moe_recipes.toml, [[layout]]: matched on the row's model, GPU, release, precision and its stated pp,
    vpp (0 when blank) and mbs), or None. The row's other recipe entries then match the corrected layout,
    the one that ran."""
    def stated(key: str) -> int:
        v = (row.get(key) or "").strip()
        return int(v) if v.isdigit() else 0 if not v else -1  # text ('interleaved ...') matches nothing

    r = _match("layout", row, {"pp": stated("pp"), "vpp": stated("virtual_pp"), "ep": stated("ep") or 1,
                                "mbs": stated("micro_batch_size")})
    if r is None:
        return None
    return LayoutCorrection({k: str(v) for k, v in r["set"].items()}, r["source"])
