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


MATCH_KEYS = {"model", "gpu", "releases", "precision", "pp", "vpp", "ep", "mbs", "source"}


def _entries(table: str, *keys: str) -> list[dict]:
    """moe_recipes.toml's ``table``, each entry holding only the match keys and ``keys``, a release and a
    source, and no source twice."""
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    entries = tomllib.loads(text)[table]
    for e in entries:
        assert set(e) <= MATCH_KEYS | set(keys), set(e) - MATCH_KEYS - set(keys)
        assert e["releases"] and e["source"] and e.get("precision", "bf16") in ("bf16", "fp8", "mxfp8")
    assert len({e["source"] for e in entries}) == len(entries)
    return entries


def test_recipe_entries_are_well_formed():
    for e in _entries("recipe", "ep_dispatch", "ep_overlap", "cuda_graphs", "fp8_attention", "fused_grouped_mlp"):
        assert e.get("ep_dispatch", "alltoall") in EP_DISPATCH and isinstance(e["ep_overlap"], bool)
        assert isinstance(e.get("cuda_graphs", False), bool) and e["ep"] >= 2
        assert isinstance(e.get("fp8_attention", False), bool)
        # FP8 attention only where the entry is an FP8 recipe and its source names the setting
        assert not e.get("fp8_attention") or (e.get("precision") in ("fp8", "mxfp8")
                                              and "fp8_dot_product_attention" in e["source"])
        assert not e.get("fused_grouped_mlp") or (e.get("precision") == "mxfp8"
                                                  and "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in e["source"])


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
    titan = [r for r in results if r.source_group == "torchtitan"]
    stated = [r for r in titan if r.scenario.plan.pp == 1 and r.scenario.job.loss == "auto"]
    assert stated and not any(n for r in stated for n in r.scenario.imputed if not n.startswith("compiled=false"))
    piped = [r for r in titan if r.scenario.plan.pp > 1]
    assert piped and all(r.scenario.plan.mbs and "pipelining_utils.py" in r.scenario.imputed[0] for r in piped)
    # torch.compile: the torchtitan rows that say so; 0 and 3 say "eager"; 13-16 say neither (imputed eager)
    assert {r.row for r in results if r.scenario.job.compiled} == {1, 2, *range(4, 13), 17}
    unstated = {r.row for r in titan if any(note.startswith("compiled=false") for note in r.scenario.imputed)}
    assert unstated == {13, 14, 15, 16}
    gpt_oss = [r for r in results if "GPT-OSS" in r.model]
    assert gpt_oss and all((r.scenario.model.attention_window, r.scenario.model.windowed_layers) == (128, 18)
                           and "gpt_oss_bridge" in " ".join(r.scenario.imputed) for r in gpt_oss)
    assert not any(r.scenario.model.attention_window for r in results if "GPT-OSS" not in r.model)
    # the 405B layout measured with both schedules: interleaved with torchtitan's two stages per rank
    assert {(r.scenario.plan.schedule, r.scenario.plan.vpp, r.scenario.plan.mbs) for r in piped
            if r.scenario.plan.cp == 1} == {("1f1b", 1, 4), ("interleaved", 2, 4)}


def _titan(**kw):
    return {"source_group": "torchtitan", "global_batch_size": "256", "notes": "1F1B + compile",
            "software": "torchtitan 9dec370 + torch 1963fc8 (2024-12)"} | kw


def test_torchtitan_pipeline_defaults_fill_what_the_row_leaves_out():
    from meshplan.validation.rows import _torchtitan_pipeline

    assert _torchtitan_pipeline(_titan(), dp=8, pp=8, vpp=None, mbs=None)[:2] == (None, 4)  # 32 local / 8
    vpp, mbs, said = _torchtitan_pipeline(_titan(notes="Interleaved 1F1B"), dp=8, pp=8, vpp=None, mbs=None)
    assert (vpp, mbs) == (2, 4) and "2 stages per rank" in said[0]
    assert _torchtitan_pipeline(_titan(), dp=8, pp=8, vpp=None, mbs=2) == (None, 2, ())  # stated wins


def test_only_torchtitan_commits_after_the_compiled_loss_fuse_it():
    from meshplan.validation.rows import _compiled
    from meshplan.validation.rows import _loss as loss_of

    def _loss(row):  # as scenario_from_row calls it: on the row's own torch.compile setting
        return loss_of(row, _compiled(row)[0])

    assert _loss(_titan()) == ("auto", ())  # December 2024: eager loss
    loss, said = _loss(_titan(software="torchtitan e7c0cae, torch 2.8.0a0 (NGC 25.05)"))
    assert loss == "fused" and "#1033" in said[0]
    assert _loss(_titan(software="torchtitan e7c0cae", notes="eager"))[0] == "auto"
    assert _loss(_titan(source_group="NeMo / Megatron-Bridge", software="e7c0cae compile"))[0] == "auto"


def test_only_the_launchers_read_to_reduce_in_bf16_do():
    from meshplan.validation.rows import _reduce_dtype_bytes

    row = {"software": "dgxc-benchmarking v25.04", "model": "Llama-3.1-8B"}
    assert _reduce_dtype_bytes(row, "fp8")[0] == 2.0 and "741c886" in _reduce_dtype_bytes(row, "fp8")[1][0]
    assert _reduce_dtype_bytes(row, "bf16") == (4.0, ())
    assert _reduce_dtype_bytes(row | {"software": "dgxc-benchmarking v24.11.1"}, "fp8") == (4.0, ())
    assert _reduce_dtype_bytes(row | {"model": "Nemotron4-15B"}, "fp8") == (4.0, ())
    # Megatron-Bridge's performance scripts turn it off for every model and precision
    bridge = {"software": "NeMo 26.04.01 / Megatron-Bridge", "model": "Qwen3-30B-A3B"}
    reduce_bytes, said = _reduce_dtype_bytes(bridge, "bf16")
    assert reduce_bytes == 2.0 and "grad_reduce_in_fp32" in said[0]
    assert _reduce_dtype_bytes(bridge | {"software": "NeMo 24.07"}, "fp8") == (4.0, ())  # not read
    # dgxc launchers read one by one (the data's software strings): GPT-3 175B's hydra yaml and Nemotron-4
    # 340B's (both precisions), Grok-1's NeMo performance script; Nemotron-4 15B's not
    v2411 = "dgxc-benchmarking v24.11.1, NeMo 24.11 container"
    assert _reduce_dtype_bytes({"software": v2411, "model": "GPT3-175B"}, "bf16")[0] == 2.0
    assert _reduce_dtype_bytes({"software": v2411, "model": "Nemotron4-340B"}, "fp8")[0] == 2.0
    assert _reduce_dtype_bytes({"software": v2411, "model": "Nemotron4-15B"}, "bf16")[0] == 4.0
    assert _reduce_dtype_bytes({"software": "dgxc-benchmarking v25.05.01", "model": "Grok-1-314B"}, "bf16")[0] == 2.0
    assert _reduce_dtype_bytes({"software": "dgxc-benchmarking v25.04", "model": "Grok-1-314B"}, "bf16")[0] == 4.0


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_each_bf16_gradient_rule_matches_the_rows_it_was_read_for():
    """Each BF16_GRAD_RULES entry takes exactly the published rows of its launcher: 14 FP8 Llama 3.1 rows
    of dgxc v25.04, 9 GPT-3 175B and 6 Nemotron-4 340B rows of v24.11.1, 4 Grok-1 rows of v25.05.01, the
    3 NeMo 25.02 and 4 NeMo 25.04 FP8 rows (one source, NeMo 2.0's scripts) and the 78 modelled
    Megatron-Bridge rows (NVFP4 ones are skipped)."""
    from collections import Counter

    from meshplan.validation.rows import BF16_GRAD_RULES
    from meshplan.validation.validate import load_scenarios, read_rows

    sources = list(dict.fromkeys(rule[3] for rule in BF16_GRAD_RULES))  # NeMo 25.02 and 25.04 share one
    hits = Counter()
    for r in load_scenarios(read_rows(SHARED)):
        for note in (r.scenario.imputed if r.scenario else ()):
            for i, source in enumerate(sources):
                if source in note:
                    hits[i] += 1
    assert [hits[i] for i in range(len(sources))] == [14, 9, 6, 4, 7, 78]


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_every_measured_run_fits_and_torchtitan_memory_is_close():
    """A published run ran: meshplan must not call it infeasible. The torchtitan rows report their peak
    memory; the memory model (DeepSpeed ZeRO-3's live-parameter limit, fused and eager losses, torchtitan's
    pipeline micro-batches) must land near it (the catalog parameters do not touch memory)."""
    from meshplan.calibration import compute_params_for
    from meshplan.validation.validate import load_scenarios, read_rows, run, summary

    results = load_scenarios(read_rows(SHARED))
    run(results, compute_params_for)
    s = summary(results, use_cv=False)
    assert s["predicted_not_to_fit"] == []
    assert s["peak_memory"]["count"] >= 14 and s["peak_memory"]["mape"] < 0.05


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_the_grand_teton_h100_is_the_part_torchtitan_describes():
    """96 GB HBM2e at 2.4 TB/s, and a 500 W cap that puts the peak "between SXM and NVL" (its middle)."""
    from meshplan import load_cluster
    from meshplan.validation.validate import load_scenarios, read_rows

    sxm = load_cluster("h100-sxm").accelerator
    gt = [r.scenario.cluster.accelerator for r in load_scenarios(read_rows(SHARED))
          if r.scenario is not None and r.gpu.startswith("H100 SXM 96GB")]
    assert gt and all(a.hbm_bytes_per_s == 2.4e12 and a.hbm_capacity_bytes == 96 * 2**30 for a in gt)
    assert all(835.5 / 989.4 < a.bf16_flop_per_s / sxm.bf16_flop_per_s < 1 for a in gt)
    assert all(a.fp8_flop_per_s / a.bf16_flop_per_s == pytest.approx(sxm.fp8_flop_per_s / sxm.bf16_flop_per_s)
               for a in gt)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_measured_parameters_are_set_not_fitted():
    """torchtitan's eager elementwise traffic is the 2.7x measured on an H200 (calibrate.MEASURED): the fit
    starts from it, never searches it, and the catalog carries it."""
    from meshplan.calibration import compute_params_for
    from meshplan.validation import calibrate as cal
    from meshplan.validation.validate import load_scenarios, read_rows

    rows = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    assert not any((p.scope, p.key) in cal.MEASURED for p in cal.parameter_space(rows))
    assert any(p.key == "elementwise_passes" for p in cal.parameter_space(rows))  # other stacks' still fitted
    assert cal.empty_state()["software"]["torchtitan"] == {"elementwise_passes": 2.7}
    assert compute_params_for("h100-sxm", "torchtitan").elementwise_passes == 2.7


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_cuda_graphs_only_where_a_recipe_or_the_token_drop_tables_say_so():
    """The 25.09 token-drop rows and the recipes that capture the whole iteration run CUDA graphs; the
    imputed note names the source; every other MoE row launches from the host."""
    from meshplan.validation.rows import TOKEN_DROP_GRAPHS
    from meshplan.validation.validate import load_scenarios, read_rows

    rows = read_rows(SHARED)
    results = [r for r in load_scenarios(rows) if r.scenario is not None]
    graphed = {r.row for r in results if r.scenario.job.cuda_graphs}
    token_drop = {r.row for r in results if "tokendrop" in rows[r.row]["notes"].lower()}
    by_recipe = {r.row for r in results if any("cuda_graph_scope=full_iteration from" in n for n in r.scenario.imputed)}
    assert token_drop and by_recipe and graphed == token_drop | by_recipe
    assert (len(token_drop), len(by_recipe), len(graphed)) == (10, 8, 18)
    assert all("NeMo 25.09" in rows[i]["software"] for i in token_drop)
    assert all(TOKEN_DROP_GRAPHS in r.scenario.imputed for r in results if r.row in token_drop)
    assert all(r.scenario.model.is_moe and r.source_group == "NeMo / Megatron-Bridge"
               for r in results if r.row in graphed)
    scope = {r.row: r.scenario.job.cuda_graph_scope for r in results if r.row in graphed}
    assert all(scope[i] == ("layers" if i in token_drop else "full_iteration") for i in graphed)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_deepseek_rows_run_mtp_unless_their_table_says_without():
    """Every DeepSeek-V3 recipe runs one MTP layer; the 25.11 tables name four runs "DeepSeekV3 (w/o MTP)"."""
    from meshplan.validation.validate import load_scenarios, read_rows

    mtp = {r.row: r.scenario.model.mtp_layers for r in load_scenarios(read_rows(SHARED))
           if r.scenario is not None and r.model.startswith("DeepSeek-V3")}
    assert sorted(k for k, v in mtp.items() if v == 0) == [86, 87, 89, 90]
    assert len(mtp) == 15 and all(v == 1 for k, v in mtp.items() if k not in (86, 87, 89, 90))


def test_recompute_entries_are_well_formed():
    from meshplan.specs.plan import RECOMPUTE_MODULES
    for e in _entries("recompute", "modules"):
        assert all(m in RECOMPUTE_MODULES for m in e.get("modules", "").split("+") if m)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_recipe_recomputation_reaches_its_rows_or_says_why_not():
    """Every [[recompute]] entry applies to a row; a row whose recipe recomputation meshplan's memory
    model does not fit keeps meshplan's choice and says so; Megatron-Bridge rows run TE's loss."""
    from meshplan.validation.validate import load_scenarios, read_rows

    results = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    sources = {e["source"] for e in tomllib.loads(text)["recompute"]}
    notes = {r.row: " | ".join(r.scenario.imputed) for r in results}
    assert {s for n in notes.values() for s in sources if s in n} == sources
    by_row = {r.row: r.scenario for r in results}
    assert by_row[80].plan.recompute_modules == "mla_up_proj" and by_row[80].plan.recompute == "selective"
    assert by_row[150].plan.recompute == "none"  # Qwen3: no recomputation
    for r in results:
        if "recompute chosen by meshplan" in notes[r.row]:
            assert r.scenario.plan.recompute is None and "GiB over" in notes[r.row]
        elif "the recipe's modules=" in notes[r.row]:
            assert r.scenario.plan.recompute == "selective" and r.scenario.plan.recompute_modules
        assert (r.scenario.job.loss == "te") == ("loss=te from" in notes[r.row])
    te = [r for r in results if r.scenario.job.loss == "te"]
    assert te and all(r.source_group == "NeMo / Megatron-Bridge" for r in te)


def test_a_layout_correction_needs_the_row_exactly_as_the_table_states_it():
    from meshplan.validation.recipes import recipe_layout

    row = _row(model="Llama-3-70B", gpu_type="GB300 (NVL72)", software="NeMo 26.02.01 / Megatron-Bridge",
               precision="mxfp8", pp="4", virtual_pp="", micro_batch_size="2", ep="1")
    fix = recipe_layout(row)
    assert fix is not None and fix.values == {"virtual_pp": "5", "micro_batch_size": "1"} and "@" in fix.source
    assert recipe_layout(row | {"micro_batch_size": "1"}) is None  # stated as the preset ran it
    assert recipe_layout(row | {"virtual_pp": "5"}) is None
    assert recipe_layout(row | {"software": "NeMo 26.04.01 / Megatron-Bridge"}) is None
    assert recipe_layout(row | {"precision": "fp8 (per-tensor current scaling)"}) is None
    assert recipe_layout(row | {"source_group": "NVIDIA dgxc-benchmarking"}) is None
    assert recipe_layout(row | {"virtual_pp": "interleaved (stages/rank not stated)"}) is None


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_every_layout_correction_reaches_its_row_and_is_listed():
    from meshplan.validation.validate import load_scenarios, read_rows

    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    entries = tomllib.loads(text)["layout"]
    results = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    for e in entries:
        hit = [r for r in results if any(e["source"] in n for n in r.scenario.imputed)]
        assert len(hit) == 1, e["model"]
        plan = hit[0].scenario.plan
        assert set(e["set"]) <= {"virtual_pp", "micro_batch_size"}
        assert plan.mbs == e["set"]["micro_batch_size"] and plan.vpp == e["set"]["virtual_pp"]
        assert any("(the table: " in n for n in hit[0].scenario.imputed)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_megatron_rows_whose_chunks_divide_only_the_layers_and_two_run_megatrons_split():
    """Megatron-core accepts 126 layers on PP=16 x VP=8 (or 94 on PP=8 x VP=3) only with the embedding and
    the loss counted as slots: those rows take that layout, listed; rows whose chunks divide the layers,
    and torchtitan's, keep the even split."""
    from meshplan.specs.layout import embedding_loss_layout
    from meshplan.validation.rows import MEGATRON_CORE_GROUPS
    from meshplan.validation.validate import load_scenarios, read_rows

    results = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    split = [r for r in results if r.scenario.plan.layout]
    assert len(split) >= 20
    for r in split:
        sc = r.scenario
        assert sc.plan.layout == embedding_loss_layout(sc.model.n_layers, sc.plan.pp * sc.plan.model_chunks)
        assert any(n.startswith(f"layout={sc.plan.layout} from Megatron-core") for n in sc.imputed)
        assert r.source_group in MEGATRON_CORE_GROUPS and not sc.model.mtp_layers
    for r in results:  # every other pipelined row: no layout where its chunks divide its layers
        p = r.scenario.plan
        if p.pp > 1 and not p.layout and r.source_group in MEGATRON_CORE_GROUPS and not r.scenario.model.mtp_layers:
            assert embedding_loss_layout(r.scenario.model.n_layers, p.pp * p.model_chunks) is None
    vp8 = [r for r in split if r.scenario.plan.pp == 16 and r.scenario.plan.vpp == 8]
    assert vp8 and all(r.scenario.plan.schedule == "interleaved" for r in vp8)  # 128 chunks for 126 layers
    one_f1b = [r for r in split if r.scenario.plan.schedule == "1f1b"]  # Qwen3-235B-A22B on PP=8 alone
    assert one_f1b and all(r.scenario.plan.layout == "Et*11|(t*12|)*6t*11L" for r in one_f1b)


def test_offload_entries_are_well_formed():
    for e in _entries("offload", "layers"):
        assert e["pp"] == 1 and e["layers"] >= 1 and "@" in e["source"]


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_recipe_offloading_reaches_its_rows():
    """Every [[offload]] entry applies to a row, which then offloads instead of recomputing and lists where
    the count came from; rows without an entry offload nothing. (That they fit: the test above.)"""
    from meshplan.validation.validate import load_scenarios, read_rows

    results = [r for r in load_scenarios(read_rows(SHARED)) if r.scenario is not None]
    text = resources.files("meshplan.validation").joinpath("moe_recipes.toml").read_text()
    sources = {e["source"] for e in tomllib.loads(text)["offload"]}
    hits = {r.row: r.scenario for r in results if any(s in " | ".join(r.scenario.imputed) for s in sources)}
    assert sorted(hits) == [102, 105, 107]
    assert {k: sc.plan.offload_layers for k, sc in hits.items()} == {102: 40, 105: 20, 107: 20}
    assert all(sc.plan.recompute == "none" for sc in hits.values())
    assert all(r.scenario.plan.offload_layers == 0 for r in results if r.row not in hits)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_fp8_attention_and_fused_grouped_mlps_only_where_a_recipe_sets_them():
    """The eight rows of the full-iteration MXFP8 recipes (DeepSeek-V3, Qwen3 and GPT-OSS, 26.06 / 26.08)
    run FP8 attention, and all but GPT-OSS's the fused grouped MLP, each saying so in its imputed note; no
    other row does."""
    from meshplan.validation.validate import load_scenarios, read_rows

    rows = read_rows(SHARED)
    results = [r for r in load_scenarios(rows) if r.scenario is not None]
    fp8_attn = {r.row for r in results if r.scenario.job.fp8_attention}
    fused = {r.row for r in results if r.scenario.job.fused_grouped_mlp}
    assert len(fp8_attn) == 8 and len(fused) == 7 and fused < fp8_attn  # GPT-OSS's recipe turns the fuser off
    assert all(any("fused_grouped_mlp=true" in n for n in r.scenario.imputed) for r in results if r.row in fused)
    for r in results:
        if r.row in fp8_attn:
            assert r.scenario.job.precision == "fp8" and r.scenario.job.cuda_graphs
            assert any("fp8_attention=true" in n for n in r.scenario.imputed)
            assert rows[r.row]["software"].split("/")[0].strip() in ("NeMo 26.06", "NeMo 26.08")


@pytest.mark.skipif(not os.path.exists(SHARED), reason="shared data not beside the repository")
def test_a_malformed_cell_skips_its_row_and_names_the_column():
    """A user's review: malformed cells were read as blank (a row then skipped for the wrong reason) or as
    another number ('2x' dropped the TP degree, '2.5' truncated, NaN passed the CI gates)."""
    import csv

    from meshplan.validation.rows import Skip, scenario_from_row

    with open(SHARED, encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))  # a torchtitan Llama 3.1 8B row
    assert scenario_from_row(0, row).plan.dp_shard == 8
    cases = {"tp": ("2x", "not a number"), "n_layers": ("32L", "not a number"), "seq_len": ("8K", "not a number"),
             "tokens_per_sec_per_gpu": ("nan", "not a number"), "micro_batch_size": ("0", "> 0"),
             "n_gpus": ("-8", "> 0"), "pp": ("2.5", "whole number"), "peak_memory_gb": ("82 GiB", "not a number"),
             "precision": ("int4", "must begin with one of"), "recompute": ("sometimes", "must begin with one of"),
             "zero_or_fsdp": ("zero7", "must begin with one of"), "flash_attention": ("maybe", "must begin with")}
    for column, (value, says) in cases.items():
        with pytest.raises(Skip, match=rf"^{column}='{value}': .*{says}"):
            scenario_from_row(0, row | {column: value})
    derived = row | {"tokens_per_sec_per_gpu": "", "tflops_per_gpu": "300", "flops_counting": "HW FLOPs"}
    with pytest.raises(Skip, match="flops_counting='HW FLOPs'"):  # model or hardware FLOPs: not guessed
        scenario_from_row(0, derived)


@pytest.mark.parametrize(("gpu", "accelerator"), [
    ("A100 40GB", "a100-40gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("A100 80GB (Selene)", "a100-80gb"),
    ("A100 (DGX A100)", "a100-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("H100 SXM 96GB HBM2e", "h100-sxm"),
    ("GB200 (NVL72)", "gb200"), ("B200 (DGX-B200)", "b200"), ("H100 PCIe 80GB", None), ("H100 NVL", None),
    ("A100", None), ("TPU v5p", None)])
def test_gpu_names_map_by_family_and_memory_not_by_prefix(gpu, accelerator):
    """'A100-SXM4-40GB' had matched the 'A100' prefix of the 80 GB part, and an H100 PCIe card the SXM part."""
    from meshplan.validation.rows import Skip, _accelerator

    if accelerator is None:
        with pytest.raises(Skip, match="not in the catalog"):
            _accelerator(gpu)
    else:
        assert _accelerator(gpu)[0] == accelerator


def test_a_row_with_too_few_or_too_many_cells_is_skipped_not_a_traceback(tmp_path):
    """A truncated last line raised a TypeError from the virtual-stage imputation."""
    from meshplan.validation.validate import load_scenarios, read_rows

    header = "model,n_layers,hidden,n_heads,vocab,seq_len,gpu_type,n_gpus,tp,pp,source_group,precision," \
             "global_batch_size,tokens_per_sec_per_gpu,notes\n"
    f = tmp_path / "runs.csv"
    f.write_text(header + "Llama,32,4096,32,128256,4096,H100 80GB,8,1\n"
                 + "Llama,32,4096,32,128256,4096,H100 80GB,8,1,1,x,bf16,8,100,note,extra\n")
    short, long = load_scenarios(read_rows(f))
    assert short.skipped == "9 cells against 15 columns"
    assert long.skipped == "16 cells against 15 columns"
