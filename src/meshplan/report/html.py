"""`meshplan report`: a self-contained HTML page (images embedded) and a Markdown twin (images beside)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from meshplan.explain import PlanAnalysis
from meshplan.fileio import atomic_write_bytes, atomic_write_text
from meshplan.report import charts
from meshplan.report.text import timing_cells
from meshplan.search.conditions import held_sentence
from meshplan.search.rank import TIE_BAND
from meshplan.search.sweep import SweepPoint, log_ticks
from meshplan.units import format_gib


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    title: str
    png: bytes


def figures(a: PlanAnalysis, sweeps: dict[str, list[SweepPoint]], top: int = 6) -> list[Figure]:
    ranked = [(i, e) for i, e in enumerate(a.result.ranked, 1) if e.feasible][:top]
    best = [e for _, e in ranked]
    # the rank ties a bar to its row of the table: plans differing only in options share a label
    labels = [f"#{i} {e.plan.label()}" for i, e in ranked]
    out = [Figure("step_breakdown.png", "Step-time breakdown of the top plans",
                  charts.step_breakdown_chart(best, labels)),
           Figure("memory.png", "Memory breakdown of the top plans", charts.memory_chart(best, labels))]
    for name, pts in sweeps.items():
        if pts:
            out.append(Figure(f"sweep_{name}.png", f"Sweep of {name}",
                              charts.sweep_chart(pts, xlabel=name,
                                                 log_x=log_ticks([p.value for p in pts]))))
    return out


def _table(a: PlanAnalysis, top: int) -> tuple[list[str], list[list[str]]]:
    header = ["#", "plan", "options", "micro-batch", "step", "MFU", "exposed comm", "peak memory", "fits", "why not"]
    rows = []
    for i, e in enumerate(a.result.ranked[:top], 1):
        p = e.plan
        rows.append([str(i), p.label(), p.to_string(), f"{p.mbs} x {e.n_microbatches}, {p.recompute_label}",
                     *timing_cells(e), format_gib(e.memory.peak_bytes), "yes" if e.feasible else "no",
                     "" if e.feasible else e.infeasible_reasons[0]])
    return header, rows


def _md_cell(text: str) -> str:
    """A Markdown table cell: a layout's '|' would end the cell and its '*' start emphasis."""
    return _md_text(text).replace("|", "\\|")


def _md_text(text: str) -> str:
    """Markdown text outside a table: a plan's layout ('Et*4|(t*5|)*4t*4L') or a product's '*' or '_' would
    start emphasis."""
    return text.replace("*", "\\*").replace("_", "\\_")


def write_report(a: PlanAnalysis, sweeps: dict[str, list[SweepPoint]], out_dir: Path, *, top: int = 15
                 ) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = figures(a, sweeps)
    title = (f"meshplan: {a.model.name} on {a.cluster.n_gpus} x {a.cluster.accelerator.name}, "
             f"{a.job.global_batch_tokens:,} tokens per step, sequence {a.job.seq_len:,}")
    header, rows = _table(a, top)

    md = [f"# {title}", ""]
    h = ["<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title>",
         "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px}"
         "img{max-width:100%}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for i, q in enumerate(a.questions, 1):
        md += [f"## {i}. {q.title}", "", *[f"- {_md_text(line)}" for line in q.lines], ""]
        h += [f"<h2>{i}. {html.escape(q.title)}</h2><ul>"] + [f"<li>{html.escape(x)}</li>" for x in q.lines] + ["</ul>"]
    if a.measurements:
        md += ["### Measure first", "", *[f"- **{_md_text(m.what)}**: {_md_text(m.why)}" for m in a.measurements],
               ""]
        h += ["<h3>Measure first</h3><ul>"] + [f"<li><b>{html.escape(m.what)}</b>: {html.escape(m.why)}</li>"
                                               for m in a.measurements] + ["</ul>"]
    md += ["### When to change the plan", ""]
    h += ["<h3>When to change the plan</h3><ul>"]
    for c in a.conditions or []:
        md.append(f"- {_md_text(c.text)}")
        h.append(f"<li>{html.escape(c.text)}</li>")
    if a.held_ranges:
        held = held_sentence(a.held_ranges, bool(a.conditions))
        md.append(f"- {_md_text(held)}")
        h.append(f"<li>{html.escape(held)}</li>")
    elif not a.conditions:
        none = ("no plan fits, so there is no recommendation to change" if a.result.recommended is None
                else "no condition could be varied around this scenario" if a.conditions_swept
                else "not computed (--no-conditions)")
        md.append(f"- {none}")
        h.append(f"<li>{none}</li>")
    md.append("")
    h.append("</ul>")
    band = (f"Within {TIE_BAND:.0%} of the fastest plan, plans with fewer axes and options rank first, so step "
            "times need not ascend.")
    md += [f"## Ranked plans (top {len(rows)} of {len(a.result.ranked):,})", "", band, "",
           "| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)] + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    md += [""]
    h += [f"<h2>Ranked plans (top {len(rows)} of {len(a.result.ranked):,})</h2><p>{html.escape(band)}</p><table><tr>"
          + "".join(f"<th>{html.escape(c)}</th>" for c in header) + "</tr>"]
    h += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows] + ["</table>"]
    for f in figs:
        atomic_write_bytes(out_dir / f.name, f.png)
        md += [f"## {f.title}", "", f"![{f.title}]({f.name})", ""]
        b64 = base64.b64encode(f.png).decode()
        h += [f"<h2>{html.escape(f.title)}</h2><img alt='{html.escape(f.title)}' src='data:image/png;base64,{b64}'>"]
    h.append("</body></html>")
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    atomic_write_text(html_path, "\n".join(h))
    atomic_write_text(md_path, "\n".join(md))
    return html_path, md_path
