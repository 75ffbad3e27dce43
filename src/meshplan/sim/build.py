"""Turn one pipeline stage's estimate (its per-micro-batch times and communication ledger) into the ops of
a training step at layer granularity.

Placement of each ledger entry (see meshplan.cost.comm for what each implementation issues):
- FSDP / ZeRO-3 parameter all-gathers: one per layer and micro-batch on the 'params' stream, prefetched
  one layer ahead (FSDP2's default: at most the current and the next unit gathered);
- gradient reduce-scatters, HSDP and DDP all-reduces: after each layer's backward on the 'grads' stream
  (only in the last micro-batch when gradients are reduced once per step);
- per-step parameter all-gathers (ZeRO-1/2, Megatron distributed optimizer): before each layer's first
  forward;
- tensor-, sequence- and expert-parallel collectives: inline, between the halves of a layer's compute
  (on the critical path), unless async-TP lets them overlap the compute they feed; of the expert-parallel
  all-to-alls overlapped with another micro-batch (Megatron's MoE overlap), the closed form's exposed
  share, on the critical path (the simulator runs one micro-batch at a time and cannot pair two);
- context-parallel exchanges: beside the layer's attention compute, which waits for them to finish;
- root units (embedding, LM head): at the start of the forward and the end of the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.estimate import OTHER_MICROBATCH, CommEntry, StageDetail
from meshplan.sim.engine import Op
from meshplan.specs import Plan

_PER_LAYER = ("ag_fwd", "ag_bwd", "grads", "step_ag", "inline_f", "inline_b", "inline_r", "cp_f", "cp_b", "cp_r",
              "other_f", "other_b")


@dataclass(frozen=True, slots=True)
class _Per:
    """A ledger entry's time per call site: per layer per micro-batch, per micro-batch, or per layer per step."""

    entry: CommEntry
    time_s: float


def _split(detail: StageDetail, m: int) -> dict[str, list[_Per]]:
    """Group the ledger into placements with the time each call site takes."""
    L = max(1, detail.n_layers)
    out: dict[str, list[_Per]] = {k: [] for k in ("ag_fwd", "ag_bwd", "grads", "step_ag", "step_ag_root",
                                                   "inline_f", "inline_b",
                                                   "inline_r", "cp_f", "cp_b", "cp_r", "root_f", "root_b", "edge_f",
                                                   "edge_b", "pipeline", "other_f", "other_b")}
    for e in detail.comm:
        root = "root" in e.purpose
        edge = "embedding" in e.purpose or "LM head" in e.purpose
        recomputed = "recomputed" in e.purpose
        if e.blocks_after_step:
            continue  # simulate adds it after the optimizer step
        if e.window == "pipeline":
            out["pipeline"].append(_Per(e, e.time_s / max(1, e.count)))
        elif e.window in ("first_forward",):  # once per step: per layer, or the root's all at once
            out["step_ag_root" if root else "step_ag"].append(_Per(e, e.time_s if root else e.time_s / L))
        elif e.axis in ("dp_shard", "edp", "dp_replicate") and e.collective == "all_gather":
            per = e.time_s / m if root else e.time_s / (m * L)
            if root:
                out["root_f"].append(_Per(e, per))
            else:
                out["ag_fwd" if e.phase == "forward" else "ag_bwd"].append(_Per(e, per))
        elif e.axis in ("dp_shard", "edp", "dp_replicate"):
            per_step = e.window == "last_backward"
            calls = (1 if per_step else m) * (1 if root else L)
            target = "root_b" if root else "grads"
            out[target].append(_Per(e, e.time_s / calls))
        elif e.window == OTHER_MICROBATCH:
            # The simulator runs one micro-batch at a time, so it cannot pair two: the closed form's exposed
            # share (warm-up, cool-down, and what the link has no compute left to hide) is on the critical path.
            out["other_f" if e.phase == "forward" else "other_b"].append(_Per(e, e.exposed_s / (m * L)))
        elif e.window == "attention":
            k = "cp_r" if recomputed else ("cp_f" if e.phase == "forward" else "cp_b")
            out[k].append(_Per(e, e.time_s / (m * L)))
        elif edge:
            out["edge_f" if e.phase == "forward" else "edge_b"].append(_Per(e, e.time_s / m))
        else:
            k = "inline_r" if recomputed else ("inline_f" if e.phase == "forward" else "inline_b")
            out[k].append(_Per(e, e.time_s / (m * L)))
    return out


def chunk_order(schedule: str, pp: int, stage: int, m: int) -> list[tuple[str, int]]:
    """Order of forward ('F') and backward ('B') micro-batch chunks on one stage, ignoring waits on
    other stages: 1F1B warm-up of pp - stage forwards, then alternating; gradient accumulation without
    a pipeline is F, B per micro-batch."""
    if pp == 1:
        return [x for k in range(m) for x in (("F", k), ("B", k))]
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warm = min(m, pp - stage)
    order = [("F", k) for k in range(warm)]
    nf, nb = warm, 0
    while nb < m:
        order.append(("B", nb))
        nb += 1
        if nf < m:
            order.append(("F", nf))
            nf += 1
    return order


def stage_ops(detail: StageDetail, plan: Plan, m: int, *, m_sim: int | None = None, max_groups: int = 16
              ) -> tuple[list[Op], dict[tuple[str, int], tuple[Op, Op]]]:
    """Ops of one stage's step (stream order = list order), and per chunk its first and last compute op.

    ``m_sim`` micro-batches are built (the steady state repeats; the caller extrapolates), and layers are
    merged into at most ``max_groups`` groups (each group's times are the sum of its layers'), which keeps
    a step of a deep model at a few hundred ops."""
    n_layers = max(1, detail.n_layers)
    place = _split(detail, m)
    L = min(n_layers, max_groups)
    if n_layers > L:
        scale = n_layers / L
        place = {k: [_Per(p.entry, p.time_s * scale) if k in _PER_LAYER else p for p in v] for k, v in place.items()}
    m_run = m if m_sim is None else min(m, m_sim)
    order = chunk_order(plan.schedule, plan.pp, detail.stage, m_run)
    st = _StageOps(detail, place, L, plan.async_tp, last_b=max(k for kind, k in order if kind == "B"))
    chunks: dict[tuple[str, int], tuple[Op, Op]] = {}
    for kind, k in order:
        start = len(st.b.compute_ops)
        if kind == "F":
            st.forward(k)
        else:
            st.backward(k)
        chunks[(kind, k)] = (st.b.compute_ops[start], st.b.compute_ops[-1])
    return st.b.ops, chunks


class _StageOps:
    """Builds ``stage_ops``'s ops, one micro-batch's forward or backward at a time, over ``L`` layer groups
    with the collectives ``place`` puts beside them."""

    def __init__(self, detail: StageDetail, place: dict[str, list[_Per]], L: int, async_tp: bool, last_b: int
                 ) -> None:
        self.detail, self.place, self.L, self.async_tp, self.last_b = detail, place, L, async_tp, last_b
        self.b = _Builder()
        self.f_layer, self.b_layer = detail.t_f_s / L, (detail.t_b_s + detail.t_w_s) / L
        self.r_layer, self.attn_f = detail.t_r_s / L, detail.attention_fwd_s / L
        self.per_step_gather: dict[int, list[Op]] = {}
        self.once = [p for p in place["grads"] if p.entry.window == "last_backward"]
        self.every = [p for p in place["grads"] if p.entry.window != "last_backward"]

    def forward(self, k: int) -> None:
        b, place, async_tp, f_layer, attn_f = self.b, self.place, self.async_tp, self.f_layer, self.attn_f
        per_step_gather = self.per_step_gather
        waits = b.comm(f"mb{k} root gather", place["root_f"], "params", [])
        fwd_done: list[Op] = []
        for i in range(self.L):
            gather = b.comm(f"mb{k} L{i} gather", place["ag_fwd"], "params",
                            [fwd_done[i - 2]] if i >= 2 else [])
            if i not in per_step_gather:
                per_step_gather[i] = b.comm(f"L{i} param gather (per step)", place["step_ag"], "params", [])
                if i == 0:  # the embedding / LM head's, once, before the first layer
                    per_step_gather[i] += b.comm("root param gather (per step)", place["step_ag_root"],
                                                 "params", [])
            deps = [*gather, *per_step_gather[i], *waits]
            a = b.compute(f"mb{k} L{i} fwd attention", attn_f + 0.5 * (f_layer - attn_f), "compute", deps)
            cp = b.comm(f"mb{k} L{i} cp", place["cp_f"], "cp", deps)
            t1 = b.comm(f"mb{k} L{i} fwd collectives (attention)", _half(place["inline_f"]), "tp", [a])
            a2a = b.comm(f"mb{k} L{i} fwd all-to-all (exposed share)", place["other_f"], "ep", [a])
            c = b.compute(f"mb{k} L{i} fwd mlp", 0.5 * (f_layer - attn_f), "compute",
                          [a, *cp, *a2a, *([] if async_tp else t1)])
            t2 = b.comm(f"mb{k} L{i} fwd collectives (mlp)", _half(place["inline_f"]), "tp", [c])
            waits = [] if async_tp else t2
            fwd_done.append(c)
        if self.detail.head_f_s:
            b.compute(f"mb{k} LM head fwd", self.detail.head_f_s, "compute", waits)
            waits = []
        b.comm(f"mb{k} edge fwd", place["edge_f"], "tp", [b.compute_ops[-1]])

    def backward(self, k: int) -> None:
        b, place, async_tp, b_layer, r_layer = self.b, self.place, self.async_tp, self.b_layer, self.r_layer
        waits = []
        if self.detail.head_b_s:
            b.compute(f"mb{k} LM head bwd", self.detail.head_b_s, "compute", [])
        waits = b.comm(f"mb{k} edge bwd", place["edge_b"], "tp", b.compute_ops[-1:])
        bwd_done: list[Op] = []
        for i in reversed(range(self.L)):
            gather = b.comm(f"mb{k} L{i} gather (backward)", place["ag_bwd"], "params",
                            [bwd_done[-2]] if len(bwd_done) >= 2 else [])
            deps = [*gather, *waits]
            if r_layer:
                rc = b.compute(f"mb{k} L{i} recompute", r_layer, "recompute", deps)
                cp_r = b.comm(f"mb{k} L{i} cp (recompute)", place["cp_r"], "cp", deps)
                t_r = b.comm(f"mb{k} L{i} recompute collectives", place["inline_r"], "tp", [rc])
                deps = [rc, *cp_r, *([] if async_tp else t_r)]
            c1 = b.compute(f"mb{k} L{i} bwd mlp", 0.5 * b_layer, "compute", deps)
            t1 = b.comm(f"mb{k} L{i} bwd collectives (mlp)", _half(place["inline_b"]), "tp", [c1])
            cp = b.comm(f"mb{k} L{i} cp (backward)", place["cp_b"], "cp", [c1])
            a2a = b.comm(f"mb{k} L{i} bwd all-to-all (exposed share)", place["other_b"], "ep", [c1])
            c2 = b.compute(f"mb{k} L{i} bwd attention", 0.5 * b_layer, "compute",
                           [c1, *a2a, *([] if async_tp else t1)])
            t2 = b.comm(f"mb{k} L{i} bwd collectives (attention)", _half(place["inline_b"]), "tp", [c2])
            waits = [*cp, *([] if async_tp else t2)]
            bwd_done.append(c2)
            b.comm(f"mb{k} L{i} grad reduction", self.every, "grads", [c2])
            if k == self.last_b:
                b.comm(f"L{i} grad reduction (per step)", self.once, "grads", [c2])
        root = [p for p in place["root_b"] if k == self.last_b or p.entry.window != "last_backward"]
        b.comm(f"mb{k} root grad reduction", root, "grads", b.compute_ops[-1:])


class _Builder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.compute_ops: list[Op] = []

    def comm(self, name: str, items: list[_Per], stream: str, deps: list[Op]) -> list[Op]:
        out = []
        for p in items:
            if p.time_s <= 0:
                continue
            op = Op(name=f"{name}: {p.entry.collective} ({p.entry.axis})", stream=f"{stream}:{p.entry.link}",
                    work_s=p.time_s, category=p.entry.breakdown_key, link=p.entry.link, deps=list(deps))
            self.ops.append(op)
            out.append(op)
        return out

    def compute(self, name: str, work: float, category: str, deps: list[Op]) -> Op:
        op = Op(name=name, stream="compute", work_s=work, category=category, deps=list(deps))
        self.ops.append(op)
        self.compute_ops.append(op)
        return op


def _half(items: list[_Per]) -> list[_Per]:
    """Half of each inline collective's per-layer time (two call sites per layer: after attention and MLP)."""
    return [_Per(p.entry, 0.5 * p.time_s) for p in items]
