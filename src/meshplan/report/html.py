"""`meshplan report`: one self-contained, interactive HTML page and a Markdown twin.

The HTML page draws its charts with the same script as ``meshplan serve`` (report/assets/charts.js on
Apache ECharts), both inlined with the charts' data, so the one file opens anywhere, offline, with zoom
and values on hover; it needs no matplotlib. The Markdown report carries PNG charts beside it where
matplotlib is installed (``pip install 'meshplan[plot]'``), and points to the HTML page otherwise.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from meshplan.explain import PlanAnalysis
from meshplan.fileio import atomic_write_bytes, atomic_write_text
from meshplan.report import chartdata
from meshplan.report.text import timing_cells
from meshplan.search.conditions import held_sentence
from meshplan.search.rank import TIE_BAND
from meshplan.search.sweep import SweepPoint, log_ticks
from meshplan.units import format_gib, format_seconds

TOP_CHARTED = 6


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    title: str
    png: bytes


def figures(a: PlanAnalysis, sweeps: dict[str, list[SweepPoint]], top: int = TOP_CHARTED) -> list[Figure]:
    """The Markdown report's PNG charts (matplotlib: report.charts)."""
    from meshplan.report import charts

    ranked = chartdata.plan_labels(a.result.ranked, top)
    labels, best = [label for label, _ in ranked], [e for _, e in ranked]
    out = [Figure("step_breakdown.png", "Step-time breakdown of the top plans",
                  charts.step_breakdown_chart(best, labels)),
           Figure("memory.png", "Memory breakdown of the top plans", charts.memory_chart(best, labels))]
    for name, pts in sweeps.items():
        if pts:
            out.append(Figure(f"sweep_{name}.png", f"Sweep of {name}",
                              charts.sweep_chart(pts, xlabel=name, log_x=log_ticks([p.value for p in pts]))))
    return out


def chart_data(a: PlanAnalysis, sweeps: dict[str, list[SweepPoint]], top: int = TOP_CHARTED) -> list[dict[str, Any]]:
    """The interactive charts of the HTML report, in order (chartdata's dicts)."""
    ranked = chartdata.plan_labels(a.result.ranked, top)
    out = [chartdata.memory_chart(ranked), chartdata.time_chart(ranked),
           chartdata.pareto_chart(a.result.ranked, a.recommended)]
    if a.recommended is not None:
        timeline = chartdata.simulated_timeline(a.recommended, a.cluster.accelerator.name, a.job.software)
        if timeline:
            out.append(timeline)
    out += [chartdata.sweep_chart(pts, name) for name, pts in sweeps.items() if pts]
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


def _title(a: PlanAnalysis) -> str:
    return (f"meshplan: {a.model.name} on {a.cluster.n_gpus} x {a.cluster.accelerator.name}, "
            f"{a.job.global_batch_tokens:,} tokens per step, sequence {a.job.seq_len:,}")


def _change_lines(a: PlanAnalysis) -> list[str]:
    """The conditions of change, the ranges over which the answer holds, or why there are none."""
    lines = [c.text for c in a.conditions or []]
    if a.held_ranges:
        lines.append(held_sentence(a.held_ranges, bool(a.conditions)))
    elif not a.conditions:
        lines.append("no plan fits, so there is no recommendation to change" if a.result.recommended is None
                     else "no condition could be varied around this scenario" if a.conditions_swept
                     else "not computed (--no-conditions)")
    return lines


BAND = (f"Within {TIE_BAND:.0%} of the fastest plan, plans with fewer axes and options rank first, so step "
        "times need not ascend.")


def markdown_report(a: PlanAnalysis, figs: list[Figure] | None, top: int) -> str:
    """The Markdown report; ``figs`` the PNG charts written beside it, None where matplotlib is missing."""
    header, rows = _table(a, top)
    md = [f"# {_title(a)}", ""]
    for i, q in enumerate(a.questions, 1):
        md += [f"## {i}. {q.title}", "", *[f"- {_md_text(line)}" for line in q.lines], ""]
    if a.measurements:
        md += ["### Measure first", "", *[f"- **{_md_text(m.what)}**: {_md_text(m.why)}" for m in a.measurements],
               ""]
    md += ["### When to change the plan", "", *[f"- {_md_text(line)}" for line in _change_lines(a)], ""]
    md += [f"## Ranked plans (top {len(rows)} of {len(a.result.ranked):,})", "", BAND, "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
           *["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows], ""]
    if figs is None:
        md += ["Charts: open report.html beside this file (interactive). PNG charts here need matplotlib: "
               "pip install 'meshplan[plot]'.", ""]
    for f in figs or []:
        md += [f"## {f.title}", "", f"![{f.title}]({f.name})", ""]
    return "\n".join(md)


def _asset(name: str) -> str:
    return resources.files("meshplan.report").joinpath(f"assets/{name}").read_text(encoding="utf-8")


def _script_json(obj: Any) -> str:
    """JSON that a <script> element holds safely: no '</' to end it, no '<!--' to open a comment."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


STYLE = """
body{font-family:Inter,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;color:#1d2433;background:#f4f6fa;margin:0}
main{max-width:1180px;margin:auto;padding:18px 22px 40px}
h1{font-size:22px;margin:6px 0 2px}h2{font-size:16px;margin:0 0 8px}h3{font-size:14px;margin:12px 0 6px}
.card{background:#fff;border:1px solid #e2e7ef;border-radius:10px;padding:14px 18px;margin:0 0 14px}
.rec{border-top:4px solid #2f5d9b}.dim{color:#5f6b80}.small{font-size:12.5px}
.metrics{display:flex;flex-wrap:wrap;gap:8px 28px;margin:10px 0}.k{font-size:11.5px;color:#5f6b80}
.v{font-size:19px;font-weight:650}.mono{font-family:Menlo,Consolas,monospace;font-size:12px}
ul{margin:0;padding-left:18px;line-height:1.5}li{margin:3px 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:14px}@media(max-width:1000px){.grid{grid-template-columns:1fr}}
.chart{width:100%;height:380px}.chart.tall{height:440px}
table{border-collapse:collapse;font-size:12px;width:100%}td,th{border-bottom:1px solid #e8ecf2;padding:4px 7px;
text-align:left;vertical-align:top}th{color:#5f6b80;border-bottom:2px solid #e2e7ef}
.fit-no td{color:#8a2a22}footer{font-size:12px;color:#5f6b80;margin-top:10px}
"""


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>"


def _recommendation_card(a: PlanAnalysis) -> list[str]:
    best, e = a.recommended, html.escape
    if best is None:
        return ["<section class='card rec'><h2>No plan fits</h2></section>"]
    band = best.uncertainty.sentence("the prediction") if best.uncertainty else ""
    metrics = [("step", format_seconds(best.step_time_s)), ("MFU", f"{best.mfu:.1%}"),
               ("tokens/s per GPU", f"{best.tokens_per_s_per_gpu:,.0f}"),
               ("peak memory", f"{format_gib(best.memory.peak_bytes)} / {format_gib(best.memory.capacity_bytes)}")]
    return ["<section class='card rec'><div class='k'>RECOMMENDED</div>",
            f"<h2 style='font-size:20px'>{e(best.plan.label())}</h2>",
            f"<div class='mono dim'>{e(best.plan.to_string())}</div><div class='metrics'>",
            *[f"<div><div class='k'>{k}</div><div class='v'>{e(v)}</div></div>" for k, v in metrics],
            f"</div><div class='small dim'>{e(band)}</div></section>"]


def html_report(a: PlanAnalysis, charts_data: list[dict[str, Any]], top: int) -> str:
    """The self-contained interactive HTML page."""
    e = html.escape
    header, rows = _table(a, top)
    h = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
         "<meta name='viewport' content='width=device-width, initial-scale=1'>",
         f"<title>{e(_title(a))}</title><style>{STYLE}</style></head><body><main>",
         f"<h1>{e(_title(a))}</h1>",
         f"<p class='dim small'>{a.cluster.n_nodes} nodes x {a.cluster.gpus_per_node} GPUs, "
         f"{a.cluster.inter.nic_bytes_per_s / 1e9:g} GB/s per GPU between nodes; {e(a.job.optimizer)}, "
         f"{e(a.job.precision)}, stack {e(a.job.software)}. Memory in GiB (2^30 bytes), traffic in decimal GB.</p>"]
    h += _recommendation_card(a)
    for i, q in enumerate(a.questions, 1):
        h += [f"<section class='card'><h2>{i}. {e(q.title)}</h2>", _list(q.lines)]
        if i == len(a.questions):
            if a.measurements:
                h += ["<h3>Measure first</h3><ul>"] + [f"<li><b>{e(m.what)}</b>: {e(m.why)}</li>"
                                                       for m in a.measurements] + ["</ul>"]
            h += ["<h3>When to change the plan</h3>", _list(_change_lines(a))]
        h.append("</section>")
    h += _chart_sections(charts_data)
    h += [f"<section class='card'><h2>Ranked plans (top {len(rows)} of {len(a.result.ranked):,})</h2>",
          f"<p class='small dim'>{e(BAND)}</p><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in header) + "</tr>"]
    h += [f"<tr class='fit-{r[8]}'>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
    h += ["</table></section>",
          "<footer>Charts drawn with Apache ECharts, inlined in this file (Apache License 2.0; Copyright The Apache "
          "Software Foundation). Scroll over a chart to zoom, hover for values.</footer></main>",
          f"<script type='application/json' id='meshplan-charts'>{_script_json(charts_data)}</script>",
          f"<script>{_asset('echarts.min.js')}</script>", f"<script>{_asset('charts.js')}</script>",
          "<script>(function(){var d=JSON.parse(document.getElementById('meshplan-charts').textContent);"
          "d.forEach(function(c,i){meshplanCharts.render(document.getElementById('chart-'+i),c);});})();</script>",
          "</body></html>"]
    return "\n".join(h)


def _chart_sections(charts_data: list[dict[str, Any]]) -> list[str]:
    """The chart containers: memory and time side by side, the Pareto front, the timeline, the sweeps."""
    out, pair = [], []
    for i, c in enumerate(charts_data):
        tall = " tall" if c["kind"] == "timeline" else ""
        height = (f" style='height:{max(260, min(900, 26 * len(c['lanes']) + 150))}px'"
                  if c["kind"] == "timeline" else "")
        div = f"<div class='card'><div id='chart-{i}' class='chart{tall}'{height} data-kind='{c['kind']}'></div></div>"
        if c["kind"] in ("memory", "time"):
            pair.append(div)
            if len(pair) == 2:
                out += ["<div class='grid'>", *pair, "</div>"]
                pair = []
        else:
            out.append(div)
    if pair:
        out += pair
    return out


def write_report(a: PlanAnalysis, sweeps: dict[str, list[SweepPoint]], out_dir: Path, *, top: int = 15
                 ) -> tuple[Path, Path]:
    """report.html (interactive, self-contained) and report.md (with PNG charts beside it where matplotlib is
    installed) in ``out_dir``; each file written whole (meshplan.fileio)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
        figs: list[Figure] | None = figures(a, sweeps)
    except ModuleNotFoundError:
        figs = None
    for f in figs or []:
        atomic_write_bytes(out_dir / f.name, f.png)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    atomic_write_text(html_path, html_report(a, chart_data(a, sweeps), top))
    atomic_write_text(md_path, markdown_report(a, figs, top))
    return html_path, md_path
