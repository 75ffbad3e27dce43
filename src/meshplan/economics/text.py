"""How a ``Summary`` reads as text: days, GPU-hours, dollars and MWh, each with its band."""

from __future__ import annotations

import re

from meshplan.economics.formulas import JOULES_PER_KWH, SECONDS_PER_DAY, SECONDS_PER_HOUR
from meshplan.economics.summary import Banded, Summary
from meshplan.units import format_gb


def format_duration_s(t_s: float) -> str:
    """'52.3 days', '7.5 h', '4.2 min', '38 s'."""
    if t_s >= 2 * SECONDS_PER_DAY:
        return f"{t_s / SECONDS_PER_DAY:,.1f} days"
    if t_s >= 2 * SECONDS_PER_HOUR:
        return f"{t_s / SECONDS_PER_HOUR:.1f} h"
    if t_s >= 120:
        return f"{t_s / 60:.1f} min"
    return f"{t_s:.2g} s" if t_s < 10 else f"{t_s:.0f} s"


def _scaled(value: float, units: tuple[tuple[float, str], ...], fmt: str) -> str:
    for div, suffix in units:
        if abs(value) >= div:
            return f"{value / div:{fmt}}{suffix}"
    return f"{value:{fmt}}"


def format_usd(usd: float) -> str:
    """'$126.8M', '$41.2K', '$950'."""
    return "$" + _scaled(usd, ((1e9, "B"), (1e6, "M"), (1e3, "K")), ".1f" if usd >= 1e3 else ".0f")


def format_energy_j(e_j: float) -> str:
    """Energy in decimal watt-hours: '35.2 GWh', '410 MWh', '12.5 kWh'."""
    kwh = e_j / JOULES_PER_KWH
    return _scaled(kwh, ((1e6, " GWh"), (1e3, " MWh")), ".3g") + (" kWh" if kwh < 1e3 else "")


def format_gpu_hours(h: float) -> str:
    """'20.6M GPU-hours', '5,120 GPU-hours'."""
    return (f"{h / 1e6:.3g}M" if h >= 1e6 else f"{h:,.0f}") + " GPU-hours"


def banded(b: Banded, fmt) -> str:
    """'52.3 days (37.1 .. 82.1)': the value and, where the band is not empty, its range."""
    return fmt(b.value) + ("" if b.low == b.high else f" ({fmt(b.low)} .. {fmt(b.high)})")


def short_source(source: str) -> str:
    """A price's source in a few words: 'CoreWeave on-demand list price, 2026-09-20' from the catalog's
    sentence (the whole sentence is in the JSON)."""
    text = source.split(": ", 1)[-1]
    date = re.search(r"\d{4}-\d{2}(?:-\d{2})?", text)
    head = text.split(",")[0]
    return head + (f", {date.group(0)}" if date and date.group(0) not in head else "")


def summary_lines(s: Summary) -> list[str]:
    """The summary as lines of text: time, GPU-hours, cost, energy, goodput and what each assumes."""
    g, st = s.goodput, s.settings
    lines = [f"Time to train {s.train_tokens:,.0f} tokens ({s.steps:,} steps of {s.global_batch_tokens:,} tokens) on "
             f"{s.n_gpus:,} {s.accelerator}; ranges are the step time's band"
             + (f" ({s.band_basis})" if s.band_basis else " (no band: the calibration has none for this case)") + ":",
             f"  failure-free: {banded(s.train_time_s, format_duration_s)}"]
    if s.wall_time_s is None:
        lines.append(f"  with failures: the job cannot make progress: it is interrupted every "
                     f"{format_duration_s(g.job_mtbf_s or 0)}, against {format_duration_s(g.restart_s)} to restart "
                     f"and {format_duration_s(g.checkpoint_write_s)} to checkpoint")
        return lines
    lines.append(f"  with failures and checkpoints: {banded(s.wall_time_s, format_duration_s)}, "
                 f"{banded(s.gpu_hours, format_gpu_hours)}")
    if s.cost_usd is not None:
        lines.append(f"  cost: {banded(s.cost_usd, format_usd)} at ${st.price_usd_per_gpu_hour:,.4g} per GPU-hour "
                     f"({short_source(st.sources['price_usd_per_gpu_hour'])}; prices vary by provider, commitment "
                     "and month: --price-per-gpu-hour)")
    else:
        lines.append("  cost: no price for this accelerator (--price-per-gpu-hour)")
    if s.energy_j is not None:
        lines.append(f"  energy: {banded(s.energy_j, format_energy_j)}: {st.board_power_w:,.0f} W per GPU (board "
                     f"power, host not included) x PUE {st.pue:.2f} (--pue)")
    if g.job_mtbf_s is None:
        lines.append("  goodput: 100 % (no failures assumed: no checkpoint needed)")
    else:
        interval = format_duration_s(g.interval_s or 0)
        lines.append(f"  goodput {g.fraction:.1%}: {g.interruptions_per_day:.3g} interruptions per day "
                     f"({g.failures_per_gpu_hour:.3g} per GPU-hour, {st.failure_source.split(':')[0]}; "
                     f"--failure-rate), {banded(s.expected_interruptions, lambda v: f'{v:,.0f}')} in all; "
                     f"checkpoint {format_gb(g.checkpoint_bytes)} ({format_gb(g.checkpoint_bytes_per_node)} per "
                     f"node) written in {format_duration_s(g.checkpoint_write_s)} at "
                     f"{st.storage_bytes_per_s_per_gpu / 1e9:.3g} GB/s per GPU (--storage-bandwidth), every "
                     f"{interval} ({g.interval_steps:,} steps; Daly's optimum); restart "
                     f"{format_duration_s(g.restart_s)} (--restart-minutes)")
    return lines
