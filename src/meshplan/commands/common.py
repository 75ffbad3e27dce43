"""What every command shares: the scenario flags with their defaults (the worked example: a 70B model on
8 nodes of 8 H100s, 4,194,304 tokens per step of 4,096-token sequences), how they become a model, a cluster
and a job, the search space flag, and the progress line on the terminal."""

from __future__ import annotations

import argparse
from typing import Any

from meshplan.argtypes import link_gb_per_s, mfu_fraction, positive_size
from meshplan.progress import Progress

DEFAULT_MODEL = "seed-70b"
DEFAULT_CLUSTER = "h100-sxm"
DEFAULT_NODES = 8
DEFAULT_BATCH_TOKENS = 4_194_304
DEFAULT_SEQ_LEN = 4096


class Parser(argparse.ArgumentParser):
    """argparse with errors on one line (and its exit status 2), and no abbreviated flags: ``--node 2`` is an
    error, not --nodes (a typo must not run another scenario)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"meshplan: error: {message}\n")


def add_scenario(p: argparse.ArgumentParser) -> None:
    """The scenario flags (model, cluster, job), --mfu, --json and --quiet, and the job fields people change
    most (meshplan.economics.flags)."""
    g = p.add_argument_group("scenario (defaults: the worked example)")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"catalog name, model .toml or Hugging Face config.json (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help=f"accelerator name (its usual node) or cluster .toml (default {DEFAULT_CLUSTER})")
    g.add_argument("--nodes", type=positive_size, default=None,
                   help=f"nodes (default: the cluster file's, else {DEFAULT_NODES})")
    g.add_argument("--gpus-per-node", type=positive_size, default=None, help="GPUs per node (default: the node's)")
    g.add_argument("--inter-node-bandwidth", type=link_gb_per_s, default=None, metavar="GB_PER_S",
                   help="NIC bandwidth per GPU per direction, decimal GB/s")
    g.add_argument("--batch-tokens", type=positive_size, default=None,
                   help=f"global batch in tokens per step (default {DEFAULT_BATCH_TOKENS:,}; 4M works)")
    g.add_argument("--seq-len", type=positive_size, default=None, help=f"sequence length (default {DEFAULT_SEQ_LEN})")
    g.add_argument("--job", default=None, metavar="FILE",
                   help="job spec .toml: every field of a job (docs/specs.md); the flags below override it")
    g.add_argument("--mfu", type=mfu_fraction, default=None,
                   help="assume this MFU for compute instead of the kernel model")
    g.add_argument("--json", action="store_true", help="write JSON (docs/outputs.md)")
    add_quiet(g)
    from meshplan.economics.flags import add_job_flags

    add_job_flags(g)


def add_quiet(p: Any) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress line on the terminal")


def add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="measured profile (meshplan measure --out): its link and GEMM figures replace the catalog's")


def add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=positive_size, default=None, metavar="N",
                   help="CPU cores for the independent work (conditions, sweep points, the simulator's "
                        "re-timing of the leading plans); default: all available")


def add_ray(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the independent searches or fits on Ray (pip install 'meshplan[ray]'): a local instance, "
                        "or the cluster at ADDRESS ('auto', 'ray://HOST:10001'); docs/performance.md")


def add_space(p: argparse.ArgumentParser) -> None:
    p.add_argument("--space", choices=("full", "dp-tp"), default="full",
                   help="full: every parallelism; dp-tp: DDP, FSDP, HSDP and TP x FSDP only")


def job(args: argparse.Namespace) -> Any:
    """The job of --job, with --batch-tokens, --seq-len and the job flags over it."""
    from meshplan.catalog import load_job
    from meshplan.economics.flags import job_overrides

    return load_job(args.job, defaults={"global_batch_tokens": DEFAULT_BATCH_TOKENS, "seq_len": DEFAULT_SEQ_LEN},
                    global_batch_tokens=args.batch_tokens, seq_len=args.seq_len, **job_overrides(args))


def scenario(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, cluster, job) from the flags; a --profile's measured figures replace the cluster's, and what
    they replaced is kept in ``args.profile_notes``."""
    from meshplan.catalog import load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                           inter_node_gb_per_s=args.inter_node_bandwidth, default_nodes=DEFAULT_NODES)
    args.profile_notes = []
    if getattr(args, "profile", None):
        from meshplan.profile import apply_profile, load_profile

        cluster, args.profile_notes = apply_profile(cluster, load_profile(args.profile))
    return model, cluster, job(args)


def space(args: argparse.Namespace) -> Any:
    from meshplan.search.space import Space

    return Space.dp_tp() if getattr(args, "space", "full") == "dp-tp" else Space()


def progress(args: argparse.Namespace, label: str) -> Progress:
    """The command's progress line: on a terminal, unless --quiet."""
    return Progress(enabled=False if getattr(args, "quiet", False) else None, label=label)


def names_no_stack(args: argparse.Namespace, job: Any) -> bool:
    """Whether the user left the software stack open: the job says 'generic' and --stack does not (``--stack
    generic`` asks for one search over every stack's plans at once)."""
    return job.software == "generic" and getattr(args, "stack", None) != "generic"
