"""The command line, in-process: the issue's commands, JSON schema fields, and bad input."""

import json

import pytest

from meshplan.cli import main

BASE = ["--model", "seed-70b", "--cluster", "h100-sxm", "--nodes", "8", "--gpus-per-node", "8",
        "--batch-tokens", "4194304"]


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse rejects a value before the command runs
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("plan", ["dp_shard=64", "dp_shard=8,tp=8", "dp_replicate=64", "dp_replicate=8,dp_shard=8"])
def test_evaluate_json(capsys, plan):
    code, out, _ = run(capsys, "evaluate", *BASE, "--plan", plan, "--json")
    assert code == 0
    d = json.loads(out)
    for key in ("feasible", "infeasible_reasons", "plan", "memory", "flops_per_step", "step_time_s", "mfu", "comm"):
        assert key in d
    for key in ("static_bytes", "activation_bytes", "peak_bytes", "capacity_bytes"):
        assert key in d["memory"]
    for key in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "mbs", "n_microbatches", "recompute"):
        assert key in d["plan"]
    for e in d["comm"]:
        assert {"collective", "axis", "link", "bytes_per_gpu", "time_s", "exposed_s"} <= set(e)
        assert e["link"] in ("intra_node", "inter_node")
    if plan == "dp_replicate=64":
        assert d["feasible"] is False
        assert "GiB" in d["infeasible_reasons"][0]


def test_evaluate_worked_example_assumptions(capsys):
    code, out, _ = run(capsys, "evaluate", *BASE, "--plan", "dp_shard=64", "--assumptions", "worked-example",
                       "--mfu", "0.4", "--json")
    d = json.loads(out)
    assert code == 0 and d["mode"] == "worked-example"
    assert d["step_time_s"] == pytest.approx(69.6, rel=5e-3)


def test_evaluate_text(capsys):
    code, out, _ = run(capsys, "evaluate", *BASE, "--plan", "tp=8,dp_shard=8")
    assert code == 0 and "communication per step" in out and "intra_node" in out


def test_plan_overrides_json(capsys):
    code, out, _ = run(capsys, "plan", "--space", "dp-tp", "--nodes", "4", "--inter-node-bandwidth", "25",
                       "--batch-tokens", "2M", "--seq-len", "2048", "--json", "--no-conditions")
    d = json.loads(out)
    assert code == 0
    assert d["scenario"]["n_gpus"] == 32 and d["scenario"]["global_batch_tokens"] == 2 * 2**20
    assert d["recommended"]["feasible"] is True
    assert d["conditions"] == [] and d["conditions_swept"] is False
    assert (d["scenario"]["software"], d["scenario"]["compiled"]) == ("generic", False)


def test_plan_without_conditions_does_not_claim_the_plan_holds(capsys):
    code, out, _ = run(capsys, "plan", "--space", "dp-tp", "--nodes", "2", "--batch-tokens", "1M",
                       "--seq-len", "2048", "--no-conditions")
    assert code == 0 and "not computed (--no-conditions)" in out and "holds over every range swept" not in out


def test_catalog(capsys):
    code, out, _ = run(capsys, "catalog")
    assert code == 0
    for name in ("h100-sxm", "h200", "a100-40gb", "a100-80gb", "b200", "mi300x", "llama-2-7b", "llama-2-13b",
                 "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "gpt3-175b", "seed-70b",
                 "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"):
        assert name in out


@pytest.mark.parametrize(("argv", "field"), [
    (["evaluate", "--model", "gpt5", "--plan", "dp_shard=64"], "model"),
    (["evaluate", "--cluster", "tpu-v9", "--plan", "dp_shard=64"], "cluster"),
    (["evaluate", "--plan", "dp_shard=63"], "plan"),
    (["evaluate", "--plan", "tp=3,dp_shard=21,dp_replicate=1"], "plan"),
    (["evaluate", "--plan", "tp=16,dp_shard=4"], "plan.tp"),
    (["evaluate", "--plan", "dp_shard=sixty"], "plan.dp_shard"),
    (["evaluate", "--plan", "dp_shard"], "plan"),
    (["evaluate", "--plan", "frobnicate=2"], "plan"),
    (["evaluate", "--plan", "dp_shard=64,ep=2"], "plan.ep"),
    (["evaluate", "--plan", "pp=64,dp_shard=1,tp=1", "--model", "llama-2-7b"], "plan.pp"),
    (["evaluate", "--plan", "dp_shard=64", "--model", "missing.toml"], "model"),
    (["evaluate", "--plan", "dp_shard=64", "--seq-len", "1000"], "job.global_batch_tokens"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, field):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("meshplan: error:") and field in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["evaluate", "--plan", "dp_shard=64", "--nodes", "0"],
                                  ["evaluate", "--plan", "dp_shard=64", "--batch-tokens", "-5"],
                                  ["evaluate", "--plan", "dp_shard=64", "--mfu", "1.5"]])
def test_bad_numbers_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_malformed_spec_file(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("n_layers = [oops")
    code, _, err = run(capsys, "evaluate", "--model", str(bad), "--plan", "dp_shard=64")
    assert code == 2 and "malformed TOML" in err
    extra = tmp_path / "extra.toml"
    extra.write_text('name="x"\nn_layers=2\nhidden=64\nn_heads=4\nn_kv_heads=4\nffn_hidden=128\nvocab=100\nwings=2\n')
    code, _, err = run(capsys, "evaluate", "--model", str(extra), "--plan", "dp_shard=64")
    assert code == 2 and "wings" in err


def test_model_spec_file(capsys, tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text('name="tiny"\nn_layers=4\nhidden=512\nn_heads=8\nn_kv_heads=8\nffn_hidden=2048\nvocab=32000\n')
    code, out, _ = run(capsys, "evaluate", "--model", str(f), "--plan", "dp_shard=64", "--json")
    assert code == 0 and json.loads(out)["model"] == "tiny"
    f.write_text(f.read_text() + 'attention_window = 128\nglobal_attention_every = 2\ngated_mlp = "no"\n')
    code, _, err = run(capsys, "evaluate", "--model", str(f), "--plan", "dp_shard=64")
    assert code == 2 and "model.gated_mlp: must be true or false" in err
    f.write_text(f.read_text().replace('name="tiny"', "name=5").replace('gated_mlp = "no"', "gated_mlp = true"))
    code, _, err = run(capsys, "evaluate", "--model", str(f), "--plan", "dp_shard=64")
    assert code == 2 and "model.name: must be a non-empty string" in err  # a name must be text


def test_job_spec_file(capsys, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('optimizer = "adam-8bit"\nprecision = "fp8"\nsoftware = "megatron"\n'
                   '[runtime]\nallocator_fraction = 0.1\n')
    code, out, _ = run(capsys, "evaluate", "--job", str(job), "--plan", "dp_shard=64", "--json")
    d = json.loads(out)
    assert code == 0 and d["global_batch_tokens"] == 4194304  # defaults still apply
    assert "software stack: megatron" in d["notes"]
    assert not any("does not offer" in n for n in d["notes"])  # Megatron runs the default FSDP plan
    for plan, said in (("tp=8,pp=8,schedule=zb-v", "does not offer schedule=zb-v (it runs 1f1b or interleaved)"),
                       ("dp_shard=64,sharding=zero3", "does not offer sharding=zero3 (it runs megatron or fsdp; "
                                                      "estimated as DeepSpeed ZeRO-3)")):
        code, out, _ = run(capsys, "evaluate", "--job", str(job), "--plan", plan, "--json")
        assert code == 0 and any(said in n for n in json.loads(out)["notes"])  # estimated, and said so
    bad = tmp_path / "bad.toml"
    bad.write_text('optimiser = "adamw"\n')
    code, _, err = run(capsys, "evaluate", "--job", str(bad), "--plan", "dp_shard=64")
    assert code == 2 and "optimiser" in err and "allowed" in err
    code, _, err = run(capsys, "evaluate", "--job", str(tmp_path / "missing.toml"), "--plan", "dp_shard=64")
    assert code == 2 and "not found" in err
    bad.write_text('compiled = "yes"\n')  # a string is not a switch
    code, _, err = run(capsys, "evaluate", "--job", str(bad), "--plan", "dp_shard=64")
    assert code == 2 and "job.compiled: must be true or false" in err


def _catalog_accelerator(name: str) -> str:
    from importlib import resources
    return resources.files("meshplan.catalog").joinpath(f"accelerators/{name}.toml").read_text()


@pytest.mark.parametrize("args, says", [
    (["evaluate", "--plan", "tp=0,dp_shard=-1"], "plan.tp: must be a whole number of at least 1"),
    (["evaluate", "--plan", "tp=-2,dp_shard=-1"], "plan.tp: must be a whole number of at least 1"),
    (["evaluate", "--job", "{job}", "--plan", "dp_shard=64"], "job.runtime: must be a table"),
    (["evaluate", "--model", "{binary}", "--plan", "dp_shard=64"], "is not UTF-8 text"),
    (["evaluate", "--profile", "{binary}", "--plan", "dp_shard=64"], "profile: file"),
    (["validate", "{binary}"], "is not UTF-8 text"),
    (["validate", "{header}"], "has a header but no data rows"),
    (["validate", "{header}", "--cv", "1"], "validate --cv: must be 0 (no cross-validation) or at least 2"),
    (["validate", "{header}", "--cv", "-1"], "validate --cv: must be 0"),
    (["validate", "{header}", "--cv", "0", "--max-cv-mape", "6"], "a fraction in (0, 1]"),
    (["validate", "{header}", "--cv", "0", "--plot", "{dir}/out.txt"], "must end in .png"),
    (["validate", "{header}", "--cv", "0", "--plot", "{dir}/no/out.png"], "does not exist"),
    (["report", "--out", "{job}", "--no-conditions"], "argument --out: "),
    (["report", "--out", "{job}/sub", "--no-conditions"], "is a file, not a folder"),
    (["evaluate", "--plan", "dp_shard=64", "--trace", "{dir}/no/x.json"], "does not exist"),
    (["evaluate", "--plan", "dp_shard=64", "--trace", "{dir}"], "must end in .json"),
    (["sweep", "--vary", "gpus=8..16", "--plot", "{dir}/x.svg"], "must end in .png"),
    (["sweep", "--vary", "inter-node-bandwidth=1..inf", "--json"], "bad range '1..inf'"),
    (["sweep", "--vary", "seq-len=3000..5000", "--points", "3"], "gives a scenario that can be built"),
    (["evaluate", "--plan", "dp_shard=64", "--nodes", "inf"], "argument --nodes"),
    (["evaluate", "--plan", "dp_shard=64", "--nodes", "1e400"], "argument --nodes"),
    (["evaluate", "--plan", "dp_shard=-1", "--nodes", "10000000"], "cluster.nodes: at most"),
    (["evaluate", "--plan", "dp_shard=64", "--inter-node-bandwidth", "1e-320"], "between 0.001 and"),
    (["evaluate", "--plan", "dp_shard=64", "--mfu", "1e-320"], "argument --mfu"),
    (["evaluate", "--plan", "dp_shard=64", "--job", "{inf_job}"], "job.reduce_dtype_bytes: must be a positive number "
                                                                  "of at most 8, got inf"),
    (["evaluate", "--plan", "dp_shard=64", "--job", "{nan_job}"], "job.moe_routing_imbalance"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{profile}"], "profile.gemm_best_flop_per_s"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{profile_inf}"], "profile.collective_fits.all_gather@"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{profile_slow}"], "from 1 MB/s to 100 TB/s"),
    (["evaluate", "--plan", "dp_shard=-1", "--cluster", "{node3}"], "cluster.node: must be a table"),
    (["evaluate", "--plan", "tp=8,pp=8", "--assumptions", "worked-example"], "no term for pp=8"),
    (["evaluate", "--plan", "dp_shard=64,reshard_after_forward=maybe"], "true, false or a group size"),
    (["evaluate", "--plan", "tp=8,dp_shard=8,reshard_after_forward=4"], "(DTensor) parameters to a smaller group"),
    (["evaluate", "--model", "deepseek-v3", "--nodes", "128", "--plan", "pp=16,ep=64,dp_shard=64,schedule=zb-v"],
     "Megatron runs no ZB-V"),
    (["evaluate", "--job", "{dir}", "--plan", "dp_shard=64"], "is a folder"),
    # found by the twenty-first session's review (tracebacks, hangs, silent misreadings)
    (["evaluate", "--model", "{big}", "--plan", "dp_shard=-1"], "model.n_layers: must be a whole number from 1 "
                                                                "to 100,000, got 1000000000000"),
    (["evaluate", "--plan", "pp=2,dp_shard=32,layout=(t*99999)*99999"], "expands to more than 1,000,000"),
    (["evaluate", "--plan", "dp_shard=-1", "--batch-tokens", "1e30"], "job.global_batch_tokens: must be a whole "
                                                                      "number from 1 to"),
    (["evaluate", "--plan", "dp_shard=-1", "--job", "{huge_batch}"], "job.global_batch_tokens: must be a whole "
                                                                     "number from 1 to"),
    (["evaluate", "--plan", "dp_shard=64,mbs=1" + "0" * 400], "plan.mbs: must be a whole number from 1 to"),
    (["evaluate", "--model", "mixtral-8x7b", "--nodes", "4", "--plan", "ep=-1,dp_shard=32"], "plan.ep: cannot be -1"),
    (["evaluate", "--cluster", "{accname}", "--plan", "dp_shard=-1"], "accelerator.name: must be a string"),
    (["evaluate", "--cluster", "{slownic}", "--plan", "dp_shard=-1"], "cluster.node.nic_gb_per_s: must be a number "
                                                                      "from 0.001 to 100000"),
    (["evaluate", "--model", "{deep}", "--plan", "dp_shard=-1"], "nested too deeply"),
    (["evaluate", "--model", "{json_model}", "--plan", "dp_shard=-1"], "(spec files are TOML, not JSON)"),
    (["evaluate", "--seq-len", "4095", "--batch-tokens", "4193280", "--plan", "tp=8,dp_shard=8"],
     "plan.sp: sequence parallelism splits seq_len=4095 over tp=8"),
    (["sweep", "--vary", "batch-tokens=2M..4M", "--points", "1"], "argument --points: must be from 2 to 200"),
    (["validate", "{header}", "--cv", "2", "--cv-rounds", "0"], "argument --cv-rounds: must be from 1 to 50"),
    (["validate", "{dir}"], "is a folder"),
    (["validate", "{twice}", "--cv", "0"], "repeats columns vocab"),
    (["validate", "{skipped}", "--cv", "0"], "has no row meshplan can model"),
    (["report", "--out", "", "--no-conditions"], "expected a folder name"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{profile_op}"], "op must be one of"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{profile_neg}"], "must be finite, and a bus bandwidth"),
    (["crosscheck", "--scale-down", "--plan", "dp_shard=1000000"], "up to 4,096 ranks"),
    (["evaluate", "--plan", "tp=8,pp=8,mbs=1,recompute=full,recompute_layers=100"], "allowed 1..10"),
])
def test_malformed_inputs_name_the_field_and_exit_2_without_a_traceback(capsys, tmp_path, args, says):
    """What a user's review found raising instead (ZeroDivisionError, TypeError, UnicodeDecodeError)."""
    fit = '{"schema": "meshplan.profile/1", "collective_fits": {"all_gather@intra_node": {"alpha_s": 1e-5, '
    files = {  # {name} in args -> the file name.toml/.csv/.json written with this content
        "job.toml": "runtime = 5\n",
        "binary.toml": b"\xff\xfe\x00",
        "header.csv": "model,n_layers,hidden,n_heads,vocab,seq_len,gpu_type,n_gpus,tp,pp,source_group,precision,"
                      "global_batch_size,tokens_per_sec_per_gpu\n",
        "inf_job.toml": "reduce_dtype_bytes = inf\n",
        "nan_job.toml": "moe_routing_imbalance = nan\n",
        "profile.json": '{"schema": "meshplan.profile/1", "gemm_best_flop_per_s": "fast"}',
        "node3.toml": 'accelerator = "h100-sxm"\nnode = 3\n',
        "profile_inf.json": fit + '"busbw_bytes_per_s": 2e10, "ranks_per_node": 1e999}}}',
        "profile_slow.json": fit + '"busbw_bytes_per_s": 1e-300}}}',
        "profile_op.json": '{"schema": "meshplan.profile/1", "collective_fits": {"frobnicate@warp_link": '
                           '{"alpha_s": 1e-5, "busbw_bytes_per_s": 2e10}}}',
        "profile_neg.json": fit + '"busbw_bytes_per_s": -2e10}}}',
        "big.toml": 'name = "big"\nn_layers = 1000000000000\nhidden = 256\nn_heads = 4\nn_kv_heads = 4\n'
                    'ffn_hidden = 1024\nvocab = 1000\n',
        "huge_batch.toml": 'global_batch_tokens = "1000000G"\n',
        "accname.toml": _catalog_accelerator("h100-sxm").replace('name = "h100-sxm"', 'name = ["x"]'),
        "slownic.toml": 'accelerator = "h100-sxm"\n[node]\nnic_gb_per_s = 1e-9\n',
        "deep.toml": "name = " + "[" * 5000 + "]" * 5000 + "\n",
        "json_model.toml": '{"name": "x"}',
        "twice.csv": "model,n_layers,hidden,n_heads,vocab,seq_len,gpu_type,n_gpus,tp,pp,source_group,precision,"
                     "global_batch_size,tokens_per_sec_per_gpu,vocab\n",
        "skipped.csv": "model,n_layers,hidden,n_heads,vocab,seq_len,gpu_type,n_gpus,tp,pp,source_group,precision,"
                       "global_batch_size,tokens_per_sec_per_gpu\nx,2,256,4,1000,128,V100,8,1,1,g,bf16,8,100\n",
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    paths = {name.split(".")[0]: str(tmp_path / name) for name in files} | {"dir": str(tmp_path)}
    code, _, err = run(capsys, *(a.format(**paths) for a in args))
    assert code == 2 and says in err and "Traceback" not in err, err


@pytest.mark.parametrize("text, says", [
    ('accelerator = "h100-sxm"\nnodes = 2\n[node]\nnic_gb_per_s = "fast"\n',
     "cluster.node.nic_gb_per_s: must be a number from 0.001 to 100000, got 'fast'"),
    ('accelerator = "h100-sxm"\n[node]\nnic_gb_per_s = -50\n', "cluster.node.nic_gb_per_s: must be a number from "
                                                               "0.001 to 100000, got -50"),  # the file's key and value
    ('accelerator = "h100-sxm"\n[node]\nnvls_min_gpus = "five"\n', "cluster.node.nvls_min_gpus: must be a whole "
                                                                   "number from 1"),
    ('accelerator = "h100-sxm"\n[node]\nnic_efficiency = 1.5\n', "cluster.node.nic_efficiency: must be a number in"),
    ("nodes = 2\n", "cluster.accelerator: is missing"),
])
def test_cluster_file_values_are_checked_under_their_own_keys(capsys, tmp_path, text, says):
    """A user's review: text in a [node] table raised ValueError from float(); a negative rate was reported
    as cluster.inter.nic_bytes_per_s in bytes; a file without its accelerator read as an accelerator's."""
    f = tmp_path / "cluster.toml"
    f.write_text(text)
    code, _, err = run(capsys, "evaluate", "--cluster", str(f), "--plan", "dp_shard=-1")
    assert code == 2 and says in err and "Traceback" not in err, err


def test_runtime_overheads_name_the_field(capsys, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[runtime]\ncuda_context_bytes = "half a gig"\n')
    code, _, err = run(capsys, "evaluate", "--job", str(job), "--plan", "dp_shard=64")
    assert code == 2 and "job.runtime.cuda_context_bytes: must be a non-negative finite number" in err


def test_the_shard_group_under_context_parallelism_is_named_with_it(capsys):
    """A user's review: FSDP over cp=8 with dp_shard=1 was shown on the 'dp_shard' group of 8 GPUs."""
    code, out, _ = run(capsys, "evaluate", "--model", "llama-3-8b", "--nodes", "1", "--batch-tokens", "1M",
                       "--seq-len", "32768", "--plan", "cp=8")
    assert code == 0 and "all_gather      dp_shard_cp  intra_node  8" in out
    # the time breakdown names the group as the table does (it had kept the internal axis 'dp_shard')
    assert "exposed reduce_scatter (dp_shard_cp)" in out and "(dp_shard)" not in out


def test_a_job_file_takes_token_counts_as_the_command_line_does(capsys, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('global_batch_tokens = "4M"\nseq_len = "4K"\n')
    code, out, _ = run(capsys, "evaluate", "--job", str(job), "--plan", "dp_shard=64", "--json")
    assert code == 0 and json.loads(out)["global_batch_tokens"] == 4 * 2**20
    job.write_text('global_batch_tokens = "lots"\n')
    code, _, err = run(capsys, "evaluate", "--job", str(job), "--plan", "dp_shard=64")
    assert code == 2 and "job.global_batch_tokens: must be a whole number of tokens" in err



def test_expert_tp_may_be_given_as_the_plans_tp(capsys):
    """The README writes expert-TP as ``etp=tp``: the plan's own tp, as a number would give it."""
    args = ["evaluate", "--model", "mixtral-8x7b", "--nodes", "4", "--json", "--plan"]
    code, out, _ = run(capsys, *args, "ep=8,tp=2,dp_shard=-1,etp=tp,sharding=megatron")
    code2, out2, _ = run(capsys, *args, "ep=8,tp=2,dp_shard=16,etp=2,sharding=megatron")
    assert code == code2 == 0 and json.loads(out)["plan"] == json.loads(out2)["plan"]


@pytest.mark.parametrize("plan, says", [
    ("dp_shard=64,cp_impl=a2a,sharding=megatron", "plan.cp_impl: chooses how context parallelism"),
    ("dp_shard=64,layout=Et*80L", "plan.layout: applies to a pipeline"),
    ("dp_shard=64,schedule=gpipe", "plan.schedule: applies to a pipeline"),
])
def test_options_of_an_axis_the_plan_does_not_have_are_refused(capsys, plan, says):
    """A context-parallel exchange without cp, a pipeline schedule or layout without pp: echoed back as if
    they applied before (a review, twenty-first session). Sequence parallelism at tp=1 stays accepted, as
    Megatron accepts it (published rows record it so)."""
    code, _, err = run(capsys, "evaluate", "--plan", plan)
    assert code == 2 and says in err, err


def test_conditions_walk_past_a_depth_the_model_cannot_have(capsys, tmp_path):
    """A four-layer model with one MTP depth: the conditions' layer walk halves the depth to one layer,
    which the model spec refuses (MTP depths below the layers); that value cannot be built, and the report
    goes on (a review found plan and report stopping there with the spec's error)."""
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny-mtp"\nn_layers = 4\nhidden = 1024\nn_heads = 16\nn_kv_heads = 16\n'
                    'ffn_hidden = 4096\nvocab = 32000\nmtp_layers = 1\n')
    code, out, err = run(capsys, "plan", "--model", str(spec), "--nodes", "1", "--seq-len", "2048",
                         "--batch-tokens", "256K", "--jobs", "1")
    assert code == 0, err
    assert "When to change the plan" in out


def test_the_tp_alternative_runs_without_sequence_parallelism_where_the_sequence_does_not_split(capsys):
    """Question 3's TP=8 plan at a sequence of 4,100 tokens (not a multiple of 8): sequence parallelism
    cannot split it, so the plan runs without it, as the search would, rather than leaving the section
    empty."""
    code, out, err = run(capsys, "plan", "--model", "llama-3-8b", "--nodes", "2", "--seq-len", "4100",
                         "--batch-tokens", str(4100 * 64), "--no-conditions", "--jobs", "1")
    assert code == 0, err
    section = out.split("3. The 2-D alternative")[1].split("4. ")[0]
    assert "Predicted tp (intra_node, 8 GPUs)" in section


def test_a_sweep_says_where_its_evaluated_values_leave_the_range(capsys):
    """GPUs move in whole nodes: gpus=1..7 on 8-GPU nodes evaluates 8, and says so."""
    code, out, err = run(capsys, "sweep", "--vary", "gpus=1..7", "--points", "2", "--jobs", "1")
    assert code == 0, err
    assert "8 lies outside 1..7" in out and "whole nodes of 8" in out
