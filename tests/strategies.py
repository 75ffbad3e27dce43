"""Hypothesis strategies shared by the property tests: small valid models, clusters, jobs and plans."""

from hypothesis import strategies as st

from meshplan import JobSpec, ModelSpec, load_cluster


@st.composite
def models(draw, moe: bool | None = None):
    heads = draw(st.sampled_from([8, 16, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    is_moe = draw(st.booleans()) if moe is None else moe
    kwargs = {}
    if is_moe:
        kwargs = {"n_experts": 8, "top_k": draw(st.sampled_from([1, 2])), "expert_ffn_hidden": 1024}
    if draw(st.sampled_from([False, False, True])):  # multi-head latent attention (its q latent optional)
        kwargs |= {"q_lora_rank": draw(st.sampled_from([0, 512, 1536])), "kv_lora_rank": 512,
                   "qk_rope_head_dim": 64, "v_head_dim": head_dim, "head_dim": head_dim}
    return ModelSpec(name="prop", n_layers=draw(st.sampled_from([8, 16, 32])), hidden=heads * head_dim,
                     n_heads=heads, n_kv_heads=kv, ffn_hidden=draw(st.sampled_from([2048, 4096, 8192])),
                     vocab=draw(st.sampled_from([32000, 50304])), gated_mlp=draw(st.booleans()), **kwargs)


def clusters(nodes=None):
    nodes = nodes if nodes is not None else st.sampled_from([1, 2, 4, 8])
    return st.builds(lambda n, name: load_cluster(name, nodes=n), nodes,
                     st.sampled_from(["h100-sxm", "a100-80gb", "mi300x", "b200"]))


def jobs():
    return st.builds(lambda seqs, s: JobSpec(global_batch_tokens=seqs * s, seq_len=s),
                     st.sampled_from([64, 128, 256, 512]), st.sampled_from([1024, 2048, 4096]))
