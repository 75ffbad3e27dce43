"""Parameter counts against the published / Hugging Face counts (exact where the source is exact)."""

import pytest

from meshplan import load_model, param_counts
from meshplan.cost.flops import attention_flop_per_token_fwd, matmul_flop_per_token_fwd

# Exact counts of the Hugging Face implementations (sum of numel), which the reference model in
# meshplan.harness reproduces; DeepSeek-V3 without its multi-token-prediction module.
EXACT = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize(("name", "count"), EXACT.items())
def test_param_count_exact(name, count):
    assert param_counts(load_model(name)).total == count


def test_deepseek_v3_total_and_active():
    """DeepSeek-V3 report (arXiv:2412.19437), abstract: 671B total, 37B activated per token."""
    pc = param_counts(load_model("deepseek-v3"))
    assert pc.total == pytest.approx(671e9, rel=0.002)
    assert pc.active == pytest.approx(37e9, rel=0.02)


def test_mixtral_active_12_9b():
    """Jiang et al. 2024: 12.9B active parameters."""
    assert param_counts(load_model("mixtral-8x7b")).active == pytest.approx(12.9e9, rel=0.002)


def test_gpt3_175b():
    assert param_counts(load_model("gpt3-175b")).total == pytest.approx(175e9, rel=0.003)


def test_llama3_8b_flops_per_token():
    """formulas.md §7 #4: 6N = 45.0 GFLOP, PaLM attention 12.9 GFLOP at S = 8192."""
    m = load_model("llama-3-8b")
    pc = param_counts(m)
    assert 3 * matmul_flop_per_token_fwd(pc) == pytest.approx(45.0e9, rel=2e-3)
    assert 3 * attention_flop_per_token_fwd(m, seq_len=8192, causal=False) == pytest.approx(12.9e9, rel=2e-3)
    assert 3 * attention_flop_per_token_fwd(m, seq_len=8192, causal=True) == pytest.approx(6.44e9, rel=2e-3)


def test_gpt_oss_120b_total_and_active():
    """OpenAI's gpt-oss model card (2025-08): 116.83B total parameters, 5.13B active per token without
    the embedding (the attention sinks and router biases, 6,912 in all, are not counted here)."""
    m = load_model("gpt-oss-120b")
    pc = param_counts(m)
    assert pc.total == pytest.approx(116.83e9, rel=1e-4)
    assert pc.active - pc.embedding == pytest.approx(5.13e9, rel=2e-3)
    assert m.windowed_layers == 18


def test_sliding_window_attention_flops():
    """Windowed layers count the keys a query sees: w non-causally, w - w(w-1)/2S causally; global layers
    count the whole sequence. A window as long as the sequence changes nothing."""
    from dataclasses import replace
    m = load_model("gpt-oss-120b")
    full = replace(m, attention_window=0, global_attention_every=0)
    per_key = 2 * m.n_heads * (m.qk_head_dim + m.value_head_dim)
    S, w = 4096, 128
    assert attention_flop_per_token_fwd(m, seq_len=S, causal=False) == pytest.approx(per_key * (18 * S + 18 * w))
    causal_keys = sum(min(i + 1, w) for i in range(S)) / S
    assert attention_flop_per_token_fwd(m, seq_len=S, causal=True) == pytest.approx(
        per_key * (18 * S / 2 + 18 * causal_keys))
    for causal in (False, True):
        assert attention_flop_per_token_fwd(m, seq_len=w, causal=causal) == pytest.approx(
            attention_flop_per_token_fwd(full, seq_len=w, causal=causal))


@pytest.mark.parametrize(("n_layers", "every"), [(36, 2), (62, 6), (7, 0), (5, 2), (3, 4)])
def test_windowed_layer_count_matches_the_per_layer_rule(n_layers, every):
    from dataclasses import replace
    m = replace(load_model("gpt-oss-120b"), n_layers=n_layers, global_attention_every=every)
    assert m.windowed_layers == sum(m.layer_is_windowed(i) for i in range(n_layers))
