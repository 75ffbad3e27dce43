"""Pipeline bubble and in-flight micro-batches (Narayanan et al. 2021 §2.2; Qi et al. 2024)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost.pipeline import bubble_fraction, bubble_time_s, in_flight_microbatches


def _rate(schedule, p, m, v=1):
    """Bubble over ideal compute, t_F = t_B = t_W = 1 (formulas.md §3.9 'bubble rate')."""
    return bubble_time_s(schedule=schedule, pp=p, vpp=v, m=m, t_f_s=1, t_b_s=1, t_w_s=1) / (3 * m)


def test_1f1b_bubble_p8_m32():
    """formulas.md §7 #6: (p-1)/m = 21.9 % of ideal; (p-1)/(m+p-1) = 17.9 % of wall time."""
    assert _rate("1f1b", 8, 32) == pytest.approx(7 / 32)
    assert bubble_fraction(schedule="1f1b", pp=8, m=32, vpp=1) == pytest.approx(7 / 39)


def test_interleaved_divides_by_v():
    assert _rate("interleaved", 8, 32, 4) == pytest.approx(7 / 32 / 4)


def test_zb_h1_is_a_third_of_1f1b():
    assert _rate("zb-h1", 8, 32) == pytest.approx(7 / 32 / 3)


def test_zb_v_keeps_half_a_forward_per_slot_when_times_equal():
    """Without the paper's optimizer post-validation the step ends in a synchronisation: the last rank
    starts (p-1)·t_F/2 late, so ZB-V's bubble does not close even at t_F = t_B = t_W."""
    assert _rate("zb-v", 8, 32) == pytest.approx(3.5 / 96)


def _simulated_bubble(schedule, p, m, f, b, w):
    from meshplan.sim.pipeline import schedule_pipeline

    makespan, _ = schedule_pipeline(schedule=schedule, pp=p, m=m, chunks=2 if schedule == "zb-v" else 1,
                                    f_s=[f] * p, b_s=[b] * p, w_s=[w] * p, p2p_s=0.0)
    return makespan - m * (f + b + w)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 12), m=st.integers(1, 30), times=st.tuples(*[st.floats(0.01, 4.0)] * 3))
def test_zero_bubble_closed_form_is_the_simulated_order(schedule, p, m, times):
    """On uniform stages the closed form is the simulator's makespan under the schedule's fixed order (the
    paper's ZB-H1, PyTorch's ZB-V), exactly, from one micro-batch to many and for any mix of pass times."""
    closed = bubble_time_s(schedule=schedule, pp=p, vpp=1, m=m, t_f_s=times[0], t_b_s=times[1],
                           t_w_s=times[2])
    assert closed == pytest.approx(_simulated_bubble(schedule, p, m, *times), rel=1e-9, abs=1e-9)


# pass-time mixes under which each of ZB-V's 22 forms is the longest somewhere on the grid below
MIXES = [(1, 1, 1), (1, 1.2, 0.8), (1, 0.8, 1.2), (1, 2, 0.5), (1, 2, 4), (1, 0.8, 0.1), (2, 1, 1), (1, 1, 0.3),
         (1, 1, 2), (0.43, 0.49, 4.94), (3, 0.2, 0.1), (0.2, 3, 0.1), (0.1, 0.2, 3), (1.3, 0.4, 0.9)]


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_zero_bubble_closed_form_on_a_grid(schedule):
    """The same on a fixed grid, every m from 1 to past 2p - 1, so that no form is left to chance."""
    for p in (2, 3, 5, 8, 13):
        for m in range(1, 2 * p + 2):
            for f, b, w in MIXES:
                closed = bubble_time_s(schedule=schedule, pp=p, vpp=1, m=m, t_f_s=f, t_b_s=b, t_w_s=w)
                assert closed == pytest.approx(_simulated_bubble(schedule, p, m, f, b, w), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_zero_bubble_longer_passes_never_shorten_the_step(schedule):
    for m in (1, 4, 7, 14, 32):
        steps = [m * (2 + t_w) + bubble_time_s(schedule=schedule, pp=8, vpp=1, m=m, t_f_s=1, t_b_s=1, t_w_s=t_w)
                 for t_w in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)]
        assert steps == sorted(steps)


def test_zb_v_waits_half_a_backward_per_slot():
    """PyTorch's ZB-V runs F, B and W of each leg in turn: with enough micro-batches each of the p - 1
    slots waits at least t_B/2, not the paper's t_F/2 (p = 16, t_B = 1.2 t_F: 9.0 t_F, not 7.5; the greedy
    schedule meshplan ran before gave 9.8 and a closed form of 7.5). Below 2p - 1 micro-batches PyTorch
    still plans 2p - 1 and the bubble doubles at m = p."""
    assert bubble_time_s(schedule="zb-v", pp=16, vpp=2, m=64, t_f_s=1, t_b_s=1.2, t_w_s=0.8) == pytest.approx(9.0)
    assert bubble_time_s(schedule="zb-v", pp=16, vpp=2, m=64, t_f_s=1, t_b_s=0.8, t_w_s=1.2) == pytest.approx(
        7.5 + 14 * 0.2 / 2)  # (p - 3/2)·t_F - (p - 2)·t_B/2 where t_F > t_B
    assert bubble_time_s(schedule="zb-v", pp=8, vpp=2, m=8, t_f_s=1, t_b_s=1, t_w_s=1) == pytest.approx(7.0)
    assert _simulated_bubble("zb-v", 16, 64, 1, 1.2, 0.8) == pytest.approx(9.0)


def test_first_stage_holds_p_microbatches():
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=32, vpp=1, stage=0, layers=10) == 8
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=32, vpp=1, stage=7, layers=10) == 1
    assert in_flight_microbatches(schedule="1f1b", pp=8, m=4, vpp=1, stage=0, layers=10) == 4
    assert in_flight_microbatches(schedule="interleaved", pp=8, m=32, vpp=2, stage=0, layers=10) == pytest.approx(
        8 * (1 + 7 / 16))
    assert in_flight_microbatches(schedule="gpipe", pp=8, m=32, vpp=1, stage=0, layers=10) == 32


def test_interleaved_stages_hold_their_warm_up_chunks():
    """A reviewer's finding: stage r of Megatron's interleaved schedule runs 2(p - r - 1) + (v - 1)p + 1
    chunk forwards before its first backward (schedules.py, get_pp_rank_microbatches), chunk (i // p) mod v
    for forward i. meshplan scaled the first stage's p + (p - 1)/v by (p - r)/p: 1.375 micro-batches on
    the last of 4 stages at v = 2 against 2.5."""
    def held(stage: int, chunks: tuple[float, ...] = ()) -> float:
        return in_flight_microbatches(schedule="interleaved", pp=4, m=32, vpp=2, stage=stage, layers=20,
                                      chunk_layers=chunks)

    assert [held(r) for r in range(4)] == pytest.approx([5.5, 4.5, 3.5, 2.5])
    assert held(0) == pytest.approx(4 * (1 + 3 / 8))  # Korthikanti et al.'s first stage
    # uneven chunks: the last stage's 5 forwards are 4 of its first chunk (7 layers) and 1 of its second (13)
    assert held(3, (7.0, 13.0)) == pytest.approx((4 * 7 + 13) / 20)
    # a later chunk smaller than the first: the steady state's backward of the small chunk frees less than
    # its forward of the large one added, and the peak comes after the warm-up (a review's simulation of
    # Megatron's order: 5.78 on the first stage of p=4, v=2 with chunks of 10 and 8 layers)
    assert held(0, (10.0, 8.0)) == pytest.approx(5.7777777, rel=1e-6)
    assert held(0, (10.0, 8.0)) > (4 * 10 + 4 * 8 + 3 * 10) / 18  # the warm-up's end
    # fewer micro-batches than the warm-up: all of them
    assert in_flight_microbatches(schedule="interleaved", pp=4, m=2, vpp=2, stage=0, layers=20) == 2


def test_moe_all_to_all_overlap_holds_one_micro_batch_and_one_layer_without_a_pipeline():
    """Megatron's combined 1F1B pairs forward layer i with backward layer N-1-i and releases the latter:
    one micro-batch and one layer are alive, not two micro-batches."""
    base = in_flight_microbatches(schedule="1f1b", pp=1, m=16, vpp=1, stage=0, layers=10)
    overlap = in_flight_microbatches(schedule="1f1b", pp=1, m=16, vpp=1, stage=0, ep_overlap=True, layers=48)
    assert base == 1.0 and overlap == pytest.approx(1 + 1 / 48)


def test_zb_v_places_the_lm_head_on_the_first_rank():
    """ZB-V's V-shaped placement gives rank r the stages r and 2p - 1 - r, so rank 0 holds the embedding and
    the LM head with its loss (torch.distributed.pipelining's V-style stage_ids_this_rank): its states and
    logits are charged there, not on the last rank (a review found rank 0 1.4 GiB short). Eight micro-batches:
    with many, the middle ranks' per micro-batch receive buffers outweigh the head (test_memory)."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
    from meshplan.cost.pipeline import head_stage

    assert head_stage("zb-v", 8) == 0 and head_stage("1f1b", 8) == head_stage("zb-h1", 8) == 7
    m, c, j = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8), JobSpec(global_batch_tokens=4096 * 16,
                                                                                  seq_len=4096)
    est = {s: evaluate(m, c, j, parse_plan(f"dp=2,tp=4,pp=8,mbs=1,recompute=full,schedule={s}", 64))
           for s in ("1f1b", "zb-v")}
    by_stage = {s: {d.stage: d for d in e.stages} for s, e in est.items()}
    assert by_stage["zb-v"][0].head_f_s > 0 and by_stage["zb-v"][7].head_f_s == 0
    assert by_stage["1f1b"][7].head_f_s > 0 and by_stage["1f1b"][0].head_f_s == 0
    zbv = est["zb-v"].memory
    assert zbv.stage == 0 and "logits_and_loss" in zbv.terms
    head = m.vocab * m.hidden / 4  # the untied head's share of a TP=4 rank, with the embedding on rank 0 too
    assert zbv.terms["params"] - est["1f1b"].memory.terms["params"] == pytest.approx(head * 4.0, rel=0.01)


def test_zb_v_middle_ranks_are_simulated_without_the_head():
    """Under ZB-V the first stage holds the LM head, so it stands for no middle stage: the simulator times
    the middle ranks by a head-free one (a review found every middle rank charged the head's time)."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
    from meshplan.cost.stage import bounding_stages
    from meshplan.sim.simulate import simulate

    assert bounding_stages([(4, 0)] * 8) == [0, 7] and bounding_stages([(4, 0)] * 8, head=0) == [0, 1, 7]
    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    est = evaluate(m, c, JobSpec(global_batch_tokens=262_144, seq_len=4096), parse_plan("pp=8,mbs=1,schedule=zb-v", 8))
    r = simulate(est, slowdown=0.0, step_overhead_s=0.0)
    busy = [sum(t.dur_s for t in r.pipeline if t.stage == s) for s in range(8)]
    assert busy[0] > busy[1] == pytest.approx(busy[7])  # the head's rank, then the head-free ones alike


def test_zero_bubble_stages_all_hold_p_micro_batches():
    """Zero-bubble schedules keep p micro-batches short of their W on every stage (ZB-H1 by holding W
    back, PyTorch's ZB-V by its V), not 1F1B's p - s: the last stage of a ZB-H1 plan, beside the loss,
    holds as many activations as the first (on Megatron-core's layers: PyTorch's pipelining would add its
    per micro-batch buffers, test_memory)."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan

    for schedule, vpp in (("zb-h1", 1), ("zb-v", 2)):
        assert [in_flight_microbatches(schedule=schedule, pp=8, m=32, vpp=vpp, stage=s, layers=10)
                for s in range(8)] == [8.0] * 8
        assert in_flight_microbatches(schedule=schedule, pp=8, m=4, vpp=vpp, stage=7, layers=10) == 4.0
    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    job = JobSpec(global_batch_tokens=4_194_304, seq_len=4096, software="megatron")
    plans = {s: parse_plan(f"tp=4,pp=16,mbs=1,recompute=none,schedule={s}", c.n_gpus) for s in ("1f1b", "zb-h1")}
    one, zb = (evaluate(m, c, job, p).memory for p in plans.values())
    assert one.stage == 0 and zb.stage == 15  # 16 micro-batches beside the logits, not one
    from meshplan.cost.memory import head_input_bytes_per_token

    head = 4096 * head_input_bytes_per_token(hidden=m.hidden, tp=4, sp=True, gathered=False)  # beside the loss
    assert zb.terms["activations"] == pytest.approx(one.terms["activations"] + 16 * head)  # 5 layers a stage
    assert zb.peak_bytes > one.peak_bytes


def _heavier_ends(schedule, p, m, f, b, w, last, first):
    """Makespans of a pipeline whose last stage (the loss's; rank 0 under ZB-V) is ``last`` times and the
    first ``first`` times as slow as the middle ones: (simulator, stage_bubbles_s, each stage's own times)."""
    from meshplan.cost.pipeline import stage_bubbles_s
    from meshplan.sim.pipeline import schedule_pipeline

    scale = [first] + [1.0] * (p - 2) + [last] if p > 2 else [first, last]
    if schedule == "zb-v":
        scale = scale[::-1]
    fs, bs, ws = ([x * k for k in scale] for x in (f, b, w))
    sim, _ = schedule_pipeline(schedule=schedule, pp=p, m=m, chunks=2 if schedule == "zb-v" else 1, f_s=fs,
                               b_s=bs, w_s=ws, p2p_s=0.0)
    split = schedule != "1f1b"
    stages = sorted({0, min(1, p - 1), p - 1})
    passes = [(fs[s], bs[s] if split else bs[s] + ws[s], ws[s] if split else 0.0) for s in stages]
    busy = [m * sum(x) for x in passes]
    closed = max(t + x for t, x in zip(busy, stage_bubbles_s(schedule=schedule, pp=p, vpp=1, m=m, stages=stages,
                                                             passes=passes), strict=True))
    own = max(t + bubble_time_s(schedule=schedule, pp=p, vpp=1, m=m, t_f_s=x[0], t_b_s=x[1], t_w_s=x[2])
              for t, x in zip(busy, passes, strict=True))
    return sim, closed, own


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 14), m=st.integers(1, 40), times=st.tuples(*[st.floats(0.1, 3.0)] * 3),
       last=st.floats(1.0, 1.8))
def test_a_heavier_loss_stage_is_waited_for_once(p, m, times, last):
    """Under 1F1B the stage that holds the LM head and the loss ends after its own m micro-batches and one
    pass of every other rank: charging every rank its times, as the bubble of uniform stages would, overstates
    the step by (p - 1) times its excess. The closed form takes the other ranks' times, exactly."""
    sim, closed, own = _heavier_ends("1f1b", p, m, *times, last=last, first=1.0)
    assert closed == pytest.approx(sim, rel=1e-9)
    assert own >= closed * (1 - 1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zb-v"])
@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 14), m=st.integers(1, 40), times=st.tuples(*[st.floats(0.1, 3.0)] * 3),
       last=st.floats(1.0, 1.8), first=st.floats(1.0, 1.1))
def test_unequal_stages_stay_near_the_simulated_step(schedule, p, m, times, last, first):
    """With the first stage heavier too, and under the zero-bubble schedules (whose forms were derived on
    uniform stages), the closed form is never above the form on each stage's own times. Under 1F1B it is
    never below the simulated step and within 5 % above it; under the zero-bubble schedules it can fall a
    little below (a review found -0.2 % in 3,000 draws of these; stage_bubbles_s gives the averages, and
    30 % over at extreme mixes, t_B thirty times t_F)."""
    sim, closed, own = _heavier_ends(schedule, p, m, *times, last=last, first=first)
    assert closed <= own * (1 + 1e-12)
    if schedule == "1f1b":
        assert sim * (1 - 1e-9) <= closed <= sim * 1.05
    else:
        assert closed >= sim * 0.98


def test_each_stage_waits_for_the_ranks_its_timed_stand_ins_cover():
    """Six ranks, four stages timed (the first, two middle ones, the last): every middle rank takes the
    slowest timed middle stage's passes (as the simulator lays them out), and a stage's bubble is the other
    ranks' passes, its own rank standing in by that middle stage too (1F1B: their sum)."""
    from meshplan.cost.pipeline import stage_bubbles_s, stand_ins

    stages, loads = [0, 1, 2, 5], [3.0, 5.0, 4.0, 6.0]
    assert stand_ins(stages, 6, loads) == [0, 1, 1, 1, 1, 3]
    passes = [(x, 0.0, 0.0) for x in loads]
    bubbles = stage_bubbles_s(schedule="1f1b", pp=6, vpp=1, m=8, stages=stages, passes=passes)
    total = 3.0 + 4 * 5.0 + 6.0
    assert bubbles == pytest.approx([total - 3.0, total - 5.0, total - 5.0, total - 6.0])


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_a_zero_bubble_rank_fills_its_slots_with_its_own_w(schedule):
    """The deferred W passes that fill a zero-bubble rank's idle slots are its own: its bubble takes the
    other ranks' t_F and t_B and its own t_W (1F1B, whose backward is whole, the other ranks' everything)."""
    from meshplan.cost.pipeline import stage_bubbles_s

    passes = [(1.0, 1.2, 2.0), (1.0, 1.2, 0.5), (1.5, 1.8, 0.5)]
    got = stage_bubbles_s(schedule=schedule, pp=6, vpp=1, m=12, stages=[0, 1, 5], passes=passes)
    others_f = (1.0 * 4 + 1.5) / 5  # stage 0's others: four middle ranks and the last
    others_b = (1.2 * 4 + 1.8) / 5
    assert got[0] == pytest.approx(bubble_time_s(schedule=schedule, pp=6, vpp=1, m=12, t_f_s=others_f,
                                                 t_b_s=others_b, t_w_s=2.0))
    one = stage_bubbles_s(schedule="1f1b", pp=6, vpp=1, m=12, stages=[0, 1, 5], passes=passes)
    assert one[0] == pytest.approx(4 * 2.7 + 3.8)  # the others' whole passes
