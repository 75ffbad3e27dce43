"""The command line: meshplan export, plan --export / --from, evaluate --export / --from, --model config.json."""

import json
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.frameworks.command import read

HF = Path(__file__).with_name("hf_configs")


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("stack", ["torchtitan", "megatron", "deepspeed"])
def test_plan_export_on_the_default_scenario_prints_a_launch_script(capsys, stack):
    out = run(capsys, "plan", "--export", stack, "--jobs", "1")
    assert out.startswith("# meshplan plan: ") and "assumed" in out
    back = read(stack, out, world_size=None)
    assert back.world_size == 64 and back.plan.world_size == 64


def test_export_writes_the_file_it_is_asked_for(capsys, tmp_path):
    target = tmp_path / "run.sh"
    out = run(capsys, "export", "megatron", "--plan", "tp=4,pp=16,sharding=megatron", "--out", str(target))
    assert "wrote the megatron settings (script)" in out
    assert "--tensor-model-parallel-size 4" in target.read_text()
    cfg = run(capsys, "export", "deepspeed", "--plan", "dp_shard=64,sharding=zero3", "--format", "json")
    assert json.loads(cfg)["zero_optimization"]["stage"] == 3


def test_a_refused_plan_exits_2_with_one_line(capsys):
    assert main(["export", "torchtitan", "--model", "llama-3-8b", "--plan", "dp_shard=64,sharding=zero1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "export.torchtitan" in err and "ZeRO-1" in err


def test_evaluate_from_an_export_gives_the_exported_plan(capsys, tmp_path):
    script = tmp_path / "run.sh"
    run(capsys, "export", "megatron", "--plan", "tp=4,pp=16,sharding=megatron,mbs=2,recompute=none", "--out",
        str(script))
    out = json.loads(run(capsys, "evaluate", "--from", "megatron", str(script), "--json"))
    assert out["plan"]["string"] == "tp=4,pp=16,mbs=2,recompute=none,sharding=megatron"
    assert any(n.startswith("read from megatron") for n in out["notes"])


def test_plan_from_says_what_meshplan_would_change(capsys):
    out = run(capsys, "plan", "--from", "torchtitan", "torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train "
              "--module llama3 --config llama3_70b --training.local_batch_size 2 --training.global_batch_size 1024 "
              "--training.seq_len 4096 --metrics.log_freq 10", "--jobs", "1")
    assert "your torchtitan configuration: TP=8 x FSDP=8" in out
    assert "meshplan would run:" in out and "change:" in out
    assert "settings read and not modelled: --metrics.log_freq 10" in out


def test_model_config_json(capsys):
    out = json.loads(run(capsys, "evaluate", "--model", str(HF / "qwen3-8b" / "config.json"), "--nodes", "1",
                         "--batch-tokens", "1M", "--plan", "dp_shard=8", "--json"))
    assert out["model"] == "qwen3-8b" and out["feasible"]
    assert main(["evaluate", "--model", str(HF / "missing" / "config.json"), "--plan", "dp_shard=64"]) == 2
