"""`meshplan measure` end to end on the CPU: 2 gloo processes started with --nproc 2 (torchrun).

The issue's two commands run as written; the profiles they write must pass the schema check and be
accepted by meshplan.profile.load_profile and apply_profile. Failure paths: a failing rank, a stuck
run, no torchrun, no torch.
"""

import importlib.util
import json
from pathlib import Path

import pytest
from tests.conftest import requires_torch

from meshplan import load_cluster, load_model
from meshplan.cli import main
from meshplan.harness.measure.launch import _descendants
from meshplan.harness.measure.profile_io import check_profile
from meshplan.harness.measure_cli import TORCH_MISSING
from meshplan.profile import apply_profile, load_profile

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("measure")


@pytest.fixture(scope="module")
def collectives_profile(workdir):
    """`meshplan measure collectives --nproc 2 --backend gloo --out profile.json` (1 KiB .. 64 MiB)."""
    out = workdir / "profile.json"
    code = main(["measure", "collectives", "--nproc", "2", "--backend", "gloo", "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def step_profile(workdir):
    """`meshplan measure step --nproc 2 --backend gloo --model llama-3-8b --scale-down --plan dp_shard=2
    --out step.json`, with --compare."""
    out = workdir / "step.json"
    code = main(["measure", "step", "--nproc", "2", "--backend", "gloo", "--model", "llama-3-8b", "--scale-down",
                 "--plan", "dp_shard=2", "--out", str(out), "--compare", "--steps", "3"])
    assert code == 0
    return out


def _accepted(path: Path) -> dict:
    data = load_profile(path)
    assert check_profile(data) == []
    apply_profile(load_cluster("h100-sxm", nodes=1), data)
    return data


@requires_torch
def test_collectives_profile_matches_schema(collectives_profile):
    data = _accepted(collectives_profile)
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["device"] == "cpu"
    assert {(c["op"], c["link"]) for c in data["collectives"]} == {(op, "intra_node") for op in OPS}
    sizes = sorted({c["message_bytes"] for c in data["collectives"]})
    assert sizes[0] == 1024 and sizes[-1] == 64 * 2**20
    for c in data["collectives"]:
        factor = {"all_reduce": 1.0, "send_recv": 1.0}.get(c["op"], 0.5)  # 2(n-1)/n, 1, (n-1)/n at n = 2
        assert c["algbw_bytes_per_s"] == pytest.approx(c["message_bytes"] / c["median_s"])
        assert c["busbw_bytes_per_s"] == pytest.approx(c["algbw_bytes_per_s"] * factor)
    for key, fit in data["collective_fits"].items():
        assert key.endswith("@intra_node") and fit["busbw_bytes_per_s"] > 0 and fit["alpha_s"] >= 0
        assert fit["group_size"] == 2 and fit["n_points"] == len(sizes)


@requires_torch
def test_apply_profile_uses_measured_collectives(collectives_profile):
    fits = load_profile(collectives_profile)["collective_fits"]
    cluster, notes = apply_profile(load_cluster("h100-sxm", nodes=1), load_profile(collectives_profile))
    assert any(n.startswith("profile: ") for n in notes)
    ring = [f["busbw_bytes_per_s"] for k, f in fits.items() if k.split("@")[0] in ("all_gather", "reduce_scatter")]
    if ring:  # both set the one ring figure; apply_profile keeps the last key's
        assert cluster.intra.ring_busbw_bytes_per_s in ring


@requires_torch
def test_gemm_merges_into_existing_profile(collectives_profile, capfd):
    code = main(["measure", "gemm", "--nproc", "2", "--model", "llama-3-8b", "--scale-down", "--plan", "tp=2",
                 "--out", str(collectives_profile)])
    out, err = capfd.readouterr()
    assert code == 0 and "lm_head" in out and "[measure gemm]" in err
    data = _accepted(collectives_profile)
    assert [g["dtype"] for g in data["gemm"]] == ["bf16"] * 5  # FP8 skipped on a CPU
    assert any("FP8 GEMMs skipped" in n for n in data["notes"])
    assert data["gemm_best_flop_per_s"] == max(g["flop_per_s"] for g in data["gemm"])
    assert all(g["p10_s"] <= g["median_s"] <= g["p90_s"] for g in data["gemm"])
    assert len(data["collectives"]) == 5 * 9  # the earlier sweep is kept
    _, notes = apply_profile(load_cluster("h100-sxm", nodes=1), data)
    assert any("measured on a CPU" in n for n in notes)


@requires_torch
def test_gemm_default_sweep_json(workdir, capfd):
    code = main(["measure", "gemm", "--nproc", "2", "--json"])
    out, _ = capfd.readouterr()
    d = json.loads(out[out.index("{"):])
    assert code == 0 and d["gemm_best_flop_per_s"] > 0
    assert any(g["m"] == g["n"] == g["k"] for g in d["gemm"]) and any(g["m"] < 256 for g in d["gemm"])


@requires_torch
def test_step_profile_trace_and_comparison(step_profile, capfd):
    data = _accepted(step_profile)
    step = data["step"]
    assert step["plan"].startswith("dp_shard=2") and step["model"] == "llama-3-8b-scaled"
    assert step["step_time_s"] > 0 and step["tokens_per_s"] == pytest.approx(2 * 256 / step["step_time_s"])
    assert step["mfu"] is None and "CPU" in step["mfu_note"]
    assert len(step["peak_memory_bytes_per_rank"]) == 2 and min(step["peak_memory_bytes_per_rank"]) > 0
    assert len(step["rank_step_time_spread"]["median_s_by_rank"]) == 2
    assert {"all_gather", "reduce_scatter"} <= set(step["exposed_comm_s_by_collective"])
    assert all(0 <= step["exposed_comm_s_by_collective"][k] <= step["comm_s_by_collective"][k] + 1e-9
               for k in step["exposed_comm_s_by_collective"])
    assert {f["figure"] for f in step["predicted"]["figures"]} >= {"step time", "tokens/s", "peak memory (max rank)",
                                                                   "exposed all_gather"}
    trace = json.loads(Path(step["trace"]).read_text())
    assert any(e.get("name") == "meshplan.step" for e in trace["traceEvents"])


@requires_torch
def test_compare_subcommand_reads_saved_profile(step_profile, capsys):
    code = main(["measure", "compare", "--profile", str(step_profile)])
    out = capsys.readouterr().out
    assert code == 0
    for figure in ("step time", "tokens/s", "exposed all_gather", "exposed reduce_scatter", "peak memory"):
        assert figure in out
    assert "predicted" in out and "measured" in out


@requires_torch
def test_step_tensor_parallel(workdir):
    out = workdir / "tp.json"
    code = main(["measure", "step", "--nproc", "2", "--model", "llama-3-8b", "--scale-down", "--plan", "tp=2",
                 "--seq-len", "64", "--steps", "2", "--out", str(out)])
    assert code == 0
    step = _accepted(out)["step"]
    assert step["plan"].startswith("tp=2") and step["global_batch_tokens"] == 64


@requires_torch
def test_failing_rank_ends_run_with_one_line(monkeypatch, capfd):
    monkeypatch.setenv("MESHPLAN_MEASURE_FAULT", "raise@1")
    code = main(["measure", "collectives", "--nproc", "2", "--max-bytes", "4K"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("meshplan: error: measure collectives failed on rank 1 of 2: RuntimeError: fault")
    assert not any("ChildFailedError" in line for line in err)


@requires_torch
def test_stuck_run_is_stopped_at_timeout(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("MESHPLAN_MEASURE_FAULT", "hang@all")
    marker = str(tmp_path / "stuck.json")  # unique to this run: other runs on the machine are not counted
    code = main(["measure", "collectives", "--nproc", "2", "--max-bytes", "4100", "--timeout", "2", "--out", marker])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 1 and "did not finish within 12 s" in err[-1] and "stopped its 2 processes" in err[-1]
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline")
            if b"measure_worker" in _read(p) and marker.encode() in _read(p)]
    assert left == []


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError:
        return b""


@requires_torch
def test_bad_plan_rejected_before_start(capsys):
    assert main(["measure", "step", "--nproc", "2", "--plan", "tp=4"]) == 2
    assert "needs 4 ranks" in capsys.readouterr().err


def test_out_folder_created_or_refused_before_start(tmp_path, capsys):
    """--out's folder is made before measuring, so that a run does not fail only when writing its results;
    one that cannot be made is a bad input, exit 2, before any process starts."""
    assert main(["measure", "gemm", "--nproc", "1", "--backend", "gloo", "--out", "/proc/no/such/p.json"]) == 2
    assert "cannot create the folder" in capsys.readouterr().err
    from meshplan.harness.measure_cli import check_inputs

    out = tmp_path / "a" / "b" / "p.json"
    args = type("A", (), {"plan": None, "model": None, "out": str(out), "measure_command": "gemm"})()
    check_inputs(args, 1)
    assert out.parent.is_dir()


def test_without_torchrun_says_how_to_launch(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch to get past the extra check")
    assert main(["measure", "collectives"]) == 2
    err = capsys.readouterr().err
    assert "torchrun" in err and "--nproc" in err


def test_missing_torch_exits_2_with_install_hint(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["measure", "gemm", "--nproc", "2"]) == 2
    assert capsys.readouterr().err.strip() == TORCH_MISSING


def test_descendants_of_nothing():
    assert _descendants(2**22 + 12345) == []


@requires_torch
def test_measure_moe_on_two_gloo_ranks(workdir, capfd):
    """`meshplan measure moe --backend gloo --nproc 2` (CI, CPU): the default sweep, then a scaled-down
    DeepSeek-V3 plan's expert shapes merged into the same profile, which `evaluate --profile` takes."""
    out = workdir / "moe.json"
    assert main(["measure", "moe", "--backend", "gloo", "--nproc", "2", "--out", str(out)]) == 0
    text, err = capfd.readouterr()
    assert "[measure moe]" in err and "per_expert" in text and "permute" in text
    data = _accepted(out)
    moe = data["moe"]
    assert moe["reference_gemm"]["flop_per_s"] > 0
    assert {e["kernel"] for e in moe["expert_gemm"]} == {"per_expert", "grouped"}  # torch 2.13 has _grouped_mm
    for e in moe["expert_gemm"]:
        assert e["flop_per_s"] == pytest.approx(2 * e["groups"] * e["m"] * e["n"] * e["k"] / e["median_s"])
        assert e["relative_efficiency"] == pytest.approx(e["flop_per_s"] / moe["reference_gemm"]["flop_per_s"])
    assert [p["pass"] for p in moe["passes"]] == ["router", "permute", "unpermute"]
    code = main(["measure", "moe", "--backend", "gloo", "--nproc", "2", "--model", "deepseek-v3", "--scale-down",
                 "--plan", "ep=2,dp_shard=2", "--out", str(out)])
    assert code == 0
    merged = _accepted(out)["moe"]
    spec = load_model("deepseek-v3")
    from meshplan.harness.reference_model import scale_down

    small = scale_down(spec)
    widths = {(e["n"], e["k"]) for e in merged["expert_gemm"]}
    assert (2 * small.expert_ffn_hidden, small.hidden) in widths and (small.hidden, small.expert_ffn_hidden) in widths
    assert len(merged["expert_gemm"]) > len(moe["expert_gemm"])  # the default sweep is kept
    cluster, notes = apply_profile(load_cluster("h100-sxm", nodes=1), load_profile(out))
    assert cluster.accelerator.moe_pass_bytes_per_s > 0
    assert any("MoE permutation passes measured" in n for n in notes)
    assert main(["evaluate", "--model", "mixtral-8x7b", "--nodes", "4", "--plan", "ep=8,dp_shard=32",
                 "--profile", str(out)]) == 0
