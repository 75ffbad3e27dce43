"""meshplan: plan how to parallelise the training of a transformer on a GPU cluster.

The core (specs, catalog, cost model, search, reports) is pure Python and never imports torch; the
PyTorch harness (``meshplan.harness``) is an optional extra.
"""

from meshplan.catalog import list_accelerators, list_models, load_accelerator, load_cluster, load_model
from meshplan.cost.estimate import CommEntry, Estimate, MemoryReport
from meshplan.cost.params import param_counts
from meshplan.cost.simplified import evaluate_simplified
from meshplan.cost.step import evaluate
from meshplan.errors import SpecError
from meshplan.explain import analyse
from meshplan.search.search import SearchResult, search
from meshplan.search.space import Space
from meshplan.specs import (
    AcceleratorSpec,
    ClusterSpec,
    InterNodeLink,
    IntraNodeLink,
    JobSpec,
    ModelSpec,
    Plan,
    RuntimeOverheads,
    parse_plan,
)

__version__ = "0.2.0"

__all__ = [
    "AcceleratorSpec",
    "ClusterSpec",
    "CommEntry",
    "Estimate",
    "InterNodeLink",
    "IntraNodeLink",
    "JobSpec",
    "MemoryReport",
    "ModelSpec",
    "Plan",
    "RuntimeOverheads",
    "SearchResult",
    "Space",
    "SpecError",
    "analyse",
    "evaluate",
    "evaluate_simplified",
    "list_accelerators",
    "list_models",
    "load_accelerator",
    "load_cluster",
    "load_model",
    "param_counts",
    "parse_plan",
    "search",
]
