"""How much of each collective compute hides: the overlap of a stage's communication ledger.

Each collective is hidden behind the compute window it can overlap (``CommEntry.window``) up to that
window's length times ``overlap_efficiency``, per link, less what traffic of an overlapping window on the
same link already hid there (``set_exposure``); what does not fit, plus the parts no compute can cover
(``edge_s``), is exposed, and excess on different links in the same phase overlaps (``_overlap_links``).
Hidden traffic slows compute by ``comm_slowdown`` of its time, and that slower compute hides as much more
of the excess (``absorb_contention``).
"""

from __future__ import annotations

from collections import defaultdict

from meshplan.cost.estimate import OTHER_MICROBATCH, CommEntry

WINDOW_ORDER = ("attention", "forward", "backward", "first_forward", "last_backward", "pipeline", OTHER_MICROBATCH)
"""The order in which traffic claims the compute that hides it on a link: the most constrained first.
Attention traffic (context-parallel exchanges) must hide behind attention, which lies within the
forwards and backwards; the first forward and the last backward are one micro-batch of those; pipeline
transfers and traffic beside another micro-batch can use any compute of the step."""


_PHASE = {"forward": "forward", "first_forward": "forward", "backward": "backward", "last_backward": "backward"}


_PARENT = {"first_forward": "forward", "last_backward": "backward"}


_WHOLE = ("pipeline", OTHER_MICROBATCH)


_RANK = {w: i for i, w in enumerate(WINDOW_ORDER)}


SHARDED_DP_AXES = ("dp_shard", "edp")
"""The mesh axes that shard data-parallel state (dense and expert parameters): their traffic is what an
implementation's own prefetching hides (``set_exposure``) and what ZeRO-3's collective efficiency slows."""


def set_exposure(entries: list[CommEntry], windows: dict[str, float], overlap: float,
                 dp_overlap: float | None = None) -> None:
    """Set ``exposed_s`` on each entry. The traffic of each window on a link hides behind that window's
    compute (times ``overlap``, or ``dp_overlap`` for data-parallel traffic: an implementation's own
    prefetching) less what traffic of an overlapping window on the same link already hid there
    (WINDOW_ORDER); the rest, and the edges, are exposed. Windows overlap in time: attention lies within
    the forwards and backwards, the first forward and the last backward are one micro-batch of them, and
    the pipeline and OTHER_MICROBATCH windows span the whole step, so the same compute never hides more
    traffic on one link than it lasts."""
    groups: dict[tuple[str, str, bool], list[CommEntry]] = defaultdict(list)
    for e in entries:
        groups[(e.window, e.link, dp_overlap is not None and e.axis in SHARDED_DP_AXES)].append(e)
    hidden: dict[tuple[str, str], float] = defaultdict(float)  # (link, window) -> compute already claimed [s]
    attention: dict[tuple[str, str], float] = defaultdict(float)  # (link, phase) -> attention traffic hidden [s]
    for (window, link, dp), group in sorted(groups.items(), key=lambda kv: _RANK.get(kv[0][0], -1)):
        if window in _WHOLE:
            used = sum(v for (lk, _), v in hidden.items() if lk == link)
        else:
            used = hidden[link, window]
            phase = _PHASE.get(window)
            if phase is not None:  # attention traffic of this phase, and the parent's share of one micro-batch
                parent = _PARENT.get(window)
                share = windows.get(window, 0.0) / windows[parent] if parent and windows.get(parent) else 1.0
                used += share * (attention[link, phase] + (hidden[link, parent] if parent else 0.0))
        _expose(group, max(0.0, windows.get(window, 0.0) * (dp_overlap if dp else overlap) - used))
        for e in group:
            hidden[link, window] += e.time_s - e.exposed_s
            if window == "attention":
                attention[link, e.phase] += e.time_s - e.exposed_s
    _overlap_links(groups)


def _overlap_links(groups: dict[tuple[str, str, bool], list[CommEntry]]) -> None:
    """Links run side by side: what exceeds the compute of one phase on two links (an intra-node
    all-gather and an inter-node reduce-scatter of the same backward) runs at the same time, so the
    phase is extended by the larger excess, not by their sum. Each link's exposed part (beyond its
    edges) is scaled by max / sum, per phase: the forward windows and the backward windows (attention,
    pipeline and other-micro-batch traffic by the phase of its collective). Traffic on the critical path
    (window 'none') stays summed."""
    if len({link for (_, link, _) in groups}) < 2:
        return

    def phase(window: str, e: CommEntry) -> str:
        return _PHASE.get(window, e.phase)

    excess: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (window, link, _), group in groups.items():
        if window != "none":
            for e in group:
                excess[phase(window, e)][link] += e.exposed_s - e.edge_s
    keep = {p: max(links.values()) / sum(links.values()) for p, links in excess.items()
            if len(links) > 1 and sum(links.values()) > 0}
    if not keep:
        return
    for (window, _, _), group in groups.items():
        if window != "none":
            for e in group:
                e.exposed_s = e.edge_s + (e.exposed_s - e.edge_s) * keep.get(phase(window, e), 1.0)


def _expose(group: list[CommEntry], capacity: float) -> None:
    """Expose what of ``group`` exceeds ``capacity`` seconds of hiding compute, pro rata, plus the edges."""
    hideable = sum(e.time_s - e.edge_s for e in group)
    excess = max(0.0, hideable - capacity)
    share = excess / hideable if hideable > 0 else 0.0
    for e in group:
        e.exposed_s = e.edge_s + (e.time_s - e.edge_s) * share


def absorb_contention(entries: list[CommEntry], slowed_s: float) -> None:
    """Hidden traffic slows the compute that hides it by ``slowed_s`` in all; that longer compute hides
    as much more of the traffic its windows could not (the exposed part beyond the edges), so the step
    pays max(contention, excess), not their sum. Where traffic exceeds compute (expert all-to-alls
    overlapped with another micro-batch), the step is the traffic's time and the slowed compute runs
    inside it, as the simulator has it; where compute exceeds traffic, nothing changes."""
    excess = sum(e.exposed_s - e.edge_s for e in entries if e.overlappable)
    if excess <= 0.0 or slowed_s <= 0.0:
        return
    keep = 1.0 - min(slowed_s, excess) / excess
    for e in entries:
        if e.overlappable:
            e.exposed_s = e.edge_s + (e.exposed_s - e.edge_s) * keep
