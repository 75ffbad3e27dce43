"""Stable JSON schema of estimates and searches (documented in docs/outputs.md).

Units: every ``*_bytes`` is bytes, every ``*_s`` seconds, FLOPs are counts. Schema versions are in
the ``schema`` field and change only when a field is removed or changes meaning.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from meshplan.cost.estimate import CommEntry, Estimate

ESTIMATE_SCHEMA = "meshplan.estimate/1"
PLAN_SCHEMA = "meshplan.plan/1"


def _num(x: float) -> float | None:
    return None if (x is None or (isinstance(x, float) and not math.isfinite(x))) else x


def comm_entry_dict(e: CommEntry) -> dict[str, Any]:
    return {
        "collective": e.collective, "axis": e.axis, "purpose": e.purpose, "phase": e.phase,
        "link": e.link, "group_size": e.group_size, "count": e.count, "message_bytes": e.message_bytes,
        "bytes_per_gpu": e.bytes_per_gpu, "inter_node_bytes_per_gpu": e.inter_node_bytes_per_gpu,
        "time_s": e.time_s, "exposed_s": e.exposed_s, "overlappable": e.overlappable, "window": e.window,
    }


def plan_dict(est: Estimate) -> dict[str, Any]:
    p = est.plan
    d = {k: v for k, v in asdict(p).items()}
    d["n_microbatches"] = est.n_microbatches
    d["sequence_parallel"] = p.sequence_parallel
    d["grad_sync"] = est.grad_sync
    d["cp_impl"] = p.context_impl if p.cp > 1 else p.cp_impl  # the exchange in effect (ring where unset)
    d["label"] = p.label()
    d["string"] = p.to_string()
    return d


def estimate_dict(est: Estimate) -> dict[str, Any]:
    m = est.memory
    return {
        "schema": ESTIMATE_SCHEMA,
        "mode": est.mode,
        "model": est.model,
        "cluster": est.cluster,
        "n_gpus": est.n_gpus,
        "global_batch_tokens": est.global_batch_tokens,
        "seq_len": est.seq_len,
        "feasible": est.feasible,
        "infeasible_reasons": list(est.infeasible_reasons),
        "plan": plan_dict(est),
        "memory": {
            "static_bytes": m.static_bytes, "activation_bytes": m.activation_bytes,
            "transient_bytes": m.transient_bytes, "runtime_bytes": m.runtime_bytes,
            "peak_bytes": m.peak_bytes, "capacity_bytes": m.capacity_bytes,
            "headroom_bytes": m.headroom_bytes, "stage": m.stage, "terms": dict(m.terms),
        },
        "flops_per_step": est.flops.model_flop_per_step,
        "hardware_flops_per_step": est.flops.hardware_flop_per_step,
        "flop_convention": est.flops.convention,
        "flops_per_step_palm": est.flops.model_flop_per_step_palm,
        "flops_per_step_causal": est.flops.model_flop_per_step_causal,
        "step_time_s": _num(est.step_time_s),
        "closed_form_step_time_s": est.closed_form_step_time_s,
        "mfu": _num(est.mfu),
        "hfu": _num(est.hfu),
        "tokens_per_s": _num(est.tokens_per_s),
        "tokens_per_s_per_gpu": _num(est.tokens_per_s_per_gpu),
        "bubble_fraction": est.bubble_fraction,
        "time_breakdown": {k: v for k, v in est.time_breakdown.items()},
        "compute_source": est.compute_source,
        "uncertainty": None if est.uncertainty is None else {
            "low": est.uncertainty.low, "high": est.uncertainty.high, "rows": est.uncertainty.rows,
            "basis": est.uncertainty.basis},
        "comm": [comm_entry_dict(e) for e in est.comm],
        "comm_stage": est.comm_stage,
        "notes": list(est.notes),
    }


def plan_analysis_dict(a: Any, *, top: int | None = None) -> dict[str, Any]:
    """``meshplan plan --json``: the scenario, the recommendation, every plan searched (best first,
    infeasible ones with reasons), the answers to the four questions and the conditions of change."""
    r = a.result
    plans = r.ranked if top is None else r.ranked[:top]
    out = {
        "schema": PLAN_SCHEMA,
        "scenario": {
            "model": a.model.name, "cluster": a.cluster.name, "n_nodes": a.cluster.n_nodes,
            "gpus_per_node": a.cluster.gpus_per_node, "n_gpus": a.cluster.n_gpus,
            "inter_node_bytes_per_s": a.cluster.inter.nic_bytes_per_s,
            "global_batch_tokens": a.job.global_batch_tokens, "seq_len": a.job.seq_len,
            "optimizer": a.job.optimizer, "precision": a.job.precision, "software": a.job.software,
            "compiled": a.job.compiled, "cuda_graphs": a.job.cuda_graphs,
            "cuda_graph_scope": a.job.cuda_graph_scope, "fp8_attention": a.job.fp8_attention,
            "fused_grouped_mlp": a.job.fused_grouped_mlp,
        },
        "n_plans": r.n_plans,
        "n_pruned": r.n_pruned,
        "n_configurations": r.n_configurations,
        "search_elapsed_s": r.elapsed_s,
        "recommended": estimate_dict(a.recommended) if a.recommended else None,
        "plans": [estimate_dict(e) for e in plans],
        "pareto": [{"plan": e.plan.to_string(), "step_time_s": e.step_time_s,
                    "headroom_bytes": e.memory.headroom_bytes} for e in r.pareto()],
        "questions": [{"title": q.title, "answer": q.lines} for q in a.questions],
        "simplified": {k: estimate_dict(v) for k, v in a.simplified.items()},
        "measure_first": [{"what": m.what, "why": m.why} for m in a.measurements],
        "conditions": [{"condition": c.condition, "direction": c.direction, "value": c.value,
                        "last_same_value": c.last_same_value, "unit": c.unit, "base_value": c.base_value,
                        "plan": c.plan, "plan_string": c.plan_string, "speedup": _num(c.speedup),
                        "text": c.text} for c in a.conditions],
        "conditions_swept": a.conditions_swept,
        "held_ranges": [{"condition": h.condition, "low_value": h.low_value, "high_value": h.high_value,
                         "base_value": h.base_value, "unit": h.unit, "low_end": h.low_end, "high_end": h.high_end,
                         "text": h.text} for h in a.held_ranges],
        "n_plans_listed": len(plans),
        "n_plans_left_out": len(r.ranked) - len(plans),
        "stacks": [{"stack": s.stack, "best": estimate_dict(s.best) if s.best else None, "why_none": s.why_none}
                   for s in a.stacks],
        "assumed_stack": {"stack": a.job.software, "why": a.stack_note} if a.stacks else None,
    }
    return out
