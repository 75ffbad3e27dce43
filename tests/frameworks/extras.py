"""The frameworks' own parsers, for the export checks: the ``frameworks-check`` extra. A test that needs one
skips with the reason when it is missing, and fails instead where MESHPLAN_REQUIRE_EXTRAS=1 (CI)."""

import importlib
import os
from functools import cache

import pytest


def require(module: str):
    """Import ``module`` of the frameworks-check extra, or skip (fail under MESHPLAN_REQUIRE_EXTRAS=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # a missing package, or one whose own imports fail
        message = (f"needs the frameworks-check extra (pip install -e '.[frameworks-check]' beside torch==2.13.0): "
                   f"{module}: {exc}")
        if os.environ.get("MESHPLAN_REQUIRE_EXTRAS") == "1":
            pytest.fail(message)
        pytest.skip(message)


@cache
def scenario(name: str):
    """(model, cluster, job) of the scenarios whose searched plans the checks export."""
    from meshplan import load_cluster, load_model
    from meshplan.catalog import load_job

    model, nodes, tokens, seq, software = {
        "dense-torchtitan": ("seed-70b", 8, 4_194_304, 4096, "torchtitan"),
        "dense-megatron": ("seed-70b", 8, 4_194_304, 4096, "megatron"),
        "dense-generic": ("seed-70b", 8, 4_194_304, 4096, "generic"),
        "moe-torchtitan": ("mixtral-8x7b", 4, 2_097_152, 4096, "torchtitan"),
        "moe-megatron": ("mixtral-8x7b", 4, 2_097_152, 4096, "megatron"),
        "moe-generic": ("mixtral-8x7b", 4, 2_097_152, 4096, "generic"),
        "long-torchtitan": ("llama-3-8b", 2, 1_048_576, 32768, "torchtitan"),
        "small-generic": ("llama-3-8b", 2, 1_048_576, 4096, "generic"),
    }[name]
    job = load_job(None, defaults={"global_batch_tokens": tokens, "seq_len": seq}, software=software)
    return load_model(model), load_cluster("h100-sxm", nodes=nodes), job


@cache
def searched(name: str) -> tuple:
    """The feasible plans a search returns for scenario ``name`` (estimates, best first)."""
    from meshplan import search
    from meshplan.search.space import Space

    model, cluster, job = scenario(name)
    return tuple(e for e in search(model, cluster, job, Space(), workers=1).ranked if e.feasible)
