"""``meshplan compare`` and the job flags: each scenario's fastest plan, ordered as evaluating it alone
orders it; the flags override the job file; bad values exit 2 with one line naming the flag."""

import json

import pytest

from meshplan.catalog import load_cluster, load_job, load_model
from meshplan.cli import main
from meshplan.compare import Scenario, compare, scenarios, within_error
from meshplan.cost.step import evaluate
from meshplan.economics import defaults_for
from meshplan.sim.simulate import refine_fitted
from meshplan.specs import parse_plan


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _alone(model, job, row):
    """The row's plan evaluated on its own, as ``meshplan evaluate`` does (closed form, then the simulator)."""
    c = row.cluster
    est = evaluate(model, c, job, parse_plan(row.fastest.plan.to_string(), world_size=c.n_gpus))
    return refine_fitted(est, c.accelerator.name, job.software)


def test_compare_orders_as_each_best_plan_alone():
    m = load_model("llama-3.2-3b")
    j = load_job(None, global_batch_tokens=2**19, seq_len=4096, train_tokens=10**11)
    items = scenarios(["a100-80gb", "h100-sxm", "h200", "b200"], [1], [None])
    rows = compare(m, j, items, load=lambda s: load_cluster(s.cluster, nodes=s.nodes or 1), settings_for=defaults_for,
                   workers=1)
    assert [r.scenario.cluster for r in rows] == ["b200", "h200", "h100-sxm", "a100-80gb"]
    alone = [_alone(m, j, r).tokens_per_s for r in rows]
    assert alone == sorted(alone, reverse=True)
    for r, t in zip(rows, alone, strict=True):
        assert r.fastest.tokens_per_s == pytest.approx(t, rel=1e-9)
        assert r.fastest.uncertainty is not None and r.summary is not None
        # the fastest plan: no feasible plan of the search is faster, whatever the tie band recommends
        if r.recommended is not None:
            assert r.recommended.step_time_s >= r.fastest.step_time_s


def test_within_error_pairs_neighbours_whose_bands_overlap():
    m = load_model("llama-3.2-3b")
    j = load_job(None, global_batch_tokens=2**19, seq_len=4096)
    rows = compare(m, j, scenarios(["h100-sxm", "h200"], [1], [None]),
                   load=lambda s: load_cluster(s.cluster, nodes=1), settings_for=defaults_for, workers=1)
    # H200 and H100 differ by a few per cent, well inside the generic stack's band
    assert within_error(rows) == [(0, 1)]
    assert rows[0].summary is None  # no token budget: no time to train


def test_scenario_limit_and_bad_cluster(capsys):
    from meshplan.errors import SpecError

    with pytest.raises(SpecError, match="at most"):
        scenarios(["h100-sxm"] * 9, list(range(1, 9)), [None])
    code, _, err = run(capsys, "compare", "--cluster", "h100-sxm,tpu-v9", "--nodes", "1")
    assert code == 2 and "tpu-v9" in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "field"), [
    (["--nodes", "1,x"], "--nodes"),
    (["--inter-node-bandwidth", "25,0"], "--inter-node-bandwidth"),
    (["--stack", "jax"], "--stack"),
    (["--recompute", "some"], "--recompute"),
    (["--train-tokens", "many"], "--train-tokens"),
    (["--pue", "0.8"], "--pue"),
    (["--failure-rate", "often"], "--failure-rate"),
    (["--price-per-gpu-hour", "-2"], "--price-per-gpu-hour"),
    (["--plot", "chart.svg"], "--plot"),
])
def test_compare_bad_flags_one_line(capsys, argv, field):
    code, _, err = run(capsys, "compare", "--model", "llama-3.2-3b", *argv)
    assert code == 2 and field in err and err.count("\n") == 1, err


def test_compare_cli_json_and_plot(capsys, tmp_path):
    png = tmp_path / "c.png"
    code, out, _ = run(capsys, "compare", "--model", "llama-3.2-3b", "--cluster", "h100-sxm,b200", "--nodes", "1,2",
                       "--batch-tokens", "512K", "--seq-len", "4096", "--train-tokens", "100B", "--jobs", "1",
                       "--json", "--plot", str(png))
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads(out)
    assert d["schema"] == "meshplan.compare/1" and len(d["rows"]) == 4 and d["train_tokens"] == 10**11
    speeds = [r["tokens_per_s"]["value"] for r in d["rows"]]
    assert speeds == sorted(speeds, reverse=True)
    e = d["rows"][0]["economics"]
    for key in ("train_time_s", "wall_time_s", "gpu_hours", "cost_usd", "energy_j", "goodput"):
        assert key in e
    assert e["goodput"]["checkpoint_interval_s"] > 0 and 0 < e["goodput"]["goodput_fraction"] <= 1
    assert d["scale_out"]  # 1 -> 2 nodes of each accelerator


def test_compare_text(capsys):
    code, out, _ = run(capsys, "compare", "--model", "llama-3.2-3b", "--cluster", "h100-sxm,h200", "--nodes", "1",
                       "--batch-tokens", "512K", "--seq-len", "4096", "--train-tokens", "100B", "--stack", "megatron",
                       "--price-per-gpu-hour", "2.5", "--jobs", "1")
    assert code == 0 and "stack megatron" in out and "goodput" in out and "h200" in out


def test_flags_override_the_job_file(tmp_path):
    from meshplan.cli import _job, build_parser

    job = tmp_path / "job.toml"
    job.write_text('software = "torchtitan"\nprecision = "bf16"\noptimizer = "adamw"\ntrain_tokens = "1T"\n')
    args = build_parser().parse_args(["plan", "--job", str(job), "--stack", "megatron", "--precision", "fp8",
                                      "--train-tokens", "15.6T", "--recompute", "full"])
    j = _job(args)
    assert (j.software, j.precision, j.optimizer, j.train_tokens, j.recompute) == (
        "megatron", "fp8", "adamw", 15_600_000_000_000, "full")
    j = _job(build_parser().parse_args(["plan", "--job", str(job)]))
    assert (j.software, j.train_tokens, j.recompute) == ("torchtitan", 10**12, "auto")


def test_deepspeed_stack_searches_zero_stages():
    from meshplan.search.search import search

    m, c = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=2)
    j = load_job(None, global_batch_tokens=2**19, seq_len=4096, software="deepspeed")
    result = search(m, c, j)
    shardings = {e.plan.sharding for e in result.ranked if e.plan.shard_degree * e.plan.cp > 1}
    assert shardings and shardings <= {"zero1", "zero2", "zero3"}
    assert all(e.plan.schedule == "1f1b" for e in result.ranked if e.plan.pp > 1)


@pytest.mark.parametrize("mode", ["none", "full", "sac"])
def test_recompute_restricts_the_search(mode):
    from meshplan.search.search import search

    m, c = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=1)
    j = load_job(None, global_batch_tokens=2**19, seq_len=4096, recompute=mode)
    result = search(m, c, j)
    assert result.feasible and {e.plan.recompute for e in result.ranked} == {mode}
    assert all(e.plan.recompute_layers is None for e in result.ranked)


def test_recompute_sac_is_not_megatrons():
    from meshplan.errors import SpecError

    with pytest.raises(SpecError, match=r"job.recompute"):
        load_job(None, global_batch_tokens=2**19, seq_len=4096, recompute="sac", software="megatron")


def test_evaluate_with_train_tokens(capsys):
    code, out, _ = run(capsys, "evaluate", "--model", "llama-3.2-3b", "--nodes", "1", "--batch-tokens", "512K",
                       "--seq-len", "4096", "--plan", "dp_shard=8", "--train-tokens", "100B", "--recompute", "full",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["plan"]["recompute"] == "full" and d["economics"]["train_tokens"] == 10**11
    code, out, _ = run(capsys, "evaluate", "--model", "llama-3.2-3b", "--nodes", "1", "--batch-tokens", "512K",
                       "--seq-len", "4096", "--plan", "dp_shard=8", "--train-tokens", "100B", "--pue", "1.1")
    assert code == 0 and "Time to train" in out and "PUE 1.10" in out
    code, _, err = run(capsys, "evaluate", "--model", "llama-3.2-3b", "--nodes", "1", "--batch-tokens", "512K",
                       "--seq-len", "4096", "--plan", "dp_shard=8,sharding=megatron", "--recompute", "sac")
    assert code == 2 and "--recompute" in err


def test_scenario_label():
    s = Scenario("h200", 64, 25.0)
    assert s.label((True, True, True)) == "h200, 64 nodes, 25 GB/s"
    assert s.label((False, False, False)) == "h200"


@pytest.mark.slow
def test_llama_405b_compare_orders_as_each_best_plan_alone(capsys):
    """The issue's must-show: on 2,048 nodes, the compare table's ordering by tokens/s agrees with evaluating
    each accelerator's best plan alone."""
    code, out, _ = run(capsys, "compare", "--model", "llama-3.1-405b", "--cluster", "h100-sxm,h200,b200",
                       "--nodes", "2048", "--batch-tokens", "16M", "--seq-len", "8192", "--train-tokens", "15.6T",
                       "--json")
    assert code == 0
    d = json.loads(out)
    m = load_model("llama-3.1-405b")
    j = load_job(None, global_batch_tokens=2**24, seq_len=8192)
    alone = []
    for r in d["rows"]:
        c = load_cluster(r["cluster"], nodes=2048)
        est = evaluate(m, c, j, parse_plan(r["fastest"]["plan"]["string"], world_size=c.n_gpus))
        alone.append((r["cluster"], refine_fitted(est, c.accelerator.name, j.software).tokens_per_s))
    assert [name for name, _ in sorted(alone, key=lambda x: -x[1])] == [r["cluster"] for r in d["rows"]]
    for r, (_, t) in zip(d["rows"], alone, strict=True):
        assert r["tokens_per_s"]["value"] == pytest.approx(t, rel=1e-9)
    assert d["rows"][0]["cluster"] == "b200"
