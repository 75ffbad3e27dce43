"""The reference model: exact parameter parity with meshplan for every catalog model (meta device), and a
scaled-down copy that keeps the shape ratios and runs on a CPU."""

import pytest
from tests.conftest import requires_torch

import meshplan

pytestmark = requires_torch

MODELS = meshplan.list_models()


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_meshplan_exactly_on_meta(name):
    from meshplan.harness.reference_model import build_model

    spec = meshplan.load_model(name)
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == meshplan.param_counts(spec).total


@pytest.mark.parametrize("name", MODELS)
def test_scaled_down_param_count_matches_and_runs(name):
    import torch

    from meshplan.harness.reference_model import build_model, reference_seq_len, scale_down

    spec = scale_down(meshplan.load_model(name))
    torch.manual_seed(0)
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == meshplan.param_counts(spec).total
    seq = reference_seq_len(spec)
    logits = model(torch.randint(0, spec.vocab, (2, seq)))
    assert logits.shape == (2, seq, spec.vocab)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", MODELS)
def test_scale_down_keeps_the_shape(name):
    from meshplan.harness.reference_model import scale_down

    full = meshplan.load_model(name)
    small = scale_down(full)
    assert 64 <= small.hidden <= 256 and 2 <= small.n_layers <= 4
    assert small.n_heads // small.n_kv_heads == full.n_heads // full.n_kv_heads
    assert (small.gated_mlp, small.tied_embeddings, small.norm, small.linear_bias) == (
        full.gated_mlp, full.tied_embeddings, full.norm, full.linear_bias)
    assert small.ffn_hidden / small.hidden == pytest.approx(full.ffn_hidden / full.hidden, rel=0.15)
    assert small.is_moe == full.is_moe and small.is_mla == full.is_mla
    assert bool(small.q_lora_rank) == bool(full.q_lora_rank)
    assert bool(small.n_shared_experts) == bool(full.n_shared_experts)
    assert bool(small.n_dense_layers) == bool(full.n_dense_layers)
    if full.n_kv_heads % 8 == 0 and full.n_heads // full.n_kv_heads <= 8:
        assert small.n_kv_heads % 8 == 0  # TP up to 8 still divides the heads


def test_tied_embeddings_share_one_tensor():
    from meshplan.harness.reference_model import build_model, scale_down

    model = build_model(scale_down(meshplan.load_model("gpt3-175b")), device="meta")
    assert model.output.weight is model.tok_embeddings.weight


def test_torchtitan_attribute_names():
    from meshplan.harness.reference_model import build_model, scale_down

    model = build_model(scale_down(meshplan.load_model("deepseek-v3")), device="meta")
    names = {n for n, _ in model.named_modules()}
    assert {"tok_embeddings", "layers.0.attention", "layers.0.attention_norm", "layers.0.ffn_norm",
            "layers.0.feed_forward", "layers.1.moe", "layers.1.moe.router", "norm", "output"} <= names
    assert {"layers.0.attention.wq_a", "layers.0.attention.wkv_a", "layers.0.attention.wkv_b",
            "layers.0.attention.wo"} <= names


def test_windowed_layers_attend_over_their_band_only():
    """GPT-OSS's even layers attend over the last 128 keys, its odd ones over the whole sequence
    (ModelSpec.layer_is_windowed); the reference attention masks exactly that band."""
    import torch

    from meshplan.harness.reference_model import _attend, build_model, scale_down

    spec = scale_down(meshplan.load_model("gpt-oss-120b"))
    model = build_model(spec, device="meta")
    assert [layer.attention.window for layer in model.layers] == [128, 0]
    torch.manual_seed(0)
    b, s, h, d, w = 1, 12, 2, 4, 5
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / d ** 0.5
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    expected = torch.einsum("bhij,bjhd->bihd", scores.masked_fill((j > i) | (i - j >= w), float("-inf"))
                            .softmax(-1), v).flatten(2)
    torch.testing.assert_close(_attend(q, k, v, w), expected)
    torch.testing.assert_close(_attend(q, k, v, s), _attend(q, k, v))  # a window as long as the sequence
