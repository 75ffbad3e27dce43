"""Shared fixtures-as-functions: the worked example's scenario, a stand-in for a validated row."""

from types import SimpleNamespace

from meshplan import JobSpec, load_cluster, load_model


def worked_example(batch_tokens: int = 4_194_304, nodes: int = 8):
    return load_model("seed-70b"), load_cluster("h100-sxm", nodes=nodes), JobSpec(
        global_batch_tokens=batch_tokens, seq_len=4096)


def stub_row(cv_error: float = 0.0, *, row: int = 0, moe: bool = False, accelerator: str = "h100",
             software: str = "megatron", source_group: str = "", lso_error: float | None = None):
    """What the calibration's bands and folds read of a validated row (RowResult), and nothing else."""
    sc = SimpleNamespace(cluster=SimpleNamespace(accelerator=SimpleNamespace(name=accelerator)),
                         job=SimpleNamespace(software=software), model=SimpleNamespace(is_moe=moe))
    return SimpleNamespace(row=row, cv_error=cv_error, scenario=sc, source_group=source_group or software,
                           lso_error=lso_error, measured_tokens_per_s_per_gpu=1.0)
