"""Chunk-level pipeline schedule across stages.

Each stage runs one chunk at a time. A forward chunk waits for the previous virtual stage's forward of
the same micro-batch (plus the send/recv time), a backward chunk for the next virtual stage's backward.
1F1B runs each stage's tasks in Megatron's fixed order (warm-up forwards, then one forward and one
backward in turn), ZB-H1 in the paper's (Qi et al. 2024 §2.1: 1F1B's order with the weight-gradient
part W split off and stage s holding s of them back, so every stage keeps p micro-batches short of their
W), ZB-V in PyTorch's (``ScheduleZBVZeroBubble``), GPipe in PyTorch's (every forward, then every
backward). sim.simulate runs the interleaved schedule as 1F1B on v times the micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meshplan.cost.pipeline import ZERO_BUBBLE


@dataclass(eq=False, slots=True)
class Task:
    stage: int
    kind: str  # F, B or W
    mb: int
    chunk: int
    dur_s: float
    deps: list[Task] = field(default_factory=list)
    start_s: float = math.nan
    end_s: float = math.nan


def virtual_route(schedule: str, pp: int) -> list[tuple[int, int]]:
    """(stage, chunk) in forward order through the model: ZB-V's V, down the ranks and back up."""
    if schedule == "zb-v":
        return [(s, 0) for s in range(pp)] + [(s, 1) for s in reversed(range(pp))]
    return [(s, 0) for s in range(pp)]


def schedule_pipeline(*, schedule: str, pp: int, m: int, chunks: int, f_s: list[float], b_s: list[float],
                      w_s: list[float], p2p_s: float) -> tuple[float, list[Task]]:
    """Makespan [s] and the scheduled tasks. f_s, b_s, w_s are per stage, per micro-batch chunk-times of the
    whole stage (split evenly over its model chunks); w_s is used only by zero-bubble schedules. Each stage
    runs its tasks in the schedule's fixed order."""
    fixed = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "zb-h1": _zb_h1, "zb-v": _zb_v}.get(schedule)
    if fixed is None:
        raise ValueError(f"schedule_pipeline runs gpipe, 1f1b, zb-h1 and zb-v, not {schedule!r} (sim.simulate "
                         "runs interleaved as 1F1B over m·v micro-batches)")
    runs = 2 if schedule == "zb-v" else 1
    if chunks != runs:
        raise ValueError(f"{schedule} runs {runs} model chunk(s) a stage, not {chunks}")
    split_w = schedule in ZERO_BUBBLE
    route = virtual_route(schedule, pp)
    tasks: list[Task] = []
    for k in range(m):
        fwd: list[Task] = []
        for s, j in route:
            t = Task(s, "F", k, j, f_s[s] / chunks, deps=fwd[-1:])
            fwd.append(t)
        bwd: list[Task] = []
        for s, j in reversed(route):
            dur = (b_s[s] if split_w else b_s[s] + w_s[s]) / chunks
            t = Task(s, "B", k, j, dur, deps=[bwd[-1]] if bwd else [fwd[-1]])
            bwd.append(t)
            if split_w:
                tasks.append(Task(s, "W", k, j, w_s[s] / chunks, deps=[t]))
        tasks += fwd + bwd
    by_key = {(t.stage, t.kind, t.mb, t.chunk): t for t in tasks}
    return _run_in_order(pp, [fixed(pp, s, m, by_key) for s in range(pp)], p2p_s), tasks


def _gpipe(pp: int, r: int, m: int, by_key: dict[tuple[int, str, int, int], Task]) -> list[Task]:
    """Rank ``r``'s tasks in GPipe's order: every forward, then every backward, each in micro-batch order
    (``ScheduleGPipe._step_microbatches``, torch/distributed/pipelining/schedules.py)."""
    return [by_key[r, kind, k, 0] for kind in "FB" for k in range(m)]


def _one_f_one_b(pp: int, s: int, m: int, by_key: dict[tuple[int, str, int, int], Task]) -> list[Task]:
    """Stage ``s``'s tasks in Megatron's 1F1B order: pp - s - 1 warm-up forwards, then a forward and a
    backward in turn, then the remaining backwards (``forward_backward_pipelining_without_interleaving``,
    megatron/core/pipeline_parallel/schedules.py). A greedy choice of the earliest-ready task does not keep
    it: with a last stage lighter than the others (a stage of fewer layers, or one holding the loss alone)
    it ran forwards ahead, and the step of Llama 3.1 405B on 64 stages came out 60 % long. ``by_key``: every
    task by (stage, kind, micro-batch, chunk)."""
    warm = min(pp - s - 1, m)
    order = [by_key[s, "F", k, 0] for k in range(warm)]
    for i in range(m - warm):
        order += [by_key[s, "F", warm + i, 0], by_key[s, "B", i, 0]]
    return order + [by_key[s, "B", k, 0] for k in range(m - warm, m)]


def _zb_h1(pp: int, s: int, m: int, by_key: dict[tuple[int, str, int, int], Task]) -> list[Task]:
    """Stage ``s``'s tasks in ZB-H1's order (Qi et al. 2024 §2.1, Fig. 3): 1F1B's p - s warm-up forwards,
    then for each micro-batch its B, a W once s of them wait, and the next forward; the held-back W passes
    fill the cool-down. Every stage then has p micro-batches short of their W (the first stage as under
    1F1B), and the makespan is the paper's: its bubble (p - 1)(t_F + t_B - t_W) on uniform stages
    (tests/test_sim.py). A greedy choice deferred W without that bound (up to every micro-batch's on the
    last stage), which the memory the plan is charged (cost.pipeline.in_flight_microbatches) does not
    hold."""
    warm = min(pp - s, m)
    order = [by_key[s, "F", k, 0] for k in range(warm)]
    held: list[int] = []
    for k in range(m):
        order.append(by_key[s, "B", k, 0])
        held.append(k)
        if len(held) > s:
            order.append(by_key[s, "W", held.pop(0), 0])
        if warm + k < m:
            order.append(by_key[s, "F", warm + k, 0])
    return order + [by_key[s, "W", k, 0] for k in held]


def _zb_v(pp: int, r: int, m: int, by_key: dict[tuple[int, str, int, int], Task]) -> list[Task]:
    """Rank ``r``'s tasks in the order of PyTorch's ZB-V (``ScheduleZBVZeroBubble._calculate_single_rank_
    operations``, torch/distributed/pipelining/schedules.py), chunk 0 being the V's first leg (stage r),
    chunk 1 its second (stage 2p - 1 - r):

    - warm-up: 2(p - r) - 1 first-leg forwards, then r pairs of a second-leg and a first-leg forward, then
      p - r times a second-leg forward with its B and W;
    - steady state, until both legs have run n = max(2p - 1, m) forwards: a first-leg forward (while any
      remain), B and W of the first leg, a second-leg forward, B and W of the second leg;
    - cool-down: r pairs of first- and second-leg B passes, then p - r first-leg B passes each with a held
      first-leg W, then the held W passes, second leg first.

    PyTorch plans n micro-batches and drops those past m. Against the greedy schedule this replaces, which
    deferred W passes until about 4p chunks waited, the rank keeps 2p chunks short of their W, and with
    m >= 2p - 1 its bubble is at least (p - 1)·t_B/2, not the paper's (p - 1)·t_F/2
    (cost.pipeline._zb_v_bubble). Checked action by action against torch 2.13's own order for p = 1..16,
    every m to 4p + 2 and every rank (tests/torch/test_pipeline_orders.py, where the torch extra is
    installed)."""
    n = max(2 * pp - 1, m)
    order: list[tuple[str, int, int]] = []
    done = dict.fromkeys([(kind, chunk) for kind in "FBW" for chunk in (0, 1)], 0)

    def run(*passes: str) -> None:  # "F0": the next first-leg forward
        for kind, chunk in ((x[0], int(x[1])) for x in passes):
            order.append((kind, done[kind, chunk], chunk))
            done[kind, chunk] += 1

    run(*["F0"] * (2 * (pp - r) - 1), *["F1", "F0"] * r, *["F1", "B1", "W1"] * (pp - r))
    while done["F", 1] < done["F", 0] or done["F", 0] < n:
        run(*(["F0"] if done["F", 0] < n else []), "B0", "W0", "F1", "B1", "W1")
    run(*["B0", "B1"] * r, *["B0", "W0"] * (pp - r))
    for chunk in (1, 0):
        run(*[f"W{chunk}"] * (done["B", chunk] - done["W", chunk]))
    return [by_key[r, kind, k, chunk] for kind, k, chunk in order if k < m]


def _run_in_order(pp: int, orders: list[list[Task]], p2p_s: float) -> float:
    """Start every task as soon as its stage is free and its dependencies have ended (a cross-stage one
    ``p2p_s`` later), each stage running its ``orders`` list in order; the makespan [s]."""
    free = [0.0] * pp
    heads = [0] * pp
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(pp):
            order, head, start = orders[s], heads[s], free[s]
            while head < len(order):
                t = order[head]
                at, ready = start, True
                for d in t.deps:  # the latest of the stage's own end and each dependency's (a hop later)
                    end = d.end_s
                    if end != end:  # NaN: not run yet
                        ready = False
                        break
                    if d.stage != s:
                        end += p2p_s
                    if end > at:
                        at = end
                if not ready:
                    break
                t.start_s = at
                t.end_s = start = at + t.dur_s
                head += 1
                left -= 1
                moved = True
            heads[s], free[s] = head, start
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")
    return max(free)
