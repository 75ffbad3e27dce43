"""Shared fixtures-as-functions: the worked example's scenario."""

from meshplan import JobSpec, load_cluster, load_model


def worked_example(batch_tokens: int = 4_194_304, nodes: int = 8):
    return load_model("seed-70b"), load_cluster("h100-sxm", nodes=nodes), JobSpec(
        global_batch_tokens=batch_tokens, seq_len=4096)
