"""The files of examples/: each loads, means what its comments say, and runs through the commands the docs
show it with (docs/specs.md, docs/getting-started.md)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from meshplan import evaluate, load_cluster, load_model, param_counts, parse_plan
from meshplan.catalog import load_job
from meshplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SHARED_RUNS = Path(os.environ.get("MESHPLAN_PUBLISHED_RUNS", ROOT.parent / "shared" / "data" / "published_runs.csv"))
"""The published runs beside the repository (MESHPLAN_PUBLISHED_RUNS names another copy)."""


def ex(*parts: str) -> str:
    return str(EXAMPLES.joinpath(*parts))


def test_dense_gqa_model_has_the_published_parameter_count():
    """Llama 3.2 1B: 1,235,814,400 parameters with tied embeddings (Hugging Face's count of the checkpoint)."""
    m = load_model(ex("models", "llama-3.2-1b.toml"))
    assert (m.n_heads, m.n_kv_heads, m.d_head, m.tied_embeddings) == (32, 8, 64, True)
    assert param_counts(m).total == 1_235_814_400


def test_moe_model_counts_total_and_active_parameters():
    """Qwen3-30B-A3B: about 30.5B parameters of which 3.3B are active per token (its model card)."""
    m = load_model(ex("models", "qwen3-30b-a3b.toml"))
    pc = param_counts(m)
    assert m.is_moe and m.n_moe_layers == 48 and m.q_dim == 4096 and m.qk_norm
    assert pc.total == pytest.approx(30.5e9, rel=0.01)
    assert pc.active == pytest.approx(3.3e9, rel=0.02)


def test_cluster_file_overrides_the_accelerators_node():
    c = load_cluster(ex("clusters", "h100-200g-ib.toml"))
    base = load_cluster("h100-sxm")
    assert (c.name, c.n_nodes, c.gpus_per_node, c.accelerator.name) == ("h100-200g-ib", 4, 8, "h100-sxm")
    assert c.inter.nic_bytes_per_s == 25e9 and c.inter.efficiency == 0.92 and c.inter.latency_s == pytest.approx(50e-6)
    assert c.intra == base.intra  # what the file does not override is the catalog node's
    assert load_cluster(ex("clusters", "h100-200g-ib.toml"), nodes=2).n_nodes == 2  # --nodes wins


def test_job_files_load_with_what_they_say():
    fp8 = load_job(ex("jobs", "megatron-fp8.toml"))
    assert (fp8.software, fp8.precision, fp8.fp8_param_gather, fp8.reduce_dtype_bytes, fp8.loss) == (
        "megatron", "fp8", True, 2, "te")
    assert (fp8.global_batch_tokens, fp8.seq_len) == (4 * 2**20, 8192)
    tt = load_job(ex("jobs", "torchtitan-compiled.toml"))
    assert (tt.software, tt.compiled, tt.loss, tt.runtime.allocator_fraction) == ("torchtitan", True, "fused", 0.05)
    moe = load_job(ex("jobs", "moe-megatron.toml"))
    assert (moe.cuda_graphs, moe.moe_capacity_factor, moe.global_batch_tokens) == (True, 1.25, 2 * 2**20)
    assert load_job(ex("jobs", "megatron-fp8.toml"), seq_len=4096).seq_len == 4096  # flags win over the file


@pytest.mark.parametrize(("model", "cluster", "nodes", "job", "plan"), [
    ("models/llama-3.2-1b.toml", "h100-sxm", 1, None, "dp_shard=8"),
    ("models/llama-3.2-1b.toml", "clusters/h100-200g-ib.toml", None, "jobs/torchtitan-compiled.toml", "dp_shard=32"),
    ("models/qwen3-30b-a3b.toml", "h100-sxm", 2, None, "ep=8,dp_shard=16"),
    ("models/qwen3-30b-a3b.toml", "h100-sxm", 2, "jobs/moe-megatron.toml", "ep=8,dp_shard=16,sharding=megatron"),
    ("seed-70b", "h100-sxm", 8, "jobs/megatron-fp8.toml", "tp=4,pp=4,dp_shard=4,sharding=megatron"),
])
def test_examples_evaluate_to_a_plan_that_fits(model, cluster, nodes, job, plan):
    """Each example in the combination the docs show it evaluates to a feasible plan with a finite step."""
    m = load_model(ex(model) if model.endswith(".toml") else model)
    c = load_cluster(ex(cluster) if cluster.endswith(".toml") else cluster, nodes=nodes)
    j = load_job(ex(job) if job else None, defaults={"global_batch_tokens": 4_194_304, "seq_len": 4096})
    est = evaluate(m, c, j, parse_plan(plan, c.n_gpus))
    assert est.feasible, est.infeasible_reasons
    assert 0 < est.step_time_s < 1e4 and 0 < est.mfu < 1
    if j.software == "megatron" and j.precision == "fp8":
        assert est.plan.runs_megatron_layers(j.software)


def test_plan_on_the_example_model_and_cluster(capsys):
    assert main(["plan", "--cluster", ex("clusters", "h100-200g-ib.toml"), "--model", ex("models", "llama-3.2-1b.toml"),
                 "--no-conditions", "--json", "--top", "3", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["cluster"] == "h100-200g-ib" and out["scenario"]["n_gpus"] == 32
    assert out["scenario"]["inter_node_bytes_per_s"] == 25e9
    assert out["recommended"]["feasible"]


def test_validate_on_the_sample_csv(capsys):
    """The sample holds seven rows of the published runs: six modelled (a V100 row is skipped), two of them
    torchtitan rows with a measured peak memory."""
    assert main(["validate", ex("published_runs_sample.csv"), "--cv", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fit = out["summary"]["fit"]
    assert (fit["rows"], fit["modelled"], fit["skipped"]) == (7, 6, 1)
    assert fit["peak_memory"]["count"] == 2 and fit["predicted_not_to_fit"] == []
    assert fit["tokens_per_s_per_gpu"]["mape"] < 0.1
    skipped = [r for r in out["rows"] if "skipped" in r]
    assert len(skipped) == 1 and "V100" in skipped[0]["skipped"]


def test_sample_csv_rows_are_copies_of_the_published_runs():
    with open(ex("published_runs_sample.csv"), newline="") as fh:
        sample = list(csv.reader(fh))
    if not SHARED_RUNS.is_file():
        pytest.skip("needs ../shared/data/published_runs.csv beside the repository")
    with open(SHARED_RUNS, newline="") as fh:
        published = list(csv.reader(fh))
    assert sample[0] == published[0]  # the same header
    assert all(row in published[1:] for row in sample[1:]) and len(sample) == 8
