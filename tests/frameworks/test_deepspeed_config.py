"""DeepSpeed 0.19.8's own DeepSpeedConfig accepts every DeepSpeed export of the plans a search returns for its
data-parallel size (passed as Megatron-DeepSpeed's mpu does), and reads back its batch split and ZeRO stage;
the Megatron-DeepSpeed arguments that go with a TP, PP or Ulysses plan are its parser's own flags (the table
dump_megatron_flags.py read from deepspeedai/Megatron-DeepSpeed@4efb479d)."""

import json
import os
from pathlib import Path

import pytest
from tests.frameworks.extras import require, scenario
from tests.frameworks.test_roundtrip import plans_of

from meshplan.errors import SpecError
from meshplan.frameworks import deepspeed as ds
from meshplan.frameworks.common import flag_pairs

MDS_FLAGS = json.loads(Path(__file__).with_name("megatron_flags.json").read_text())["megatron_deepspeed"]["flags"]
NAMES = ("dense-generic", "small-generic", "dense-megatron-zero")


def exports():
    out = []
    for name in NAMES:
        model, cluster, job = scenario("dense-megatron" if name == "dense-megatron-zero" else name)
        for est in plans_of(name):
            try:
                out.append((est.plan, ds.export(model, cluster, job, est.plan), job))
            except SpecError:
                continue
    return out


class MPU:
    """What DeepSpeedConfig asks Megatron-DeepSpeed's mpu: the data-parallel size its batch check divides by."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module")
def deepspeed_config():
    require("deepspeed")
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    if not dist.is_initialized():
        dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return DeepSpeedConfig


@pytest.mark.slow
def test_deepspeed_config_accepts_every_export_for_its_world_size(deepspeed_config):
    checked = exports()
    assert len(checked) >= 5
    for plan, ex, job in checked:
        cfg = ds.ds_config(plan, job)
        c = deepspeed_config(cfg, mpu=MPU(plan.dp))
        assert c.world_size == plan.dp
        assert c.train_batch_size == job.global_batch_seqs and c.train_micro_batch_size_per_gpu == plan.mbs
        assert c.gradient_accumulation_steps * plan.mbs * plan.dp == job.global_batch_seqs
        assert c.zero_optimization_stage == ds.STAGES.get(plan.sharding, 0)
        with pytest.raises(AssertionError):  # the same config on another data-parallel size is refused
            deepspeed_config(cfg, mpu=MPU(plan.dp * 2))
        assert json.loads(ex.text[ex.text.index("<<'EOF'\n") + 8:ex.text.index("\nEOF\n")]) == cfg


def test_megatron_deepspeed_arguments_are_its_own():
    checked = [(p, ex) for p, ex, _ in exports() if ds.uses_megatron_deepspeed(p)]
    assert checked
    for _plan, ex in checked:
        for key, values in flag_pairs(list(ex.args)):
            assert key in MDS_FLAGS, f"{key} is not a Megatron-DeepSpeed flag"
            assert (values == []) == (MDS_FLAGS[key]["kind"] in ("store_true", "store_false")), key


def test_plan_export_on_the_default_scenario_is_accepted(deepspeed_config, capsys):
    """`meshplan plan --export deepspeed` on the default scenario writes a ds_config DeepSpeed accepts for its
    data-parallel size."""
    from meshplan.cli import main

    assert main(["plan", "--export", "deepspeed", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    back = ds.read(out)
    cfg = json.loads(out[out.index("<<'EOF'\n") + 8:out.index("\nEOF\n")])
    assert deepspeed_config(cfg, mpu=MPU(back.plan.dp)).train_batch_size == cfg["train_batch_size"]
