"""Export, then read back: every plan a search returns that a framework runs comes back as the same plan (as
the framework runs it: options equal to its defaults read as left out), for every plan family; a plan a
framework cannot run is refused with one line naming what it lacks. No framework is needed."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.frameworks.extras import scenario, searched

from meshplan import evaluate, parse_plan
from meshplan.errors import SpecError
from meshplan.frameworks import deepspeed as ds
from meshplan.frameworks import megatron as mg
from meshplan.frameworks import torchtitan as tt
from meshplan.search.space import family

CASES = [("torchtitan", name) for name in ("dense-torchtitan", "moe-torchtitan", "long-torchtitan")] + \
    [("megatron", name) for name in ("dense-megatron", "moe-megatron")] + \
    [("deepspeed", name) for name in ("dense-generic", "small-generic", "dense-megatron-zero")]
MODULES = {"torchtitan": tt, "megatron": mg, "deepspeed": ds}


def back(stack: str, ex, model, cluster):
    """The plan read back from an export, both as the framework runs them."""
    if stack == "torchtitan":
        return tt.read(ex.text, n_layers=model.n_layers).plan
    if stack == "megatron":
        return mg.read(ex.text).plan
    return ds.read(ex.text, world_size=cluster.n_gpus).plan


def as_run(stack: str, plan, model):
    return mg.round_trip(plan, model) if stack == "megatron" else MODULES[stack].round_trip(plan)


def plans_of(name: str):
    if name != "dense-megatron-zero":
        return searched(name)
    # Megatron-DeepSpeed: ZeRO-1 under a pipeline and ZeRO stages with TP run Megatron's layers
    model, cluster, job = scenario("dense-megatron")
    texts = ["tp=8,pp=8,sharding=zero1,mbs=1,recompute=full", "tp=4,pp=4,dp_shard=4,sharding=zero1,mbs=1",
             "tp=8,dp_shard=8,sharding=zero3,mbs=2,recompute=full", "tp=8,dp_shard=8,sharding=zero2,mbs=1,"
             "recompute=selective", "tp=4,pp=8,dp_replicate=2,mbs=1,recompute=full,recompute_layers=3",
             "tp=4,cp=2,pp=8,sp=false,sharding=zero1,mbs=1,recompute=full"]
    return tuple(e for e in (evaluate(model, cluster, job, parse_plan(t)) for t in texts) if e.feasible)


@pytest.mark.slow
@pytest.mark.parametrize("stack,name", CASES)
def test_every_searched_plan_round_trips_or_is_refused(stack, name):
    model, cluster, job = scenario(name if name != "dense-megatron-zero" else "dense-megatron")
    module = MODULES[stack]
    families, refused = set(), 0
    for est in plans_of(name):
        try:
            ex = module.export(model, cluster, job, est.plan)
        except SpecError as exc:
            assert exc.field == f"export.{stack}" and "\n" not in exc.message, exc
            refused += 1
            continue
        assert as_run(stack, back(stack, ex, model, cluster), model) == as_run(stack, est.plan, model), \
            est.plan.to_string()
        families.add(family(est.plan))
    assert families, f"no plan of {name} exports to {stack} ({refused} refused)"


def variant_plans():
    """Options on the searched plans of a scenario: what a user might write, beyond what the search returns."""
    return st.tuples(
        st.sampled_from(["dense-torchtitan", "dense-megatron", "small-generic"]), st.integers(0, 10_000),
        st.sampled_from([{}, {"sp": False}, {"recompute": "full"}, {"recompute": "sac"}, {"recompute": "selective"},
                         {"reshard_after_forward": False}, {"reshard_after_forward": True}, {"grad_sync": "every"},
                         {"grad_sync": "last"}, {"async_tp": True}, {"mbs": 1}]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant_plans(), st.sampled_from(["torchtitan", "megatron", "deepspeed"]))
def test_an_export_reads_back_as_its_plan_or_is_refused(case, stack):
    name, index, change = case
    model, cluster, job = scenario(name)
    plans = searched(name)
    try:
        plan = replace(plans[index % len(plans)].plan, **change)
    except SpecError:
        return  # not a plan (an option of an axis the plan lacks)
    try:
        ex = MODULES[stack].export(model, cluster, job, plan)
    except SpecError as exc:
        assert exc.field == f"export.{stack}" and exc.message and "\n" not in exc.message
        return
    assert as_run(stack, back(stack, ex, model, cluster), model) == as_run(stack, plan, model)


@pytest.mark.parametrize("stack,plan,lacks", [
    ("torchtitan", "dp_shard=64,sharding=zero1,mbs=1,recompute=full", "ZeRO-1"),
    ("torchtitan", "tp=4,pp=16,mbs=1,recompute=none,sharding=megatron", "distributed optimizer"),
    ("torchtitan", "tp=8,pp=8,mbs=1,recompute=none,schedule=zb-h1", "ZB-H1"),
    ("torchtitan", "dp_shard=64,mbs=1,recompute=full,recompute_layers=40", "partial"),
    ("torchtitan", "dp_shard=32,cp=2,mbs=1,recompute=full", "all-gather"),
    ("megatron", "tp=8,pp=8,mbs=1,recompute=none,schedule=zb-v,sharding=fsdp", "zb-v"),
    ("megatron", "tp=8,dp_shard=8,sharding=zero3,mbs=1,recompute=full", "ZeRO-3"),
    ("megatron", "tp=4,pp=16,mbs=1,recompute=sac", "op-level"),
    ("deepspeed", "tp=4,pp=16,sharding=megatron,mbs=1,recompute=none", "distributed optimizer"),
    ("deepspeed", "dp_replicate=2,dp_shard=32,sharding=zero3,mbs=1,recompute=full", "replicate axis"),
    ("deepspeed", "tp=8,pp=8,sharding=zero3,mbs=1,recompute=full", "ZeRO-1 at most"),
])
def test_a_plan_the_framework_cannot_run_is_refused_naming_what_it_lacks(stack, plan, lacks):
    model, cluster, job = scenario("dense-megatron" if stack == "megatron" else "dense-generic")
    if stack == "torchtitan":
        job = replace(job, software="torchtitan")
    with pytest.raises(SpecError) as err:
        MODULES[stack].export(model, cluster, job, parse_plan(plan))
    assert err.value.field == f"export.{stack}" and lacks in err.value.message and "\n" not in err.value.message


def test_an_unevaluated_plan_is_refused_until_its_batch_split_is_chosen():
    model, cluster, job = scenario("dense-megatron")
    with pytest.raises(SpecError, match="mbs, recompute"):
        mg.export(model, cluster, job, parse_plan("tp=4,pp=16,sharding=megatron"))


def test_unknown_settings_are_listed_not_dropped():
    imported = tt.read("torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train --module llama3 --config "
                       "llama3_70b --parallelism.tensor_parallel_degree 8 --metrics.log_freq 5 --optimizer.lr 3e-4")
    assert imported.unsupported == ("--metrics.log_freq 5", "--optimizer.lr 3e-4")
    assert imported.plan.tp == 8 and imported.plan.dp_shard == 8 and imported.world_size == 64
    assert imported.model == "llama-3-70b" and imported.plan.recompute == "full"  # llama3_70b's FullAC
    mds = mg.read("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                  "--global-batch-size 64 --seq-length 2048 --use-distributed-optimizer --lr 1e-4", world_size=16)
    assert mds.plan.to_string() == "dp_shard=2,tp=4,pp=2,mbs=1,recompute=none,sharding=megatron,sp=false"
    assert mds.unsupported == ("--lr 1e-4",) and mds.job["global_batch_tokens"] == 64 * 2048
    cfg = ds.read('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "zero_optimization": '
                  '{"stage": 3, "stage3_max_live_parameters": 1e9}, "fp16": {"enabled": true}}', world_size=16)
    assert cfg.plan.to_string() == "dp_shard=16,mbs=2,sharding=zero3"
    assert cfg.unsupported == ('fp16: {"enabled": true}', "zero_optimization.stage3_max_live_parameters: 1000000000.0")


@pytest.mark.parametrize("drop,factor", [("drop", 1.25), ("pad", 1.0), ("dropless", 1.0)])
def test_megatron_capacity_round_trips(drop, factor):
    """An MoE job's token dropping and capacity are written as Megatron-core's flags and read back."""
    model, cluster, job = scenario("moe-megatron")
    job = replace(job, moe_token_drop=drop, moe_capacity_factor=factor)
    est = evaluate(model, cluster, job, parse_plan("ep=8,dp_shard=32,sharding=megatron,mbs=1,recompute=full", 32))
    ex = mg.export(model, cluster, job, est.plan)
    assert ("--moe-expert-capacity-factor" in ex.text) == (drop != "dropless")
    assert ("--moe-pad-expert-input-to-capacity" in ex.text) == (drop == "pad")
    got = mg.read(ex.text)
    assert got.job.get("moe_token_drop", "dropless") == drop
    assert got.job.get("moe_capacity_factor", 1.0) == factor
    assert not [u for u in got.unsupported if "capacity" in u]


def test_torchtitan_refuses_a_capacity():
    model, cluster, job = scenario("moe-torchtitan")
    job = replace(job, moe_token_drop="drop", moe_capacity_factor=1.25)
    plan = parse_plan("ep=8,dp_shard=32,mbs=1,recompute=full", 32)
    with pytest.raises(SpecError, match="dropless"):
        tt.export(model, cluster, job, evaluate(model, cluster, job, plan).plan)
