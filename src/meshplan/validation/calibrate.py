"""Fit the compute model's physical parameters on published runs, and cross-validate the fit.

Procedure (docs/validation.md):
1. Parameters: a few global ones (attention efficiency and its block-length constant, the GEMM shape
   constant and the FP8 one relative to it, overlap efficiency, compute slowdown under communication,
   expert-GEMM efficiency), one per accelerator family (``gemm_scale``: training-kernel over best-case
   matmul efficiency), three per software stack (``layer_overhead_s``, ``step_overhead_s``,
   ``elementwise_passes``: its elementwise memory traffic over the fused minimum), and per stack and
   family where the reference stack (Megatron-core) also has rows ``kernel_scale`` for its GEMMs and, on
   Hopper only (ATTENTION_SPLIT_FAMILIES), ``attention_kernel_scale`` for its attention kernel. None is
   per row; the MEASURED ones are set from a measurement, not fitted.
2. Loss: mean |log(predicted / measured)| of tokens/s per GPU over the training rows (robust to the
   few rows whose published configuration is incomplete).
3. Optimiser: cyclic coordinate descent, a golden-section search per parameter within physical bounds,
   starting from the stated defaults, in rounds until one improves the loss by less than 0.2 % (at most
   eight); a parameter's search re-evaluates only the rows it affects. After each round, a line search
   along the round's net step (Hooke and Jeeves's pattern move) follows the valleys that single
   coordinates descend slowly.
4. Cross-validation: k folds (deterministic, stratified by GPU family, stack and kind of model), each
   fitted from the defaults on the other folds and used to predict its own rows; the reported error is
   over those out-of-fold predictions. Optionally leave-one-source-group-out.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from meshplan.calibration import _load, band_keys, family, params_from, seen_key, stack_key, unseen_stack_keys
from meshplan.cost.compute import ComputeParams
from meshplan.parallel import parallel_map
from meshplan.validation.validate import RowResult, predict

GOLDEN = (math.sqrt(5) - 1) / 2
REFERENCE_STACK = "megatron"
"""The stack whose kernels define each GPU family's gemm_scale and attention efficiency; other stacks get a
kernel_scale for their GEMMs (and, on ATTENTION_SPLIT_FAMILIES, an attention_kernel_scale)."""
ATTENTION_SPLIT_FAMILIES = ("h100-sxm",)
"""GPU families on which the reference stack's attention kernel is not the other stacks' FlashAttention-2:
on Hopper, Transformer Engine runs cuDNN's fused attention (FlashAttention-3 class), while flash_attn 2.x
and PyTorch SDPA run FlashAttention-2, which reaches a smaller share of Hopper's peak than of Ampere's
(FlashAttention-3, arXiv:2407.08608: FlashAttention-2 at 35 % of H100's peak). On A100 every stack of the data
ran FlashAttention-2 (or unfused attention, modelled as such), so one attention efficiency serves them all;
on Blackwell only the reference stack has rows."""


MEASURED = {("software:torchtitan", "elementwise_passes"): 2.7}
"""Parameters set from a measurement instead of fitted, by (scope, key). torchtitan's eager blocks: an
eager PyTorch Llama block moved 2.7x the fused minimum of elementwise traffic on an H200
(docs/measure-and-crosscheck.md). Fitted freely, it goes to 3.7, standing in for launch gains that only two
eager/compiled pairs of rows separate, with a fixed 3 ms per layer and micro-batch; pinned, the fit's MAPE is
the same or lower (docs/validation.md, "Alternatives tested and not adopted")."""


@dataclass(frozen=True, slots=True)
class Param:
    key: str
    scope: str
    """'global', 'accelerator:<family>', 'software:<stack>' or 'stack:<stack>/<family>'."""
    lo: float
    hi: float
    log: bool = False


GLOBAL_PARAMS = [
    Param("attention_half_len", "global", 16.0, 8192.0, log=True),
    Param("gemm_half_dim", "global", 8.0, 2048.0, log=True),
    Param("fp8_half_dim_ratio", "global", 0.5, 8.0, log=True),
    Param("overlap_efficiency", "global", 0.2, 1.0),
    Param("comm_slowdown", "global", 0.0, 0.6),
    Param("moe_gemm_efficiency", "global", 0.1, 1.0),
    Param("causal_attention_fraction", "global", 0.5, 1.0),
    Param("moe_permute_passes", "global", 4.0, 64.0, log=True),
    Param("zero3_overlap_efficiency", "global", 0.0, 1.0),
    Param("zero3_collective_efficiency", "global", 0.1, 1.0),
    Param("moe_layer_overhead_s", "global", 0.0, 0.01),
    Param("moe_layer_host_s", "global", 0.0, 0.03),
    Param("moe_expert_host_s", "global", 0.0, 0.002),
]


def parameter_space(rows: list[RowResult]) -> list[Param]:
    fams = sorted({family(r.scenario.cluster.accelerator.name) for r in rows if r.scenario})
    stacks = sorted({r.scenario.job.software for r in rows if r.scenario})
    out = list(GLOBAL_PARAMS)
    for f in fams:  # FlashAttention reaches a different share of peak on each generation (FA2: A100 58 %, H100 33 %)
        out += [Param("gemm_scale", f"accelerator:{f}", 0.3, 1.25),
                Param("attention_efficiency", f"accelerator:{f}", 0.1, 0.9),
                Param("fp8_gemm_efficiency", f"accelerator:{f}", 0.3, 0.95)]
    for s in stacks:
        out += [Param("layer_overhead_s", f"software:{s}", 0.0, 0.01),
                Param("step_overhead_s", f"software:{s}", 0.0, 3.0),
                Param("elementwise_passes", f"software:{s}", 1.0, 8.0, log=True)]
    # each other stack's kernels against the reference stack's on the same GPU generation, where both
    # have rows (otherwise the family's gemm_scale already is that stack's)
    combos = {(r.scenario.job.software, family(r.scenario.cluster.accelerator.name)) for r in rows if r.scenario}
    for s, f in sorted(combos):
        if s != REFERENCE_STACK and (REFERENCE_STACK, f) in combos:
            out.append(Param("kernel_scale", f"stack:{stack_key(s, f)}", 0.5, 1.5))
            if f in ATTENTION_SPLIT_FAMILIES:
                out.append(Param("attention_kernel_scale", f"stack:{stack_key(s, f)}", 0.3, 1.5))
    return [p for p in out if (p.scope, p.key) not in MEASURED]


State = dict[str, dict]


STATE_KINDS = ("global", "accelerator", "software", "stack")
"""The tables of a fit's state, as Param.scope names them (and fitted.toml stores them)."""


def empty_state() -> State:
    """The tables a fit starts from: the MEASURED parameters, nothing fitted."""
    state: State = {kind: {} for kind in STATE_KINDS}
    for (scope, key), value in MEASURED.items():
        _table(state, scope)[key] = value
    return state


def _table(state: State, scope: str) -> dict:
    """The table of ``state`` a parameter of ``scope`` lives in (Param.scope)."""
    if scope == "global":
        return state["global"]
    kind, name = scope.split(":")
    return state[kind].setdefault(name, {})


def params_for(state: State, accelerator: str, software: str) -> ComputeParams:
    tables = [_load("default"), state["global"], state["accelerator"].get(family(accelerator), {}),
              state["software"].get(software, {}), state["stack"].get(stack_key(software, accelerator), {})]
    return params_from(tables, "calibration in progress")


def _affects(p: Param, r: RowResult) -> bool:
    if p.scope == "global":
        return True
    kind, name = p.scope.split(":")
    sc = r.scenario
    assert sc is not None
    if kind == "accelerator":
        return family(sc.cluster.accelerator.name) == name
    if kind == "stack":
        return stack_key(sc.job.software, sc.cluster.accelerator.name) == name
    return sc.job.software == name


def _row_loss(r: RowResult, state: State) -> float:
    sc = r.scenario
    assert sc is not None
    est = predict(sc, params_for(state, sc.cluster.accelerator.name, sc.job.software))
    pred = est.tokens_per_s_per_gpu
    if not pred > 0 or not math.isfinite(pred):
        return 5.0
    return abs(math.log(pred / sc.measured_tokens_per_s_per_gpu))


MAX_ROUNDS = 8
TOLERANCE = 0.002
"""Coordinate descent stops when a round improves the total loss by less than this fraction (at most
MAX_ROUNDS rounds). A few fixed rounds stop short of the optimum: the GEMM shape constant and the per-GPU
kernel scales trade off along a valley that coordinate steps descend slowly."""


def total_loss(rows: list[RowResult], state: State) -> float:
    return sum(_row_loss(r, state) for r in rows)


def fit(rows: list[RowResult], *, rounds: int = MAX_ROUNDS, tol: float = TOLERANCE, pattern: bool = True,
        progress: Callable[[str], None] | None = None) -> State:
    """Fit the parameter space on ``rows`` (which must have scenarios) from the defaults: rounds of
    coordinate descent, each followed by a pattern move unless ``pattern`` is false, until one improves
    the loss by less than ``tol`` (relative), at most ``rounds``."""
    state = empty_state()
    defaults = params_from([_load("default")], "defaults")  # what params_for falls back to
    space = parameter_space(rows)
    before = total_loss(rows, state)
    for rnd in range(rounds):
        before_round = _values(state, space, defaults)
        for p in space:
            subset = [r for r in rows if _affects(p, r)]
            if not subset:
                continue
            table = _table(state, p.scope)
            start = _value(state, p, defaults)

            def loss(x: float, table: dict = table, p: Param = p, subset: list = subset) -> float:
                table[p.key] = x
                return sum(_row_loss(r, state) for r in subset)

            table[p.key] = _golden(loss, p, start)
            if progress:
                progress(f"round {rnd + 1}/{rounds} {p.scope}.{p.key} = {table[p.key]:.4g}")
        if pattern:
            _pattern_move(rows, state, space, before_round, _values(state, space, defaults))
        after = total_loss(rows, state)
        if before - after < tol * before:
            break
        before = after
    return state


def _value(state: State, p: Param, defaults: ComputeParams) -> float:
    """A parameter's current value in ``state`` (its default where the fit has not set it)."""
    return _table(state, p.scope).get(p.key, getattr(defaults, p.key))


def _values(state: State, space: list[Param], defaults: ComputeParams) -> list[float]:
    """Every parameter of ``space``'s current value."""
    return [_value(state, p, defaults) for p in space]


PATTERN_REACH = 3.0
"""How far a pattern move may extrapolate a round's step (in multiples of it)."""


def _pattern_move(rows: list[RowResult], state: State, space: list[Param], start: list[float],
                  end: list[float]) -> None:
    """Hooke and Jeeves's pattern move: a line search along the step the last round of coordinate searches
    took, from where it ended (in log space for log-scaled parameters, clipped to the bounds). Where
    parameters trade off along a valley (a GPU family's GEMM scale against a stack's kernel scale, the
    GEMM shape constant against both), single coordinates zig-zag down it; the round's net step points
    along it. Keeps the round's end unless the line finds a lower loss."""
    moved = [(p, a, b) for p, a, b in zip(space, start, end, strict=True) if a != b]
    if not moved:
        return
    tables = [_table(state, p.scope) for p, _, _ in moved]

    def along(p: Param, a: float, b: float, t: float) -> float:
        if t == 0.0:
            return b  # exactly the round's end, not exp(log(b))
        x = b * (b / a) ** t if p.log else b + t * (b - a)
        return min(p.hi, max(p.lo, x))

    def loss(t: float) -> float:
        for (p, a, b), table in zip(moved, tables, strict=True):
            table[p.key] = along(p, a, b, t)
        return total_loss(rows, state)

    # the step multiple t is searched like a parameter (scope "pattern" only names it); _golden leaves the
    # state at the best t, 0 unless another is lower
    _golden(loss, Param("t", "pattern", 0.0, PATTERN_REACH), 0.0, iters=10)


def _golden(loss: Callable[[float], float], p: Param, start: float, iters: int = 14) -> float:
    """Golden-section search of ``loss`` over [lo, hi] (log-spaced if ``p.log``); keeps ``start`` unless
    something better is found."""
    def to_x(u: float) -> float:
        return math.exp(u) if p.log else u

    lo, hi = (math.log(p.lo), math.log(p.hi)) if p.log else (p.lo, p.hi)
    best_x, best = start, loss(start)
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = loss(to_x(c)), loss(to_x(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = loss(to_x(c))
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = loss(to_x(d))
    for x, f in ((to_x(c), fc), (to_x(d), fd)):
        if f < best:
            best_x, best = x, f
    loss(best_x)  # leave the state at the optimum
    return best_x


def folds(rows: list[RowResult], k: int) -> list[list[RowResult]]:
    """Deterministic stratified k-fold split of the modelled rows.

    The strata are the most specific uncertainty tables (GPU family, software stack, dense or MoE;
    ``band_keys``). Each stratum's rows, in the order of a multiplicative hash of their index, are dealt
    to the folds in turn, starting at a fold chosen by a hash of the stratum's name. Every fold then trains
    on about (k-1)/k of each kind of run, as the catalog's own fit does on all of them; a split by the
    hash alone could leave a fold's training set with few rows of a small stratum (56 MoE rows in three
    GPU families), and the out-of-fold error of those rows then measured the split more than the model
    (docs/validation.md, "The procedure"). A row added or dropped moves only rows of its own stratum to
    other folds."""
    strata: dict[str, list[RowResult]] = {}
    for r in rows:
        strata.setdefault(_row_band_keys(r)[0] if r.scenario is not None else "unmodelled", []).append(r)
    out: list[list[RowResult]] = [[] for _ in range(k)]
    for key in sorted(strata):
        first = zlib.crc32(key.encode())
        for i, r in enumerate(sorted(strata[key], key=lambda r: ((r.row * 2654435761) % (2**32), r.row))):
            out[(first + i) % k].append(r)
    return out


def source_groups(rows: list[RowResult]) -> list[list[RowResult]]:
    """The rows of each source group, groups in name order: leave-one-source-out's folds."""
    return [[r for r in rows if r.source_group == g] for g in sorted({r.source_group for r in rows})]


def cv_rows(rows: list[RowResult]) -> list[RowResult]:
    """The rows cross-validation folds and predicts: modelled, with a measured throughput."""
    return [r for r in rows if r.scenario is not None and r.measured_tokens_per_s_per_gpu]


def held_out_ids(part: list[RowResult]) -> tuple[int, ...]:
    """The row indices of a fold, sorted: how a FoldFit names the rows it held out."""
    return tuple(sorted(r.row for r in part))


@dataclass(frozen=True, slots=True)
class FoldFit:
    """One cross-validation fold: the rows it held out and the parameters fitted without them."""

    held_out_rows: tuple[int, ...]
    state: State


def cross_validate(rows: list[RowResult], *, k: int = 5, rounds: int = MAX_ROUNDS, by_group: bool = False,
                   progress: Callable[[str], None] | None = None) -> list[FoldFit]:
    """Fit each fold (``by_group``: each source group) on the other rows, on every core; return the fits.
    ``out_of_fold`` predicts the held-out rows with them."""
    modelled = cv_rows(rows)
    parts = source_groups(modelled) if by_group else folds(modelled, k)

    def fold(i: int) -> State:  # runs in a forked worker: parts is inherited, not pickled
        held_ids = {r.row for r in parts[i]}
        state = fit([r for r in modelled if r.row not in held_ids], rounds=rounds)
        if progress:
            progress(f"fold {i + 1}/{len(parts)} done")
        return state

    return [FoldFit(held_out_ids(part), state)
            for part, state in zip(parts, parallel_map(fold, range(len(parts)), distributable=True), strict=True)]


def out_of_fold(rows: list[RowResult], fits: list[FoldFit]) -> dict[int, float]:
    """Each held-out row's tokens/s per GPU predicted by its fold's fit, by row index."""
    by_row = {r.row: r for r in cv_rows(rows)}
    out = {}
    for f in fits:
        for row in f.held_out_rows:
            sc = by_row[row].scenario
            assert sc is not None
            out[row] = predict(sc, params_for(f.state, sc.cluster.accelerator.name,
                                              sc.job.software)).tokens_per_s_per_gpu
    return out


BAND_NOMINAL = 0.8  # the band runs from the 10th to the 90th percentile: 80 % of rows inside
BAND_MIN_ROWS = 8  # fewer rows than this and a table falls back to the next, wider one


def _row_band_keys(r: RowResult) -> tuple[str, ...]:
    """The band tables of a modelled row, most specific first (calibration.band_keys)."""
    sc = r.scenario
    assert sc is not None
    return band_keys(sc.cluster.accelerator.name, sc.job.software, sc.model.is_moe)


def _step_ratio(e: float) -> float:
    """A tokens/s error turned into a step-time ratio (predicted step over measured step, minus one):
    tokens/s over-predicted by e, the step under-predicted."""
    return 1.0 / (1.0 + e) - 1.0


def _band_residuals(rows: list[RowResult]) -> tuple[dict[str, list[float]], list[tuple[bool, tuple[str, ...], float]]]:
    """Each band table's out-of-fold step-time ratios (_step_ratio), and per row (MoE?, its band_keys
    chain, its own ratio)."""
    groups: dict[str, list[float]] = {}
    per_row = []
    for r in rows:
        e = r.cv_error
        if e is None or r.scenario is None:
            continue
        keys, ratio = _row_band_keys(r), _step_ratio(e)
        for key in keys:
            groups.setdefault(key, []).append(ratio)
        per_row.append((r.scenario.model.is_moe, keys, ratio))
    return groups, per_row


def _band_of(ratios: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentile of step ratios (statistics.quantiles, exclusive method)."""
    q = statistics.quantiles(ratios, n=10)
    return q[0], q[-1]


def _bands(groups: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each table with at least BAND_MIN_ROWS ratios as a band on the measured step relative to the
    prediction (low, high: measured / predicted - 1): for ratios between lo and hi the measured step
    lies within [pred/(1+hi), pred/(1+lo)]."""
    out = {}
    for key, v in groups.items():
        if len(v) < BAND_MIN_ROWS:
            continue
        lo, hi = _band_of(v)
        out[key] = {"low": _step_ratio(hi), "high": _step_ratio(lo), "rows": len(v)}  # the map is its own inverse
    return out


def uncertainty_bands(rows: list[RowResult]) -> dict[str, dict[str, float]]:
    """Relative step-time bands (10th and 90th percentile of the out-of-fold tokens/s errors, turned into
    step-time ratios) for every table of calibration.band_keys with at least BAND_MIN_ROWS rows."""
    return _bands(_band_residuals(rows)[0])


def unseen_stack_rows(rows: list[RowResult]) -> list[RowResult]:
    """The rows with a leave-one-source-out prediction whose software stack no other source group's fitted
    rows (cv_rows) ran: the fit that predicted them had seen no run of their stack, so it timed them with
    the stated defaults a stack the catalog has no tables for ('generic') gets."""
    fitted = [(r, r.scenario.job.software) for r in cv_rows(rows) if r.scenario is not None]
    groups_of: dict[str, set[str]] = {}
    for r, software in fitted:
        groups_of.setdefault(software, set()).add(r.source_group)
    return [r for r, software in fitted if r.lso_error is not None and groups_of[software] == {r.source_group}]


def _unseen_stack_ratios(rows: list[RowResult]) -> dict[tuple[str, bool], list[float]]:
    """The leave-one-source-out step ratios of unseen_stack_rows by (software, MoE?)."""
    out: dict[tuple[str, bool], list[float]] = {}
    for r in unseen_stack_rows(rows):
        assert r.scenario is not None and r.lso_error is not None
        out.setdefault((r.scenario.job.software, r.scenario.model.is_moe), []).append(_step_ratio(r.lso_error))
    return out


def unseen_stack_bands(rows: list[RowResult]) -> dict[str, dict[str, float]]:
    """The calibration.unseen_stack_keys bands: the 10th and 90th percentile of the leave-one-source-out
    step ratios of unseen_stack_rows, by kind of model and over all, where a table has BAND_MIN_ROWS."""
    groups: dict[str, list[float]] = {}
    for (_, moe), ratios in _unseen_stack_ratios(rows).items():
        for key in unseen_stack_keys(moe):
            groups.setdefault(key, []).extend(ratios)
    return _bands(groups)


def unseen_stack_coverage(rows: list[RowResult]) -> dict[str, object] | None:
    """How well the unseen-stack band carries to yet another stack: each software stack's rows (of
    unseen_stack_rows) checked against the band built from the other stacks' rows alone. Nominal 80 %; a
    stack far below it runs unlike the others, and the band understates what a new stack may do."""
    ratios: dict[str, list[float]] = {}
    for (software, _), v in _unseen_stack_ratios(rows).items():
        ratios.setdefault(software, []).extend(v)
    by_stack = {}
    for software, own in sorted(ratios.items()):
        others = [x for s, v in ratios.items() if s != software for x in v]
        if len(others) >= BAND_MIN_ROWS:
            lo, hi = _band_of(others)
            by_stack[software] = {"rows": len(own), "inside": sum(lo <= x <= hi for x in own) / len(own)}
    if not by_stack:
        return None
    n = sum(v["rows"] for v in by_stack.values())
    return {"nominal": BAND_NOMINAL, "rows": n,
            "inside": sum(v["rows"] * v["inside"] for v in by_stack.values()) / n, "by_stack": by_stack}


def band_coverage(rows: list[RowResult]) -> dict[str, object] | None:
    """How often the band holds on a row it was not built from: each row's out-of-fold error is checked
    against the band of the first table of its chain that keeps BAND_MIN_ROWS rows without it (leave one
    out), built as uncertainty_bands builds it. Nominal coverage is 80 %; well below means the band is
    too narrow to trust, well above that it is wider than it need be."""
    groups, per_row = _band_residuals(rows)
    inside: dict[str, list[bool]] = {"all": [], "dense": [], "moe": []}
    for moe, keys, ratio in per_row:
        for key in keys:
            others = list(groups[key])
            others.remove(ratio)
            if len(others) >= BAND_MIN_ROWS:
                lo, hi = _band_of(others)
                hit = lo <= ratio <= hi
                inside["all"].append(hit)
                inside["moe" if moe else "dense"].append(hit)
                break
    if not inside["all"]:
        return None
    return {"nominal": BAND_NOMINAL, **{k: {"rows": len(v), "inside": sum(v) / len(v)} for k, v in inside.items() if v}}


def toml_line(key: str, value: str | float) -> str:
    """``key = value``: a string quoted, a number to six significant digits (as fitted.toml keeps them)."""
    return f"{key} = {value!r}" if isinstance(value, str) else f"{key} = {float(value):.6g}"


def state_toml(state: State, prefix: str = "") -> list[str]:
    """The tables of a fitted ``state`` as TOML lines, each table's name after ``prefix``."""
    def table(d: dict) -> list[str]:
        return [toml_line(k, v) for k, v in sorted(d.items())]

    lines = ["", f"[{prefix}global]", *table(state["global"])]
    for name, t in sorted(state["accelerator"].items()):
        lines += ["", f"[{prefix}accelerator.{name}]", *table(t)]
    for name, t in sorted(state["software"].items()):
        lines += ["", f"[{prefix}software.{name}]", *table(t)]
    for name, t in sorted(state["stack"].items()):
        lines += ["", f'[{prefix}stack."{name}"]', *table(t)]
    return lines


def rows_by_stack(rows: list[RowResult]) -> dict[str, int]:
    """The modelled rows of each software stack on each GPU family, by kind of model
    (calibration.seen_key: 'torchtitan/h100-sxm/dense'): where the fit has seen a stack run that kind of
    model, and so where a prediction may take the band of similar runs."""
    return dict(sorted(Counter(seen_key(r.scenario.job.software, r.scenario.cluster.accelerator.name,
                                        r.scenario.model.is_moe) for r in rows if r.scenario is not None).items()))


def to_toml(state: State, *, source: str, summary: dict, bands: dict[str, dict[str, float]],
            stack_rows: dict[str, int]) -> str:
    """The fitted parameters as catalog/calibration/fitted.toml."""
    lines = ["# Written by `meshplan validate --calibrate`; see docs/validation.md for the procedure.",
             f"source = {source!r}"]
    lines += [toml_line(k, v) for k, v in summary.items()]
    lines += state_toml(state)
    lines += ["", "[rows_by_stack]", *(f'"{k}" = {n}' for k, n in stack_rows.items())]
    for key, b in sorted(bands.items()):
        lines += ["", f'[uncertainty."{key}"]', f"low = {b['low']:.4f}", f"high = {b['high']:.4f}",
                  f"rows = {b['rows']}"]
    return "\n".join(lines) + "\n"
