"""What `meshplan catalog --model` and `--cluster` print: a spec with what follows from it (parameter counts
by component, per-layer widths, weights and training states in memory; a cluster's GPUs, links and memory).

Memory in binary GiB, bandwidth in decimal GB/s, counts as plain numbers.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from meshplan.cost.params import param_counts
from meshplan.specs import ClusterSpec, ModelSpec
from meshplan.units import GB, GiB

BF16_BYTES = 2
ADAMW_MIXED_BYTES_PER_PARAM = 16
"""bf16 weight and gradient, fp32 master weight and two fp32 Adam moments (Rajbhandari et al., "ZeRO,"
arXiv:1910.02054, §3.1: 2 + 2 + 12 bytes per parameter)."""


def model_summary(model: ModelSpec) -> dict[str, Any]:
    """The model's fields and what follows from them, in base units (counts, bytes)."""
    pc = param_counts(model)
    derived: dict[str, Any] = {
        "params": pc.total, "active_params_per_token": pc.active, "embedding_params": pc.embedding,
        "lm_head_params": pc.lm_head, "params_per_dense_layer": pc.dense_layer if pc.n_dense_layers else None,
        "attention_params_per_layer": pc.attention_per_layer,
        "n_dense_layers": pc.n_dense_layers, "n_moe_layers": pc.n_moe_layers,
        "head_dim": model.d_head, "q_dim": model.q_dim, "kv_dim": model.kv_dim,
        "weights_bf16_bytes": pc.total * BF16_BYTES,
        "adamw_mixed_precision_states_bytes": pc.total * ADAMW_MIXED_BYTES_PER_PARAM,
    }
    if model.is_moe:
        derived |= {"routed_expert_params": pc.routed_experts, "params_per_expert":
                    pc.routed_experts_per_moe_layer // model.n_experts,
                    "non_expert_params": pc.non_expert}
    return {"spec": asdict(model), "derived": derived}


def _b(n: float) -> str:
    """A parameter count as people say it: 70.55B, 8.03B, 405M."""
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def model_text(model: ModelSpec) -> str:
    s = model_summary(model)
    d, m = s["derived"], model
    lines = [f"model {m.name} ({m.source or 'no source given'})",
             f"  parameters: {d['params']:,} ({_b(d['params'])})"
             + (f"; active per token {_b(d['active_params_per_token'])} (top-{m.top_k} of {m.n_experts} experts"
                f"{f' + {m.n_shared_experts} shared' if m.n_shared_experts else ''})" if m.is_moe else ""),
             f"    embedding {d['embedding_params']:,}; LM head {d['lm_head_params']:,}"
             + (" (tied to the embedding)" if m.tied_embeddings else "")
             + f"; attention {d['attention_params_per_layer']:,} per layer"
             + (f"; {d['params_per_dense_layer']:,} per dense layer" if d["params_per_dense_layer"] else "")]
    if m.is_moe:
        lines.append(f"    routed experts {d['routed_expert_params']:,} ({d['params_per_expert']:,} per expert), "
                     f"everything else {d['non_expert_params']:,}")
    attn = ("MLA" if m.is_mla else "GQA" if m.n_kv_heads < m.n_heads else "multi-head")
    lines += [f"  layers {m.n_layers}" + (f" ({d['n_dense_layers']} dense, {d['n_moe_layers']} MoE)" if m.is_moe
                                           else "")
              + f"; hidden {m.hidden:,}; {attn} attention, {m.n_heads} heads / {m.n_kv_heads} KV heads of "
              f"{d['head_dim']}; FFN {m.ffn_hidden:,}" + (f", experts {m.expert_ffn_hidden:,}" if m.is_moe else "")
              + f" ({'gated' if m.gated_mlp else 'two-matrix'}); vocabulary {m.vocab:,}",
              f"  memory: weights {d['weights_bf16_bytes'] / GiB:,.1f} GiB in bf16; with AdamW in mixed precision "
              f"(16 bytes per parameter) {d['adamw_mixed_precision_states_bytes'] / GiB:,.1f} GiB of model states, "
              "before any sharding"]
    if m.attention_window:
        lines.append(f"  sliding-window attention of {m.attention_window:,} tokens"
                     + (f", every {m.global_attention_every}th layer global" if m.global_attention_every else ""))
    if m.mtp_layers:
        lines.append(f"  multi-token prediction depth {m.mtp_layers}")
    return "\n".join(lines)


def cluster_summary(cluster: ClusterSpec) -> dict[str, Any]:
    a = cluster.accelerator
    return {"spec": asdict(cluster), "derived": {
        "n_gpus": cluster.n_gpus, "hbm_bytes_total": a.hbm_capacity_bytes * cluster.n_gpus,
        "bf16_flop_per_s_total": a.bf16_flop_per_s * cluster.n_gpus}}


def cluster_text(cluster: ClusterSpec) -> str:
    a, i, n = cluster.accelerator, cluster.intra, cluster.inter
    fp8 = f", FP8 {a.fp8_flop_per_s / 1e12:,.0f}" if a.fp8_flop_per_s else ""
    return "\n".join([
        f"cluster {cluster.name}: {cluster.n_nodes:,} nodes x {cluster.gpus_per_node} {a.name} = "
        f"{cluster.n_gpus:,} GPUs",
        f"  {a.name}: {a.description}; dense BF16 {a.bf16_flop_per_s / 1e12:,.0f}{fp8} TFLOP/s; HBM "
        f"{a.hbm_capacity_bytes / GiB:.2f} GiB at {a.hbm_bytes_per_s / 1e12:.2f} TB/s",
        f"  in a node: {i.kind}, {i.link_bytes_per_s / GB:,.0f} GB/s per GPU per direction (ring bus bandwidth "
        f"{i.ring_busbw_bytes_per_s / GB:,.0f} GB/s" + (f", NVLS {i.nvls_busbw_bytes_per_s / GB:,.0f}"
                                                       if i.nvls_busbw_bytes_per_s else "") + ")",
        f"  between nodes: {n.nic_bytes_per_s / GB:,.1f} GB/s per GPU per direction at efficiency {n.efficiency:.2f}",
        f"  in all: {a.hbm_capacity_bytes * cluster.n_gpus / GiB:,.0f} GiB of HBM, "
        f"{a.bf16_flop_per_s * cluster.n_gpus / 1e15:,.1f} PFLOP/s dense BF16",
    ])


def listing() -> dict[str, Any]:
    """Every catalog accelerator (with its usual node) and model, in display units (TFLOP/s, GiB, TB/s,
    GB/s), with their sources."""
    from meshplan.catalog import list_accelerators, list_models, load_cluster, load_model

    accels = []
    for name in list_accelerators():
        c = load_cluster(name)
        a = c.accelerator
        accels.append({"name": name, "description": a.description, "bf16_tflop_per_s": a.bf16_flop_per_s / 1e12,
                       "fp8_tflop_per_s": None if a.fp8_flop_per_s is None else a.fp8_flop_per_s / 1e12,
                       "hbm_gib": a.hbm_capacity_bytes / 2**30, "hbm_tb_per_s": a.hbm_bytes_per_s / 1e12,
                       "gpus_per_node": c.gpus_per_node, "intra": c.intra.kind,
                       "intra_gb_per_s": c.intra.link_bytes_per_s / GB,
                       "ring_busbw_gb_per_s": c.intra.ring_busbw_bytes_per_s / GB,
                       "nvls_busbw_gb_per_s": None if c.intra.nvls_busbw_bytes_per_s is None
                       else c.intra.nvls_busbw_bytes_per_s / GB,
                       "nic_gb_per_s": c.inter.nic_bytes_per_s / GB, "sources": a.sources})
    models = []
    for name in list_models():
        m = load_model(name)
        pc = param_counts(m)
        models.append({"name": name, "params": pc.total, "active_params": pc.active, "n_layers": m.n_layers,
                       "hidden": m.hidden, "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads,
                       "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "moe": m.is_moe, "source": m.source})
    return {"accelerators": accels, "models": models}


def listing_text(data: dict[str, Any]) -> str:
    out = ["accelerators (dense TFLOP/s; HBM in GiB and TB/s; links per GPU per direction and NCCL bus bandwidths "
           "(busbw) in decimal GB/s):"]
    for a in data["accelerators"]:
        fp8 = f"{a['fp8_tflop_per_s']:.0f}" if a["fp8_tflop_per_s"] else "-"
        nvls = f"{a['nvls_busbw_gb_per_s']:.0f}" if a["nvls_busbw_gb_per_s"] else "-"
        out.append(f"  {a['name']:<10} BF16 {a['bf16_tflop_per_s']:>7.1f}  FP8 {fp8:>6}  HBM {a['hbm_gib']:>6.2f} GiB "
                   f"{a['hbm_tb_per_s']:>4.1f} TB/s  {a['gpus_per_node']:>2}/node {a['intra']:<8} "
                   f"{a['intra_gb_per_s']:>4.0f} GB/s (busbw ring {a['ring_busbw_gb_per_s']:.0f}, NVLS {nvls})  NIC "
                   f"{a['nic_gb_per_s']:.0f} GB/s   {a['description']}")
    out.append("models:")
    for m in data["models"]:
        active = f" ({m['active_params'] / 1e9:.1f}B active)" if m["moe"] else ""
        out.append(f"  {m['name']:<16} {m['params'] / 1e9:>8.2f}B{active:<18} L={m['n_layers']:<4} h={m['hidden']:<6} "
                   f"heads={m['n_heads']}/{m['n_kv_heads']}  {m['source'][:60]}")
    out.append("every number has a source: meshplan catalog --json (in these display units, not the base units of "
               "plan and evaluate JSON); one entry in full: meshplan catalog --model NAME, --cluster NAME")
    return "\n".join(out)
