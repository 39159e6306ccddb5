"""The plan's explanations: :meth:`Plan.explain`'s table, :meth:`Plan.top`,
:meth:`Plan.why_not` and the pipeline's part of the table.

Plain functions of a :class:`autopar.planning.plan.Plan` (they read its fields and
nothing else), kept apart from the data structure so that each stays short. What is a
family's own comes from its declaration (:mod:`autopar.planning.declared`): the rank
layout beside the mesh and the notes after it, the notes on the levers it runs, its
lines and sections (placed by :data:`PLACES`), how the configurations weighed show its
configurations and which are its (``why_not``). The texts are golden
(``tests/planning/test_plan.py``, ``tests/planning/test_planner_search.py``): change
them on purpose only.
"""
from __future__ import annotations

import re
from autopar.grid import MeshAxis
from autopar.passes.analysis.batch_rows import Coupling, remedy_text
from autopar.planning.region_table import region_table, runs
from autopar.planning.declared import DECLARED, by_word, declarations, first, registered

PLACES = {"boundaries": 10, "branches": 20, "layers": 30, "pipeline": 40, "experts": 50, "kept whole": 60,
          "padded": 70, "batch rows": 80, "weighed": 90}
"""The sections after the region table, in this order: a family's (``Language.sections``:
a mixed plan's boundaries, D&SP's branches, the 3D or cube layers, the pipeline, the
experts, padded vocabularies) and the generic ones (the regions kept whole, where rows
of the batch meet, the configurations weighed)."""


def explain(plan: "Plan") -> str:
    """A readable table: mesh, predicted step, per-region strategy and costs (:meth:`Plan.explain`)."""
    mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.items())
    lines = [
        f"autopar plan: {plan.model} on {plan.world_size} rank(s), hardware {plan.hardware}"
        + (f" ({plan.hardware_source})" if plan.hardware_source.startswith(("default", "this machine")) else "")
        + ", "
        f"global batch {plan.global_batch}{' (forced)' if plan.forced else ''}",
        f"mesh: {mesh}   " + (first(d.rank_layout(plan) for d in declarations()) or _rank_layout(plan))
        + "".join(d.mesh_note(plan) for d in declarations()),
        f"predicted step {_ms(plan.step_s)}: compute {_ms(plan.total.compute_s)}, "
        + ", ".join(f"{k} comm {_ms(v)}" for k, v in sorted(plan.total.comm_s.items()))
        + (f", runtime per step {_ms(plan.step_overhead_s)}" if plan.step_overhead_s else "")
        + (f" (of the step, host overheads {_ms(plan.overhead_s)}: per kernel pass, collective call, pipeline "
           f"action and step)" if plan.overhead_s else "")
        + f"; memory per rank {_mb(plan.total.memory_bytes)}"
        + ("; activations recomputed in backward to fit" if plan.recompute else "")
        + (f"; the all-gather cache keeps at most {plan.gather_cache} 3D layers' gathered weights for the "
           f"recomputation (the rest gathered again, axonn §IV-D)" if plan.recompute and plan.gather_cache is not None
           else "")
        + ("; attention cores recomputed in backward (selective)" if plan.selective_recompute else "")
        + (first(d.lever_note(plan, "sequence_parallel") for d in declarations()) or "")
        + (f"; gradients accumulated over {plan.microbatches} microbatches of "
           f"{plan.global_batch // plan.batch_parts() // plan.microbatches} rows" if plan.microbatches > 1 else "")
        + (f"; ZeRO-{plan.zero} over the {'data x context' if plan.degree('context') > 1 else 'data'} ranks ("
           + {1: "optimizer state", 2: "optimizer state and gradients",
              3: "parameters, gradients and optimizer state"}[plan.zero] + " sharded"
           + ("; the gradients accumulate whole over the microbatches" if plan.zero == 2 and (
               plan.pipeline.get("microbatches", 1) if plan.pipeline else plan.microbatches) > 1 else "")
           + ")" if plan.zero else "")
        + (f"; context parallel: the sequence of {plan.context['seq']} tokens split over {plan.degree('context')} "
           f"ranks" + (" (chunks r and 2c-1-r)" if plan.context["balanced"] else " (contiguous chunks)")
           + f", attention by {plan.context.get('summary', plan.context['mode'])} (docs/context.md)"
           if plan.degree("context") > 1 else "")
        + ("; pointwise chains fused into generated kernels" if plan.fusion else ""),
        *([f"model: {plan.flops_per_step:.4g} FLOP per step -> {plan.flops_per_device():.4g} FLOP/s per device "
           f"predicted"] if plan.flops_per_step else []),
        *[line for d in declarations() for line in d.header_lines(plan)],
        *_declared(plan),
        "",
    ]
    lines += region_table(plan)
    sections = [(PLACES["kept whole"], _kept_whole(plan)), (PLACES["batch rows"], _batch_rows(plan)),
                (PLACES["weighed"], _weighed(plan))] + [s for d in DECLARED.values() for s in d.sections(plan)]
    for _, part in sorted(sections, key=lambda s: s[0]):
        lines += part
    return "\n".join(lines)


def _rank_layout(plan: "Plan") -> str:
    """How the ranks lie on the mesh where no family lays them out: ``rank`` over the
    pipeline, data, context and tensor axes it has, outermost first (Horner's form), and
    what a family adds after "tensor ranks adjacent" (the first that says)."""
    axes = ([MeshAxis.PIPELINE] if plan.pipeline else []) + [MeshAxis.DATA] \
        + ([MeshAxis.CONTEXT] if plan.degree(MeshAxis.CONTEXT) > 1 else []) + [MeshAxis.TENSOR]
    rank = axes[0]
    for axis in axes[1:]:
        rank = f"{f'({rank})' if ' + ' in rank else rank}*{plan.degree(axis)} + {axis}"
    return f"(rank = {rank}; tensor ranks adjacent{first(d.rank_note(plan) for d in declarations()) or ''})"


def grid_layout(plan: "Plan", title: str) -> str:
    """The rank layout of AxoNN's ``Gx × Gy × Gz × Gdata`` grid (a 3D or cube plan), named ``title``."""
    return (f"({title} Gx={plan.degree('x')} Gy={plan.degree('y')} Gz={plan.degree('z')} "
            f"Gdata={plan.degree('data')}; rank = ((data*Gz + z)*Gy + y)*Gx + x)")


def layer_lines(rows) -> list[str]:
    """The split linears of 3D or cube regions, each region's with its boundary."""
    lines = []
    for r in rows:
        lines.append(f"  {r.region}: " + "; ".join(f"{layer['linear']} {layer['orientation']}"
                                                  for layer in r.details.get("layers", [])))
        lines.append(f"    boundary: {r.details.get('boundary', '-')}")
    return lines


def mesh_text(mesh: dict) -> str:
    """A mesh as the configurations weighed show it: ``data=2 x tensor=2``."""
    return " x ".join(f"{k}={v}" for k, v in mesh.items())


def _declared(plan: "Plan") -> list[str]:
    """A registered family's plan: its name and options, and the lines it explains itself with."""
    if not plan.family:
        return []
    options = ", ".join(f"{k}={v!r}" for k, v in sorted(plan.family_options.items()))
    lines = [f"family: {plan.family} (registered)" + (f", options {options}" if options else "")]
    declared = DECLARED.get(plan.family)
    if declared is None:
        lines.append(f"  (the family {plan.family!r} is not registered in this process: register it before "
                     f"compiling with this plan)")
    elif declared.explain is not None:
        lines += [f"  {line}" for line in declared.explain(plan)]
    return lines


def _batch_rows(plan: "Plan") -> list[str]:
    """Where rows of the batch meet (docs/batch_rows.md) and what this plan does there."""
    if not plan.batch_couplings:
        return []
    split = plan.batch_parts() > 1
    lines = ["", f"rows of the batch meet at {len(plan.batch_couplings)} node(s) (docs/batch_rows.md); this plan "
             + (f"splits the batch over {plan.batch_parts()} data ranks:" if split else "keeps the batch whole:")]
    for data in plan.batch_couplings:
        c = Coupling.from_json(data)
        done = remedy_text(c) if split else "nothing to do: every rank sees the whole batch"
        lines.append(f"  {c.kind:<12} {c.describe()}")
        lines.append(f"  {'':<12} -> {done}" + (f" ({_bytes(c.nbytes)} per step)" if split and c.exact else ""))
    return lines


def _bytes(nbytes: float) -> str:
    """Bytes in KiB below 1 MiB, else MiB."""
    return f"{nbytes / 2**10:.1f} KiB" if nbytes < 2**20 else _mb(nbytes)


def _kept_whole(plan: "Plan") -> list[str]:
    """The regions a tensor or 3D plan left replicated, and why."""
    lines: list[str] = []
    kept_whole = [r for r in plan.regions if r.strategy == "replicate" and r.kind != "-"
                  and (plan.degree(MeshAxis.TENSOR) > 1 or plan.grid is not None)]
    if kept_whole:
        lines.append("")
        lines.append("regions not split over the tensor group:")
        for start, end, count, r in runs(kept_whole, key=lambda r: r.reason):
            lines.append(f"  {start if count == 1 else f'{start} .. {end} (x{count})'}: {r.reason}")
    return lines


def _weighed(plan: "Plan") -> list[str]:
    """The configurations weighed: all of them, or the best eight and the rejections counted."""
    lines: list[str] = []
    if len(plan.candidates) > LONG_CANDIDATE_LIST:
        lines.append("")
        lines.append(top(plan, 8))
        lines.append("rejected: " + rejections(plan.candidates))
    elif plan.candidates:
        lines.append("")
        lines.append("meshes weighed:")
        for c in plan.candidates:
            mesh_c = _mesh_text(c)
            mark = "*" if plan._same_layout(c) else " "
            if c.feasible:
                lines.append(f" {mark} {mesh_c}: step {_ms(c.step_s)}, memory {_mb(c.memory_bytes)}")
            else:
                lines.append(f" {mark} {mesh_c}: rejected: {c.reason}")
    return lines


def top(plan: "Plan", k: int = 5) -> str:
    """The ``k`` fastest feasible configurations weighed, with the predicted step and
    its communication split by group (``autopar plan --top K``)."""
    feasible = sorted((c for c in plan.candidates if c.feasible), key=lambda c: (c.step_s, _mesh_text(c)))
    groups = [g for g in (MeshAxis.TENSOR, MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.PIPELINE, MeshAxis.EXPERTS,
                          MeshAxis.DATA) if any(g in c.comm_s for c in feasible)]
    header = ("#", "configuration", "step", *(f"comm {g}" for g in groups), "memory")
    rows = [header]
    for i, c in enumerate(feasible[:k], 1):
        rows.append((str(i), _mesh_text(c), _ms(c.step_s), *(_ms(c.comm_s.get(g, 0.0)) for g in groups),
                     _mb(c.memory_bytes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"the {min(k, len(feasible))} best of {len(feasible)} feasible configuration(s) "
             f"({len(plan.candidates) - len(feasible)} rejected):"]
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def why_not_region(plan: "Plan", family: str, region: str) -> str:
    """Why region ``region`` does not run under ``family`` in this plan: its chosen
    strategy's predicted seconds against the family's, or why the family was not
    offered for it."""
    row = next((r for r in plan.regions if r.region == region), None)
    if row is None:
        raise ValueError(f"why_not: the plan has no region {region!r}; its regions are "
                         f"{', '.join(r.region for r in plan.regions if r.kind != '-')}")
    named = by_word(family)   # its regions' strategy, where the family splits regions
    strategy = named.region_strategies[0] if named is not None and named.region_strategies else family.lower()
    if strategy == row.strategy:
        return f"{region}: chosen: {strategy} ({row.reason})"
    if strategy not in row.alternatives:
        offered = ", ".join(sorted(row.alternatives)) or row.strategy
        return f"{region}: {family} not weighed for this region (weighed: {offered}); {row.reason}"
    mine, theirs = row.alternatives.get(row.strategy), row.alternatives[strategy]
    ratio = f" ({theirs / mine:.2f}x)" if mine else ""
    return (f"{region}: {family} lost: predicted {_ms(theirs)} against {_ms(mine)} for {row.strategy}{ratio}; "
            f"{row.reason}")


def why_not(plan: "Plan", family: str) -> str:
    """Why a family of strategies lost or was infeasible (``autopar plan --why-not``):
    a family that declares why it may be absent (``Language.absent``), by its name or an
    alias, or a registered family by its name. Names the binding constraint of an
    infeasible family (the most frequent reason, and the configuration closest to
    fitting), or, for one that lost, its best configuration against the chosen one,
    group by group."""
    if family not in DECLARED:   # a registered family's name as it registered it
        named = by_word(family)
        family = named.name if named is not None else family.lower()
    known = tuple(n for n, d in DECLARED.items() if d.absent is not None or not d.built_in)
    if family not in known:
        raise ValueError(f"why_not: unknown family {family!r}; choose one of {', '.join(known)}")
    mine = [c for c in plan.candidates if _family(c, plan.world_size) == family]
    chosen = plan._chosen_candidate()
    if not mine:
        return f"{family}: not weighed: " + (DECLARED[family].absent or "a strategy of another family was forced, "
                                                                        "or it offered no configuration here")
    feasible = sorted((c for c in mine if c.feasible), key=lambda c: (c.step_s, _mesh_text(c)))
    if chosen is not None and _family(chosen, plan.world_size) == family and feasible and \
            feasible[0].step_s >= chosen.step_s * (1 - 1e-9):
        return f"{family}: chosen: {_mesh_text(chosen)}, step {_ms(chosen.step_s)}"
    if not feasible:
        return f"{family}: infeasible: all {len(mine)} configuration(s) rejected: {rejections(mine)}" + \
            (f"; the closest to fitting: {_mesh_text(c)}: {c.reason}" if (c := closest_to_fitting(mine)) else "")
    best = feasible[0]
    lines = [f"{family}: lost: its best, {_mesh_text(best)}, is predicted at {_ms(best.step_s)} per step "
             f"against {_ms(plan.step_s)} for the plan ({best.step_s / plan.step_s:.2f}x)"]
    if chosen is not None:
        groups = sorted(set(best.comm_s) | set(chosen.comm_s))
        rows = [("", "step", "compute+other", *groups, "memory")]
        for label, c in (("plan", chosen), (family, best)):
            rows.append((label, _ms(c.step_s), _ms(c.step_s - sum(c.comm_s.values())),
                         *(_ms(c.comm_s.get(g, 0.0)) for g in groups), _mb(c.memory_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines.extend("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows)
        worse = {g: best.comm_s.get(g, 0.0) - chosen.comm_s.get(g, 0.0) for g in groups}
        worse["compute+other"] = (best.step_s - sum(best.comm_s.values())) - \
            (chosen.step_s - sum(chosen.comm_s.values()))
        g, by = max(sorted(worse.items()), key=lambda kv: kv[1])
        lines.append(f"  the most it loses: {g} (+{_ms(by)})")
    rejected = [c for c in mine if not c.feasible]
    if rejected:
        lines.append(f"  {len(rejected)} other {family} configuration(s) rejected: {rejections(rejected)}")
    return "\n".join(lines)



LONG_CANDIDATE_LIST = 40
"""Beyond this many configurations weighed, explain() shows the best few and counts the rest."""

def _family(c: MeshCandidate, world: int) -> str:
    """The family a configuration weighed is of: a registered family's form, else the
    first declaration (by precedence) that owns it."""
    if registered(c.form):
        return c.form
    return first(d.name if d.owns(c) else None for d in declarations())


def reason_kind(reason: str) -> str:
    """A rejection reason with its numbers taken out, to count rejections by kind."""
    if reason.startswith("needs "):
        return "memory"
    return re.sub(r"\d+", "N", re.split(r"[;.] ", reason)[0])[:100]


def rejections(candidates) -> str:
    """The infeasible candidates counted by :func:`reason_kind`, most frequent first."""
    kinds: dict[str, int] = {}
    for c in candidates:
        if not c.feasible:
            kind = reason_kind(c.reason)
            kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{k} ({n})" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def closest_to_fitting(candidates) -> "MeshCandidate | None":
    """The infeasible candidate needing the least memory (None when none was sized)."""
    sized = [c for c in candidates if not c.feasible and c.memory_bytes is not None]
    return min(sized, key=lambda c: (c.memory_bytes, _mesh_text(c)), default=None)


def _mesh_text(c: MeshCandidate) -> str:
    """A configuration weighed as the lists show it: its family's text (the first
    declaration that has one), else its mesh (with a registered family's name)."""
    text = first(d.candidate_text(c) for d in declarations())
    if text is not None:
        return text
    return mesh_text(c.mesh) + (f", {c.form}" if registered(c.form) else "")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _mb(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"

