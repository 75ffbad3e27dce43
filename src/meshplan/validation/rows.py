"""Turn a row of a published-runs CSV (columns of shared/data/published_runs.csv) into meshplan specs.

Every mapping decision is written here once; a row that cannot be modelled gets a reason instead of
being dropped. Inferred pieces (gated MLP from the model family, the Megatron distributed optimizer
for NeMo rows, a node size for NVL72 racks) follow the data file's README.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from meshplan.catalog import load_cluster, load_model
from meshplan.cost.step import evaluate
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.units import GiB, ascii_float
from meshplan.validation.recipes import RecipeSettings, moe_recipe, recipe_layout, recipe_offload, recipe_recompute


@dataclass(frozen=True, slots=True)
class Scenario:
    """A row as meshplan sees it: what to evaluate, what was measured."""

    row: int
    source_group: str
    gpu: str
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    plan: Plan
    measured_tokens_per_s_per_gpu: float
    measured_from: str
    """'tokens_per_sec_per_gpu' or how it was derived (e.g. from tflops_per_gpu)."""
    measured_step_time_s: float | None
    measured_peak_memory_bytes: float | None
    flops_counting: str
    precision_label: str
    imputed: tuple[str, ...] = ()
    """Settings the row does not state, taken from elsewhere, each with where from."""
    release: str = ""
    """The software release the row names (its ``software`` cell, e.g. 'NeMo 26.04.01 / Megatron-Bridge')."""


class Skip(Exception):
    """A row meshplan does not model, with the reason."""


# gpu_type pattern -> (catalog accelerator, overrides: AcceleratorSpec fields in base units, and
# "peak_scale", a factor on its BF16 and FP8 peaks), the first that matches the name in upper case with
# "NVIDIA" dropped and hyphens read as spaces ("NVIDIA A100-SXM4-40GB" is "A100 SXM4 40GB"); None for a part
# the catalog lacks, with the reason
_GPUS: list[tuple[str, str | None, dict[str, Any] | str]] = [
    (r"\b(PCIE|NVL)\b", None, "PCIe and NVL cards run at other clocks and power than the catalog's SXM parts"),
    # Meta's Grand Teton H100: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", run at a 500 W power limit;
    # "the actual peak TFLOPs number is between SXM and NVL, and we don't know its exact value" (torchtitan
    # benchmarks/llama3_h100_202412_torchtitan.md, "Hardware" and footnote 2). Taken at the middle of that
    # range: SXM 989.4 and NVL 835.5 dense BF16 TFLOP/s (NVIDIA H100 datasheet, 1,979 and 1,671 with
    # sparsity), 0.922 of the SXM peak, BF16 and FP8 alike; the range is +-8 %.
    (r"\bH100\b.*\b96 ?GB\b", "h100-sxm", {"hbm_capacity_bytes": 96 * GiB, "hbm_bytes_per_s": 2.4e12,
                                           "peak_scale": (989.4 + 835.5) / 2 / 989.4}),
    (r"\bH100\b", "h100-sxm", {}),
    (r"\bH200\b", "h200", {}),
    (r"\bA100\b.*(\b40 ?GB\b|\(DGX A100\))", "a100-40gb", {}),  # Megatron v1's 2020 tables: DGX A100 shipped
    (r"\bA100\b.*\b80 ?GB\b", "a100-80gb", {}),                  # 40 GB parts until Nov 2020
    (r"\bA100\b", None, "an A100 without its memory size (40GB or 80GB)"),
    (r"\bGB200\b", "gb200", {}),
    (r"\bGB300\b", "gb300", {}),
    (r"\bB200\b", "b200", {}),
    (r"\bB300\b", "b300", {}),
]


def _accelerator(gpu: str) -> tuple[str, dict[str, Any]]:
    """The catalog accelerator of a ``gpu_type`` and its overrides (_GPUS); skips a part the catalog lacks."""
    name = re.sub(r"\bNVIDIA\b", "", gpu.upper()).replace("-", " ").replace("_", " ")
    for pattern, accel, extra in _GPUS:
        if re.search(pattern, name):
            if accel is None:
                raise Skip(f"accelerator {gpu!r} not in the catalog: {extra}")
            assert isinstance(extra, dict)
            return accel, extra
    raise Skip(f"accelerator {gpu!r} not in the catalog")


SOFTWARE_OF_GROUP = {
    "MosaicML llm-foundry": "llm-foundry",
    "torchtitan": "torchtitan",
    "NVIDIA dgxc-benchmarking": "megatron",
    "NeMo / Megatron-Bridge": "megatron",
    "Megatron-LM papers": "megatron",
    "Megatron-LM": "megatron",
}

MEGATRON_V1 = "Megatron-LM (2020)"
MEGATRON_CORE_GROUPS = ("NVIDIA dgxc-benchmarking", "NeMo / Megatron-Bridge", "Megatron-LM")
"""Source groups whose runs used Megatron-core (its distributed optimizer, sequence parallelism, TP overlap)."""
EMBEDDING_LOSS_SPLIT = ("Megatron-core's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_"
                        "split: it asserts that the model chunks divide the decoder layers unless a flag or a layout "
                        "is set, and here they divide the layers + 2 only (specs.layout.embedding_loss_layout); "
                        "Megatron-Bridge's Llama 3.1 405B and Qwen3-235B-A22B recipes set both")
MEGATRON_V1_RECIPE = ("Shoeybi et al. 2019 (arXiv:1909.08053) §4.2, Megatron-LM v1's training recipe: \"we utilize "
                      "activation checkpointing after every transformer layer\"")
"""The Megatron v1 README's scaling rows leave recompute blank; the paper whose code and recipe they
ran states it."""


def _software(row: dict[str, str]) -> str:
    """The row's software stack: by source group, except the dgxc MaxText (JAX) rows."""
    if "maxtext" in (row.get("model", "") + row.get("software", "")).lower():
        return "maxtext"
    return SOFTWARE_OF_GROUP.get(row["source_group"], "generic")


GPT_OSS_WINDOW = (128, 2)
"""GPT-OSS's (attention_window, global_attention_every), which the rows do not state: Megatron-Bridge's
GPT-OSS bridge sets window_size=(127, 0) and window_attn_skip_freq=2 (src/megatron/bridge/models/gpt_oss/
gpt_oss_bridge.py), as the Hugging Face config does (sliding_window 128, sliding and full layers
alternating)."""

_GATED_FAMILIES = ("llama", "mixtral", "qwen", "deepseek", "kimi", "gpt-oss", "grok", "mistral")


def _f(row: dict[str, str], key: str) -> float | None:
    """The row's number in column ``key``, None where the cell is blank; a cell that is not a finite
    positive number skips the row, naming the column (never read as blank, nor as another number)."""
    v = (row.get(key) or "").strip()
    if not v:
        return None
    try:
        x = ascii_float(v)
    except ValueError:
        raise Skip(f"{key}={v[:40]!r}: not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise Skip(f"{key}={v!r}: must be a finite number > 0")
    return x


def _i(row: dict[str, str], key: str, default: int | None = None) -> int | None:
    """``_f`` for a count: a whole number >= 1."""
    v = _f(row, key)
    if v is None:
        return default
    if v != int(v):
        raise Skip(f"{key}={row[key].strip()!r}: must be a whole number >= 1")
    return int(v)


def _word(row: dict[str, str], key: str, allowed: tuple[str, ...]) -> str:
    """The lower-cased cell of a categorical column, which must begin with one of ``allowed`` (the words
    of shared/data/README.md; '' allows a blank cell); anything else skips the row, naming them."""
    cell = (row.get(key) or "").strip()
    v = cell.lower()
    if any(v.startswith(a) if a else not v for a in allowed):
        return v
    shown = ", ".join(repr(a) if a else "blank" for a in allowed)
    raise Skip(f"{key}={cell!r}: must begin with one of {shown} (any case)")


def _model(row: dict[str, str], idx: int) -> ModelSpec:
    name = row["model"]
    low = name.lower()
    notes = row.get("notes", "")
    if "nemotron-h" in low or "mamba" in notes.lower():
        raise Skip("hybrid Mamba/attention stack: Mamba layers are not modelled")
    if low.startswith("deepseek-v3"):
        base = load_model("deepseek-v3")
        mtp = 0 if "w/o mtp" in notes.lower() else base.mtp_layers  # the 25.11 tables' "DeepSeekV3 (w/o MTP)"
        return replace(base, name=name, nominal_params=None, mtp_layers=mtp)
    L, h, heads = _i(row, "n_layers"), _i(row, "hidden"), _i(row, "n_heads")
    kv = _i(row, "n_kv_heads", heads)
    ffn = _i(row, "ffn_hidden", 4 * h if h else None)
    vocab = _i(row, "vocab")
    if not (L and h and heads and ffn and vocab):
        raise Skip("model dimensions incomplete")
    gated = any(f in low for f in _GATED_FAMILIES) and "squared-relu" not in notes.lower()
    kwargs: dict[str, Any] = {}
    moe = re.search(r"MoE[^;|]*?(\d+)\s+(?:routed\s+)?experts?[^;|]*?top-(\d+)", notes)
    if "kimi" in low:
        base = load_model("deepseek-v3")
        return replace(base, name=name, n_heads=heads, n_kv_heads=heads, n_experts=384, vocab=vocab,
                       n_dense_layers=1, n_expert_groups=0, topk_groups=0, mtp_layers=0,
                       nominal_params=None)  # no group limit; Kimi-K2 has no MTP (num_nextn_predict_layers = 0)
    if moe:
        n_exp, top = int(moe.group(1)), int(moe.group(2))
        shared = 1 if re.search(r"\+\s*1 shared", notes) else 0
        kwargs = {"n_experts": n_exp, "top_k": top, "expert_ffn_hidden": ffn, "n_shared_experts": shared}
    head_dim = None
    if h % heads:
        head_dim = 128
    elif "qwen3" in low or "gpt-oss" in low:
        head_dim = 128 if "qwen3" in low else 64
    if "gpt-oss" in low:  # alternating 128-token sliding-window and full attention (GPT_OSS_WINDOW)
        kwargs |= {"attention_window": GPT_OSS_WINDOW[0], "global_attention_every": GPT_OSS_WINDOW[1]}
    try:
        return ModelSpec(name=name, n_layers=L, hidden=h, n_heads=heads, n_kv_heads=kv, ffn_hidden=ffn, vocab=vocab,
                         gated_mlp=gated, head_dim=head_dim, tied_embeddings=low.startswith("mpt"), **kwargs)
    except SpecError as exc:
        raise Skip(f"model spec: {exc}") from None


def _cluster(row: dict[str, str]) -> ClusterSpec:
    gpu = row["gpu_type"]
    n = _i(row, "n_gpus")
    if not n:
        raise Skip("n_gpus missing")
    name, overrides = _accelerator(gpu)
    gpn = _i(row, "gpus_per_node", 8) or 8
    if gpn > 8:  # an NVL72 domain: jobs use whole trays; take the largest power of two dividing the job
        gpn = math.gcd(n, 64)
    gpn = min(gpn, n)
    nodes = max(1, n // gpn)
    if nodes * gpn != n:
        raise Skip(f"{n} GPUs do not fill nodes of {gpn}")
    inter = None
    m = re.search(r"(\d+)\s*Gbps node-node", row.get("interconnect", ""))
    if m:
        inter = int(m.group(1)) / 8 / gpn  # Gb/s per node -> GB/s per GPU
    m = re.search(r"(\d+)\s*Gb/s per GPU", row.get("interconnect", ""))
    if m:
        inter = int(m.group(1)) / 8
    try:
        cluster = load_cluster(name, nodes=nodes, gpus_per_node=gpn, inter_node_gb_per_s=inter)
    except SpecError as exc:
        raise Skip(f"cluster: {exc}") from None
    if overrides:
        accel = cluster.accelerator
        fields = {k: v for k, v in overrides.items() if k != "peak_scale"}
        peak = overrides.get("peak_scale", 1.0)
        accel = replace(accel, bf16_flop_per_s=accel.bf16_flop_per_s * peak,
                        fp8_flop_per_s=accel.fp8_flop_per_s and accel.fp8_flop_per_s * peak, **fields)
        cluster = replace(cluster, accelerator=accel)
    return cluster


TORCHTITAN_COMPILED_LOSS = {"e7c0cae": "2025-06-13"}
"""torchtitan commits in the data that compile the loss under --training.compile: torchtitan PR #1033
(merged 2025-04-01) made the loss builder "compiling the loss fn if job_config.training.compile is set";
the December 2024 rows (9dec370) ran before it, with the eager loss."""


NEMO2_PERF_FP8 = ("NeMo 2.0's performance scripts of early 2025 set grad_reduce_in_fp32 = False for FP8 runs: "
                  "scripts/performance/llm/pretrain_gpt3_175b.py @013fdca7 (recipe.trainer.plugins = "
                  "bf16_with_fp8_mixed(); recipe.trainer.plugins.grad_reduce_in_fp32 = False), the same block in "
                  "the Mixtral and Llama 3 scripts, later scripts/performance/utils.py set_primary_perf_configs")
"""The NeMo 25.02 and 25.04 user-guide tables (B200, GB200; every row FP8) ran these scripts."""

BF16_GRAD_RULES: tuple[tuple[str, str, str | None, str], ...] = (
    ("dgxc-benchmarking v25.04", "Llama-3.1", "fp8",
     "dgxc-benchmarking v25.04 llama3.1/pretrain_llama31.py @741c886: FP8 runs set grad_reduce_in_fp32 = False "
     "(BF16 runs keep the NeMo recipe's fp32)"),
    ("dgxc-benchmarking v24.11.1", "GPT3-175B", None,
     "dgxc-benchmarking v24.11.1 nemo_megatron/gpt3_175b_hydra.yaml @35a9aec: optim grad_sync_dtype: bf16"),
    ("dgxc-benchmarking v24.11.1", "Nemotron4-340B", None,
     "dgxc-benchmarking nemotron4-340b-synth.yaml (v25.02 @8f5cbb3, the nearest stored version): "
     "grad_sync_dtype: bf16"),
    ("dgxc-benchmarking v25.05.01", "Grok-1", None,
     "dgxc-benchmarking v25.05.01 grok1/launch.sh @60d6fd3 runs NeMo's performance script "
     "pretrain_grok1_314b.py (@01b83a7, the nearest stored version): grad_reduce_in_fp32 = False for BF16 and FP8"),
    ("NeMo 25.02", "", "fp8", NEMO2_PERF_FP8),
    ("NeMo 25.04", "", "fp8", NEMO2_PERF_FP8),
    ("Megatron-Bridge", "", None,
     "Megatron-Bridge's performance scripts set grad_reduce_in_fp32 = False for every model: the 25.09 workload "
     "yamls (mixed_precision: grad_reduce_in_fp32: false), the per-family set_*_common_configs of "
     "scripts/performance (recipe.mixed_precision.grad_reduce_in_fp32 = False, recipe.ddp.grad_reduce_in_fp32 = "
     "False) and perf_recipes' _perf_precision (cfg.grad_reduce_in_fp32 = False)"),
)
"""Rows whose launcher is read to keep Megatron's gradient buffer and reduction in bf16: (software contains,
model starts with, precision or None for any, source). NeMo 2.0's and Megatron-Bridge's library recipes keep
it in fp32 (bf16_mixed(): grad_reduce_in_fp32=True; Megatron-Bridge training/mixed_precision.py); the
benchmark launchers named here turn it off. Launchers not read keep fp32."""


RECIPE_RECOMPUTE = "recompute: the recipe's "
"""Prefix of the imputed note of a recomputation read in a recipe file (moe_recipes.toml, [[recompute]])."""

BRIDGE_TE_LOSS = ("Megatron-Bridge's performance scripts set cross_entropy_fusion_impl = 'te' for every workload "
                  "(scripts/performance/utils/overrides.py @00538e2, _set_common_perf_overrides; the same line in "
                  "every stored version of the file; not for the 25.09 rows, whose YAML launchers were not read)")
"""The NeMo / Megatron-Bridge rows' cross-entropy: Transformer Engine's, in place over the logits."""


def _loss(row: dict[str, str], compiled: bool) -> tuple[str, tuple[str, ...]]:
    """(JobSpec.loss, imputed note) of a row: the stack's own ('auto'), except Megatron-Bridge rows
    (BRIDGE_TE_LOSS) and torchtitan rows run with torch.compile (``compiled``, from _compiled) at a commit
    that compiles the loss (TORCHTITAN_COMPILED_LOSS)."""
    sw = row.get("software", "")
    if "Megatron-Bridge" in sw and "25.09" not in sw:
        return "te", (f"loss=te from {BRIDGE_TE_LOSS}",)
    commit = next((c for c in TORCHTITAN_COMPILED_LOSS if c in sw), None)
    if not compiled or commit is None:
        return "auto", ()
    return "fused", (f"loss=fused: torchtitan {commit} ({TORCHTITAN_COMPILED_LOSS[commit]}) compiles the loss "
                     "with the model since PR #1033 (2025-04-01)",)


def _compiled(row: dict[str, str]) -> tuple[bool, tuple[str, ...]]:
    """(JobSpec.compiled, imputed note): the torchtitan rows that say they ran torch.compile ("FSDP+compile",
    "torch.compile") are compiled, those that say "eager" are not; the torchtitan rows that say neither are
    taken as eager, torchtitan's default (``training.compile = false``), and list it. Other stacks' rows run
    eager blocks or the stack's own fused kernels."""
    if row.get("source_group") != "torchtitan":
        return False, ()
    notes = row.get("notes", "").lower()
    if "compile" in notes:
        return True, ()
    if "eager" in notes:
        return False, ()
    return False, ("compiled=false: the row does not say; torchtitan's training.compile defaults to false",)


def _reduce_dtype_bytes(row: dict[str, str], precision: str) -> tuple[float, tuple[str, ...]]:
    """(JobSpec.reduce_dtype_bytes, imputed note): 2 where the row's launcher is read to reduce in bf16
    (BF16_GRAD_RULES), else fp32's 4."""
    software, model = row.get("software", ""), row.get("model", "")
    for in_software, model_prefix, rule_precision, source in BF16_GRAD_RULES:
        if (in_software in software and model.startswith(model_prefix)
                and rule_precision in (None, precision)):
            return 2.0, (f"reduce_dtype_bytes=2 from {source}",)
    return 4.0, ()


def _precision(row: dict[str, str]) -> str:
    p = _word(row, "precision", ("bf16", "fp16", "16-bit", "fp8", "mxfp8", "nvfp4"))
    if "fp4" in p:
        raise Skip("NVFP4 compute is not modelled")
    return "fp8" if ("fp8" in p) else "bf16"


TORCHTITAN_PIPELINE = ("torchtitan's pipeline defaults of late 2024 (torchtitan/parallelisms/pipelining_utils.py): "
                       "n_microbatches = pipeline_parallel_degree when pipeline_parallel_microbatches is unset, "
                       "and 2 stages per rank for multi-stage schedules (generate_split_points)")
"""torchtitan's pipelined benchmark rows give the local batch and the schedule's name, not the micro-batch
or the stages per rank. Its code of the time split the local batch into as many micro-batches as there are
pipeline ranks. The two schedules measured on one layout (Llama 3.1 405B, 1F1B 100 against interleaved
128 tokens/s per GPU) differ by what their bubbles predict with 8 micro-batches, (8+7)/(8+3.5) = 1.30, and
not with 32 (1.10)."""


def _torchtitan_pipeline(row: dict[str, str], dp: int, pp: int, vpp: int | None, mbs: int | None
                         ) -> tuple[int | None, int | None, tuple[str, ...]]:
    """(vpp, mbs, imputed) of a torchtitan pipelined row that leaves them out (TORCHTITAN_PIPELINE)."""
    said = []
    gbs = _i(row, "global_batch_size")
    if not mbs and gbs and gbs % (dp * pp) == 0:
        mbs = gbs // (dp * pp)
        said.append(f"mbs={mbs} (local batch {gbs // dp} over {pp} micro-batches)")
    if not vpp and "interleaved" in row.get("notes", "").lower():
        vpp = 2
        said.append("2 stages per rank")
    return vpp, mbs, (f"{', '.join(said)} from {TORCHTITAN_PIPELINE}",) if said else ()


def _plan(row: dict[str, str], model: ModelSpec,
          n_gpus: int) -> tuple[Plan, tuple[str, ...], RecipeSettings | None]:
    """The plan a row ran, what of it was imputed (and from where), and its MoE recipe's settings."""
    imputed: tuple[str, ...] = ()
    fix = recipe_layout(row)
    if fix is not None:  # the table's row disagrees with every version of the preset it ran
        said = ", ".join(f"{k}={v} (the table: {row.get(k) or 'blank'})" for k, v in fix.values.items())
        imputed = (f"{said} from {fix.source}",)
        row = {**row, **fix.values}
    tp, pp, cp, ep = (_i(row, k, 1) or 1 for k in ("tp", "pp", "cp", "ep"))
    dp = _i(row, "dp") or n_gpus // (tp * pp * cp)
    if tp * pp * cp * dp != n_gpus:
        raise Skip(f"layout tp·pp·cp·dp = {tp * pp * cp * dp} does not match {n_gpus} GPUs")
    group = row["source_group"]
    sharding, raf, dp_shard, dp_rep = _sharding(row, group, dp)
    if ep > 1 and (tp * cp * dp_shard) % ep:
        raise Skip(f"ep={ep} does not fold into tp·cp·dp_shard = {tp * cp * dp_shard}")
    schedule, v, split, mbs, said_pipeline = _pipeline(row, model, group, dp, pp)
    recompute, said_recompute = _recompute(row)
    imputed = (*imputed, *said_pipeline, *said_recompute)
    sp, async_tp, etp = _tp_options(row, group, tp, ep)
    try:
        plan = Plan(dp_replicate=dp_rep, dp_shard=dp_shard, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, mbs=mbs,
                    recompute=recompute, sharding=sharding, reshard_after_forward=raf, sp=sp, schedule=schedule,
                    vpp=v, async_tp=async_tp, layout=split)
    except SpecError as exc:
        raise Skip(f"plan: {exc}") from None
    layout = {"pp": pp, "vpp": v if schedule == "interleaved" else 0, "ep": ep, "mbs": mbs or 0}
    if recompute is None:
        plan, imputed = _recipe_memory_saving(row, layout, plan, imputed)
    return _with_moe_recipe(row, layout, plan, imputed)


def _sharding(row: dict[str, str], group: str, dp: int) -> tuple[str, bool | int | None, int, int]:
    """A row's sharding, reshard_after_forward and (dp_shard, dp_replicate) split of its ``dp`` replicas,
    from its zero_or_fsdp column and source group."""
    z = _word(row, "zero_or_fsdp", ("", "none", "fsdp", "zero1", "zero2", "zero3", "distributed optimizer"))
    sharding = "fsdp"
    raf: bool | int | None = None
    dp_shard, dp_rep = dp, 1
    if "jax fsdp" in z:
        m = re.search(r"degree (\d+); dp (\d+)", z)
        if m:
            dp_shard, dp_rep = int(m.group(1)), int(m.group(2))
            if dp_shard * dp_rep != dp:
                dp_shard, dp_rep = dp, 1
    elif "shard_grad_op" in z:
        raf = False
    elif z[:5] in ("zero1", "zero2", "zero3"):
        sharding = z[:5]
    elif "fsdp" in z:
        pass
    elif group in MEGATRON_CORE_GROUPS or "distributed optimizer" in z:
        sharding = "megatron"
    elif group == "Megatron-LM papers":
        sharding, dp_shard, dp_rep = "fsdp", 1, dp  # 2020-2022 Megatron: DDP, optimizer not sharded
    return sharding, raf, dp_shard, dp_rep


def _pipeline(row: dict[str, str], model: ModelSpec, group: str, dp: int, pp: int
              ) -> tuple[str, int, str, int | None, tuple[str, ...]]:
    """A row's schedule, virtual stages, layout and micro-batch size, and what of them was imputed."""
    imputed: tuple[str, ...] = ()
    # a pipeline said to interleave without its stages per rank ('... not stated'): imputed below
    vpp = None if "not stated" in (row.get("virtual_pp") or "").lower() else _i(row, "virtual_pp")
    mbs = _i(row, "micro_batch_size")
    if group == "torchtitan" and pp > 1:
        vpp, mbs, said_tt = _torchtitan_pipeline(row, dp, pp, vpp, mbs)
        imputed = (*imputed, *said_tt)
    elif group == "torchtitan" and not mbs:  # without PP (and no accumulation then) the local batch is it
        stated = re.search(r"local batch (\d+)", row.get("notes", ""))
        mbs = int(stated.group(1)) if stated else None
    schedule, v = "1f1b", 1
    split = ""
    if group in MEGATRON_CORE_GROUPS and pp > 1:
        split = model.embedding_loss_layout(pp * (vpp or 1)) or ""
        if split:
            imputed = (*imputed, f"layout={split} from {EMBEDDING_LOSS_SPLIT}")
    if pp > 1 and vpp and vpp > 1 and (model.n_layers >= pp * vpp or split):  # uneven chunks: Megatron layouts
        schedule, v = "interleaved", vpp
    return schedule, v, split, mbs, imputed


def _recompute(row: dict[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """A row's recompute mode (None where it does not say), and what was imputed."""
    rc = _word(row, "recompute", ("", "none", "full", "selective"))
    if rc.startswith("selective") and ("op" in rc or "sac" in rc):
        recompute: str | None = "sac"  # torchtitan selective AC, op policy
    elif rc.startswith("selective"):
        recompute = "selective"
    else:
        recompute = "full" if rc.startswith("full") else "none" if rc.startswith("none") else None
    if not rc and row.get("software", "").startswith(MEGATRON_V1):
        return "full", (f"recompute=full from {MEGATRON_V1_RECIPE}",)
    return recompute, ()


def _tp_options(row: dict[str, str], group: str, tp: int, ep: int) -> tuple[bool | None, bool, int | None]:
    """A row's sequence parallelism, async TP and expert TP (None: as stated nowhere)."""
    spv = _word(row, "sequence_parallel", ("", "y", "n"))
    sp = None if not spv else spv.startswith("y")
    if group in MEGATRON_CORE_GROUPS and not spv:
        sp = True
    # NeMo / Megatron performance recipes overlap TP communication with GEMMs (--tp-comm-overlap, userbuffers)
    async_tp = tp > 1 and group in MEGATRON_CORE_GROUPS
    async_tp = async_tp or (tp > 1 and "asynctp" in row.get("notes", "").lower().replace(" ", ""))  # as stated
    m = re.search(r"expert TP \(ETP\)\s*=\s*(\d+)", row.get("notes", ""))
    etp = int(m.group(1)) if m and ep > 1 else None  # stated; else Plan's default (1 under EP, the recipes')
    return sp, async_tp, etp


def _recipe_memory_saving(row: dict[str, str], layout: dict[str, int], plan: Plan, imputed: tuple[str, ...]
                          ) -> tuple[Plan, tuple[str, ...]]:
    """For a row that does not say how it recomputes: its recipe's recomputation, else its recipe's
    activation offloading, where the recipe is known."""
    rc_recipe = recipe_recompute(row, layout)
    if rc_recipe is not None:
        plan = replace(plan, recompute=rc_recipe.recompute, recompute_modules=rc_recipe.modules)
        said = f"modules={rc_recipe.modules}" if rc_recipe.modules else "none"
        return plan, (*imputed, f"{RECIPE_RECOMPUTE}{said} from {rc_recipe.source}")
    offload = recipe_offload(row, layout)
    if offload is not None:
        plan = replace(plan, recompute="none", offload_layers=offload.layers)
        imputed = (*imputed, f"offload_layers={offload.layers}, recompute=none from {offload.source}")
    return plan, imputed


def _with_moe_recipe(row: dict[str, str], layout: dict[str, int], plan: Plan, imputed: tuple[str, ...]
                     ) -> tuple[Plan, tuple[str, ...], RecipeSettings | None]:
    """``plan`` with its MoE recipe's plan settings where the row ran a known recipe, and the recipe."""
    recipe = moe_recipe(row, layout)
    if recipe is None:
        return plan, imputed, None
    settings = {"ep_overlap": recipe.ep_overlap} | ({"ep_dispatch": recipe.ep_dispatch} if recipe.ep_dispatch else {})
    job_settings = ", ".join(said for on, said in ((recipe.fp8_attention, "fp8_attention=true"),
                                                  (recipe.fused_grouped_mlp, "fused_grouped_mlp=true"),
                                                  (recipe.cuda_graphs, "cuda_graphs=true, "
                                                                       "cuda_graph_scope=full_iteration")) if on)
    try:
        plan = replace(plan, **settings)
    except SpecError as exc:  # a recipe meshplan's plan checks refuse: keep the defaults, say so
        kept = f"; {job_settings} from it kept" if job_settings else ""
        return plan, (*imputed, f"recipe {recipe.source}'s plan settings not applied: {exc}{kept}"), recipe
    said = ", ".join([*(f"{k}={str(v).lower()}" for k, v in settings.items()), *filter(None, [job_settings])])
    return plan, (*imputed, f"{said} from {recipe.source}"), recipe


TOKEN_DROP_GRAPHS = ("cuda_graphs=true: Megatron-Bridge 25.09's token-drop MoE runs capture each layer in a CUDA "
                     "graph, which dropping and padding to capacity make possible (static shapes; the 25.09 "
                     "workload yamls set cuda_graphs, e.g. scripts/performance/configs/qwen3/"
                     "qwen3_30b_a3b_llm_pretrain.yaml@48b5204)")


def _cuda_graphs(row: dict[str, str], recipe: RecipeSettings | None) -> tuple[bool, str, tuple[str, ...]]:
    """(JobSpec.cuda_graphs, JobSpec.cuda_graph_scope, imputed note): NeMo / Megatron-Bridge MoE rows whose
    recipe captures the whole iteration (moe_recipes.toml; its note is the recipe's), and the 25.09
    token-drop rows, each layer a graph. Every other row launches its MoE layers from the host: the
    dropless dispatcher waits on the host for its token counts, and the 25.11-26.04 recipes capture
    attention and the router, not the experts."""
    if recipe is not None and recipe.cuda_graphs:
        return True, "full_iteration", ()
    if (row.get("source_group") == "NeMo / Megatron-Bridge" and "tokendrop" in row.get("notes", "").lower()
            and "NeMo 25.09" in row.get("software", "")):
        return True, "layers", (TOKEN_DROP_GRAPHS,)
    return False, "layers", ()


FLOPS_COUNTINGS = ("hardware-like", "model flops", "nemo", "megatron", "mfu")
"""How a row's TFLOP/s counts (``flops_counting``, read where throughput is derived from them): 'hardware-like'
counts the full-recompute forward; the others (model FLOPs as NeMo, Megatron-core, Megatron v1 or an MFU
definition state them) count none."""


def _measured_tokens(row: dict[str, str], model: ModelSpec) -> tuple[float, str]:
    tps = _f(row, "tokens_per_sec_per_gpu")
    if tps:
        return tps, "tokens_per_sec_per_gpu"
    tflops = _f(row, "tflops_per_gpu")
    if not tflops:
        raise Skip("no throughput measured (tokens/s and TFLOP/s both blank)")
    from meshplan.cost.flops import model_flop_per_token, recompute_flop_per_token
    from meshplan.cost.params import param_counts

    counts = param_counts(model)
    seq = int(_f(row, "seq_len") or 0)
    f = model_flop_per_token(model, counts, seq_len=seq, causal=False)
    how = "tflops_per_gpu / model FLOPs per token (non-causal)"
    counting = _word(row, "flops_counting", FLOPS_COUNTINGS)
    if counting.startswith("hardware-like"):
        f += recompute_flop_per_token(model, counts, seq_len=seq, recompute="full", flash_attention=True,
                                      causal=False)
        how = "tflops_per_gpu / hardware FLOPs per token (with the full-recompute forward)"
    return tflops * 1e12 / f, how


def impute_virtual_stages(rows: list[dict[str, str]]) -> dict[int, dict[str, str]]:
    """Rows whose configuration table lists the virtual pipeline stages as not available ('VP=NA' in the
    notes), with the VP that every other row of the same source group, model, TP and PP states, where
    they all state the same one (dgxc Nemotron-4 340B v25.04 on PP=8: VP=12 in its other releases). The
    returned rows carry it in ``virtual_pp``; rows with no such siblings, or disagreeing ones, are left
    as they are."""
    def key(r: dict[str, str]) -> tuple[str, ...]:
        return tuple(r.get(k) or "" for k in ("source_group", "model", "tp", "pp"))

    stated: dict[tuple[str, ...], set[str]] = {}
    for r in rows:
        v = (r.get("virtual_pp") or "").strip()
        if v.isdigit():
            stated.setdefault(key(r), set()).add(v)
    out = {}
    for i, r in enumerate(rows):
        vs = stated.get(key(r), set())
        if re.search(r"\bVP=NA\b", r.get("notes") or "") and not (r.get("virtual_pp") or "").strip() and len(vs) == 1:
            out[i] = {**r, "virtual_pp": next(iter(vs))}
    return out


RECOMPUTE_REPLACED = "recompute chosen by meshplan"
"""How an imputed note begins where meshplan's memory model puts a run's recipe recomputation over the GPU
(the run fitted), so that the row runs meshplan's own choice: the memory model's error, counted by
``validate`` beside the runs predicted not to fit."""


def _fitting_recompute(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan,
                       imputed: tuple[str, ...]) -> tuple[Plan, tuple[str, ...]]:
    """The plan with its recipe's recomputation where meshplan's memory model has it fit; otherwise the
    recomputation meshplan chooses (the fastest that fits), and the imputed note says why: a measured run
    fitted, so the excess is the memory model's, and it is listed rather than reported as a run that
    cannot fit."""
    est = evaluate(model, cluster, job, plan, time_infeasible=False)
    over = (est.memory.peak_bytes - est.memory.capacity_bytes) / GiB
    if over <= 0:
        return plan, imputed
    said = next(n for n in imputed if n.startswith(RECIPE_RECOMPUTE))
    kept = tuple(n for n in imputed if n is not said)
    return replace(plan, recompute=None, recompute_modules=""), (
        *kept, f"{RECOMPUTE_REPLACED}: its memory model puts {said} {over:.1f} GiB over the GPU's memory")


def scenario_from_row(idx: int, row: dict[str, str]) -> Scenario:
    """The specs of one row; raises Skip with a reason when the row cannot be modelled."""
    model = _model(row, idx)
    cluster = _cluster(row)
    seq = _i(row, "seq_len")
    gbs = _i(row, "global_batch_size")
    if not seq:
        raise Skip("seq_len missing")
    if not gbs:
        raise Skip("global batch size not published")
    precision = _precision(row)
    compiled, compiled_note = _compiled(row)
    loss, loss_note = _loss(row, compiled)
    reduce_bytes, reduce_note = _reduce_dtype_bytes(row, precision)
    plan, imputed, recipe = _plan(row, model, cluster.n_gpus)
    graphs, graph_scope, graphs_note = _cuda_graphs(row, recipe)
    try:
        job = JobSpec(global_batch_tokens=gbs * seq, seq_len=seq, precision=precision,
                      fp8_param_gather=precision == "fp8" and "fp8 fsdp all-gather" in row["precision"].lower(),
                      loss=loss, reduce_dtype_bytes=reduce_bytes,
                      flash_attention=not _word(row, "flash_attention", ("", "y", "n", "unknown")).startswith("n"),
                      fp8_attention=recipe is not None and recipe.fp8_attention and precision == "fp8",
                      fused_grouped_mlp=recipe is not None and recipe.fused_grouped_mlp and precision == "fp8",
                      compiled=compiled, cuda_graphs=graphs, cuda_graph_scope=graph_scope, software=_software(row))
    except SpecError as exc:
        raise Skip(f"job: {exc}") from None
    imputed = (*imputed, *loss_note, *reduce_note, *compiled_note, *graphs_note)
    if any(note.startswith(RECIPE_RECOMPUTE) for note in imputed):
        plan, imputed = _fitting_recompute(model, cluster, job, plan, imputed)
    if "gpt-oss" in row["model"].lower():
        imputed = (*imputed, f"attention_window={model.attention_window}, global_attention_every="
                             f"{model.global_attention_every} from Megatron-Bridge's gpt_oss_bridge.py "
                             "(rows.GPT_OSS_WINDOW)")
    tokens, how = _measured_tokens(row, model)
    mem = _f(row, "peak_memory_gb")
    return Scenario(row=idx, source_group=row["source_group"], gpu=row["gpu_type"], model=model, cluster=cluster,
                    job=job, plan=plan, measured_tokens_per_s_per_gpu=tokens, measured_from=how,
                    measured_step_time_s=_f(row, "step_time_s"),
                    measured_peak_memory_bytes=None if mem is None else mem * GiB,
                    flops_counting=row.get("flops_counting", ""), precision_label=row["precision"],
                    imputed=imputed, release=(row.get("software") or "").strip())
