"""A Hugging Face ``config.json`` read into a ModelSpec: nothing is downloaded, only the local file is read.

Supported ``model_type``: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, deepseek_v3, gpt_oss, gemma,
gemma2, gemma3_text (and gemma3, whose text part is its ``text_config``). Each key is read as the
transformers modelling code of that architecture reads it (transformers 5.x: ``LlamaConfig``,
``Qwen3MoeConfig``, ``DeepseekV3Config``, ``GptOssConfig``, ...), with the class's default where the file leaves
a key out. The parameter count of the spec equals the count of the model transformers builds from the same
file (tests/frameworks/test_hf.py, on the meta device). A setting meshplan cannot model (a dense-layer pattern
other than the leading layers, a sliding-window pattern other than one global layer every n) is an error
naming the key, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.specs import ModelSpec

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss", "gemma",
             "gemma2", "gemma3_text", "gemma3")

# transformers 5.x defaults of the keys each architecture reads where config.json leaves them out
# (the configuration classes' __init__ signatures): what the file does not say, the class decides.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
                "sliding_window": 4096},
    "mixtral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
                "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False,
              "use_sliding_window": False},
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "tie_word_embeddings": False,
              "attention_bias": False, "use_sliding_window": False},
    "qwen3_moe": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "tie_word_embeddings": False,
                  "attention_bias": False, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False},
    "deepseek_v3": {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "tie_word_embeddings": False,
                    "attention_bias": False, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8,
                    "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128, "num_nextn_predict_layers": 0},
    "gpt_oss": {"vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": False,
                "attention_bias": True, "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128},
    "gemma": {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "tie_word_embeddings": True,
              "attention_bias": False},
    "gemma2": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
               "attention_bias": False, "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
                    "attention_bias": False, "sliding_window": 4096, "sliding_window_pattern": 6},
}


def load_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a local Hugging Face ``config.json``; SpecError naming the key where the file is not
    one meshplan reads."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("model", f"config file {str(path)!r} not found (a Hugging Face config.json is read from "
                                 "disk; nothing is downloaded)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError("model", f"{p}: not a JSON config.json ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError("model", f"{p}: a config.json holds one JSON object")
    return model_from_hf(data, name=p.parent.name if p.name == "config.json" and p.parent.name else p.stem,
                         source=f"Hugging Face config.json read from {p}")


def model_from_hf(data: dict[str, Any], *, name: str = "hf-model",
                  source: str = "Hugging Face config.json") -> ModelSpec:
    """A ModelSpec from the dict of a config.json (see the module docstring for the architectures)."""
    kind = data.get("model_type")
    if kind == "gemma3" and isinstance(data.get("text_config"), dict):  # the multimodal wrapper: its text model
        data, kind = {**data["text_config"], "model_type": "gemma3_text"}, "gemma3_text"
    if kind not in _DEFAULTS:
        raise SpecError("model.model_type", f"{kind!r} is not read; supported: {', '.join(SUPPORTED)}")
    c = {**_DEFAULTS[kind], **{k: v for k, v in data.items() if v is not None or k == "sliding_window"}}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(c.get(key), int) or isinstance(c.get(key), bool):
            raise SpecError(f"model.{key}", f"must be a whole number in config.json; got {c.get(key)!r}")
    n_heads = c["num_attention_heads"]
    spec: dict[str, Any] = {
        "name": str(data.get("_name_or_path") or name).rsplit("/", 1)[-1] or name,
        "n_layers": c["num_hidden_layers"], "hidden": c["hidden_size"], "n_heads": n_heads,
        "n_kv_heads": c.get("num_key_value_heads") or n_heads, "ffn_hidden": c["intermediate_size"],
        "vocab": c["vocab_size"], "tied_embeddings": bool(c.get("tie_word_embeddings", False)),
        "source": source,
    }
    head_dim = c.get("head_dim")
    if head_dim and kind != "deepseek_v3" and (c["hidden_size"] % n_heads or head_dim != c["hidden_size"] // n_heads):
        spec["head_dim"] = head_dim
    spec.update(_biases(kind, c))
    if kind in ("qwen3", "qwen3_moe", "gemma3_text"):
        spec["qk_norm"] = True
    if kind in ("gemma2", "gemma3_text"):
        spec["sandwich_norm"] = True
    if kind == "gpt_oss":
        spec["attention_sinks"] = True
    spec.update(_window(kind, c))
    spec.update(_moe(kind, c))
    if kind == "deepseek_v3":
        spec.update(_mla(c))
    return ModelSpec(**spec)


def _biases(kind: str, c: dict[str, Any]) -> dict[str, Any]:
    """Projection biases: Qwen2's on q, k and v alone; GPT-OSS's on the attention and the experts; a Llama-style
    ``attention_bias`` (q, k, v and o) only together with ``mlp_bias`` (every projection, ``linear_bias``)."""
    if kind == "qwen2":
        return {"qkv_bias": True}  # Qwen2Attention: q/k/v with bias, o_proj without, whatever the file says
    attention, mlp = bool(c.get("attention_bias")), bool(c.get("mlp_bias"))
    if kind == "gpt_oss":
        if not attention:
            raise SpecError("model.attention_bias", "GPT-OSS without attention biases (its experts keep theirs) is "
                                                    "not modelled")
        return {"linear_bias": True}
    if kind == "deepseek_v3" and (attention or mlp):
        raise SpecError("model.attention_bias", "biases in DeepSeek-V3's latent attention are not modelled")
    if attention != mlp:
        key = "attention_bias" if attention else "mlp_bias"
        raise SpecError(f"model.{key}", "biases on the attention projections without the MLP's, or the other way "
                                        "round, are not modelled (both or neither: linear_bias)")
    return {"linear_bias": True} if attention else {}


def _window(kind: str, c: dict[str, Any]) -> dict[str, Any]:
    """Sliding-window attention: the window [tokens] and every how many layers one is global."""
    if kind in ("qwen2", "qwen3", "qwen3_moe") and c.get("use_sliding_window"):
        raise SpecError("model.use_sliding_window", "Qwen's sliding window on the layers past max_window_layers "
                                                    "is not modelled; set use_sliding_window to false")
    window = c.get("sliding_window") if kind in ("mistral", "mixtral", "gpt_oss", "gemma2", "gemma3_text") else None
    if not window:
        return {}
    n = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        if kind == "gemma3_text":
            every = c.get("sliding_window_pattern", 6)
            types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
        elif kind in ("gpt_oss", "gemma2"):
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        else:
            types = ["sliding_attention"] * n
    if not isinstance(types, list) or len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise SpecError("model.layer_types", f"must list 'sliding_attention' or 'full_attention' for each of the "
                                             f"{n} layers; got {types!r}")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return {"attention_window": int(window)}
    every = full[0] + 1
    if full != list(range(every - 1, n, every)) or every < 2:
        raise SpecError("model.layer_types", "meshplan models one global layer every n layers (the n-th, 2n-th, "
                                             f"...); this file's global layers are {full}")
    return {"attention_window": int(window), "global_attention_every": every}


def _moe(kind: str, c: dict[str, Any]) -> dict[str, Any]:
    """Routed and shared experts, the leading dense layers and group-limited routing."""
    n = c["num_hidden_layers"]
    if kind in ("mixtral", "gpt_oss"):
        return {"n_experts": c["num_local_experts"], "top_k": c["num_experts_per_tok"],
                "expert_ffn_hidden": c["intermediate_size"], "router_bias": kind == "gpt_oss"}
    if kind == "qwen3_moe":
        step, dense = c.get("decoder_sparse_step", 1), sorted(c.get("mlp_only_layers") or [])
        moe_layers = [i for i in range(n) if i not in dense and c["num_experts"] > 0 and (i + 1) % step == 0]
        leading = n - len(moe_layers)
        if moe_layers != list(range(leading, n)):
            raise SpecError("model.mlp_only_layers", "meshplan models dense layers as the leading layers of an MoE "
                                                     f"model; this file's dense layers are "
                                                     f"{[i for i in range(n) if i not in moe_layers]}")
        return {"n_experts": c["num_experts"], "top_k": c["num_experts_per_tok"],
                "expert_ffn_hidden": c["moe_intermediate_size"], "n_dense_layers": leading}
    if kind == "deepseek_v3":
        out = {"n_experts": c["n_routed_experts"], "top_k": c["num_experts_per_tok"],
               "expert_ffn_hidden": c["moe_intermediate_size"], "n_shared_experts": c.get("n_shared_experts") or 0,
               "n_dense_layers": c.get("first_k_dense_replace", 0),
               "mtp_layers": c.get("num_nextn_predict_layers") or 0}
        if (c.get("n_group") or 1) > 1:
            out.update(n_expert_groups=c["n_group"], topk_groups=c["topk_group"])
        return out
    return {}


def _mla(c: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention (DeepseekV3Attention: q_a/q_b or q_proj, kv_a with the rotary
    key part, kv_b, o_proj)."""
    return {"q_lora_rank": c.get("q_lora_rank") or 0, "kv_lora_rank": c["kv_lora_rank"],
            "qk_rope_head_dim": c["qk_rope_head_dim"], "head_dim": c["qk_nope_head_dim"],
            "v_head_dim": c["v_head_dim"]}
