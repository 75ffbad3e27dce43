"""What the published tables leave out and the recipe files of the same release state: the MoE token
dispatcher, the expert-parallel overlap and full-iteration CUDA graphs of NeMo / Megatron-Bridge runs
(moe_recipes.toml, each entry with the file and commit it was read from). A row takes an entry only when
its model, GPU, release, precision and layout all match the entry's; every other row keeps meshplan's
defaults.
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
    source: str


@functools.cache
def _recipes() -> tuple[dict[str, Any], ...]:
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    return tuple(tomllib.loads(text)["recipe"])


def _release(software: str) -> str:
    m = re.search(r"NeMo\s+([\d.]+)", software)
    return m.group(1) if m else ""


def precision_family(precision: str) -> str:
    """'mxfp8', 'fp8' or 'bf16' from a row's precision text."""
    p = precision.lower()
    return "mxfp8" if "mxfp8" in p else "fp8" if "fp8" in p else "bf16"


def moe_recipe(row: dict[str, str], layout: dict[str, int]) -> RecipeSettings | None:
    """The recipe settings of a NeMo / Megatron-Bridge MoE row, or None where no read recipe matches.
    ``layout`` holds the row's pp, vpp (0 without interleaving), ep and mbs."""
    if row.get("source_group") != "NeMo / Megatron-Bridge":
        return None
    release, precision = _release(row.get("software", "")), precision_family(row.get("precision") or "")
    for r in _recipes():
        if (row.get("model") == r["model"] and row.get("gpu_type", "").startswith(r["gpu"])
                and release in r["releases"] and r.get("precision", precision) == precision
                and all(layout.get(k) == r[k] for k in _LAYOUT_KEYS if k in r)):
            return RecipeSettings(r.get("ep_dispatch"), bool(r["ep_overlap"]), bool(r.get("cuda_graphs", False)),
                                  r["source"])
    return None
