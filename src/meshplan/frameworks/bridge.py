"""Megatron-Bridge: a plan as ConfigContainer overrides (``section.field=value``) on a recipe, the form its
launchers take (scripts/training/run_recipe.py and train.sh: "Use trailing KEY=VALUE overrides for every other
ConfigContainer field"; NVIDIA-NeMo/Megatron-Bridge@067f987d). The overrides are the Megatron-LM arguments of
megatron.export, field by field: ``model`` is the recipe's GPTModelProvider (megatron-core's TransformerConfig),
``train`` the batch, ``ddp`` and ``optimizer`` the distributed optimizer, ``comm_overlap`` TP overlap,
``mixed_precision`` a named recipe."""

from __future__ import annotations

import shlex

from meshplan.frameworks.common import Export, comment_block, flag_pairs, refuse
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

STACK = "megatron"
_SAME = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
         "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups",
         "--kv-channels": "kv_channels", "--normalization": "normalization",
         "--position-embedding-type": "position_embedding_type", "--softmax-type": "softmax_type",
         "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk",
         "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
         "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
         "--moe-router-num-groups": "moe_router_num_groups", "--moe-router-group-topk": "moe_router_group_topk",
         "--mtp-num-layers": "mtp_num_layers", "--window-attn-skip-freq": "window_attn_skip_freq",
         "--vocab-size": "vocab_size", "--seq-length": "seq_length",
         "--tensor-model-parallel-size": "tensor_model_parallel_size",
         "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
         "--context-parallel-size": "context_parallel_size",
         "--expert-model-parallel-size": "expert_model_parallel_size",
         "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
         "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
         "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend",
         "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
         "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout", "--cp-comm-type": "cp_comm_type",
         "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
         "--recompute-num-layers": "recompute_num_layers", "--cpu-offloading-num-layers": "cpu_offloading_num_layers",
         "--cross-entropy-fusion-impl": "cross_entropy_fusion_impl", "--cuda-graph-impl": "cuda_graph_impl",
         "--moe-expert-capacity-factor": "moe_expert_capacity_factor"}
"""Megatron-LM flags whose value is a model (TransformerConfig) field of the same meaning."""
_TRUE = {"--swiglu": "gated_linear_unit", "--add-qkv-bias": "add_qkv_bias", "--qk-layernorm": "qk_layernorm",
         "--moe-grouped-gemm": "moe_grouped_gemm", "--sequence-parallel": "sequence_parallel",
         "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
         "--cross-entropy-loss-fusion": "cross_entropy_loss_fusion", "--fp8-param-gather": "fp8_param",
         "--moe-pad-expert-input-to-capacity": "moe_pad_expert_input_to_capacity"}
"""Megatron-LM switches that set a model field true."""
_RECIPES = (("mla", "deepseek_v3_pretrain_config"), ("window_moe", "gpt_oss_120b_pretrain_config"),
            ("moe_qk_norm", "qwen3_30b_a3b_pretrain_config"), ("qk_norm", "qwen3_8b_pretrain_config"))


BRIDGE_RECIPES = {"llama-3-8b": "llama3_8b_pretrain_config", "llama-3-70b": "llama3_70b_pretrain_config",
                  "llama-3.1-405b": "llama31_405b_pretrain_config", "llama-3.2-3b": "llama32_3b_pretrain_config",
                  "gpt3-175b": "gpt3_175b_pretrain_config", "deepseek-v3": "deepseek_v3_pretrain_config",
                  "gpt-oss-120b": "gpt_oss_120b_pretrain_config", "llama-2-7b": "llama2_7b_pretrain_config"}
"""Megatron-Bridge's recipe of each catalog model (src/megatron/bridge/recipes, aliases of the H100 recipes);
a model without one takes vanilla_gpt_pretrain_config with its architecture overridden field by field."""


def recipe(model: ModelSpec) -> str:
    """The Megatron-Bridge recipe an export starts from: the catalog model's own, else one of the same kind."""
    from meshplan.frameworks.torchtitan import model_kind

    if model.name in BRIDGE_RECIPES:
        return BRIDGE_RECIPES[model.name]
    kind = model_kind(model)
    if model.qkv_bias:
        return "qwen25_7b_pretrain_config"
    dense = "llama3_70b_pretrain_config" if model.n_layers > 48 else "llama3_8b_pretrain_config"
    return dict(_RECIPES).get(kind, dense)


def _value(vals: list[str]) -> str:
    if len(vals) > 1:
        return "[" + ",".join(vals) + "]"
    v = vals[0]
    if v.startswith("(") and v.endswith(")"):  # a window '(127,0)' becomes a list
        return "[" + v[1:-1] + "]"
    return v


def _model_overrides(args: list[str], model: ModelSpec) -> list[str]:
    """model.* overrides from the Megatron-LM arguments, with the switches off written explicitly (a recipe may
    have them on)."""
    pairs = flag_pairs(args)
    flags = {k: v for k, v in pairs if k}
    out = []
    for key, vals in pairs:
        if key in _SAME:
            out.append(f"model.{_SAME[key]}={_value(vals)}")
        elif key == "--window-size":
            out.append(f"model.window_size={_value(vals)}")
        elif key == "--moe-layer-freq":
            out.append(f"model.moe_layer_freq=[{','.join(['0'] * model.n_dense_layers + ['1'] * model.n_moe_layers)}]")
        elif key == "--recompute-modules":
            out.append(f"model.recompute_modules=[{','.join(vals)}]")
    for key, field in _TRUE.items():
        if key in ("--moe-grouped-gemm", "--overlap-moe-expert-parallel-comm") and not model.is_moe:
            continue
        out.append(f"model.{field}={'true' if key in flags else 'false'}")
    out.append(f"model.add_bias_linear={'false' if '--disable-bias-linear' in flags else 'true'}")
    out.append(f"model.share_embeddings_and_output_weights="
               f"{'false' if '--untie-embeddings-and-output-weights' in flags else 'true'}")
    if "--recompute-granularity" not in flags:
        out.append("model.recompute_granularity=null")
    if "--num-virtual-stages-per-pipeline-rank" not in flags:
        out.append("model.virtual_pipeline_model_parallel_size=null")
    if "--pipeline-model-parallel-layout" not in flags:
        out.append("model.pipeline_model_parallel_layout=null")
    out.append(f"model.cpu_offloading={'true' if '--cpu-offloading-num-layers' in flags else 'false'}")
    return out


def _other_overrides(args: list[str], job: JobSpec) -> list[str]:
    flags = dict(flag_pairs(args))
    distopt = "--use-distributed-optimizer" in flags
    instances = (flags.get("--num-distributed-optimizer-instances") or ["1"])[0]
    out = [f"train.micro_batch_size={flags['--micro-batch-size'][0]}",
           f"train.global_batch_size={flags['--global-batch-size'][0]}",
           f"dataset.seq_length={flags['--seq-length'][0]}",
           f"ddp.use_distributed_optimizer={str(distopt).lower()}",
           f"optimizer.use_distributed_optimizer={str(distopt).lower()}",
           f"ddp.overlap_grad_reduce={str('--overlap-grad-reduce' in flags).lower()}",
           f"ddp.overlap_param_gather={str('--overlap-param-gather' in flags).lower()}",
           f"ddp.num_distributed_optimizer_instances={instances}",
           f"ddp.grad_reduce_in_fp32={'false' if '--grad-reduce-in-bf16' in flags else 'true'}",
           f"optimizer.optimizer={flags['--optimizer'][0]}",
           f"comm_overlap.tp_comm_overlap={str('--tp-comm-overlap' in flags).lower()}",
           "mixed_precision=" + ("bf16_with_fp8_current_scaling_mixed" if job.precision == "fp8" else "bf16_mixed")]
    if job.fp8_attention:
        out.append("model.fp8_dot_product_attention=true")
    return out


def overrides(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, args: list[str],
              assumptions: list[str]) -> Export:
    """The Megatron-LM arguments ``args`` of ``plan`` as Megatron-Bridge overrides on the closest recipe."""
    if plan.sharding == "fsdp":
        refuse(STACK, "the Megatron-Bridge export writes Megatron's distributed optimizer; for Megatron-FSDP use the "
                      "Megatron-LM arguments (--format script or args)")
    if job.optimizer == "adamw-bf16-moments":
        refuse(STACK, "bf16 optimizer moments are torch dtypes in Megatron-Bridge's OptimizerConfig, which a "
                      "KEY=VALUE override does not set; use the Megatron-LM arguments")
    name = recipe(model)
    items = _model_overrides(args, model) + _other_overrides(args, job)
    notes = [f"the recipe {name}: its data, tokenizer, optimizer hyper-parameters, provider class (activation, "
             "norm epsilon, rotary settings) and everything below stay the recipe's; the overrides set the "
             "architecture meshplan estimated field by field"]
    if model.is_mla and name != "deepseek_v3_pretrain_config":
        notes.append("multi-head latent attention: the recipe's provider decides it; only DeepSeek-V3's has MLA")
    head = ["torchrun", "--nnodes", str(cluster.n_nodes), "--nproc-per-node", str(cluster.gpus_per_node),
            "scripts/training/run_recipe.py", "--recipe", name, "--mode", "pretrain"]
    text = "\n".join([comment_block([f"meshplan: {plan.label()} [{plan.to_string()}] for Megatron-Bridge "
                                     "(NVIDIA-NeMo/Megatron-Bridge@067f987d)",
                                     f"model {model.name}, {cluster.n_gpus} x {cluster.accelerator.name}",
                                     "assumed (Megatron-Bridge or its recipe decides these itself):"]),
                      comment_block(notes + assumptions, "#   - "),
                      " \\\n    ".join([" ".join(shlex.quote(h) for h in head), *(shlex.quote(i) for i in items)])])
    return Export(stack=STACK, format="bridge", text=text + "\n", args=tuple(items),
                  assumptions=tuple(notes + assumptions))
