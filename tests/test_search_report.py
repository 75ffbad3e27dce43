"""Search, recommendation, conditions of change, sweep and report (issue: search every plan)."""

import json
from html.parser import HTMLParser

import pytest
from tests.helpers import worked_example

from meshplan.cli import main
from meshplan.search.space import Space, enumerate_plans
from meshplan.specs.plan import FRAMEWORK_SCHEDULES

SMALL = ["--model", "llama-2-7b", "--nodes", "2", "--batch-tokens", "512K"]


def _run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def plan_json():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # the engine's answer: one search over every stack's plans
        assert main(["plan", "--json", "--stack", "generic"]) == 0
    return json.loads(buf.getvalue())


def test_plan_json_lists_plans_reasons_recommendation_and_conditions(plan_json):
    d = plan_json
    assert d["recommended"]["feasible"] is True
    assert len(d["plans"]) == d["n_plans"] > 100
    assert d["n_pruned"] > 0 and d["n_configurations"] > 1_000_000  # option variants and partial recompute
    assert all(p["step_time_s"] is None for p in d["plans"] if not p["feasible"])  # listed, not timed
    infeasible = [p for p in d["plans"] if not p["feasible"]]
    assert infeasible and all(p["infeasible_reasons"] for p in infeasible)
    assert isinstance(d["conditions"], list) and d["conditions"] and d["conditions_swept"] is True
    for c in d["conditions"]:
        assert {"condition", "direction", "value", "plan", "text"} <= set(c)
        if c["condition"] == "batch_tokens":  # the batch evaluated, in whole sequences, not the bisection's point
            assert c["value"] % d["scenario"]["seq_len"] == 0 and c["last_same_value"] % d["scenario"]["seq_len"] == 0
    assert len(d["questions"]) == 4 and d["measure_first"]
    _check_held_ranges(d)
    band = d["recommended"]["uncertainty"]  # from the cross-validated residuals of similar published runs
    assert band is not None and band["low"] < 0 < band["high"]


def _check_held_ranges(d):
    """Each condition's held range contains the scenario's value and ends, on a side where the answer
    changes, at the last value at which it held; the worked example varies all five conditions."""
    held = {h["condition"]: h for h in d["held_ranges"]}
    varied = set(held) | {c["condition"] for c in d["conditions"]}
    assert varied == {"batch_tokens", "inter_node_bandwidth", "gpus", "seq_len", "model_layers"}
    for h in held.values():
        assert h["low_value"] <= h["base_value"] <= h["high_value"] and h["low_value"] < h["high_value"]
        assert {h["low_end"], h["high_end"]} <= {"change", "range", "not built", "none fits"}
    for c in d["conditions"]:
        h = held.get(c["condition"])
        if h is None:  # no range: the answer changes at the next value checked on either side
            sides = {x["direction"] for x in d["conditions"] if x["condition"] == c["condition"]}
            assert sides == {"below", "above"} and c["last_same_value"] == c["base_value"]
            continue
        side = "low" if c["direction"] == "below" else "high"
        assert h[f"{side}_end"] == "change" and h[f"{side}_value"] == c["last_same_value"]
    # a longer sequence needs another micro-batch size or recomputation: the candidates re-choose them there,
    # so the walk reaches past the scenario's 4,096 tokens (with the base search's choices nothing fit there)
    assert held["seq_len"]["high_value"] > d["scenario"]["seq_len"]


def test_a_prediction_takes_the_band_of_its_kind_of_model_even_where_its_family_has_few_such_runs():
    """Blackwell Ultra has 19 MoE rows and 7 dense ones, Hopper 5 MoE rows: a dense GB300 plan takes the
    dense rows' band and a Hopper MoE plan the MoE rows', never the other kind's (calibration.band_keys)."""
    from meshplan.calibration import _load, band_keys, uncertainty_band
    bands = _load("fitted")["uncertainty"]
    assert all(band_keys(a, "megatron", m)[0] in bands for a, m in (("b200", True), ("b200", False)))
    assert "gb300/megatron/dense" not in bands and "h100-sxm/megatron/moe" not in bands
    assert not any("/" in k and not k.endswith(("/dense", "/moe")) for k in bands)  # no mixed band is kept
    def band(*a):
        b = uncertainty_band(*a)
        return b.low, b.high

    assert band("gb300", "megatron", False) == (bands["all/dense"]["low"], bands["all/dense"]["high"])
    assert band("h100-sxm", "megatron", True) == (bands["all/moe"]["low"], bands["all/moe"]["high"])
    dense, moe = band("gb300", "megatron", False), band("gb300", "megatron", True)
    assert moe[1] - moe[0] > dense[1] - dense[0]


def test_moe_predictions_carry_the_wider_band_their_runs_earned():
    """On Blackwell with Megatron-core, MoE runs were predicted less well than dense ones (calibration)."""
    from meshplan.calibration import uncertainty_band
    moe, dense = (uncertainty_band("b200", "megatron", m) for m in (True, False))
    assert moe.low < dense.low < 0 < dense.high < moe.high


def test_a_stack_the_fit_has_no_tables_for_carries_the_band_of_stacks_it_had_not_seen():
    """'generic' runs on the fitted GPU parameters and default stack parameters, as each stack only its own
    source group ran did when leave-one-source-out hid that group: its band is theirs (unseen-stack),
    never narrower at either end than the similar runs' band, and says so."""
    from meshplan.calibration import _load, uncertainty_band
    bands = _load("fitted")["uncertainty"]
    unseen, similar = bands["unseen-stack/dense"], bands["h100-sxm/dense"]
    generic, named = uncertainty_band("h100-sxm", "generic"), uncertainty_band("h100-sxm", "megatron")
    assert (generic.low, generic.high) == (min(unseen["low"], similar["low"]), max(unseen["high"], similar["high"]))
    assert generic.high - generic.low > 2 * (named.high - named.low)
    assert "not seen" in generic.basis and "'generic'" in generic.basis and "similar" in named.basis
    moe = uncertainty_band("b200", "generic", True)  # no unseen-stack MoE rows: every kind, widened to MoE's
    assert moe.low <= bands["b200/moe"]["low"] and moe.high >= bands["b200/moe"]["high"]


def test_a_stack_on_a_gpu_family_it_has_no_runs_on_carries_the_unseen_stack_band():
    """torchtitan has runs on Hopper and Ampere, none on Blackwell: there it runs on default kernel scales
    (without its Hopper table llm-foundry's H100 rows are over-predicted by a quarter), so it takes the
    unseen-stack band, not the Blackwell band of Megatron's runs."""
    from meshplan.calibration import _load, uncertainty_band
    seen = _load("fitted")["rows_by_stack"]
    assert "torchtitan/h100-sxm/dense" in seen and "torchtitan/b200/dense" not in seen
    assert "megatron/b200/dense" in seen and "megatron/h100-sxm/moe" in seen and "torchtitan/h100-sxm/moe" not in seen
    blackwell, hopper = uncertainty_band("b200", "torchtitan"), uncertainty_band("h100-sxm", "torchtitan")
    assert "no runs of 'torchtitan' on b200" in blackwell.basis and "similar" in hopper.basis
    assert blackwell.high - blackwell.low > 3 * (uncertainty_band("b200", "megatron").high
                                                 - uncertainty_band("b200", "megatron").low)
    # an MoE model on a stack whose fitted runs were all dense: not the MoE runs' band of other stacks
    moe = uncertainty_band("h100-sxm", "torchtitan", True)
    assert "no MoE runs of 'torchtitan' on h100-sxm" in moe.basis
    assert "similar" in uncertainty_band("h100-sxm", "megatron", True).basis


def test_a_condition_with_the_same_degrees_names_the_options_that_change():
    """'below 981K tokens, PP=16 x TP=4 is best' would read as no change: the options that differ are named,
    also against the recommendation re-sized to another GPU count."""
    from meshplan import parse_plan
    from meshplan.search.conditions import changed_label

    rec = parse_plan("tp=4,pp=16,mbs=2,recompute=none,async_tp=true", 64)
    zb = parse_plan("tp=4,pp=16,mbs=1,schedule=zb-h1,async_tp=true", 64)
    assert changed_label(zb, rec) == "PP=16 x TP=4 (schedule=zb-h1)"
    assert changed_label(rec, rec) == "PP=16 x TP=4"  # micro-batch and recompute are not structure
    wide = parse_plan("dp_replicate=2,tp=4,pp=16,schedule=zb-v,async_tp=true", 128)
    assert changed_label(wide, parse_plan("dp_replicate=2,tp=4,pp=16,async_tp=true", 128)) == (
        "PP=16 x TP=4 x DDP=2 (schedule=zb-v)")
    assert changed_label(parse_plan("tp=8,pp=8", 64), rec) == "PP=8 x TP=8 (1f1b)"  # other degrees: its schedule
    # and options, which two plans of one label may differ in alone (a ZB-V plan must not read as the 1F1B one)
    megatron = parse_plan("tp=4,pp=16,sharding=megatron,async_tp=true", 64)
    zbv = parse_plan("dp_replicate=2,tp=4,pp=8,schedule=zb-v,async_tp=true", 64)
    assert changed_label(zbv, megatron) == "PP=8 x TP=4 x DDP=2 (zb-v, async-TP)"
    assert changed_label(megatron, zbv) == "PP=16 x TP=4 (Megatron; 1f1b, async-TP)"
    assert changed_label(parse_plan("dp_shard=64", 64), megatron) == "FSDP=64"  # nothing beyond its sharding
    # a plan that leaves an option at its default says which: 'CP=8 is best' against 'CP=8 (ZERO1 over CP)'
    assert changed_label(parse_plan("cp=8", 8), parse_plan("cp=8,sharding=zero1", 8)) == "CP=8 (sharding=fsdp)"
    assert changed_label(rec, zb) == "PP=16 x TP=4 (schedule=1f1b)"
    assert changed_label(parse_plan("cp=8", 8), parse_plan("cp=8,cp_impl=allgather", 8)) == "CP=8 (cp_impl=ring)"
    assert changed_label(parse_plan("tp=4,dp_shard=2", 8), parse_plan("tp=4,dp_shard=2,sp=false", 8)) == (
        "TP=4 x FSDP=2 (sp=true)")


def test_the_layer_walk_redoes_megatrons_split_for_each_layer_count():
    """A recommendation carrying Megatron's embedding-and-loss split is the same plan at another layer
    count: the walk re-splits it there (re-evaluating the old layout would fail and read as 'no longer
    fits'), and the split does not make the plan's layout key differ from its unsplit form."""
    from meshplan import JobSpec, load_cluster, load_model, parse_plan
    from meshplan.cost.step import evaluate
    from meshplan.search.conditions import _evaluate_at, _resplit, knob, layout_key

    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-sxm", nodes=64)
    job = JobSpec(global_batch_tokens=4 * 2**20, seq_len=8192)
    text = "tp=8,pp=16,dp_shard=4,sharding=megatron,schedule=interleaved,vpp=4"
    split = parse_plan(text + ",layout=Et*1|(t*2|)*62t*1L")
    base = evaluate(model, cluster, job, split)
    layers = knob(model, cluster, job, "layers")
    at_252 = _evaluate_at(layers, 252, base, None)
    assert at_252 is not None and at_252.plan.layout == ""  # 64 chunks divide 252 layers
    assert _resplit(split, *layers.apply(190)[::2]).layout == "Et*2|(t*3|)*62t*2L"
    assert _evaluate_at(layers, 63, base, None) is None  # 64 chunks for 63 layers: no such plan
    assert layout_key(split) == layout_key(parse_plan(text))
    assert layout_key(parse_plan(text + ",layout=Et*3|(t*2|)*61t*1|L")) != layout_key(parse_plan(text))


def test_no_listed_plan_beats_the_recommendation_without_a_reason(plan_json):
    d = plan_json
    best = d["recommended"]["step_time_s"]
    faster = [p for p in d["plans"] if p["feasible"] and p["step_time_s"] < best]
    if faster:  # only near-ties, and the recommendation says so
        from meshplan.search.rank import TIE_BAND

        assert all(p["step_time_s"] * (1 + TIE_BAND) >= best for p in faster)
        assert any("tie band" in line for line in d["questions"][3]["answer"])


def test_search_space_is_structurally_valid_and_framework_consistent():
    from meshplan.cost.validate import validate_plan

    m, c, j = worked_example()
    plans = list(enumerate_plans(m, c, j, Space()))
    assert len(plans) == len({p.to_string() for p in plans})
    for p in plans:
        validate_plan(m, c, j, p)
        assert p.pp == 1 or p.schedule in FRAMEWORK_SCHEDULES[p.sharding]


def test_sweep_json_and_plot(capsys, tmp_path):
    png = tmp_path / "s.png"
    code, out = _run(capsys, "sweep", *SMALL, "--vary", "batch-tokens=256K..2M", "--points", "3", "--space", "dp-tp",
                     "--json", "--plot", str(png))
    d = json.loads(out)
    assert code == 0 and len(d["points"]) == 3 and d["points"][0]["best"]["feasible"]
    assert d["unit"] == "tokens per step"  # the values' unit, named (JSON is otherwise in base units)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # each point's best plan is re-timed by the simulator, as plan's are: the same step time as plan gives
    best = d["points"][-1]["best"]
    assert best["closed_form_step_time_s"] is not None
    code, out = _run(capsys, "plan", *SMALL[:-1], "2M", "--space", "dp-tp", "--json", "--no-conditions")
    assert json.loads(out)["recommended"]["step_time_s"] == pytest.approx(best["step_time_s"])


def test_sweep_bad_range_is_one_line(capsys):
    code = main(["sweep", "--vary", "batch-tokens=16M..1M"])
    assert code == 2 and "sweep.vary" in capsys.readouterr().err


class _Page(HTMLParser):
    """The tags of a page, what its elements load from elsewhere, and its scripts' text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self._script: dict | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        self.external += [a[k] for k in ("src", "href") if a.get(k)]
        if tag == "script":
            self._script = a

    def handle_data(self, data):
        if self._script is not None:
            self.scripts.append((self._script, data))
            self._script = None


def test_report_html_is_one_interactive_self_contained_file(capsys, tmp_path):
    code, _ = _run(capsys, "report", *SMALL, "--space", "dp-tp", "--no-conditions", "--out", str(tmp_path))
    assert code == 0
    html = (tmp_path / "report.html").read_text()
    page = _Page()
    page.feed(html)
    assert {"html", "body", "table", "h2", "script"} <= set(page.tags)
    assert page.external == []  # nothing loaded from elsewhere: the charts' library and data are inline
    data = [json.loads(text) for attrs, text in page.scripts if attrs.get("type") == "application/json"]
    assert len(data) == 1
    kinds = [c["kind"] for c in data[0]]
    assert kinds == ["memory", "time", "pareto", "timeline", "sweep", "sweep"]
    code_text = "".join(text for attrs, text in page.scripts if not attrs.get("type"))
    assert "echarts" in code_text and "meshplanCharts" in code_text
    # the charts draw the plan command's figures: the top plans' memory by term against the HBM line
    plan = json.loads(_run(capsys, "plan", *SMALL, "--space", "dp-tp", "--no-conditions", "--json")[1])
    memory = data[0][0]
    top = [(i, p) for i, p in enumerate(plan["plans"], 1) if p["feasible"]][:6]
    assert [r["label"] for r in memory["rows"]] == [f"#{i} {p['plan']['label']}" for i, p in top]
    assert memory["rows"][0]["terms"] == pytest.approx(
        {k: v / 2**30 for k, v in plan["recommended"]["memory"]["terms"].items() if v > 0})
    assert memory["capacity_gib"] == pytest.approx(plan["recommended"]["memory"]["capacity_bytes"] / 2**30)
    md = (tmp_path / "report.md").read_text()
    assert "## 4." in md and "![" in md  # PNG charts beside the Markdown where matplotlib is installed
    for name in ("memory.png", "step_breakdown.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "not computed (--no-conditions)" in md and "holds over every range swept" not in md
    # list items escape what Markdown would read as emphasis (a plan's layout, 'dp_shard'), as table cells do
    from meshplan.report.html import _md_cell, _md_text
    assert _md_text("layout=Et*4|(t*5|)*4t*4L, dp_shard=8") == "layout=Et\\*4|(t\\*5|)\\*4t\\*4L, dp\\_shard=8"
    assert _md_cell("a|b*c") == "a\\|b\\*c"
    assert "dp\\_shard" in md and "dp_shard" not in md.replace("dp\\_shard", "")


def test_the_html_report_needs_no_matplotlib(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from meshplan.cli import main\n"
            f"sys.exit(main(['report', '--model', 'llama-2-7b', '--nodes', '2', '--batch-tokens', '512K', "
            f"'--space', 'dp-tp', '--no-conditions', '--out', {str(tmp_path)!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "meshplanCharts.render" in (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert "![" not in md and "pip install 'meshplan[plot]'" in md and not list(tmp_path.glob("*.png"))


def test_report_where_no_plan_fits_says_there_is_nothing_to_change(capsys, tmp_path):
    code, _ = _run(capsys, "report", "--model", "llama-3.1-405b", "--cluster", "a100-40gb", "--nodes", "1",
                   "--space", "dp-tp", "--out", str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert code == 0 and "no plan fits, so there is no recommendation to change" in md
    assert "not computed" not in md and "holds over every range swept" not in md


def test_validate_cli_on_a_few_rows(capsys, tmp_path):
    import csv

    src = "../shared/data/published_runs.csv"
    import os

    if not os.path.exists(src):
        pytest.skip("shared data not beside the repository")
    with open(src, newline="") as fh:
        rows = list(csv.DictReader(fh))
    sub = tmp_path / "few.csv"
    with sub.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[:6] + rows[200:206])
    code, out = _run(capsys, "validate", str(sub), "--cv", "0", "--json")
    d = json.loads(out)
    assert code == 0 and len(d["rows"]) == 12
    modelled = [r for r in d["rows"] if "skipped" not in r]
    assert modelled and all(r["predicted_tokens_per_s_per_gpu"] > 0 for r in modelled)
    assert d["summary"]["fit"]["tokens_per_s_per_gpu"]["count"] == len(modelled)
    assert d["summary"]["fit"]["predicted_not_to_fit"] == []
    # the gates: memory MAPE over the torchtitan rows among the twelve, every measured run fits
    code, _ = _run(capsys, "validate", str(sub), "--cv", "0", "--json", "--max-memory-mape", "0.2", "--require-fit")
    assert code == 0
    code, _ = _run(capsys, "validate", str(sub), "--cv", "0", "--json", "--max-memory-mape", "0.0001")
    assert code == 1
    # --by-source: each row predicted by a fit that saw no row of its source group, kept per row
    code, out = _run(capsys, "validate", str(sub), "--cv", "0", "--by-source", "--cv-rounds", "1", "--json")
    d = json.loads(out)
    lso = [r for r in d["rows"] if "leave_one_source_out_error" in r]
    assert code == 0 and len({r["source_group"] for r in lso}) >= 2
    assert len(lso) == d["summary"]["leave_one_source_out"]["tokens_per_s_per_gpu"]["count"]
    assert all(r["cv_error"] is None and r["leave_one_source_out_predicted_tokens_per_s_per_gpu"] > 0 for r in lso)
    mape = sum(abs(r["leave_one_source_out_error"]) for r in lso) / len(lso)
    assert mape == pytest.approx(d["summary"]["leave_one_source_out"]["tokens_per_s_per_gpu"]["mape"])


def test_validate_fails_when_a_measured_run_is_predicted_not_to_fit(capsys, tmp_path):
    """--require-fit: a published run ran, so a prediction that it does not fit fails the command. A row
    edited to 64 sequences of 8,192 tokens per micro-batch on 8 H100s cannot fit."""
    import csv
    import os

    src = "../shared/data/published_runs.csv"
    if not os.path.exists(src):
        pytest.skip("shared data not beside the repository")
    with open(src, newline="") as fh:
        rows = list(csv.DictReader(fh))
    big = rows[0] | {"micro_batch_size": "64", "global_batch_size": "512", "recompute": "none"}
    sub = tmp_path / "unfit.csv"
    with sub.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([rows[1], big])
    code, out = _run(capsys, "validate", str(sub), "--cv", "0", "--json")
    assert code == 0 and json.loads(out)["summary"]["fit"]["predicted_not_to_fit"] == [1]
    code, _ = _run(capsys, "validate", str(sub), "--cv", "0", "--json", "--require-fit")
    assert code == 1


def test_option_variants_are_valid_distinct_and_not_the_default():
    from meshplan.cost.validate import validate_plan
    from meshplan.search.space import has_default_options, option_variants

    m, c, j = worked_example()
    seen = set()
    for p in enumerate_plans(m, c, j, Space()):
        assert has_default_options(p)
        for v in option_variants(m, c, j, p):
            validate_plan(m, c, j, v)
            assert not has_default_options(v) and v.unfixed(sp=None, async_tp=False, cp_impl=None,
                                                             reshard_after_forward=None, grad_sync=None,
                                                             offload_layers=0) == p
            key = v.to_string()
            assert key not in seen
            seen.add(key)
    assert len(seen) > 1000


def _moe_scenario():
    """Mixtral 8x7B on four 4-GPU nodes: expert groups span nodes, so DeepEP and the overlap are offered."""
    from meshplan import JobSpec, load_cluster, load_model
    return (load_model("mixtral-8x7b"), load_cluster("h100-sxm", nodes=4, gpus_per_node=4),
            JobSpec(global_batch_tokens=262_144, seq_len=4096))


def _offload_scenario():
    """No fully sharded structure fits, but offloading activations (a Megatron option) does, slowly: the
    family's best is that variant, far outside the tie band."""
    from meshplan import JobSpec, load_cluster, load_model
    return (load_model("seed-70b"), load_cluster("h100-sxm", nodes=3, gpus_per_node=6, inter_node_gb_per_s=1),
            JobSpec(global_batch_tokens=1_179_648, seq_len=8192, software="megatron"))


@pytest.mark.parametrize("scenario", [lambda: worked_example(nodes=2), _moe_scenario, _offload_scenario],
                         ids=["dense", "moe", "offload"])
def test_branch_and_bound_finds_what_evaluating_every_variant_finds(scenario):
    """The search prunes option variants by lower bounds; evaluating all of them must not change the
    recommendation, the tie band or the best plan of each family."""
    from meshplan import evaluate, search
    from meshplan.search.rank import TIE_BAND, rank
    from meshplan.search.space import family, option_variants

    m, c, j = scenario()
    space = Space(max_vpp=2)
    result = search(m, c, j, space)
    assert result.n_pruned > 0
    plans = list(enumerate_plans(m, c, j, space))
    every = rank([evaluate(m, c, j, p) for p in [*plans, *(v for p in plans for v in option_variants(m, c, j, p))]])
    assert result.recommended.plan == every[0].plan
    assert result.recommended.step_time_s == every[0].step_time_s
    fastest = min(e.step_time_s for e in every if e.feasible)
    assert min(e.step_time_s for e in result.feasible) == fastest

    def band(estimates):
        return {(e.plan, e.step_time_s) for e in estimates if e.feasible and e.step_time_s <= fastest * (1 + TIE_BAND)}

    assert band(result.ranked) == band(every)

    def family_best(estimates):
        best: dict[str, float] = {}
        for e in estimates:
            if e.feasible:
                best[family(e.plan)] = min(best.get(family(e.plan), float("inf")), e.step_time_s)
        return best

    assert family_best(result.ranked) == family_best(every)

    def shown(r):  # the report's "best plan of each family" lines, where one fits
        return {f: (e.plan, e.step_time_s) for f, e in r.items() if e.feasible}

    by_family = {}
    for e in every:
        by_family.setdefault(family(e.plan), e)
    assert shown(result.best_by_family()) == shown(by_family)


def test_search_chooses_partial_recomputation_when_it_is_fastest():
    """At 64 GPUs without TP the worked example's FSDP plan needs recomputation; recomputing only the
    layers that do not fit must be considered, and never be slower than recomputing all of them."""
    from meshplan import Plan, evaluate

    m, c, j = worked_example()
    free = evaluate(m, c, j, Plan(dp_shard=64))
    whole = evaluate(m, c, j, Plan(dp_shard=64, recompute="full"))
    assert free.feasible and free.step_time_s <= whole.step_time_s
    part = evaluate(m, c, j, Plan(dp_shard=64, mbs=whole.plan.mbs, recompute_layers=40))
    assert part.plan.recompute == "full" and part.plan.recompute_layers == 40
    assert part.time_breakdown["recompute"] == pytest.approx(whole.time_breakdown["recompute"] * 40 / 80, rel=1e-6)


def test_partial_recompute_needs_full_recompute(capsys):
    code = main(["evaluate", "--plan", "dp_shard=64,recompute=sac,recompute_layers=4"])
    err = capsys.readouterr().err
    assert code == 2 and "plan.recompute_layers" in err and "recompute=full" in err


def test_a_condition_says_why_the_recommendation_is_out():
    """'no longer fits' only when memory is the reason; a plan broken by its schedule's batch rule cannot run."""
    from meshplan import JobSpec, load_cluster, load_model, parse_plan
    from meshplan.cost.step import evaluate
    from meshplan.search.conditions import _gain_text

    model, cluster = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    job = JobSpec(global_batch_tokens=4 * 2**20, seq_len=4096)
    ddp = evaluate(model, cluster, job, parse_plan("dp_replicate=64"))
    odd = evaluate(model, cluster, JobSpec(global_batch_tokens=12 * 4096, seq_len=4096),
                   parse_plan("tp=8,pp=8,schedule=interleaved,vpp=2,mbs=1"))
    assert not ddp.feasible and ddp.memory.headroom_bytes < 0
    assert not odd.feasible and odd.memory.headroom_bytes >= 0, odd.infeasible_reasons
    assert _gain_text(float("inf"), ddp) == "the recommendation no longer fits"
    assert _gain_text(float("inf"), odd) == "the recommendation cannot run there"
    assert _gain_text(float("inf"), None) == "the recommendation cannot be built there"
    assert _gain_text(1.234, ddp) == "1.23x faster"
    both = evaluate(model, cluster, JobSpec(global_batch_tokens=12 * 4096, seq_len=4096), parse_plan("dp_replicate=64"))
    assert both.memory.headroom_bytes < 0 and len(both.infeasible_reasons) > 1  # the batch rule is the first reason
    assert _gain_text(float("inf"), both) == "the recommendation cannot run there"


@pytest.mark.parametrize("software, shardings, schedules", [
    ("torchtitan", {"fsdp"}, None), ("llm-foundry", {"fsdp"}, set()), ("megatron", {"fsdp", "megatron"},
                                                                         {"1f1b", "interleaved"})])
def test_a_named_stack_is_searched_only_over_what_it_runs(software, shardings, schedules):
    """A user who names the stack gets plans it can run (and the band of its runs), never DeepSpeed's ZeRO
    stages under torchtitan's name or zero-bubble schedules under Megatron-core's."""
    from dataclasses import replace
    m, c, j = worked_example()
    plans = list(enumerate_plans(m, c, replace(j, software=software), Space()))
    assert plans and {p.sharding for p in plans} <= shardings
    if schedules is not None:  # llm-foundry: no pipeline at all
        assert {p.schedule for p in plans if p.pp > 1} <= schedules
    generic = {p.sharding for p in enumerate_plans(m, c, j, Space())}
    assert {"zero1", "zero3", "megatron"} <= generic


def test_the_report_says_when_an_alternative_is_no_slower_and_why_q3_does_not_apply(capsys):
    from meshplan import Plan, evaluate, parse_plan
    from meshplan.explain import why_not
    m, c, j = worked_example()
    a = evaluate(m, c, j, Plan(dp_shard=64))
    assert "within the tie band" in why_not(a, a) and "most of the gap" not in why_not(a, a)
    # a term larger than the whole gap (others offset part of it) is "the largest difference", not "most of it"
    best = evaluate(m, c, j, parse_plan("tp=4,pp=16,sharding=megatron,async_tp=true", 64))
    line = why_not(a, best)
    d = a.time_breakdown["recompute"] - best.time_breakdown.get("recompute", 0.0)
    assert d > a.step_time_s - best.step_time_s and "the largest difference is recompute" in line
    code = main(["plan", "--model", "llama-3-8b", "--nodes", "1", "--batch-tokens", "1M", "--no-conditions",
                 "--space", "dp-tp"])
    out = capsys.readouterr().out
    assert code == 0 and "Not applicable: the cluster is a single node" in out  # TP=8 divides heads and GPUs


def test_the_simplified_mode_counts_an_moe_models_active_parameters():
    """The hand analysis's 6·N for a mixture of experts is 6·N_active: each token runs top-k experts."""
    from meshplan import Plan, evaluate_simplified, load_cluster, load_model
    from meshplan.cost.params import param_counts
    m, c = load_model("deepseek-v3"), load_cluster("gb200", nodes=4)
    j = worked_example()[2]
    est = evaluate_simplified(m, c, j, Plan(dp_shard=c.n_gpus), mfu=0.4)
    pc = param_counts(m)
    assert est.flops.model_flop_per_token == pytest.approx(6 * m.nominal_params * pc.active / pc.total, rel=1e-9) \
        if m.nominal_params else pytest.approx(6 * pc.active, rel=1e-9)
    assert est.flops.convention == "6N (nominal, active)"


def test_a_condition_on_depth_keeps_a_candidate_that_recomputed_more_layers_than_a_stage_now_holds():
    """Partial recomputation of 15 layers per stage, at half the depth (10 a stage): recompute them all,
    rather than drop the candidate because its recompute_layers is now more than a stage holds."""
    from meshplan import JobSpec, load_model
    from meshplan.search.conditions import _resplit
    from meshplan.specs import Plan
    half = replace_layers(load_model("seed-70b"), 40)
    plan = Plan(tp=8, pp=4, dp_shard=2, mbs=1, recompute="full", recompute_layers=15)
    job = JobSpec(global_batch_tokens=4096 * 64, seq_len=4096)
    assert _resplit(plan, half, job).recompute_layers is None
    assert _resplit(plan, load_model("seed-70b"), job).recompute_layers == 15
    # and at a sequence TP does not split, without sequence parallelism (nor the async TP riding on it)
    odd = _resplit(Plan(tp=8, pp=4, dp_shard=2, async_tp=True), half, JobSpec(global_batch_tokens=4100 * 64,
                                                                               seq_len=4100))
    assert odd.sp is False and not odd.async_tp


def replace_layers(model, n):
    from dataclasses import replace
    return replace(model, n_layers=n, nominal_params=None)


def test_question_2_gives_no_step_for_a_batch_full_sharding_cannot_split_and_no_quarter_batch_line_at_the_batch():
    """With 8 sequences per step on 16 GPUs, question 2 gives no full-sharding step (timed for 16 sequences
    beside the FLOPs of 8) and no 'quarter batch' line at the scenario's own or a larger batch; at long
    sequences 'why the figures differ' names attention's FLOPs."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.explain import analyse

    model, cluster = load_model("llama-2-7b"), load_cluster("h100-sxm", nodes=2)
    q2 = analyse(model, cluster, JobSpec(global_batch_tokens=2**20, seq_len=131072), space=Space.dp_tp(),
                 with_conditions=False).questions[1].lines
    assert any(line.startswith("Predicted: none; full sharding over 16 GPUs cannot run this batch") for line in q2)
    assert not any(line.startswith(("At a", "Why the figures differ")) for line in q2)
    q = analyse(model, cluster, JobSpec(global_batch_tokens=2**20, seq_len=131072), space=Space.dp_tp(),
                with_conditions=False).questions
    assert "no step is predicted for it" in " ".join(q[0].lines)
    assert "against full sharding, which cannot run this batch" in " ".join(q[2].lines)  # no step of it in Q3
    q2 = analyse(model, cluster, JobSpec(global_batch_tokens=2**20, seq_len=65536), space=Space.dp_tp(),
                 with_conditions=False).questions[1].lines
    assert not any(line.startswith("At a") for line in q2)  # 16 sequences on 16 GPUs: no smaller batch splits
    why = next(line for line in q2 if line.startswith("Why the figures differ"))
    assert "attention's score and value products" in why


def test_a_familys_line_names_its_fastest_plan_where_the_tie_band_ranked_a_simpler_one_first():
    """A family's line names its fastest plan ('Best HSDP plan HSDP=2x4: +1.7 % (2.78 s)' must not stand
    beside an HSDP plan with more options at 2.74 s): the family's first plan in rank order is the simplest
    within the tie band, not its fastest."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.explain import analyse
    from meshplan.search.space import family

    analysis = analyse(load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=1),
                       JobSpec(global_batch_tokens=524_288, seq_len=4096), with_conditions=False)
    lines = [x for x in analysis.questions[3].lines if x.startswith("Best ")]
    shown = analysis.result.best_by_family()
    named = 0
    for fam, e in shown.items():
        line = next((x for x in lines if f" plan {e.plan.label()}: " in x), None)
        if line is None or not e.feasible:
            continue
        fastest = min((x for x in analysis.result.feasible if family(x.plan) == fam), key=lambda x: x.step_time_s)
        assert ("its fastest" in line) == (fastest.step_time_s < e.step_time_s), line
        named += fastest.step_time_s < e.step_time_s
    assert named  # the scenario has such a family


def test_the_search_offers_no_partial_reshard_with_dtensor_parameters():
    """FSDP2 cannot reshard TP or EP (DTensor) parameters to a node-sized group after forward
    (FSDPParam.to_sharded_post_forward raises NotImplementedError): no such variant, and only with tp = ep = 1
    the node-sized one."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.search.space import option_variants
    from meshplan.specs import parse_plan
    from meshplan.specs.plan import partial_reshard_blocked

    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=16)
    j = JobSpec(global_batch_tokens=4_194_304, seq_len=4096)
    offered = {tp: [v.reshard_after_forward  # the node-sized partial reshard: 8
                    for v in option_variants(m, c, j, parse_plan(f"tp={tp},dp_shard={128 // tp}"))]
               for tp in (1, 4)}
    assert 8 in offered[1] and not any(isinstance(r, int) and not isinstance(r, bool) for r in offered[4])
    assert partial_reshard_blocked(parse_plan("tp=4,dp_shard=32,reshard_after_forward=8"))


def test_a_batch_condition_is_where_another_layout_beats_the_recommendation_by_the_tie_band(plan_json):
    """At the batch a condition names, some plan of another layout is more than the tie band faster than the
    recommendation (both timed as plan times them) or the recommendation does not fit; at the last batch it
    says the recommendation holds, none is. A change is found where only the fastest plan, not the simplest
    one of the tie band, beats the recommendation by more than the band."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, search
    from meshplan.explain import _try
    from meshplan.search.conditions import layout_key
    from meshplan.search.screen import MIN_GAIN
    from meshplan.search.search import REFINE_TOP
    from meshplan.specs import parse_plan

    (cond,) = [c for c in plan_json["conditions"] if c["condition"] == "batch_tokens"]
    rec = parse_plan(plan_json["recommended"]["plan"]["string"]).unfixed()
    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)

    def margin(batch: float, refined: bool) -> float:
        """The recommendation's step time over the fastest plan of another layout at ``batch``: timed as plan
        times them (``refined``), or by the closed form alone."""
        j = JobSpec(global_batch_tokens=int(batch), seq_len=4096)
        ranked = search(m, c, j, refine_top=REFINE_TOP if refined else 0, workers=1).feasible
        mine = _try(m, c, j, rec, None) if refined else evaluate(m, c, j, rec)
        fastest = min(e.step_time_s for e in ranked if layout_key(e.plan) != layout_key(rec))
        return mine.step_time_s / fastest if mine is not None and mine.feasible else float("inf")

    # the change is confirmed by the search plan runs; the values held are screened by the closed form
    assert cond["direction"] == "below" and margin(cond["value"], refined=True) >= MIN_GAIN
    assert margin(cond["last_same_value"], refined=False) < MIN_GAIN


def test_memory_chart_draws_the_hbm_capacity_and_the_sweep_names_families(monkeypatch):
    """The memory chart's bars stand against the GPU's HBM capacity, and the sweep's lines carry the
    families' report names, not their keys."""
    from meshplan import evaluate, parse_plan
    from meshplan.report import charts

    m, c, j = worked_example()
    est = evaluate(m, c, j, parse_plan("tp=8,pp=4,dp_shard=2,sharding=megatron,mbs=1,recompute=none", c.n_gpus))
    seen = {}
    monkeypatch.setattr(charts, "_stacked", lambda rows, xlabel, title, limit=None: seen.update(limit=limit) or b"")
    charts.memory_chart([est])
    assert seen["limit"][0] == pytest.approx(c.accelerator.hbm_capacity_bytes / 2**30)
    assert seen["limit"][1] == "HBM capacity (79.2 GiB)"
    labels = []

    class _Axes:
        def plot(self, *a, label="", **k):
            labels.append(label)

        def __getattr__(self, name):
            return lambda *a, **k: None

    class _Plt:
        def subplots(self, **k):
            return None, _Axes()

    monkeypatch.setattr(charts, "_plt", lambda: _Plt())
    monkeypatch.setattr(charts, "_png", lambda fig: b"")
    point = charts.SweepPoint(value=1.0, best=est, by_family={"fsdp": est, "pp": est})
    monkeypatch.setattr(charts, "changes", lambda points: [])
    charts.sweep_chart([point], xlabel="gpus", log_x=False)
    assert labels == ["best sharded data parallel (FSDP, ZeRO, Megatron) plan", "best pipeline plan", "recommended"]


def test_sequence_parallelism_turned_off_is_no_choice_where_the_sequence_cannot_split():
    """rank.complexity counts sp=false as an option where sequence parallelism could run, not where the
    sequence does not split over TP (the search then runs every TP plan without it)."""
    from meshplan import Plan
    from meshplan.search.rank import complexity

    plan = Plan(tp=8, dp_shard=2, sp=False)
    assert complexity(plan, 4096) == complexity(Plan(tp=8, dp_shard=2), 4096) + 1
    assert complexity(plan, 4100) == complexity(Plan(tp=8, dp_shard=2), 4100)


def test_the_simulator_counts_zb_vs_two_chunks_per_rank():
    """simulable counts chunk passes: ZB-V's two model chunks per rank double them."""
    from dataclasses import replace

    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
    from meshplan.sim.simulate import MAX_PIPELINE_PASSES, simulable

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    job = JobSpec(global_batch_tokens=4096 * 8, seq_len=4096)
    est = evaluate(model, cluster, job, parse_plan("pp=2,dp_shard=4,mbs=1,schedule=zb-v", 8))
    m = MAX_PIPELINE_PASSES // 2  # one chunk per rank would fit; ZB-V's two do not
    assert not simulable(replace(est, n_microbatches=m))
    assert simulable(replace(est, n_microbatches=m // 2))


def test_full_sharding_that_does_not_fit_is_timed_only_as_if_it_fitted():
    """On 8 GPUs a 70B model's full sharding does not fit: question 2 must not print its step as a
    prediction, question 3 must not compare the TP alternative with it, and question 1 must not quote its
    recomputation's share of a step it never runs."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.explain import analyse

    q = analyse(load_model("seed-70b"), load_cluster("h100-sxm", nodes=1),
                JobSpec(global_batch_tokens=2**20, seq_len=4096), space=Space.dp_tp(), with_conditions=False).questions
    assert "Full sharding cannot run here" in " ".join(q[0].lines)
    assert "and it costs" not in " ".join(q[0].lines)
    assert any(line.startswith("As if it fitted (it does not: question 1), predicted (") for line in q[1].lines)
    assert "even recomputing every layer does not make it fit" in " ".join(q[0].lines)


def test_a_moe_models_family_lines_say_they_lack_expert_parallelism():
    """On Mixtral, 'Best pipeline plan ...: +20.7 %' must not stand beside a PP x EP runner-up at +0.3 %: a
    plan's family is its most distinctive axis, expert parallelism first, so the other families are plans
    without it."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.explain import analyse

    lines = analyse(load_model("mixtral-8x7b"), load_cluster("h100-sxm", nodes=2),
                    JobSpec(global_batch_tokens=2**20, seq_len=4096), with_conditions=False).questions[3].lines
    best = [x for x in lines if x.startswith("Best ")]
    assert best and all("expert parallel plan" in x or "plan without expert parallelism" in x for x in best)
