"""torchtitan 0.3.0's own config manager parses every torchtitan export of the plans a search returns, and
the degrees, batch sizes, pipeline schedule and stages, and checkpointing mode read back equal the plan's;
torchtitan's own ParallelDims accepts the degrees for the cluster's GPU count."""

import logging
import warnings

import pytest
from tests.frameworks.extras import require, scenario, searched

from meshplan.errors import SpecError
from meshplan.frameworks import torchtitan as tt

SCENARIOS = ("dense-torchtitan", "moe-torchtitan", "long-torchtitan")
AC = {"none": type(None), "full": "FullAC", "sac": "SelectiveAC"}


def signature(plan) -> tuple:
    """What decides which settings an export writes: one plan of each signature is parsed (each parse builds
    torchtitan's whole command line; every plan's round trip is checked in test_frameworks_roundtrip.py)."""
    return (plan.schedule if plan.pp > 1 else "", plan.model_chunks, plan.recompute, plan.sequence_parallel,
            plan.reshard_after_forward, plan.async_tp, plan.cp > 1, plan.ep > 1, plan.tp > 1, plan.dp_replicate > 1,
            plan.dp_shard > 1)


def exports(name: str):
    model, cluster, job = scenario(name)
    out, seen = [], set()
    for est in searched(name):
        if signature(est.plan) in seen:
            continue
        try:
            out.append((est.plan, tt.export(model, cluster, job, est.plan)))
        except SpecError:
            continue
        seen.add(signature(est.plan))
    return out


@pytest.fixture(scope="module")
def titan():
    require("torchtitan.config.manager")
    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    return ConfigManager, ParallelDims, _get_pipeline_metadata


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_config_manager_reads_back_the_plan(titan, name):
    ConfigManager, ParallelDims, pipeline_metadata = titan
    _model, cluster, job = scenario(name)
    checked = exports(name)
    assert checked, "the search returned no plan torchtitan runs"
    for plan, ex in checked:
        c = ConfigManager().parse_args(list(ex.args))
        p, t = c.parallelism, c.training
        dims = ParallelDims.from_config(p, cluster.n_gpus)
        assert (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp, dims.ep) == \
            (plan.dp_replicate, plan.dp_shard, plan.cp, plan.tp, plan.pp, plan.ep), plan.to_string()
        assert p.enable_sequence_parallel == (plan.sequence_parallel or plan.tp == 1)
        assert t.seq_len == job.seq_len and t.global_batch_size == job.global_batch_seqs
        accumulation = t.global_batch_size // (t.local_batch_size * plan.dp)
        assert t.global_batch_size == accumulation * t.local_batch_size * plan.dp
        ac = c.activation_checkpoint
        assert (ac is None) if plan.recompute == "none" else type(ac).__qualname__.startswith(AC[plan.recompute])
        assert c.compile.enable == job.compiled and c.compile.enable_async_tensor_parallel == plan.async_tp
        if plan.pp > 1:
            assert p.pipeline_parallel_schedule == tt.SCHEDULE_NAMES[plan.schedule]
            assert p.pipeline_parallel_microbatch_size == plan.mbs and accumulation == 1
            micro = t.local_batch_size // p.pipeline_parallel_microbatch_size
            assert micro * plan.mbs * plan.dp == job.global_batch_seqs
            stages, _layers, *_ = pipeline_metadata(dims, p, c.model_spec.model)
            assert stages == plan.pp * plan.model_chunks
        else:
            assert t.local_batch_size == plan.mbs


def test_plan_export_on_the_default_scenario_is_parsed(titan, capsys):
    """`meshplan plan --export torchtitan` on the default scenario (timed on torchtitan's stack) prints a command
    torchtitan's config manager and ParallelDims accept for the 64 GPUs it names."""
    from meshplan.cli import main
    from meshplan.frameworks.common import split_command

    ConfigManager, ParallelDims, _ = titan
    assert main(["plan", "--export", "torchtitan", "--jobs", "1"]) == 0
    cmd = split_command(capsys.readouterr().out, ("torchtitan.train",))
    c = ConfigManager().parse_args(cmd.program)
    dims = ParallelDims.from_config(c.parallelism, cmd.world_size)
    assert dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp * dims.pp == 64
