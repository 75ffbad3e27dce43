"""What the web page asks for, computed: the search and its explanation, the conditions of change, one
plan in detail with its simulated timeline. Each function takes a normalised scenario (web.scenario) and
returns a JSON-ready dict (base units: bytes, seconds; every number finite). They run in the worker
processes of web.pool, one search per process, so they use one core each (``workers=1``).

The figures are those of ``meshplan plan --json`` and ``meshplan evaluate --json`` for the same scenario:
the same search, explanation and dict builders (report.json)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.errors import SpecError
from meshplan.report import chartdata
from meshplan.report.json import estimate_dict
from meshplan.web import extensions
from meshplan.web.scenario import Built, build

TOP_CHARTED = 6
"""Plans drawn in the memory and time charts (the best feasible ones)."""

STACKS = {"fsdp": "PyTorch", "zero1": "DeepSpeed", "zero2": "DeepSpeed", "zero3": "DeepSpeed",
          "megatron": "Megatron-core"}
"""The framework whose implementation a plan's figures assume, by its ``sharding`` (specs.plan.SHARDING):
PyTorch's FSDP2, DDP and pipelining; DeepSpeed's ZeRO stages; Megatron-core's distributed optimizer."""


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _space(name: str) -> Any:
    from meshplan.search.space import Space

    return Space.dp_tp() if name == "dp-tp" else Space()


def scenario_summary(b: Built, s: dict[str, Any]) -> dict[str, Any]:
    """The scenario as searched: the request's fields and what they resolved to."""
    from meshplan.cost.params import param_counts

    c, m = b.cluster, b.model
    pc = param_counts(m)
    return {
        **{k: v for k, v in s.items() if k not in ("model_spec", "job_spec")},
        "model_name": m.name, "model_source": m.source, "params": pc.total, "active_params": pc.active,
        "moe": m.is_moe, "n_layers": m.n_layers, "accelerator_description": c.accelerator.description,
        "n_nodes": c.n_nodes, "gpus_per_node": c.gpus_per_node, "n_gpus": c.n_gpus,
        "inter_node_bytes_per_s": c.inter.nic_bytes_per_s, "hbm_capacity_bytes": c.accelerator.hbm_capacity_bytes,
        "global_batch_tokens": b.job.global_batch_tokens, "seq_len": b.job.seq_len,
        "uploaded_model": s["model_spec"]["name"] if s["model_spec"] else None,
        "uploaded_job": s["job_spec"]["name"] if s["job_spec"] else None,
    }


def plan_row(rank: int, e: Estimate) -> dict[str, Any]:
    """One row of the ranked table (the plan's figures of ``meshplan plan --json``, fewer fields)."""
    from meshplan.search.space import FAMILY_NAMES, family

    p = e.plan
    timed = _num(e.step_time_s) is not None
    fam = family(p)
    return {
        "rank": rank, "label": p.label(), "plan": p.to_string(), "family": fam, "family_name": FAMILY_NAMES[fam],
        "stack": STACKS[p.sharding], "options": ", ".join(p.option_labels()), "mbs": p.mbs,
        "n_microbatches": e.n_microbatches, "recompute": p.recompute_label,
        "step_time_s": _num(e.step_time_s), "mfu": _num(e.mfu) if timed else None,
        "tokens_per_s_per_gpu": _num(e.tokens_per_s_per_gpu) if timed else None,
        "exposed_comm_s": _num(e.comm_time_s(exposed=True)) if timed else None,
        "peak_bytes": e.memory.peak_bytes, "headroom_bytes": e.memory.headroom_bytes,
        "feasible": e.feasible, "reasons": list(e.infeasible_reasons),
        "simulated": e.closed_form_step_time_s is not None,
    }


def timeline(b: Built, est: Estimate) -> dict[str, Any] | None:
    """The simulated step of ``est`` as a timeline chart (chartdata.simulated_timeline)."""
    return chartdata.simulated_timeline(est, b.cluster.accelerator.name, b.job.software)


def detail(b: Built, est: Estimate) -> dict[str, Any]:
    """One plan in full: its estimate (``meshplan evaluate --json``'s dict), what limits it, its charts."""
    from meshplan.explain import binding_resource

    timed = _num(est.step_time_s) is not None
    return {
        "estimate": estimate_dict(est),
        "binding": binding_resource(est) if timed and est.feasible else None,
        "band": est.uncertainty.sentence("the prediction") if est.uncertainty else None,
        "memory_chart": chartdata.memory_chart([(est.plan.label(), est)]),
        "time_chart": chartdata.time_chart([(est.plan.label(), est)]),
        "timeline": timeline(b, est),
    }


def plan(s: dict[str, Any]) -> dict[str, Any]:
    """``meshplan plan`` for the page, without the conditions of change (``conditions`` computes them):
    the recommendation with its reasons and band, every plan ranked, the charts, the recommended plan's
    detail."""
    from meshplan.search.rank import TIE_BAND

    b = build(s)
    a = _analyse(b, with_conditions=False)
    b = dataclasses.replace(b, job=a.job)  # the stack the recommendation assumes, where none was named
    r, best = a.result, a.recommended
    top = chartdata.plan_labels(r.ranked, TOP_CHARTED)
    return {
        "schema": "meshplan.web.plan/1",
        "scenario": scenario_summary(b, s),
        "search": {"n_plans": r.n_plans, "n_pruned": r.n_pruned, "n_configurations": r.n_configurations,
                   "n_feasible": len(r.feasible), "elapsed_s": r.elapsed_s, "tie_band": TIE_BAND},
        "recommended": detail(b, best) if best else None,
        "questions": [{"title": q.title, "lines": q.lines} for q in a.questions],
        "measure_first": [{"what": m.what, "why": m.why} for m in a.measurements],
        "plans": [plan_row(i, e) for i, e in enumerate(r.ranked, 1)],
        "charts": {"memory": chartdata.memory_chart(top), "time": chartdata.time_chart(top),
                   "pareto": chartdata.pareto_chart(r.ranked, best)},
        "economics": extensions.economics(b, best, s["train_tokens"]) if best else None,
        "stacks": [{"stack": st.stack, "name": st.name, "why_none": st.why_none,
                    "best": None if st.best is None else {
                        "plan": st.best.plan.to_string(), "label": st.best.plan.label(),
                        "step_time_s": st.best.step_time_s, "mfu": st.best.mfu,
                        "tokens_per_s_per_gpu": st.best.tokens_per_s_per_gpu,
                        "peak_bytes": st.best.memory.peak_bytes,
                        "band": None if st.best.uncertainty is None else {"low": st.best.uncertainty.low,
                                                                          "high": st.best.uncertainty.high}}}
                   for st in a.stacks],
        "assumed_stack": {"stack": a.job.software, "why": a.stack_note} if a.stacks else None,
    }


def _analyse(b: Any, *, with_conditions: bool) -> Any:
    """The analysis ``meshplan plan`` gives this scenario: per stack where the scenario names none
    (meshplan.stacks), else of its stack."""
    if b.job.software == "generic":
        from meshplan.stacks import analyse_by_stack

        return analyse_by_stack(b.model, b.cluster, b.job, space=_space(b.space), with_conditions=with_conditions,
                                workers=1)
    from meshplan.explain import analyse

    return analyse(b.model, b.cluster, b.job, space=_space(b.space), with_conditions=with_conditions, workers=1)


def conditions(s: dict[str, Any]) -> dict[str, Any]:
    """The conditions of change of ``meshplan plan`` (the search re-run while global batch, inter-node
    bandwidth, GPU count, sequence length and depth vary) and the ranges over which the answer holds."""
    from meshplan.search.conditions import held_sentence

    b = build(s)
    a = _analyse(b, with_conditions=True)
    return {
        "schema": "meshplan.web.conditions/1",
        "recommended_plan": a.recommended.plan.to_string() if a.recommended else None,
        "swept": a.conditions_swept,
        "conditions": [{"condition": c.condition, "direction": c.direction, "value": c.value,
                        "last_same_value": c.last_same_value, "unit": c.unit, "base_value": c.base_value,
                        "plan": c.plan, "plan_string": c.plan_string, "speedup": _num(c.speedup),
                        "text": c.text} for c in a.conditions],
        "held": held_sentence(a.held_ranges, bool(a.conditions)),
        "measure_first": [{"what": m.what, "why": m.why} for m in a.measurements],
    }


def evaluate(s: dict[str, Any], plan_string: str) -> dict[str, Any]:
    """One plan as ``meshplan evaluate`` gives it (re-timed by the simulator where it fits, with the
    uncertainty band), with its charts and timeline."""
    from meshplan.cost.step import evaluate as evaluate_plan
    from meshplan.sim.simulate import refine_fitted
    from meshplan.specs import parse_plan
    from meshplan.specs.plan import stack_mismatch
    from meshplan.uncertainty import attach_band

    if not isinstance(plan_string, str) or not 0 < len(plan_string) <= 2000:
        raise SpecError("plan", "must be a plan string of at most 2,000 characters, e.g. tp=8,dp_shard=8")
    b = build(s)
    p = parse_plan(plan_string, world_size=b.cluster.n_gpus)
    est = refine_fitted(evaluate_plan(b.model, b.cluster, b.job, p), b.cluster.accelerator.name, b.job.software)
    est = attach_band(est, accelerator=b.cluster.accelerator.name, software=b.job.software, moe=b.model.is_moe)
    out = detail(b, est)
    out["schema"] = "meshplan.web.evaluate/1"
    out["stack_note"] = stack_mismatch(b.job.software, p)
    out["exports"] = extensions.exports(b, est)
    return out


def inspect_spec(kind: str, doc: Any) -> dict[str, Any]:
    """An uploaded spec document checked on its own: a model's name and size, or a job's fields (the page
    sets its controls from them)."""
    from dataclasses import asdict

    from meshplan.catalog import job_from_data
    from meshplan.cost.params import param_counts
    from meshplan.web.scenario import DEFAULTS, _document, _parse, model_from_document

    if kind not in ("model", "job"):
        raise SpecError("kind", f"must be model or job; got {str(kind)[:40]!r}")
    field = f"{kind}_spec"
    d = _document(field, doc)
    if d is None:
        raise SpecError(field, "is missing")
    try:
        if kind == "model":
            m = model_from_document(d)
            pc = param_counts(m)
            return {"kind": "model", "name": m.name, "params": pc.total, "active_params": pc.active,
                    "n_layers": m.n_layers, "moe": m.is_moe}
        job = job_from_data(_parse(field, d), defaults={"global_batch_tokens": DEFAULTS["batch_tokens"],
                                                        "seq_len": DEFAULTS["seq_len"]})
    except SpecError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError) as exc:
        raise SpecError(field, f"a value could not be used: {str(exc)[:200]}") from None
    fields = asdict(job)
    return {"kind": "job", "batch_tokens": job.global_batch_tokens, "seq_len": job.seq_len,
            "optimizer": job.optimizer, "precision": job.precision, "software": job.software,
            "fields": {k: v for k, v in fields.items() if k != "runtime"}}


def export_plan(s: dict[str, Any], plan_string: str, framework: str) -> dict[str, Any]:
    """A plan as ``framework``'s settings (web.extensions.export), where ``meshplan.frameworks`` is installed."""
    from meshplan.specs import parse_plan

    b = build(s)
    return extensions.export(b, parse_plan(plan_string, world_size=b.cluster.n_gpus), framework)


HANDLERS = {"plan": plan, "conditions": conditions, "evaluate": evaluate, "inspect_spec": inspect_spec,
            "export": export_plan}
"""What a worker process runs, by the name the app sends (web.pool)."""
