"""Fuzzing: generated plan strings, spec files, CSV cells and command lines. Every one either works or is
refused with meshplan's own error (SpecError, or a CSV row skipped with its reason); none raises anything
else. Every JSON meshplan prints is strict JSON, and every MFU and HFU it reports is at most 1."""

from __future__ import annotations

import json
import math
import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.strategies import clusters, jobs, models

from meshplan import SpecError, evaluate, load_cluster, load_model, parse_plan
from meshplan.catalog import load_job
from meshplan.cli import main
from meshplan.report.json import estimate_dict
from meshplan.specs.plan import Plan

EXAMPLES = int(os.environ.get("MESHPLAN_FUZZ_EXAMPLES", "150"))
"""Examples per fuzz test; set MESHPLAN_FUZZ_EXAMPLES=5000 for a long run."""
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
NUMBERS = st.one_of(st.integers(min_value=-(10**30), max_value=10**30), st.floats(allow_nan=True,
                                                                                  allow_infinity=True),
                    st.just(10**400), st.sampled_from(["4M", "fast", "", "\u0668", "1e400", "nan"]))
TOML_VALUES = st.one_of(NUMBERS, st.booleans(), st.text(max_size=20), st.lists(st.integers(), max_size=3))
KEYS = ["dp_replicate", "dp_shard", "fsdp", "ddp", "cp", "tp", "pp", "ep", "etp", "mbs", "recompute",
        "recompute_layers", "recompute_modules", "offload_layers", "sharding", "reshard_after_forward", "grad_sync",
        "sp", "schedule", "vpp", "cp_impl", "async_tp", "ep_dispatch", "layout", "ep_overlap", "bogus"]
WORDS = ["-1", "0", "1", "2", "4", "8", "64", "3", "true", "false", "auto", "full", "none", "sac", "selective",
         "megatron", "fsdp", "zero1", "zero3", "1f1b", "interleaved", "zb-v", "ring", "a2a", "deepep", "tp",
         "Et*4|t*4L", "(t*2|)*4", "1" + "0" * 50, "\u0668", "nan", " ", "=", ",,"]


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else "inf" if v == math.inf else "-inf" if v == -math.inf else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return str(v) if not isinstance(v, list) else "[" + ", ".join(str(x) for x in v) + "]"


@FUZZ
@given(st.one_of(st.text(max_size=80),
                 st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(WORDS)), min_size=1, max_size=6)
                 .map(lambda kv: ",".join(f"{k}={v}" for k, v in kv))))
def test_any_plan_string_parses_or_names_the_field(text):
    try:
        plan = parse_plan(text, world_size=64)
    except SpecError as exc:
        assert exc.field.startswith("plan") and len(str(exc)) < 1000
    else:
        assert isinstance(plan, Plan) and parse_plan(plan.to_string()) == plan


MODEL_KEYS = ["name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "head_dim", "n_experts",
              "top_k", "expert_ffn_hidden", "attention_window", "global_attention_every", "mtp_layers", "norm",
              "gated_mlp", "nominal_params", "kv_lora_rank", "unknown_key"]
VALID_MODEL = {"name": '"m"', "n_layers": "4", "hidden": "256", "n_heads": "4", "n_kv_heads": "4",
               "ffn_hidden": "512", "vocab": "1000"}


@FUZZ
@given(st.dictionaries(st.sampled_from(MODEL_KEYS), TOML_VALUES, max_size=5))
def test_any_model_file_loads_or_names_the_field(tmp_path_factory, changes):
    lines = dict(VALID_MODEL) | {k: _toml_value(v) for k, v in changes.items()}
    path = tmp_path_factory.mktemp("m") / "model.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in lines.items()), encoding="utf-8")
    try:
        load_model(str(path))
    except SpecError as exc:
        assert exc.field.startswith("model") and len(str(exc)) < 1000


NODE_KEYS = ["gpus_per_node", "intra_link_gb_per_s", "ring_busbw_gb_per_s", "nvls_busbw_gb_per_s", "nvls_min_gpus",
             "p2p_gb_per_s", "intra_latency_us", "nic_gb_per_s", "nic_efficiency", "inter_latency_us",
             "host_gb_per_s", "host_memory_gib", "intra_kind", "bogus"]


@FUZZ
@given(st.dictionaries(st.sampled_from(NODE_KEYS), TOML_VALUES, max_size=4), TOML_VALUES)
def test_any_cluster_file_loads_or_names_the_field(tmp_path_factory, node, nodes):
    path = tmp_path_factory.mktemp("c") / "cluster.toml"
    path.write_text(f'accelerator = "h100-sxm"\nnodes = {_toml_value(nodes)}\n[node]\n'
                    + "".join(f"{k} = {_toml_value(v)}\n" for k, v in node.items()), encoding="utf-8")
    try:
        load_cluster(str(path))
    except SpecError as exc:
        assert exc.field.startswith("cluster") and len(str(exc)) < 1000


JOB_KEYS = ["global_batch_tokens", "seq_len", "optimizer", "precision", "reduce_dtype_bytes", "moe_capacity_factor",
            "moe_routing_imbalance", "software", "loss", "compiled", "cuda_graphs", "cuda_graph_scope",
            "fp8_attention", "flop_convention", "bogus"]


@FUZZ
@given(st.dictionaries(st.sampled_from(JOB_KEYS), TOML_VALUES, max_size=4))
def test_any_job_file_loads_or_names_the_field(tmp_path_factory, fields):
    path = tmp_path_factory.mktemp("j") / "job.toml"
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in fields.items()), encoding="utf-8")
    try:
        load_job(str(path), defaults={"global_batch_tokens": 4 << 20, "seq_len": 4096})
    except SpecError as exc:
        assert exc.field.startswith("job") and len(str(exc)) < 1000


def _published_header_and_row() -> tuple[list[str], dict[str, str]] | None:
    data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "published_runs.csv"
    if not data.is_file():
        return None
    import csv

    with data.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), next(reader)


CELLS = st.one_of(st.text(max_size=12), st.sampled_from(["0", "-1", "nan", "inf", "1e400", "\u0668", "9" * 400,
                                                        "2.5", "", "none", "fsdp", "zero3"]))


@FUZZ
@given(st.data())
def test_any_csv_cell_models_the_row_or_skips_it_with_a_reason(data):
    from meshplan.validation.validate import load_scenarios

    template = _published_header_and_row()
    if template is None:
        pytest.skip("needs ../shared/data/published_runs.csv beside the repository")
    columns, row = template
    changed = data.draw(st.dictionaries(st.sampled_from(columns), CELLS, max_size=3))
    (result,) = load_scenarios([row | changed])
    assert (result.scenario is None) != (result.skipped is None)


FLAGS = {"--model": ["llama-3-8b", "mixtral-8x7b", "nope", ""], "--cluster": ["h100-sxm", "b200", "x"],
         "--nodes": ["1", "2", "0", "-3", "1e9", "\u0668", "4M"], "--gpus-per-node": ["8", "3", "0"],
         "--inter-node-bandwidth": ["50", "0", "1e-9", "inf", "nan", "1e9"],
         "--batch-tokens": ["1M", "64K", "3", "0", "1e30"], "--seq-len": ["4096", "8192", "3", "0"],
         "--mfu": ["0.4", "0", "5", "nan"], "--plan": ["dp_shard=-1", "tp=8,dp_shard=-1", "ep=8,dp_shard=-1",
                                                    "pp=2,dp_shard=-1,schedule=zb-v", "bogus"]}


@settings(max_examples=max(40, EXAMPLES // 4), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(list(FLAGS)), st.integers(0, 10), max_size=5))
def test_any_evaluate_command_line_works_or_exits_2_with_one_line(capsys, picks):
    argv = ["evaluate", "--json", "--plan", "dp_shard=-1"]
    for flag, i in picks.items():
        values = FLAGS[flag]
        argv += [flag, values[i % len(values)]]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and code in (0, 2), (argv, err)
    if code == 0:
        _strict(out)
    else:
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


@settings(max_examples=max(30, EXAMPLES // 5), deadline=None)
@given(models(), clusters(), jobs(), st.sampled_from(["dp_shard=-1", "tp=2,dp_shard=-1", "dp_replicate=-1",
                                                     "pp=2,dp_shard=-1", "cp=2,dp_shard=-1"]),
       st.sampled_from([None, 0.001, 0.5, 1.0]))
def test_reported_mfu_and_hfu_are_at_most_one_and_json_is_strict(model, cluster, job, plan, mfu):
    try:
        est = evaluate(model, cluster, job, parse_plan(plan, world_size=cluster.n_gpus), mfu=mfu)
    except SpecError:
        return
    assert 0 <= est.mfu <= 1 and 0 <= est.hfu <= 1, (est.mfu, est.hfu)
    _strict(json.dumps(estimate_dict(est)))


def test_text_strategy_alphabet_is_not_ascii_only():
    """The plan-string fuzzing reaches other scripts' digits (the text strategy draws from all of Unicode)."""
    assert "\u0668" not in string.printable
