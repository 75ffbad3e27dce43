"""Citation keys used by cost terms, catalog entries and reports.

Each key maps to an IEEE-style reference with the table, equation or section used.
"""

from __future__ import annotations

REFERENCES: dict[str, str] = {
    "rajbhandari2020": (
        "S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, \"ZeRO: Memory Optimizations Toward Training "
        "Trillion Parameter Models,\" SC'20, arXiv:1910.02054, §3.1 (K = 12) and §5 (communication)."
    ),
    "korthikanti2022": (
        "V. Korthikanti et al., \"Reducing Activation Recomputation in Large Transformer Models,\" "
        "arXiv:2205.05198, 2022, Table 2 (activation bytes) and §4.2.2 (TP/SP collectives)."
    ),
    "narayanan2021": (
        "D. Narayanan et al., \"Efficient Large-Scale Language Model Training on GPU Clusters Using "
        "Megatron-LM,\" SC'21, arXiv:2104.04473, §2.2 (bubble (p-1)/m, interleaving /v) and §3.5 (FLOPs)."
    ),
    "chowdhery2022": (
        "A. Chowdhery et al., \"PaLM: Scaling Language Modeling with Pathways,\" arXiv:2204.02311, "
        "Appendix B (model FLOPs 6N + 12·L·H·Q·T, MFU vs HFU)."
    ),
    "megatron_flops": (
        "NVIDIA Megatron-LM, megatron/training/training.py::num_floating_point_operations "
        "(causal attention counted as 6·s·h_q per token per layer)."
    ),
    "megatron_memory": (
        "NVIDIA Megatron-LM, megatron/training/theoretical_memory_usage.py and "
        "docs/user-guide/features/dist_optimizer.md (18 and 6 + 12/d bytes per parameter)."
    ),
    "fsdp2_api": (
        "PyTorch, torch/distributed/fsdp/_fully_shard/_fully_shard.py and _fsdp_api.py: per-unit "
        "all-gather before forward and backward, reduce-scatter after backward, reshard_after_forward, "
        "set_requires_gradient_sync, MixedPrecisionPolicy(param_dtype, reduce_dtype)."
    ),
    "nccl_tests_perf": (
        "NVIDIA nccl-tests, doc/PERFORMANCE.md: algbw = S/t, busbw = algbw·2(n-1)/n (all-reduce), "
        "·(n-1)/n (all-gather, reduce-scatter, all-to-all)."
    ),
    "thakur2005": (
        "R. Thakur, R. Rabenseifner, W. Gropp, \"Optimization of Collective Communication Operations in "
        "MPICH,\" IJHPCA 19(1), 2005 (alpha-beta costs of ring and tree collectives)."
    ),
    "shoeybi2019": (
        "M. Shoeybi et al., \"Megatron-LM: Training Multi-Billion Parameter Language Models Using Model "
        "Parallelism,\" arXiv:1909.08053, §3 (two all-reduces forward, two backward per layer)."
    ),
    "qi2024": (
        "P. Qi et al., \"Zero Bubble Pipeline Parallelism,\" ICLR 2024 (ZB-H1 bubble (p-1)(T_F+T_B-T_W), "
        "ZB-V); sail-sg/zero-bubble-pipeline-parallelism README."
    ),
    "liu2023ring": (
        "H. Liu, M. Zaharia, P. Abbeel, \"Ring Attention with Blockwise Transformers,\" arXiv:2310.01889."
    ),
    "jacobs2023ulysses": (
        "S. A. Jacobs et al., \"DeepSpeed Ulysses,\" arXiv:2309.14509 (all-to-all of Q, K, V and O)."
    ),
    "young1974": (
        "J. W. Young, \"A first order approximation to the optimum checkpoint interval,\" Commun. ACM 17(9):530-531, "
        "1974 (tau = sqrt(2 delta M))."
    ),
    "daly2006": (
        "J. T. Daly, \"A higher order estimate of the optimum checkpoint interval for restart dumps,\" Future "
        "Generation Computer Systems 22(3):303-312, 2006, doi:10.1016/j.future.2004.11.016 (expected wall time "
        "under Poisson failures and its higher-order optimum; Figures 3-5)."
    ),
    "dubey2024": (
        "A. Dubey et al. (Meta), \"The Llama 3 Herd of Models,\" arXiv:2407.21783, 2024, §3.3.1 (storage) and "
        "§3.3.4, Table 5 (419 unexpected interruptions in 54 days on 16,384 H100)."
    ),
    "kokolis2025": (
        "A. Kokolis et al. (Meta), \"Revisiting Reliability in Large-Scale Machine Learning Research Clusters,\" "
        "HPCA 2025, arXiv:2410.21680 (failures per 1000 node-days, MTTF by job size)."
    ),
    "worked_example": "shared/seed/worked-example.md (the hand analysis meshplan starts from).",
    "ml_engineering": (
        "S. Bekman, ml-engineering (stas00/ml-engineering @744d01e1), network/README.md and "
        "compute/accelerator/README.md (measured busbw, MAMF)."
    ),
}


def cite(key: str) -> str:
    """Full reference for ``key``; raises KeyError for an unregistered key (tests check all keys)."""
    return REFERENCES[key]
