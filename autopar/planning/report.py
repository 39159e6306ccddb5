"""A plan as one self-contained web page, ``report.html`` (written by :meth:`Plan.save`,
so by ``autopar plan`` too): what the explanation's text says, drawn.

* the header: model, ranks, mesh, hardware, predicted step (and the measured one, where
  the plan was saved after training: :meth:`autopar.api.ParallelModule.save_plan`);
* the regions in model order, each a box coloured by the strategy it got (a pipeline's
  stages as columns), linked to its row of the table;
* the per-region table: kind, strategy (a pipeline's stage), predicted compute and
  communication by group in ms per step, memory in MiB, the alternatives weighed with
  their predicted ms, the reason (what each figure is per is said above it, as in the
  explanation);
* where the step and the memory go: the predicted step and the rank's memory as sums of
  named terms (:mod:`autopar.planning.totals`);
* memory per rank against the device's (a pipeline's ranks one bar each);
* the pipeline's timeline (:meth:`autopar.planning.timeline.Timeline.svg`);
* every configuration weighed with its predicted step, and why each that lost did.

No network: the styles, the drawing (inline SVG) and the small script (a click on a
region shows its row; a filter over the table) are in the file. A plain function of
the plan's fields, as :mod:`autopar.planning.explain`.
"""
from __future__ import annotations

import html
import json
import re

from autopar.cost.hardware import get_hardware
from autopar.planning.declared import DECLARED
from autopar.planning.region_table import mib_figure as c_mib, ms_figure as c_ms, preamble
from autopar.planning.totals import OUTSIDE, memory_reconciliation, stage_ranks, step_reconciliation

OTHER = "#d0a040"


def colours() -> dict[str, str]:
    """The regions' colours by the prefix of their strategy, as the families declare them
    (``Language.colours``; ``OTHER`` for the rest)."""
    return {key: colour for d in DECLARED.values() for key, colour in d.colours}

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#555} table{border-collapse:collapse;font-size:13px;margin-top:8px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f5f8} tr.lost td{color:#777} tr.chosen td{background:#eef6ee;font-weight:600}
tr.hit td{background:#fff6d0} .num{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:12px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.region{cursor:pointer} .region:hover rect{stroke:#000;stroke-width:2}
.bar{height:16px;background:#4a7bd0} .barbox{width:420px;background:#eee;position:relative;height:16px}
.limit{position:absolute;top:-3px;height:22px;border-left:2px solid #c0392b}
input{font-size:13px;padding:3px 6px;width:260px}
"""

SCRIPT = """
function showRegion(name){
  document.querySelectorAll('tr.hit').forEach(function(r){r.classList.remove('hit');});
  var row=document.querySelector('tr[data-region="'+CSS.escape(name)+'"]');
  if(row){row.classList.add('hit');row.scrollIntoView({block:'center'});}
}
document.querySelectorAll('g.region').forEach(function(g){
  g.addEventListener('click',function(){showRegion(g.getAttribute('data-region'));});
});
var filter=document.getElementById('filter');
filter.addEventListener('input',function(){
  var q=filter.value.toLowerCase();
  document.querySelectorAll('#regions tbody tr').forEach(function(r){
    r.style.display=r.textContent.toLowerCase().indexOf(q)>=0?'':'none';
  });
});
document.getElementById('count').textContent=document.querySelectorAll('#regions tbody tr').length;
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _family(strategy: str) -> str:
    """The colour key of a region's strategy ("megatron-vocab" → megatron, "tensor3d x=2.." → tensor3d)."""
    name = (strategy.split() or ["?"])[0].split("(")[0].lower()
    for key in colours():
        if name.startswith(key):
            return key
    return name


def _colour(strategy: str) -> str:
    return colours().get(_family(strategy), OTHER)


def _device_memory(plan) -> float | None:
    try:
        return get_hardware(plan.hardware).memory_bytes
    except (KeyError, ValueError, OSError, TypeError):  # a calibrated profile's name, or a file gone: no line
        return None


def _stage_of(choice) -> int | None:
    where = choice.details.get("stage") if isinstance(choice.details, dict) else None
    return where[0] if isinstance(where, list) and where else where if isinstance(where, int) else None


def _model_order(indexed) -> tuple:
    """A region's place in the model: by the numbers in its module path (``layers.3``
    before ``layers.12``), then as the plan lists it; an embedding first, other regions
    without numbers (a head, what lies outside regions) last."""
    index, choice = indexed
    numbers = tuple(int(n) for n in re.findall(r"\d+", choice.region))
    if numbers:
        return 1, numbers, index
    return (0 if "embed" in choice.region else 2), (), index


def region_svg(plan) -> str:
    """The regions as boxes coloured by strategy, in model order (:func:`_model_order`);
    with a pipeline, one column per stage (a region of several stages in its first)."""
    columns: dict[int, list] = {}
    for _, choice in sorted(enumerate(plan.regions), key=_model_order):
        columns.setdefault(_stage_of(choice) or 0, []).append(choice)
    width, box_h, gap = 300, 26, 8
    tallest = max((len(c) for c in columns.values()), default=1)
    svg_w = len(columns) * (width + 40) + 20
    svg_h = tallest * (box_h + gap) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{svg_w}" height="{svg_h}" font-size="11" '
             f'font-family="monospace" id="region-graph">']
    for col, stage in enumerate(sorted(columns)):
        x = 10 + col * (width + 40)
        if plan.pipeline:
            parts.append(f'<text x="{x}" y="14" font-weight="bold">stage {stage}</text>')
        for i, choice in enumerate(columns[stage]):
            y = 24 + i * (box_h + gap)
            if i:
                parts.append(f'<line x1="{x + width / 2}" y1="{y - gap}" x2="{x + width / 2}" y2="{y}" '
                             f'stroke="#999"/>')
            label = choice.region if len(choice.region) <= 46 else "…" + choice.region[-45:]
            parts.append(f'<g class="region" data-region="{_e(choice.region)}"><title>{_e(choice.region)}: '
                         f'{_e(choice.kind)}, {_e(choice.strategy)}; {_e(choice.reason)}</title>'
                         f'<rect x="{x}" y="{y}" width="{width}" height="{box_h}" rx="4" '
                         f'fill="{_colour(choice.strategy)}" stroke="#fff"/>'
                         f'<text x="{x + 6}" y="{y + 17}" fill="#fff">{_e(label)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _legend(plan) -> str:
    used = sorted({_family(c.strategy) for c in plan.regions})
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{colours().get(k, OTHER)}"></i>{_e(k)}</span>' for k in used) + "</div>"


def region_table(plan) -> str:
    """One row per region, in model order (:func:`_model_order`), in ms per step and
    MiB, what they are per said above it (as the explanation says it)."""
    groups = sorted({g for c in plan.regions for g in c.cost.comm_s})
    head = "".join(f"<th>comm {_e(g)} (ms)</th>" for g in groups)
    staged = bool(plan.pipeline)
    ranks = stage_ranks(plan) if staged else []
    rows = []
    for _, c in sorted(enumerate(plan.regions), key=_model_order):
        alternatives = ", ".join(f"{_e(k)} {c_ms(v)}" for k, v in sorted(c.alternatives.items(), key=lambda kv: kv[1]))
        comm = "".join(f'<td class="num">{c_ms(c.cost.comm_s.get(g, 0.0))}</td>' for g in groups)
        where = c.details.get("stage")
        stage = ("all" if c.region == OUTSIDE else "-" if where is None else
                 ", ".join(f"{s} (rank {ranks[s]})" for s in (where if isinstance(where, list) else [where])))
        rows.append(f'<tr data-region="{_e(c.region)}"><td>{_e(c.region)}</td><td>{_e(c.kind)}</td>'
                    f'<td><i style="display:inline-block;width:10px;height:10px;background:{_colour(c.strategy)}">'
                    f'</i> {_e(c.strategy)}</td>' + (f'<td>{_e(stage)}</td>' if staged else "")
                    + f'<td class="num">{c_ms(c.cost.compute_s)}</td>{comm}'
                    f'<td class="num">{c_mib(c.cost.memory_bytes)}</td><td>{alternatives}</td>'
                    f'<td>{_e(c.reason)}</td></tr>')
    return (f'<p class="sub">{"<br>".join(_e(line) for line in preamble(plan, folded=False))}</p>'
            f'<table id="regions"><thead><tr><th>region</th><th>kind</th><th>strategy</th>'
            + ("<th>stage</th>" if staged else "") + f'<th>compute (ms)</th>{head}'
            f'<th>memory (MiB)</th><th>alternatives (ms)</th><th>why</th></tr></thead><tbody>{"".join(rows)}'
            f'</tbody></table>')


def reconciliation_tables(plan) -> str:
    """The predicted step and the rank's memory as sums of named terms
    (:mod:`autopar.planning.totals`), each a table."""
    out = []
    for rec, unit, fmt, total in ((step_reconciliation(plan), "ms", c_ms, "predicted step"),
                                  (memory_reconciliation(plan), "MiB", c_mib, "predicted memory per rank")):
        if rec is None:
            out.append(f"<p class='sub'>memory per rank {_mib(plan.total.memory_bytes)}: its parts are not in this "
                       f"plan (made before they were recorded)</p>")
            continue
        terms = [(t.label, t.value) for t in rec.terms]
        if abs(rec.unattributed) > 1e-9 * abs(rec.total):
            terms.append(("not attributed to a term above", rec.unattributed))
        body = "".join(f'<tr><td>{_e(label)}</td><td class="num">{fmt(value)}</td></tr>' for label, value in terms)
        out.append(f"<p class='sub'>{_e(total)} on {_e(rec.where)}, {unit} per step:</p>" if unit == "ms" else
                   f"<p class='sub'>memory on {_e(rec.where)}, {unit}:</p>")
        out.append(f'<table class="sum"><thead><tr><th>term</th><th>{unit}</th></tr></thead><tbody>{body}'
                   f'<tr class="chosen"><td>= {_e(total)}</td><td class="num">{fmt(rec.total)}</td></tr>'
                   f'</tbody></table>')
    return "".join(out)


def memory_bars(plan) -> str:
    """Per-rank memory against the device's: a pipeline's ranks one bar each, else the
    one figure every rank shares."""
    device = _device_memory(plan)
    if plan.pipeline and plan.pipeline.get("memory_bytes"):
        bars = [(f"pipeline rank {r}", b) for r, b in enumerate(plan.pipeline["memory_bytes"])]
    else:
        bars = [("every rank", plan.total.memory_bytes)]
    scale = max([device or 0.0] + [b for _, b in bars]) or 1.0
    out = ["<table id='memory'><tr><th>rank</th><th></th><th>memory</th><th>of the device's</th></tr>"]
    for name, nbytes in bars:
        limit = f'<div class="limit" style="left:{420 * device / scale:.0f}px"></div>' if device else ""
        share = f"{100 * nbytes / device:.0f} %" if device else "-"
        out.append(f'<tr><td>{_e(name)}</td><td><div class="barbox"><div class="bar" '
                   f'style="width:{420 * nbytes / scale:.0f}px"></div>{limit}</div></td>'
                   f'<td class="num">{_mib(nbytes)}</td>'
                   f'<td class="num">{share}</td></tr>')
    out.append("</table>")
    caption = (f"device memory {_mib(device)} (red line), hardware {_e(plan.hardware)}" if device else
               f"the device memory of hardware {_e(plan.hardware)} is not known here")
    return f'<p class="sub">{caption}</p>' + "".join(out)


def alternatives_table(plan) -> str:
    """Every configuration weighed, fastest first, the chosen one marked, each loser's
    ratio to it and its reason."""
    rows = []
    chosen = plan._chosen_candidate()
    ranked = sorted(plan.candidates, key=lambda c: (not c.feasible, c.step_s if c.step_s is not None else 1e300))
    for c in ranked:
        mesh = " × ".join(f"{k}={v}" for k, v in c.mesh.items()) + (f" {c.form}" if c.form else "")
        is_chosen = c is chosen
        if is_chosen:
            why = "chosen"
        elif not c.feasible:
            why = c.reason or "infeasible"
        elif c.step_s is not None and plan.step_s:
            why = f"{c.step_s / plan.step_s:.2f}× the chosen step" + (f"; {c.reason}" if c.reason else "")
        else:
            why = c.reason
        rows.append(f'<tr class="{"chosen" if is_chosen else "lost"}"><td>{_e(mesh)}</td>'
                    f'<td class="num">{_ms(c.step_s)}</td><td class="num">{_mib(c.memory_bytes)}</td>'
                    f'<td>{"yes" if c.feasible else "no"}</td><td>{_e(why)}</td></tr>')
    return ('<table id="alternatives"><thead><tr><th>configuration</th><th>predicted step</th><th>memory</th>'
            f'<th>fits</th><th>why not chosen</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def report_html(plan, measured_step_s: float | None = None) -> str:
    """The page (module docstring)."""
    mesh = " × ".join(f"{k}={v}" for k, v in plan.mesh.items())
    measured = (f"; measured step <b>{_ms(measured_step_s)}</b> ({measured_step_s / plan.step_s:.2f}× predicted)"
                if measured_step_s and plan.step_s else "")
    head = (f"<h1>autopar plan: {_e(plan.model)}</h1><p class='sub'>{plan.world_size} rank(s), mesh {_e(mesh)}, "
            f"hardware {_e(plan.hardware)}, global batch {plan.global_batch}; predicted step "
            f"<b>{_ms(plan.step_s)}</b>{measured}; memory per rank {_mib(plan.total.memory_bytes)}; "
            f"{len(plan.regions)} regions; traced with {_e(plan.tracer)}</p>")
    data = json.dumps({"regions": [c.region for c in plan.regions], "step_s": plan.step_s}).replace("</", "<\\/")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>autopar plan: "
            f"{_e(plan.model)}</title><style>{STYLE}</style></head><body>{head}"
            f"<h2>Regions{' by pipeline stage' if plan.pipeline else ''}, in model order</h2>{_legend(plan)}{region_svg(plan)}"
            f"<h2>Per region (<span id='count'></span> rows)</h2><input id='filter' placeholder='filter the rows'>"
            f"{region_table(plan)}<h2>Where the step and the memory go</h2>{reconciliation_tables(plan)}"
            f"<h2>Memory per rank</h2>{memory_bars(plan)}{''.join(d.report(plan) for d in DECLARED.values())}"
            f"<h2>Configurations weighed</h2>{alternatives_table(plan)}"
            f"<h2>The explanation</h2><details open><summary>plan.explain()</summary>"
            f"<pre>{_e(plan.explain())}</pre></details>"
            f"<script type='application/json' id='plan-data'>{data}</script><script>{SCRIPT}</script>"
            "</body></html>\n")
