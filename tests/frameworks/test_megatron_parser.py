"""Megatron-LM and Megatron-Bridge exports of the plans a search returns, checked against the frameworks' own
definitions: every flag is one Megatron-LM's parser defines, with a value of its type and choices (the table
dump_megatron_flags.py read from NVIDIA/Megatron-LM@d98e8a64), every Bridge override a field of its
ConfigContainer section (NVIDIA-NeMo/Megatron-Bridge@067f987d); and, where MEGATRON_LM_SOURCE names a
checkout of Megatron-LM, its own parse_args and validate_args accept each export for the cluster's world size
and read back the plan's degrees and batch (neither Megatron-LM's training package nor Megatron-Bridge installs
from the package index on Python 3.11)."""

import json
import os
import sys
from pathlib import Path

import pytest
from tests.frameworks.extras import scenario, searched

from meshplan.errors import SpecError
from meshplan.frameworks import megatron as mg
from meshplan.frameworks.common import flag_pairs

TABLE = json.loads(Path(__file__).with_name("megatron_flags.json").read_text())
FLAGS = TABLE["megatron_lm"]["flags"]
SECTIONS = TABLE["bridge"]["sections"]
SCENARIOS = ("dense-megatron", "moe-megatron")


def exports(name: str, fmt: str):
    model, cluster, job = scenario(name)
    out = []
    for est in searched(name):
        try:
            out.append((est.plan, mg.export(model, cluster, job, est.plan, fmt)))
        except SpecError:
            continue
    return out


def check_flag(key: str, values: list[str]) -> None:
    spec = FLAGS.get(key)
    assert spec is not None, f"{key} is not a Megatron-LM flag"
    if spec["kind"] in ("store_true", "store_false", "store_const"):
        assert values == [], f"{key} takes no value"
        return
    nargs = spec["nargs"]
    assert (len(values) >= 1) if nargs in ("+", "*") else len(values) == 1, f"{key} {values}"
    for v in values:
        if spec["type"] == "int":
            int(v)
        elif spec["type"] == "float":
            float(v)
        if spec["choices"]:
            assert v in spec["choices"], f"{key} {v} not in {spec['choices']}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_megatron_lm_flags_are_its_own(name):
    checked = exports(name, "args")
    assert checked
    for _plan, ex in checked:
        for key, values in flag_pairs(list(ex.args)):
            assert key, f"stray value {values}"
            check_flag(key, values)


@pytest.mark.parametrize("name", SCENARIOS)
def test_bridge_overrides_are_config_container_fields(name):
    checked = exports(name, "bridge")
    assert checked
    for _plan, ex in checked:
        for item in ex.args:
            key, _, value = item.partition("=")
            assert value, item
            if key == "mixed_precision":
                assert value in SECTIONS["mixed_precision"]
                continue
            section, _, field = key.partition(".")
            assert field in SECTIONS[section], f"{key} is not a field of ConfigContainer.{section}"


def _megatron_lm():
    source = os.environ.get("MEGATRON_LM_SOURCE")
    if not source:
        pytest.skip("set MEGATRON_LM_SOURCE to a checkout of NVIDIA/Megatron-LM (d98e8a64 or later) to run its own "
                    "parse_args and validate_args")
    import typing
    import warnings

    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override
    sys.path.insert(0, source)
    warnings.filterwarnings("ignore")
    import megatron.training.arguments as arguments

    arguments.get_device_arch_version = lambda: 9  # Hopper; validate_args asks the GPU, which the CPU lacks
    return arguments


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_megatron_lm_parse_and_validate(name, monkeypatch, capsys):
    arguments = _megatron_lm()
    _model, cluster, job = scenario(name)
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # an H100, for the grouped GEMM
    monkeypatch.setenv("WORLD_SIZE", str(cluster.n_gpus))
    monkeypatch.setenv("RANK", "0")
    seen = set()
    for plan, ex in exports(name, "args"):
        sig = (plan.schedule, plan.model_chunks, plan.recompute, plan.sharding, plan.cp > 1, plan.ep > 1,
               plan.ep_dispatch, plan.ep_overlap, plan.async_tp, bool(plan.layout), plan.dp_replicate > 1)
        if sig in seen:
            continue
        seen.add(sig)
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
        for key, value in ex.env:
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *ex.args])
        args = arguments.parse_args()
        arguments.validate_args(args)
        capsys.readouterr()
        assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size,
                args.data_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.dp), plan.to_string()
        assert args.micro_batch_size == plan.mbs and args.global_batch_size == job.global_batch_seqs
        assert args.expert_model_parallel_size == plan.ep
        assert args.sequence_parallel == plan.sequence_parallel
        assert (args.virtual_pipeline_model_parallel_size or 1) == plan.model_chunks


@pytest.mark.parametrize("fmt", ["script", "bridge"])
def test_plan_export_on_the_default_scenario_is_megatron_s_own(fmt, capsys, monkeypatch):
    """`meshplan plan --export megatron` on the default scenario prints Megatron-LM's own flags (and, with
    MEGATRON_LM_SOURCE, arguments its parse_args and validate_args accept for 64 GPUs), or Bridge fields."""
    from meshplan.cli import main
    from meshplan.frameworks.common import split_command

    assert main(["plan", "--export", "megatron", "--format", fmt, "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    if fmt == "bridge":
        items = [i for i in split_command(out, ("run_recipe.py",)).program if "=" in i]
        assert items
        for item in items:
            key, _, value = item.partition("=")
            section, _, field = key.partition(".")
            assert (value in SECTIONS["mixed_precision"]) if not field else field in SECTIONS[section], item
        return
    cmd = split_command(out, ("pretrain_gpt.py",))
    for key, values in flag_pairs(cmd.program):
        check_flag(key, values)
    if os.environ.get("MEGATRON_LM_SOURCE"):
        arguments = _megatron_lm()
        import torch

        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
        monkeypatch.setenv("WORLD_SIZE", str(cmd.world_size))
        monkeypatch.setenv("RANK", "0")
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
        for line in out.splitlines():  # the script's exports
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *cmd.program])
        args = arguments.parse_args()
        arguments.validate_args(args)
        assert args.world_size == 64
