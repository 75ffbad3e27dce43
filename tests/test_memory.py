"""Memory formulas against published examples."""

from dataclasses import replace

import pytest

from meshplan import load_model
from meshplan.cost import memory as mem


@pytest.mark.parametrize(("stage", "expected_gb"), [(None, 120.0), ("zero1", 31.4), ("zero2", 16.6),
                                                     ("zero3", 1.9)])
def test_zero_paper_7_5b_on_64(stage, expected_gb):
    """Rajbhandari et al. 2020, Figure 1 / §5: Ψ = 7.5B, N_d = 64: 120, 31.4, 16.6, 1.9 GB."""
    sharding = stage or "zero1"
    state = mem.state_bytes_per_param(sharding=sharding, optimizer="adamw", dp_sharded=True,
                                      reduce_dtype_bytes=4.0)
    total = sum(mem.model_state_bytes(n_params=7.5e9, shard_degree=1 if stage is None else 64,
                                      state=state).values())
    assert total / 1e9 == pytest.approx(expected_gb, abs=0.06)


def test_megatron_18_and_distributed_optimizer():
    """Megatron theoretical_memory_usage.py: 18 B/param, 6 + 12/d with the distributed optimizer."""
    state = mem.state_bytes_per_param(sharding="megatron", optimizer="adamw", dp_sharded=True, reduce_dtype_bytes=4)
    assert sum(mem.model_state_bytes(n_params=1.0, shard_degree=1, state=state).values()) == 18.0
    assert sum(mem.model_state_bytes(n_params=1.0, shard_degree=8, state=state).values()) == pytest.approx(6 + 12 / 8)


def test_korthikanti_table2_without_dropout():
    """Korthikanti et al. 2022 Table 2, no parallelism: sbh(34 + 5as/h) with dropout. Without dropout
    (no 2sbh masks, no as²b mask and 2as²b dropout output) it is sbh(32 + 2as/h); with TP + SP all of it
    divides by t."""
    h, a, s = 4096, 32, 2048
    from dataclasses import replace

    m = replace(load_model("llama-2-7b"), gated_mlp=False, ffn_hidden=4 * h, n_kv_heads=a)
    per_token = mem.layer_activation_bytes_per_token(m, ffn_hidden=4 * h, tp=1, sp=False, flash_attention=False,
                                                     seq_len=s)
    assert per_token == pytest.approx(h * (32 + 2 * a * s / h))
    tp_sp = mem.layer_activation_bytes_per_token(m, ffn_hidden=4 * h, tp=8, sp=True, flash_attention=True, seq_len=s)
    assert tp_sp == pytest.approx(h * 32 / 8)
    tp_only = mem.layer_activation_bytes_per_token(m, ffn_hidden=4 * h, tp=8, sp=False, flash_attention=True,
                                                   seq_len=s)
    assert tp_only == pytest.approx(h * (8 + 24 / 8))


def test_llama3_8b_layer_activations_34_sbh():
    """formulas.md §7 #3: Llama-3-8B layer at S = 8192, b = 1, FA, no TP: 34.0·sbh = 1.0625 GiB."""
    m = load_model("llama-3-8b")
    b = mem.layer_activation_bytes_per_token(m, ffn_hidden=m.ffn_hidden, tp=1, sp=False, flash_attention=True,
                                             seq_len=8192) * 8192
    assert b / 2**30 == pytest.approx(1.0625, rel=1e-3)


def test_transformer_engine_fp8_saves_gemm_inputs_at_one_byte():
    """TE's FP8 linears save the FP8 copy of their input for the weight gradient: the QKV and MLP inputs
    (D each) and the SwiGLU output (F) drop to one byte. The attention output gains one: FlashAttention
    keeps its bf16 copy and the projection an FP8 one. Llama-3-8B: (2D + F - h_q) per token less."""
    m = load_model("llama-3-8b")

    def per_token(fp8, flash=True):
        return mem.layer_activation_bytes_per_token(m, ffn_hidden=m.ffn_hidden, tp=1, sp=False,
                                                    flash_attention=flash, seq_len=8192, fp8_inputs=fp8)

    assert per_token(False) - per_token(True) == pytest.approx(2 * m.hidden + m.ffn_hidden - m.q_dim)
    # unfused attention: only the projection keeps the attention output, so it drops to one byte too
    assert per_token(False, False) - per_token(True, False) == pytest.approx(2 * m.hidden + m.ffn_hidden + m.q_dim)


def test_an_moe_layers_mlp_input_stays_bf16_for_its_router():
    m = load_model("mixtral-8x7b")

    def per_token(fp8):
        return mem.layer_activation_bytes_per_token(
            m, ffn_hidden=m.ffn_hidden, tp=1, sp=False, flash_attention=True, seq_len=4096, fp8_inputs=fp8,
            moe_tokens_factor=m.top_k, moe_ffn_hidden=m.expert_ffn_hidden)

    # QKV input D, each routed copy's dispatched input D and SwiGLU output F_e; the attention output +h_q
    expected = m.hidden + m.top_k * (m.hidden + m.expert_ffn_hidden) - m.q_dim
    assert per_token(False) - per_token(True) == pytest.approx(expected)


def test_only_transformer_engine_stacks_store_fp8_activations():
    from meshplan import JobSpec

    def job(**kw):
        return JobSpec(global_batch_tokens=8192, seq_len=8192, **kw)

    assert job(precision="fp8", software="megatron").fp8_saves_fp8_inputs
    assert job(precision="fp8", software="llm-foundry").fp8_saves_fp8_inputs
    assert not job(precision="fp8", software="torchtitan").fp8_saves_fp8_inputs  # torchao saves bf16
    assert not job(software="megatron").fp8_saves_fp8_inputs


def test_kv_all_gather_context_parallelism_holds_the_full_sequence_kv_and_dkv():
    """A user's review: all-gather CP showed the ring's peak. PyTorch's KV all-gather re-gathers the full
    sequence's K and V in each layer's backward (2 x S x kv_dim x 2 B per micro-batch: Llama 2 7B at
    S = 131,072, 2.1 GB); Transformer Engine's also accumulates dK, dV for the full sequence (twice that);
    the ring holds blocks only."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan

    model, cluster = load_model("llama-2-7b"), load_cluster("h100-sxm", nodes=2)
    job = JobSpec(global_batch_tokens=2**20, seq_len=131072)
    peaks = {}
    for impl in ("ring", "allgather"):
        est = evaluate(model, cluster, job, parse_plan(f"cp=16,mbs=1,recompute=full,cp_impl={impl}", 16))
        peaks[impl] = est.memory
    gathered = peaks["allgather"].terms["cp_kv_gather"]
    assert gathered == pytest.approx(2 * 131072 * model.kv_dim * 2.0)  # PyTorch's: K and V, dK/dV ring-passed
    te = evaluate(model, cluster, job, parse_plan("cp=16,mbs=1,recompute=full,cp_impl=allgather,sharding=megatron",
                                                  16)).memory.terms["cp_kv_gather"]
    assert te == pytest.approx(2 * gathered)  # Transformer Engine's also gathers dK and dV
    assert "cp_kv_gather" not in peaks["ring"].terms
    frag = 1 + job.runtime.allocator_fraction
    assert peaks["allgather"].peak_bytes - peaks["ring"].peak_bytes == pytest.approx(gathered * frag, rel=1e-6)


def test_pytorch_tensor_parallelism_saves_the_sequence_parallel_linears_gathered_input():
    """A reviewer's finding, measured under a fake process group (tests/torch/test_saved_activations.py):
    PyTorch's column-parallel linears save the all-gathered input of QKV and the MLP (2D bytes per token
    each) where Megatron-core saves the rank's shard and gathers it again in backward (2D/t). Llama 3 8B,
    tp=4, one sequence of 4,096 tokens in flight: the difference is 32 layers x 4,096 x 4D x (1 - 1/4), and
    the SwiGLU activation's output eager PyTorch saves beside its input (2F/t bytes per token) where
    Megatron-core's fused SwiGLU recomputes it; and the LM head's input, gathered likewise (2D against 2D/t,
    once)."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    job = JobSpec(global_batch_tokens=4096 * 2, seq_len=4096)
    acts = {}
    for sharding in ("fsdp", "megatron"):
        plan = parse_plan(f"tp=4,dp_shard=2,mbs=1,recompute=none,sp=true,sharding={sharding}", 8)
        acts[sharding] = evaluate(model, cluster, job, plan).memory.terms["activations"]
    D = model.hidden
    per_token = 4 * D * (1 - 1 / 4) + 2 * model.ffn_hidden / 4
    assert acts["fsdp"] - acts["megatron"] == pytest.approx(32 * 4096 * per_token + 4096 * 2 * D * (1 - 1 / 4))
    # on the Megatron stack (Megatron-FSDP, the Megatron papers' data parallelism) the layers are Megatron's
    megatron_fsdp = evaluate(model, cluster, JobSpec(global_batch_tokens=4096 * 2, seq_len=4096, software="megatron"),
                             parse_plan("tp=4,dp_shard=2,mbs=1,recompute=none,sp=true", 8))
    assert megatron_fsdp.memory.terms["activations"] == pytest.approx(acts["megatron"])


def test_an_eager_swiglu_also_saves_its_activation():
    """From a review, measured with saved_tensors_hooks (tests/torch/test_saved_activations.py): eager
    PyTorch's w2(silu(w1 x) * w3 x) saves four tensors of the FFN width (silu's input and output, w3's
    output, the product); torch.compile and Megatron-core's fused SwiGLU save three. Llama 3 8B on one
    GPU, one sequence of 4,096 tokens, no recomputation: 32 layers x 4,096 x 2F bytes apart. A GeLU MLP
    saves the same either way."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)

    def acts(m, **job):
        j = JobSpec(global_batch_tokens=4096 * 8, seq_len=4096, **job)
        return evaluate(m, cluster, j, parse_plan("dp_shard=8,mbs=1,recompute=none", 8)).memory.terms["activations"]

    eager, compiled = acts(model), acts(model, compiled=True)
    assert eager - compiled == pytest.approx(32 * 4096 * 2 * model.ffn_hidden)
    assert acts(model, software="megatron") < eager
    gelu = replace(model, gated_mlp=False)
    assert acts(gelu) == pytest.approx(acts(gelu, compiled=True))


def test_parameters_kept_gathered_are_not_counted_twice():
    """From a review: with reshard_after_forward=False (and so under a pipeline) FSDP2 keeps every unit's
    gathered parameters from its forward to its backward; the unit being computed and the one prefetched
    are among them, not two more."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    job = JobSpec(global_batch_tokens=4096 * 8, seq_len=4096)
    terms = {raf: evaluate(model, cluster, job, parse_plan(f"dp_shard=8,mbs=1,reshard_after_forward={raf}", 8)
                           ).memory.terms for raf in ("true", "false")}
    assert "fsdp_unsharded_params" in terms["true"] and "fsdp_kept_after_forward" not in terms["true"]
    assert "fsdp_unsharded_params" not in terms["false"] and terms["false"]["fsdp_kept_after_forward"] > 0


def test_fsdp2_gathers_an_moe_layer_and_its_experts_together():
    """torchtitan wraps an MoE layer's experts and the rest of its block as two FSDP units and prefetches
    [next block, next block's experts]: the gathered buffers hold both units of a layer, the current and
    the prefetched (from a review that recomputed them by hand: 872.6 MB, not the larger unit's 704.6 MB)."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan
    from meshplan.cost.params import param_counts

    m, c = load_model("mixtral-8x7b"), load_cluster("h100-sxm", nodes=4)
    est = evaluate(m, c, JobSpec(global_batch_tokens=4_194_304, seq_len=4096), parse_plan("ep=8,dp_shard=32", 32))
    counts = param_counts(m)
    layer = counts.moe_layer_non_expert + counts.routed_experts_per_moe_layer / 8  # one expert of 8 per rank
    assert est.memory.terms["fsdp_unsharded_params"] == pytest.approx(2 * layer * 2.0)  # bf16, two layers
    assert est.memory.terms["fsdp_unsharded_grads"] == pytest.approx(layer * (2.0 + 4.0))  # bf16 + fp32 reduce


@pytest.mark.parametrize(("ids", "n_stages", "alive", "kept", "expected"), [
    # 1F1B, p = 4, m = 8: the first stage, 8 gradient buffers and 4 outputs awaiting their backward
    ((0,), 4, (4,), None, 8 + 4),
    # a middle one: its 2 alive inputs are the buffers its first layer saves
    ((2,), 4, (2,), None, (8 - 2) + (8 + 2)),
    # the last: no gradient arrives, its output is the loss's (the logits, apart)
    ((3,), 4, (1,), None, 8 - 1),
    # ZB-H1 (p = 4, m = 8), ranks 1, 2 and 3: the received inputs' gradients stay on them until the next
    # step, m - (p - 1 - r) by the end; 22, 23 and 12 measured on four gloo ranks
    ((1,), 4, (4,), (6,), (8 - 4) + 6 + (8 + 4)),
    ((2,), 4, (4,), (7,), (8 - 4) + 7 + (8 + 4)),
    ((3,), 4, (4,), (8,), (8 - 4) + 8),
    # ZB-V's turn (p = 4, rank 3: stages 3 and 4): stage 3 hands its outputs and stage 4 its input gradients
    # over on the rank, each kept per micro-batch like a buffer, its outputs being stage 4's inputs (32
    # measured)
    ((3, 4), 8, (4, 4), (4, 4), (8 - 4) + 4 + 8 + (8 - 4) + (8 + 4)),
    # ZB-V's rank 0 (stages 0 and 7): the embedding's stage receives nothing, the loss's no gradient
    ((0, 7), 8, (7, 1), (1, 7), (8 + 7) + 2 * (8 - 1)),
    # interleaved, p = 4, v = 2, rank 0 (stages 0 and 4): stage 4 receives, both send
    ((0, 4), 8, (7, 4), None, (8 + 7) + (8 - 4) + (8 + 4)),
])
def test_pytorch_pipelining_keeps_a_buffer_per_micro_batch(ids, n_stages, alive, kept, expected):
    """torch.distributed.pipelining keeps an activation and a gradient tensor per micro-batch (m = 8) for
    each stage a rank runs that has a neighbour, each output until its backward, and under the schedules
    that split W off each received input's gradient (memory.pipelining_boundary_tensors)."""
    assert mem.pipelining_boundary_tensors(stage_ids=ids, n_stages=n_stages, m=8, alive=alive,
                                           grads_kept=kept) == expected


def test_zero_bubble_schedules_keep_the_input_gradients_they_have_run():
    """PyTorch's zero-bubble schedules leave each received input's gradient on it until the next step: by
    the end of a ZB-H1 step rank r has run m - (p - 1 - r) of them; ZB-V's legs m less those alive."""
    from meshplan.cost.pipeline import stage_input_grads_kept

    assert [stage_input_grads_kept(schedule="zb-h1", pp=4, m=8, rank=r, alive=(4,)) for r in range(4)] == [
        (5,), (6,), (7,), (8,)]
    assert stage_input_grads_kept(schedule="zb-v", pp=4, m=8, rank=0, alive=(7, 1)) == (1, 7)
    assert stage_input_grads_kept(schedule="1f1b", pp=4, m=8, rank=0, alive=(4,)) is None
    assert stage_input_grads_kept(schedule="interleaved", pp=4, m=8, rank=0, alive=(7, 4)) is None


def test_each_rank_runs_its_stages_and_holds_its_micro_batches_on_them():
    """The stages a rank runs (interleaved: r + k·p; ZB-V's V: r and 2p - 1 - r) and the micro-batches alive
    on each at its peak (p = 8: PyTorch's ZB-V order keeps 15 on rank 0's first leg and 1 on the loss's;
    the interleaved schedule at m = 32, v = 2, 15 and 8 on the first rank, 8 and 1 on the last)."""
    from meshplan.cost.pipeline import rank_stage_ids, stage_alive

    assert rank_stage_ids("interleaved", 8, 2, 3) == (3, 11)
    assert rank_stage_ids("zb-v", 8, 2, 3) == (3, 12)
    assert rank_stage_ids("1f1b", 8, 1, 3) == (3,)
    kw = {"pp": 8, "vpp": 2, "m": 32, "held": 99.0}
    assert stage_alive(schedule="zb-v", rank=0, **kw) == (15, 1)
    assert stage_alive(schedule="zb-v", rank=7, **kw) == (8, 8)
    assert stage_alive(schedule="interleaved", rank=0, **kw) == (15, 8)
    assert stage_alive(schedule="interleaved", rank=7, **kw) == (8, 1)
    assert stage_alive(schedule="1f1b", rank=7, **kw) == (99.0,)


def test_only_pytorch_pipelines_pay_for_the_buffers():
    """A torchtitan plan (FSDP2 under torch.distributed.pipelining) holds per micro-batch stage-boundary
    buffers; the same layout on Megatron-core allocates each receive when it posts it and frees the sent
    output (deallocate_pipeline_outputs), and no pipeline holds none."""
    from meshplan import JobSpec, evaluate, load_cluster, parse_plan

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=2)
    job = JobSpec(global_batch_tokens=4096 * 64, seq_len=4096, software="torchtitan")

    def terms(plan: str):
        return evaluate(model, cluster, job, parse_plan(plan, cluster.n_gpus)).memory

    for tp in (1, 2):  # a layer's input: 2D per token, over TP with sequence parallelism
        layer_input = 4096 * mem.full_recompute_bytes_per_token(hidden=model.hidden, tp=tp, sp=tp > 1)
        torch_pp = terms(f"pp=4,tp={tp},dp_shard={4 // tp},mbs=1")
        assert torch_pp.stage == 0  # 64 / (4 / tp) micro-batches: as many gradient buffers, 4 outputs alive
        assert torch_pp.terms["pipelining_buffers"] == pytest.approx((64 * tp // 4 + 4) * layer_input)
    assert "pipelining_buffers" not in terms("pp=4,dp_shard=4,mbs=1,sharding=megatron").terms
    assert "pipelining_buffers" not in terms("dp_shard=16,mbs=1").terms


def _stage_memory_terms(plan_str: str, stage: int, m_target: int = 8, loss: str = "auto"):
    """A timed stage's memory terms (cost.fixed_plan's own stage contexts) for Llama 3 8B on torchtitan, with
    ``m_target`` micro-batches of one sequence."""
    from meshplan import JobSpec, load_cluster, parse_plan
    from meshplan.cost.batch import batch_split_reasons
    from meshplan.cost.fixed_plan import plan_shared, stage_ctxs
    from meshplan.cost.params import param_counts
    from meshplan.cost.stage_memory import stage_memory

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1, gpus_per_node=4)
    job = JobSpec(global_batch_tokens=4096 * m_target, seq_len=4096, software="torchtitan", loss=loss)
    plan = parse_plan(plan_str, cluster.n_gpus)
    counts = param_counts(model)
    shared = plan_shared(model, counts, cluster, job, plan)
    _, m = batch_split_reasons(job, plan)
    assert m == m_target
    ctx = next(c for c in stage_ctxs(model, counts, cluster, job, plan, m, shared) if c.s == stage)
    return model, stage_memory(ctx, shared.static[stage]).terms


def test_the_loss_stage_holds_the_heads_inputs_for_its_own_micro_batches():
    """ZB-V puts the loss on rank 0's second leg, where one micro-batch is alive (its W follows its B); the
    rank holds p micro-batches of layers. Under full recomputation each layer keeps its input (2D per
    token), the final norm and the LM head theirs (4D), and PyTorch's pipelining its buffers: rank 0 runs
    stages 0 and 7 of 8, with 7 and 1 micro-batches alive, and has run 1 and 7 input-gradient passes."""
    model, terms = _stage_memory_terms("pp=4,mbs=1,recompute=full,schedule=zb-v", 0)
    layer_input = 4096 * 2 * model.hidden
    assert terms["activations"] == pytest.approx((7 + 1) / 2 * 8 * layer_input + 1 * 2 * layer_input)
    assert terms["pipelining_buffers"] == pytest.approx((8 + 7) * layer_input + (8 - 1 + 7) * layer_input
                                                        + 4096 * 2.0 * model.vocab)  # and the bf16 logits


def test_zb_h1_keeps_the_input_gradients_of_every_finished_pass():
    """ZB-H1's last rank (p = 4, m = 8) holds its 4 micro-batches short of W, the LM head's inputs with
    them and, for the 3 past their input-gradient pass, the logits' gradient the head's W needs; and the 8
    input gradients it has run on the buffers they arrived in."""
    model, terms = _stage_memory_terms("pp=4,mbs=1,recompute=full,schedule=zb-h1", 3)
    layer_input = 4096 * 2 * model.hidden
    logits = 4096 * 2.0 * model.vocab
    assert terms["activations"] == pytest.approx(4 * 8 * layer_input + 4 * 2 * layer_input)
    assert terms["pipelining_buffers"] == pytest.approx(((8 - 4) + 8) * layer_input + logits + 3 * logits)


@pytest.mark.parametrize(("loss", "saved"), [("eager", 4.0), ("fused", 0.0)])
def test_gpipe_keeps_every_micro_batchs_logits_and_loss_graph(loss, saved):
    """PyTorch's GPipe computes each micro-batch's loss after its forward and keeps it, with its graph, until
    the backward (``_internal_losses``), and the logits in ``fwd_cache``: on the last rank (p = 4, m = 8) the
    7 micro-batches not in their backward hold 2 B per logit each, and eager cross-entropy's saved fp32
    log-softmax 4 B more; 1F1B's last rank runs each backward straight after its forward and holds none."""
    model, gpipe = _stage_memory_terms("pp=4,mbs=1,recompute=full,schedule=gpipe", 3, loss=loss)
    _, one_f = _stage_memory_terms("pp=4,mbs=1,recompute=full,schedule=1f1b", 3, loss=loss)
    layer_input = 4096 * 2 * model.hidden
    logits = 4096 * model.vocab
    eager = 2.0 if loss == "eager" else 0.0  # the one in its backward: the logits beside the loss's working set
    assert gpipe["pipelining_buffers"] == pytest.approx((8 - 8) * layer_input + eager * logits
                                                        + 7 * (2.0 + saved) * logits)
    assert one_f["pipelining_buffers"] == pytest.approx((8 - 1) * layer_input + eager * logits)
    assert gpipe["logits_and_loss"] == one_f["logits_and_loss"] > 0


@pytest.mark.parametrize(("loss", "per_logit"), [("vocab_parallel", 2 * 4 + 2), ("te", 2 * 2), ("eager", 4 + 12),
                                                  ("fused", 2 + 4)])
def test_each_mtp_loss_keeps_what_it_saves_and_one_runs_its_backward_at_a_time(loss, per_logit):
    """With one multi-token-prediction depth the last stage computes two losses: Megatron-core's
    vocab-parallel loss keeps each one's fp32 copy (4 B per logit) and works in one bf16 copy at a time,
    10 B where two whole working sets would be 12; Transformer Engine's keeps each one's bf16 logits."""
    assert mem.logits_bytes_per_token(vocab=129280, tp=2, loss=loss, losses=2) == pytest.approx(
        per_logit * 129280 / 2)
    assert mem.logits_bytes_per_token(vocab=129280, tp=2, loss=loss) == pytest.approx(
        mem.LOSS_BYTES_PER_LOGIT[loss] * 129280 / 2)


def test_each_mtp_depth_saves_its_norms_concatenation_and_head_input():
    """Megatron-core's last stage (sequence-parallel shards, 2D/t each) saves the final norm's and the
    head's inputs; one MTP depth adds its own two, its embedding norm's input and eh_proj's concatenated
    input (two shards): 2 + 5 shards."""
    shard = mem.full_recompute_bytes_per_token(hidden=7168, tp=2, sp=True)
    assert shard == 2 * 7168 / 2
    assert mem.head_input_bytes_per_token(hidden=7168, tp=2, sp=True, gathered=False) == 2 * shard
    assert mem.head_input_bytes_per_token(hidden=7168, tp=2, sp=True, gathered=False, mtp_layers=1) == 7 * shard
