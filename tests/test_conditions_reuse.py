"""The conditions of change and the sweeps reuse what the base search established (the cheap pass screens the
leading plans by their bounds, search.screen; the confirming searches and the sweep points evaluate only the
structures that can matter, search.leading), and answer exactly as evaluating every candidate and running
full searches does: on several models, clusters and batch sizes, MoE and pipeline recommendations among them."""

from __future__ import annotations

import pytest

from meshplan import JobSpec, load_cluster, load_model
from meshplan.explain import analyse
from meshplan.search.conditions import layout_key
from meshplan.search.leading import search_leading
from meshplan.search.search import REFINE_TOP, search
from meshplan.search.space import Space, family
from meshplan.search.sweep import sweep

# (model, accelerator, nodes, global batch tokens, sequence length, job fields)
LEADING_SCENARIOS = [
    ("seed-70b", "h100-sxm", 8, 4 * 2**20, 4096, {}),  # the worked example: a pipeline recommendation
    ("llama-3-8b", "h100-sxm", 2, 2**20, 4096, {}),
    ("mixtral-8x7b", "h100-sxm", 2, 2 * 2**20, 4096, {}),  # MoE: expert parallelism
    ("gpt-oss-120b", "h100-sxm", 4, 2 * 2**20, 4096, {}),
    ("llama-3-70b", "a100-80gb", 8, 2 * 2**20, 4096, {}),
    ("llama-2-13b", "b200", 2, 2**20, 8192, {"software": "megatron"}),
    ("llama-3.1-405b", "h100-sxm", 16, 2**21, 8192, {}),  # deep pipelines, Megatron's split layouts
]


def _scenario(name: str, accel: str, nodes: int, batch: int, seq: int, fields: dict):
    return load_model(name), load_cluster(accel, nodes=nodes), JobSpec(global_batch_tokens=batch, seq_len=seq,
                                                                       **fields)


def _first_and_fastest(ranked, classes) -> dict:
    """Per class, the first plan of the ranking and the fastest (plan and step time, exactly)."""
    out: dict = {}
    for e in ranked:
        c = classes(e.plan)
        first, fastest = out.get(c, (e, e))
        out[c] = (first, e if e.step_time_s < fastest.step_time_s else fastest)
    return {c: [(x.plan.to_string(), x.step_time_s, x.memory.peak_bytes) for x in pair] for c, pair in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", LEADING_SCENARIOS, ids=[f"{s[0]}-{s[1]}-{s[2]}" for s in LEADING_SCENARIOS])
def test_a_search_for_the_leading_plans_answers_as_the_full_search(scenario) -> None:
    model, cluster, job = _scenario(*scenario)
    full = search(model, cluster, job, Space(), refine_top=REFINE_TOP, workers=1).feasible
    assert full, "a scenario where some plan fits"
    mine = layout_key(full[0].plan)
    # a sweep point's classes, a condition's, and one class (stacks.stack_bests: the recommendation alone)
    for classes in (family, lambda p: layout_key(p) != mine, lambda p: 0):
        lean = search_leading(model, cluster, job, Space(), classes=classes)
        assert lean.feasible[0] is not None
        assert lean.feasible[0].plan == full[0].plan and lean.feasible[0].step_time_s == full[0].step_time_s
        assert _first_and_fastest(lean.feasible, classes) == _first_and_fastest(full, classes)
        # what it returns is the full ranking's, in its order, less plans behind every threshold
        positions = [next(i for i, f in enumerate(full) if f.plan == e.plan) for e in lean.feasible]
        assert positions == sorted(positions)
        assert all(e.step_time_s == full[i].step_time_s for e, i in zip(lean.feasible, positions, strict=True))
        assert lean.structures_timed < lean.structures


CONDITION_SCENARIOS = [
    # (scenario, the conditions walked: None for all)
    (("llama-3-8b", "h100-sxm", 2, 2**20, 4096, {}), None),  # ZeRO-1; a longer sequence, a deeper model change it
    (("mixtral-8x7b", "h100-sxm", 2, 2 * 2**20, 4096, {}), ("inter_node_bandwidth", "seq_len")),  # MoE: EP x
    # ZeRO-1, changing to pipelines with EP; the bandwidth bisected
    (("llama-3-70b", "a100-80gb", 8, 2 * 2**20, 4096, {}), ("batch_tokens", "model_layers")),  # PP x TP on
    # Megatron: the batch bisected, and at twice the depth a deeper pipeline
]


def _conditions(found: tuple) -> tuple:
    conditions, held = found
    return ([(c.condition, c.direction, c.value, c.last_same_value, c.plan_string, c.speedup, c.text)
             for c in conditions],
            [(h.condition, h.low_value, h.high_value, h.low_end, h.high_end, h.text) for h in held])


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "only"), CONDITION_SCENARIOS, ids=[s[0][0] for s in CONDITION_SCENARIOS])
def test_the_conditions_of_change_are_those_of_full_re_searches(scenario, only) -> None:
    from meshplan.explain import _conditions_of_change, _Scenario

    found = []
    for exhaustive in (False, True):
        model, cluster, job = _scenario(*scenario)  # fresh specs: nothing shared through the caches
        analysis = analyse(model, cluster, job, workers=2, with_conditions=False)
        assert analysis.recommended is not None
        found.append(_conditions(_conditions_of_change(_Scenario(model, cluster, job, None), analysis.result,
                                                       analysis.recommended, Space(), 2, exhaustive=exhaustive,
                                                       only=only)))
    assert found[0][0], "a scenario with conditions of change"
    assert found[0] == found[1]


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "vary", "values"), [
    (LEADING_SCENARIOS[1], "batch-tokens", [2**18, 2**20, 2**23]),
    (LEADING_SCENARIOS[2], "inter-node-bandwidth", [6.25, 100.0]),
], ids=["llama-3-8b-batch", "mixtral-bandwidth"])
def test_a_sweep_answers_as_full_searches_at_each_value(scenario, vary, values) -> None:
    model, cluster, job = _scenario(*scenario)

    def points(exhaustive: bool) -> list:
        return [(p.value, p.best.plan.to_string() if p.best else None, p.best.step_time_s if p.best else None,
                 {f: (e.plan.to_string(), e.step_time_s) for f, e in p.by_family.items()})
                for p in sweep(model, cluster, job, vary, values, workers=2, exhaustive=exhaustive)]

    assert points(False) == points(True)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [LEADING_SCENARIOS[0], LEADING_SCENARIOS[2]], ids=["seed-70b", "mixtral-8x7b"])
def test_a_search_that_reuses_the_memory_facts_of_another_bandwidth_answers_as_a_fresh_one(scenario) -> None:
    """search.leading keeps what depends on memory alone (the plans, which structures fit, the variants that fit
    at no micro-batch size) for the next search of a scenario that differs only in the inter-node network: a
    bandwidth sweep's points and the walk of the conditions along it. Its answer is a fresh search's."""
    from dataclasses import replace

    from meshplan.search import leading
    from meshplan.units import GB

    model, cluster, job = _scenario(*scenario)

    def at(gb_per_s: float):
        c = replace(cluster, inter=replace(cluster.inter, nic_bytes_per_s=gb_per_s * GB))
        r = search_leading(model, c, job, Space())
        return [(e.plan.to_string(), e.step_time_s, e.memory.peak_bytes) for e in r.feasible], r.structures_timed

    leading._MEMORY.clear()
    at(25.0)
    kept = next(iter(leading._MEMORY.values()))
    reused = at(6.25)
    assert next(iter(leading._MEMORY.values())) is kept and len(leading._MEMORY) == 1
    assert kept.unfit_variants, "variants that fit at no micro-batch size, passed over the second time"
    leading._MEMORY.clear()
    assert reused == at(6.25)


def test_the_conditions_do_not_depend_on_the_order_the_walks_are_dispatched_in(monkeypatch) -> None:
    """The walks go to the workers likely-longest first (conditions.WALK_DISPATCH); the conditions and held
    ranges come back in the walks' own order whatever that order is."""
    from meshplan.explain import _conditions_of_change, _Scenario
    from meshplan.search import conditions

    model, cluster, job = _scenario("llama-3-8b", "h100-sxm", 2, 2**20, 4096, {})
    analysis = analyse(model, cluster, job, workers=2, with_conditions=False)
    found = []
    for dispatch in (conditions.WALK_DISPATCH, conditions.WALK_DISPATCH[::-1], ()):
        monkeypatch.setattr(conditions, "WALK_DISPATCH", dispatch)
        found.append(_conditions(_conditions_of_change(_Scenario(model, cluster, job, None), analysis.result,
                                                       analysis.recommended, Space(), 2)))
    knobs = ["batch_tokens", "inter_node_bandwidth", "gpus", "seq_len", "model_layers"]
    held = [h[0] for h in found[0][1]]
    assert held and held == sorted(held, key=knobs.index)
    assert found[0] == found[1] == found[2]
