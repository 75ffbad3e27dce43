"""A job that names no software stack is answered per stack: each stack's best plan with its own band, and a
recommendation that says which stack it assumes (meshplan.stacks)."""

import json

import pytest

from meshplan import JobSpec, load_cluster, load_model
from meshplan.cli import main
from meshplan.cost.estimate import Band
from meshplan.stacks import StackLeader, assumed_stack, stack_bests, stack_leaders


def _leader(stack: str, step_s: float, band: tuple[float, float] | None):
    class E:  # what assumed_stack reads of an estimate
        step_time_s = step_s
        uncertainty = Band(band[0], band[1], 10, "test") if band else None
    return StackLeader(stack, E(), None)  # type: ignore[arg-type]


def test_the_fastest_stack_is_assumed_unless_a_better_validated_one_is_within_the_tie_band():
    fast, close, far = _leader("deepspeed", 10.0, (-0.3, 0.6)), _leader("megatron", 10.3, (-0.06, 0.06)), \
        _leader("torchtitan", 12.0, (-0.1, 0.2))
    chosen, why = assumed_stack([fast, close, far])
    assert chosen is close and "tie band" in why and "better validated" in why
    chosen, why = assumed_stack([fast, _leader("megatron", 11.0, (-0.06, 0.06)), far])  # 10 % slower: no tie
    assert chosen is fast and "fastest" in why
    assert assumed_stack([StackLeader("megatron", None, None, "nothing fits")]) == (None, "no stack runs a plan "
                                                                                         "that fits")


def test_leaders_are_ordered_by_step_time_and_deepspeed_says_why_it_has_no_moe_plan():
    leaders = stack_leaders(load_model("mixtral-8x7b"), load_cluster("h100-sxm", nodes=4),
                            JobSpec(global_batch_tokens=1 << 21, seq_len=4096), workers=1)
    ran = [s for s in leaders if s.best]
    assert [s.best.step_time_s for s in ran] == sorted(s.best.step_time_s for s in ran)
    assert all(s.best.uncertainty is not None for s in ran)  # each with its own band
    ds = next(s for s in leaders if s.stack == "deepspeed")
    assert ds.best is None and "DeepSpeed-MoE" in ds.why_none and leaders[-1] is ds


@pytest.mark.parametrize("model,nodes,batch", [("mixtral-8x7b", 4, 1 << 21), ("llama-3-8b", 2, 1 << 20),
                                               ("seed-70b", 8, 1 << 22)])
def test_the_stacks_leading_searches_choose_as_their_full_searches(model, nodes, batch):
    """What sweep and compare choose their stack with (stack_bests: leading searches) is stack_leaders' answer:
    each stack's recommendation, its step time and band, in the same order, and so the same assumed stack."""
    args = (load_model(model), load_cluster("h100-sxm", nodes=nodes), JobSpec(global_batch_tokens=batch,
                                                                               seq_len=4096))
    full, lean = stack_leaders(*args, workers=1), stack_bests(*args, workers=1)

    def seen(leaders):
        return [(s.stack, s.best.plan if s.best else None, s.best.step_time_s if s.best else None,
                 s.best.uncertainty if s.best else None) for s in leaders]

    assert seen(lean) == seen(full)
    assert all(s.result is None for s in lean)
    assert assumed_stack(lean)[0].stack == assumed_stack(full)[0].stack
    assert assumed_stack(lean)[1] == assumed_stack(full)[1]


@pytest.mark.slow
def test_the_default_plan_names_its_stack_and_shows_each_stacks_leader(capsys):
    assert main(["plan", "--no-conditions", "--quiet"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "(assumed)" in head
    assert "Software stacks (none was named" in out and "The recommendation below assumes" in out
    for name in ("Megatron-LM", "torchtitan", "DeepSpeed"):
        assert f"\n  {name}" in out
    assert main(["plan", "--no-conditions", "--quiet", "--json", "--top", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["assumed_stack"]["stack"] in ("megatron", "torchtitan", "deepspeed")
    assert d["scenario"]["software"] == d["assumed_stack"]["stack"]
    assert d["stacks"][0]["stack"] == min(d["stacks"], key=lambda s: s["best"]["step_time_s"])["stack"]
    assert d["n_plans_listed"] == 3 and d["n_plans_left_out"] > 0


@pytest.mark.slow
def test_a_sweep_with_no_stack_named_runs_on_the_stack_plan_assumes(capsys):
    args = ["--model", "llama-3-8b", "--nodes", "1", "--seq-len", "8192", "--batch-tokens", "1M", "--quiet"]
    assert main(["plan", *args, "--no-conditions", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["sweep", *args, "--vary", "batch-tokens=512K..1M", "--points", "2", "--json"]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert sweep["software"] == plan["assumed_stack"]["stack"]
    at_base = next(p for p in sweep["points"] if p["value"] == 1 << 20)
    assert at_base["best"]["plan"]["string"] == plan["recommended"]["plan"]["string"]
    assert at_base["best"]["step_time_s"] == pytest.approx(plan["recommended"]["step_time_s"])


def test_the_stacks_searches_are_kept_for_a_sweep_through_the_scenario_even_when_run_in_workers():
    """report's sweep of the batch passes through the scenario's own value: there it reads the stack's search
    that plan ran (search.recent_search), sent back from the worker that ran it, instead of searching again."""
    from dataclasses import replace

    from meshplan.search.search import REFINE_TOP, recent_search
    from meshplan.search.space import Space

    model, cluster, job = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1), JobSpec(
        global_batch_tokens=1 << 19, seq_len=4096)
    leaders = stack_leaders(model, cluster, job, workers=2)
    ran = [s for s in leaders if s.result is not None]
    assert len(ran) == 3
    for s in ran:
        assert recent_search(model, cluster, replace(job, software=s.stack), Space(), refine_top=REFINE_TOP) is s.result
