"""A model spec from Megatron-LM's architecture flags (--num-layers, --hidden-size, ...), for reading a launch
script back (megatron.read)."""

from __future__ import annotations

import re

from meshplan.errors import SpecError
from meshplan.specs import ModelSpec


def _int(flags: dict[str, list[str]], key: str, default: int | None = None) -> int:
    vals = flags.get(key)
    if not vals:
        if default is None:
            raise SpecError(f"from.megatron {key}", "is needed to read the model's architecture")
        return default
    try:
        return int(vals[0])
    except ValueError:
        raise SpecError(f"from.megatron {key}", f"must be a whole number; got {vals[0]!r}") from None


def _dense_layers(freq: str, n_layers: int) -> int:
    """Leading dense layers of --moe-layer-freq '([0]*3+[1]*58)' (or a plain 1: none)."""
    text = freq.replace(" ", "")
    if text == "1":
        return 0
    m = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", text)
    if not m or int(m.group(1)) + int(m.group(2)) != n_layers:
        raise SpecError("from.megatron --moe-layer-freq", f"meshplan models leading dense layers, "
                                                          f"'([0]*d+[1]*(L-d))'; got {freq!r}")
    return int(m.group(1))


def model_from_flags(flags: dict[str, list[str]]) -> ModelSpec:
    L, D = _int(flags, "--num-layers"), _int(flags, "--hidden-size")
    N = _int(flags, "--num-attention-heads")
    spec: dict[str, object] = {
        "name": "megatron-model", "n_layers": L, "hidden": D, "n_heads": N,
        "n_kv_heads": _int(flags, "--num-query-groups", N) if "--group-query-attention" in flags else N,
        "ffn_hidden": _int(flags, "--ffn-hidden-size", 4 * D), "vocab": _int(flags, "--vocab-size"),
        "gated_mlp": "--swiglu" in flags, "tied_embeddings": "--untie-embeddings-and-output-weights" not in flags,
        "linear_bias": "--disable-bias-linear" not in flags, "qkv_bias": "--add-qkv-bias" in flags,
        "qk_norm": "--qk-layernorm" in flags,
        "norm": "rmsnorm" if (flags.get("--normalization") or ["LayerNorm"])[0] == "RMSNorm" else "layernorm",
        "attention_sinks": (flags.get("--softmax-type") or ["vanilla"])[0] == "learnable",
        "source": "Megatron-LM architecture flags of an imported launch command",
    }
    if "--kv-channels" in flags:
        spec["head_dim"] = _int(flags, "--kv-channels")
    if (flags.get("--position-embedding-type") or ["learned_absolute"])[0] == "learned_absolute":
        spec["learned_pos_emb"] = _int(flags, "--max-position-embeddings", _int(flags, "--seq-length", 0))
    if "--num-experts" in flags:
        fe = _int(flags, "--moe-ffn-hidden-size", int(spec["ffn_hidden"]))  # type: ignore[call-overload]
        shared = _int(flags, "--moe-shared-expert-intermediate-size", 0)
        spec.update(n_experts=_int(flags, "--num-experts"), top_k=_int(flags, "--moe-router-topk", 2),
                    expert_ffn_hidden=fe, n_shared_experts=shared // fe if shared else 0,
                    n_dense_layers=_dense_layers((flags.get("--moe-layer-freq") or ["1"])[0], L))
        if "--moe-router-num-groups" in flags:
            spec.update(n_expert_groups=_int(flags, "--moe-router-num-groups"),
                        topk_groups=_int(flags, "--moe-router-group-topk", 1))
    if "--multi-latent-attention" in flags:
        spec.update(kv_lora_rank=_int(flags, "--kv-lora-rank", 32), head_dim=_int(flags, "--qk-head-dim", 128),
                    qk_rope_head_dim=_int(flags, "--qk-pos-emb-head-dim", 64),
                    v_head_dim=_int(flags, "--v-head-dim", 128),
                    q_lora_rank=_int(flags, "--q-lora-rank", 0))
    if "--mtp-num-layers" in flags:
        spec["mtp_layers"] = _int(flags, "--mtp-num-layers")
    window = (flags.get("--window-size") or [None])[0]
    if window:
        m = re.fullmatch(r"\(?(\d+),\s*0\)?", window.replace(" ", ""))
        if not m:
            raise SpecError("from.megatron --window-size", f"meshplan models a causal window '(W,0)'; got {window!r}")
        spec["attention_window"] = int(m.group(1)) + 1
        if "--window-attn-skip-freq" in flags:
            spec["global_attention_every"] = _int(flags, "--window-attn-skip-freq")
    return ModelSpec(**spec)  # type: ignore[arg-type]
