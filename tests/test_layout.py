"""Pipeline layouts (Megatron's --pipeline-model-parallel-layout) and multi-token prediction (DeepSeek-V3)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import JobSpec, load_cluster, load_model
from meshplan.cost.pipeline import mtp_chunk_layers, stage_layers
from meshplan.cost.step import evaluate
from meshplan.errors import SpecError
from meshplan.specs.layout import layers_per_stage, parse_layout
from meshplan.specs.plan import Plan, parse_plan

# NVIDIA's DeepSeek-V3 layouts (Megatron-Bridge recipes/deepseek/deepseek_v3.py; perf_recipes h100)
NVIDIA = {4: "Et*16|t*16|t*16|t*13mL", 8: "Et*8|(t*8|)*6t*5mL", 16: "Et*4|(t*4|)*14tmL", 32: "Et|(tt|)*30mL"}


def test_layout_strings_expand_to_their_chunks():
    chunks = parse_layout(NVIDIA[16])
    assert len(chunks) == 16 and [c.layers for c in chunks] == [4] * 15 + [1]
    assert chunks[0].embedding and not chunks[1].embedding
    assert chunks[-1].mtp == 1 and chunks[-1].loss
    assert layers_per_stage([c.layers for c in chunks], 8) == [8] * 7 + [5]  # chunk c on rank c mod pp
    assert [c.layers for c in parse_layout(NVIDIA[32])] == [1] + [2] * 30 + [0]


@pytest.mark.parametrize("text, says", [("Et*4|X", "unexpected 'X'"), ("t|Et", "first chunk"),
                                        ("tL|t", "last chunk"), ("", "not a Megatron")])
def test_malformed_layouts_name_the_field(text, says):
    with pytest.raises(SpecError, match=says) as e:
        parse_layout(text)
    assert e.value.field == "plan.layout"


def test_the_default_split_of_a_model_with_mtp_is_nvidias():
    for chunks, text in NVIDIA.items():
        assert mtp_chunk_layers(61, 1, chunks) == [c.layers for c in parse_layout(text)]


def test_plan_checks_the_chunk_count_and_keeps_the_case():
    p = parse_plan("pp=8,vpp=2,schedule=interleaved,sharding=megatron,layout=Et*4|(t*4|)*14tmL")
    assert p.layout == "Et*4|(t*4|)*14tmL" and parse_plan(p.to_string()) == p
    with pytest.raises(SpecError, match="16 chunks; pp x chunks per rank = 8 x 1"):
        Plan(pp=8, sharding="megatron", layout=NVIDIA[16])
    with pytest.raises(SpecError, match="ZB-V"):
        Plan(pp=4, schedule="zb-v", layout="Et*16|t*16|t*16|t*13mL")


def test_plan_runs_mtp_on_the_last_rank_and_a_layer_on_every_other():
    megatron = {"sharding": "megatron", "schedule": "interleaved"}
    # Megatron's own example: commas are cosmetic; its MTP chunk (30 of 32) runs on rank 14 of 16
    assert len(parse_layout("Et*3|(tt|)*29,m|L")) == 32
    with pytest.raises(SpecError, match=r"MTP layers \(m\) on the last pipeline rank"):
        Plan(pp=16, vpp=2, layout="Et*3|(tt|)*29,m|L", **megatron)
    with pytest.raises(SpecError, match=r"rank\(s\) \[1\] without a decoder layer"):
        Plan(pp=2, sharding="megatron", layout="Et*32|L")
    assert Plan(pp=2, sharding="megatron", layout="Et*61|mL").layout  # a last rank of MTP and loss alone


DSV3 = load_model("deepseek-v3")
JOB = JobSpec(global_batch_tokens=1024 * 4096, seq_len=4096)
CLUSTER = load_cluster("b200", nodes=32)


def test_a_layout_must_list_the_models_layers_and_mtp():
    base = "pp=16,ep=8,dp_shard=16,sharding=megatron,mbs=1,layout="
    with pytest.raises(SpecError, match="lists 0 MTP layers"):
        evaluate(DSV3, CLUSTER, JOB, parse_plan(base + "Et*4|(t*4|)*14tL"))
    with pytest.raises(SpecError, match="lists 60 decoder layers"):
        evaluate(DSV3, CLUSTER, JOB, parse_plan(base + "Et*4|(t*4|)*14mL"))


@settings(max_examples=12, deadline=None)
@given(pp_vpp=st.sampled_from([(4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4), (8, 4)]))
def test_nvidias_layout_written_out_is_the_default(pp_vpp):
    """A model with MTP and no layout splits as NVIDIA's recipes do; writing the layout changes nothing."""
    pp, vpp = pp_vpp
    sched = f",schedule=interleaved,vpp={vpp}" if vpp > 1 else ""
    text = f"pp={pp},ep=8,dp_shard={256 // pp},sharding=megatron,mbs=1{sched}"
    sizes = mtp_chunk_layers(61, 1, pp * vpp)
    chunks = [f"t*{n}" if n else "" for n in sizes]
    layout = "E" + chunks[0] + "|" + "|".join(chunks[1:-1]) + "|" + chunks[-1] + "mL"
    a = evaluate(DSV3, CLUSTER, JOB, parse_plan(text))
    b = evaluate(DSV3, CLUSTER, JOB, parse_plan(text + ",layout=" + layout))
    assert a.step_time_s == pytest.approx(b.step_time_s) and a.memory.peak_bytes == pytest.approx(b.memory.peak_bytes)


def test_mtp_costs_a_layer_a_projection_and_the_head_again_on_the_last_stage():
    plain = replace(DSV3, mtp_layers=0)
    plan = parse_plan("ep=8,dp_shard=256,sharding=megatron,mbs=1,recompute=full")
    with_mtp, without = evaluate(DSV3, CLUSTER, JOB, plan), evaluate(plain, CLUSTER, JOB, plan)
    assert with_mtp.flops.model_flop_per_step == without.flops.model_flop_per_step  # MFU leaves it out
    s1, s0 = with_mtp.stages[-1], without.stages[-1]
    assert s1.n_layers == s0.n_layers + 1
    assert s1.head_f_s > 2 * s0.head_f_s - 1e-12  # the head again, and the projection
    assert with_mtp.step_time_s > without.step_time_s
    assert with_mtp.memory.peak_bytes > without.memory.peak_bytes
    assert stage_layers(DSV3, 1) == [(3, 59)]  # 58 MoE layers and the MTP layer
    with pytest.raises(SpecError, match=r"model\.mtp_layers"):
        replace(DSV3, mtp_layers=-1)


def test_a_middle_stage_heavier_than_the_first_bounds_the_step_and_the_simulator_agrees():
    """PP=8 x VP=4 with MTP splits 1, 2, ..., 2, 0 over 32 chunks: ranks 1-6 hold 8 layers, rank 0 seven."""
    from meshplan.sim.simulate import refine

    plan = parse_plan("pp=8,ep=32,dp_shard=32,sharding=megatron,mbs=1,schedule=interleaved,vpp=4")
    assert [d + e for d, e in stage_layers(DSV3, 8, "", 4)] == [7, 8, 8, 8, 8, 8, 8, 7]
    est = evaluate(DSV3, CLUSTER, JobSpec(global_batch_tokens=4096 * 4096, seq_len=4096), plan)
    assert [s.stage for s in est.stages] == [0, 1, 7]
    assert max(est.stages, key=lambda s: s.time_s).stage == 1
    sim = refine(est, slowdown=0.27, step_overhead_s=0.03)
    assert sim.step_time_s == pytest.approx(est.step_time_s, rel=0.05)


def test_the_search_offers_interleaving_to_a_model_with_mtp():
    """61 layers divide into no power-of-two chunk count; NVIDIA's interleaved layouts split them anyway."""
    from meshplan.search.space import Space, _pipeline_options

    assert ("interleaved", 2, "") in set(_pipeline_options(DSV3, 8, Space()))
    assert not any(v == 2 for _, v, _ in _pipeline_options(replace(DSV3, mtp_layers=0), 8, Space()))


@settings(max_examples=40, deadline=None)
@given(n_layers=st.integers(2, 200), pp=st.integers(2, 16), vpp=st.integers(1, 12))
def test_megatrons_embedding_and_loss_split_counts_them_as_slots(n_layers, pp, vpp):
    """account_for_embedding/loss_in_pipeline_split: n_layers + 2 slots evenly over the chunks, one fewer
    decoder layer in the first and the last chunk; only where the chunks divide n_layers + 2, not n_layers."""
    from meshplan.specs.layout import embedding_loss_layout

    chunks = pp * vpp
    text = embedding_loss_layout(n_layers, chunks)
    if n_layers % chunks == 0 or (n_layers + 2) % chunks:
        assert text is None
        return
    listed = parse_layout(text)
    k = (n_layers + 2) // chunks
    assert len(listed) == chunks and listed[0].embedding and listed[-1].loss
    assert [c.layers for c in listed] == [k - 1] + [k] * (chunks - 2) + [k - 1]
    stages = layers_per_stage([c.layers for c in listed], pp)
    assert sum(stages) == n_layers
    # chunk c on rank c mod pp: the first and the last rank hold one layer fewer than each middle one
    assert stages[0] == stages[-1] == k * vpp - 1 and all(s == k * vpp for s in stages[1:-1])


def test_405b_on_pp16_with_eight_chunks_per_rank_runs_with_megatrons_split():
    """Llama 3.1 405B (126 layers) at PP=16, VP=8: 128 chunks, so the embedding and the loss fill the first
    and the last alone (Megatron-Bridge's GB200 preset); without the layout the plan is refused with it
    named."""
    from meshplan.specs.layout import embedding_loss_layout

    model, cluster = load_model("llama-3.1-405b"), load_cluster("gb200", nodes=4, gpus_per_node=64)
    job = JobSpec(global_batch_tokens=1024 * 4096, seq_len=4096)
    text = "tp=4,pp=16,vpp=8,dp_shard=4,schedule=interleaved,sharding=megatron"
    split = embedding_loss_layout(126, 128)
    assert split == "E|(t*1|)*126L"
    with pytest.raises(SpecError, match=r"layout=E\|\(t\*1\|\)\*126L"):
        evaluate(model, cluster, job, parse_plan(text))
    est = evaluate(model, cluster, job, parse_plan(text + ",layout=" + split))
    assert stage_layers(model, 16, split, 8) == [(7, 0)] + [(8, 0)] * 14 + [(7, 0)]
    one_f1b = evaluate(model, cluster, job, parse_plan("tp=4,pp=16,dp_shard=4,sharding=megatron"))
    assert est.time_breakdown["pipeline bubble"] < one_f1b.time_breakdown["pipeline bubble"] / 4
