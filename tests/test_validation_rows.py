"""Mapping published rows to specs: the recipe settings a NeMo MoE row takes."""

import os
import tomllib
from importlib import resources

import pytest

from meshplan.specs.plan import EP_DISPATCH
from meshplan.validation.recipes import moe_recipe

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "published_runs.csv")


def _row(**kw):
    base = {"source_group": "NeMo / Megatron-Bridge", "model": "Qwen3-30B-A3B", "gpu_type": "H100 80GB (DGX-H100)",
            "software": "NeMo 26.04.01 / Megatron-Bridge", "precision": "fp8 (per-tensor current scaling)"}
    return base | kw


LAYOUT = {"pp": 1, "vpp": 0, "ep": 16, "mbs": 1}


def test_a_recipe_applies_only_to_its_model_gpu_release_and_layout():
    hit = moe_recipe(_row(), LAYOUT)
    assert hit is not None and hit.ep_dispatch == "deepep" and not hit.ep_overlap and "@" in hit.source
    assert moe_recipe(_row(software="NeMo 25.09 / Megatron-Bridge"), LAYOUT) is None
    assert moe_recipe(_row(gpu_type="GB200 (NVL72)"), LAYOUT) is None
    assert moe_recipe(_row(model="Qwen3-235B-A22B"), LAYOUT) is None
    assert moe_recipe(_row(), LAYOUT | {"ep": 8}) is None
    assert moe_recipe(_row(), LAYOUT | {"mbs": 2}) is None
    assert moe_recipe(_row(source_group="torchtitan"), LAYOUT) is None


def test_recipe_entries_are_well_formed():
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    entries = tomllib.loads(text)["recipe"]
    allowed = {"model", "gpu", "releases", "precision", "pp", "vpp", "ep", "mbs", "ep_dispatch", "ep_overlap",
               "source"}
    for e in entries:
        assert set(e) <= allowed, set(e) - allowed
        assert e.get("ep_dispatch", "alltoall") in EP_DISPATCH and isinstance(e["ep_overlap"], bool)
        assert e.get("precision", "bf16") in ("bf16", "fp8", "mxfp8")
        assert e["releases"] and e["source"] and e["ep"] >= 2
    assert len({e["source"] for e in entries}) == len(entries)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_every_recipe_entry_reaches_a_published_row():
    """An entry no row matches is dead (a typo in a model, GPU or release): every one must apply."""
    from meshplan.validation.validate import load_scenarios, read_rows

    results = load_scenarios(read_rows(SHARED))
    imputed = [r for r in results if r.scenario is not None and r.scenario.imputed]
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    sources = {e["source"] for e in tomllib.loads(text)["recipe"]}
    notes = {r.row: " | ".join(r.scenario.imputed) for r in imputed}
    used = {s for r in imputed for s in sources if s in notes[r.row]}
    assert used == sources
    for r in imputed:
        assert "not applied" not in notes[r.row]
        if "ep_dispatch" in notes[r.row]:
            assert r.scenario.plan.ep_dispatch is not None
        if "ep_overlap=true" in notes[r.row]:
            assert r.scenario.plan.ep_overlap


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_unstated_settings_come_from_their_source_and_are_listed():
    """Megatron v1's scaling rows recompute (the paper's recipe); the dgxc MaxText rows run on JAX."""
    from meshplan.validation.validate import load_scenarios, read_rows

    results = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    v1 = [r for r in results if "Megatron v1" in r.model]
    assert v1 and all(r.scenario.plan.recompute == "full" and "1909.08053" in r.scenario.imputed[0] for r in v1)
    maxtext = [r for r in results if "MaxText" in r.model]
    assert maxtext and all(r.scenario.job.software == "maxtext" for r in maxtext)
    stated = [r for r in results if r.source_group == "torchtitan"]
    assert stated and not any(r.scenario.imputed for r in stated)
