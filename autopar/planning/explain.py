"""The plan's explanations: :meth:`Plan.explain`'s table, :meth:`Plan.top`,
:meth:`Plan.why_not` and the pipeline's part of the table.

Plain functions of a :class:`autopar.planning.plan.Plan` (they read its fields and
nothing else), kept apart from the data structure so that each stays short. The texts
are golden (``tests/planning/test_plan.py``, ``tests/planning/test_planner_search.py``): change them on
purpose only.
"""
from __future__ import annotations

import re
from autopar.passes.analysis.batch_rows import Coupling, remedy_text
from autopar.planning.region_table import region_table, runs
from autopar.planning.declared import DECLARED, registered


def explain(plan: "Plan") -> str:
    """A readable table: mesh, predicted step, per-region strategy and costs (:meth:`Plan.explain`)."""
    mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.items())
    lines = [
        f"autopar plan: {plan.model} on {plan.world_size} rank(s), hardware {plan.hardware}"
        + (f" ({plan.hardware_source})" if plan.hardware_source.startswith(("default", "this machine")) else "")
        + ", "
        f"global batch {plan.global_batch}{' (forced)' if plan.forced else ''}",
        f"mesh: {mesh}   " + (f"({'Bian cube' if plan.form == 'cube' else '3D grid'} Gx={plan.degree('x')} "
                                f"Gy={plan.degree('y')} Gz={plan.degree('z')} "
                                f"Gdata={plan.degree('data')}; rank = ((data*Gz + z)*Gy + y)*Gx + x)"
                                if plan.grid is not None else
                                f"(rank = ({'(pipeline*%d + data)' % plan.degree('data') if plan.pipeline else 'data'}"
                                f"*{plan.degree('context')} + context)*{plan.degree('tensor')} + tensor; tensor "
                                f"ranks adjacent, then context)" if plan.degree("context") > 1 else
                                f"(rank = (pipeline*{plan.degree('data')} + data)*{plan.degree('tensor')} + "
                                f"tensor; tensor ranks adjacent, pipeline outermost)" if plan.pipeline else
                                f"(rank = data*{plan.degree('tensor')} + tensor; tensor ranks adjacent)")
        + ("; replicated: the tensor group splits nothing, each of its ranks computes its data rank's whole "
           "batch" + ("; no configuration that splits the work is feasible (meshes weighed, below)"
                      if not any(c.feasible for c in plan.candidates if c.form != "replicate") else "")
           if plan.form == "replicate" else "")
        + ("; mixed: each region its own family over the tensor group"
           + ((f", 3D regions on it as Gx={plan.tensor_grid['x']} x Gy={plan.tensor_grid['y']} "
               f"(tensor = y*Gx + x)" if plan.tensor_grid.get("z", 1) == 1 else
               f", 3D regions on it as Gx={plan.tensor_grid['x']} x Gy={plan.tensor_grid['y']} x "
               f"Gz={plan.tensor_grid['z']}, their rows split over z (tensor = (z*Gy + y)*Gx + x)")
              if plan.tensor_grid else "")
           + (f", D&SP over {plan.tensor_subgrids} sub-grids of it, their branches Megatron-split inside one "
              f"(tensor = sub-grid*{plan.degree('tensor') // plan.tensor_subgrids} + place)"
              if plan.tensor_subgrids else "") if plan.mixed else "")
        + (f"; {'D&SP-cSub' if plan.csub else 'D&SP'}: {plan.subgrids} sub-grids of "
           f"{plan.world_size // plan.subgrids} rank(s), {'topology-aware' if plan.topology_aware else 'naive'} "
           f"order" + (", common layers on sub-grid 0" if plan.csub else "") if plan.subgrids > 1 else ""),
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
        + ("; sequence parallel: between the Megatron regions (norms, residual adds, dropout) each tensor rank "
           "holds 1/t of the tokens" if plan.sequence_parallel else "")
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
        *_single_family(plan),
        *_declared(plan),
        "",
    ]
    lines += region_table(plan)
    lines += _boundaries(plan)
    lines += _layouts(plan)
    lines += _experts(plan)
    lines += _kept_whole(plan)
    lines += _padded(plan)
    lines += _batch_rows(plan)
    lines += _weighed(plan)
    return "\n".join(lines)


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


def _experts(plan: "Plan") -> list[str]:
    """Expert parallelism's part (docs/experts.md): the expert groups, and per MoE region
    its placement, the rows per rank the planner assumed (uniform routing) and the last
    measured ones (``ParallelModule.expert_load``), its all-to-all volume and seconds."""
    rows = [r for r in plan.regions if r.kind == "experts"]
    if plan.experts <= 1 or not rows:
        return []
    e, d = plan.experts, plan.degree("data")
    groups = [list(range(g * e, (g + 1) * e)) for g in range(d // e)]
    lines = ["", f"expert parallelism: expert groups of {e} consecutive data ranks (data indices {groups}); each "
                 f"MoE layer's experts spread over a group, tokens dispatched and combined by all-to-all (dropless), "
                 f"expert gradients reduced over the {d // e} rank(s) holding the same experts"
                 + ("; experts Megatron-split over the tensor group inside" if plan.degree("tensor") > 1 else "")]
    for r in rows:
        x = r.details
        if r.strategy != "experts":
            lines.append(f"  {r.region}: {x['experts']} experts, top-{x['top_k']}: not expert-parallel ({r.reason})")
            continue
        placement = ", ".join(f"place {i}: experts {a}..{b - 1}" for i, (a, b) in enumerate(x["placement"]))
        measured = x.get("measured_tokens_per_rank")
        lines.append(f"  {r.region}: {x['experts']} experts, top-{x['top_k']}, {x['experts_per_rank']} per rank "
                     f"({placement}); rows per rank and step predicted {x['tokens_per_rank']:.0f} (uniform routing)"
                     + (f", measured {measured} (last step, the expert group's ranks)" if measured else "")
                     + f"; all-to-all of {_bytes(x['all_to_all_bytes'])} per rank, 4 per step: "
                     f"{_ms(x['all_to_all_s'])}")
    return lines


def _bytes(nbytes: float) -> str:
    """Bytes in KiB below 1 MiB, else MiB."""
    return f"{nbytes / 2**10:.1f} KiB" if nbytes < 2**20 else _mb(nbytes)


def _padded(plan: "Plan") -> list[str]:
    """The split vocabularies the tensor degree does not divide, and their padding."""
    padded = [r for r in plan.regions if r.details.get("padded_vocab")]
    if not padded:
        return []
    lines = ["", "padded vocabularies (as Megatron-LM's --make-vocab-size-divisible-by: the last ranks' rows past "
             "the vocabulary are zero padding, their logits left out of the softmax and the loss):"]
    for r in padded:
        d = r.details
        lines.append(f"  {r.region}: vocab {d['vocab']} padded to {d['padded_vocab']} ({d['rows_per_rank']} rows "
                     f"per rank)")
    return lines


def _single_family(plan: "Plan") -> list[str]:
    """Beside a mixed plan, the best plan of one family weighed (what mixing buys)."""
    if not plan.mixed:
        return []
    single = [c for c in plan.candidates if c.feasible and "mixed" not in c.form]
    if not single:
        return ["best single-family plan: none weighed (the mixed plan was forced)" if plan.forced else
                "best single-family plan: none feasible"]
    best = min(single, key=lambda c: (c.step_s, _mesh_text(c)))
    return [f"best single-family plan: {_mesh_text(best)} ({_family(best, plan.world_size)}), step "
            f"{_ms(best.step_s)}: {best.step_s / plan.step_s:.2f}x the mixed plan's"]


def _boundaries(plan: "Plan") -> list[str]:
    """In a mixed plan, each split region's conversions from and to the layout regions
    meet at (the activation replicated over the tensor group), with their cost (the
    row's communication; docs/mixed_plans.md has each conversion's formula)."""
    if not plan.mixed:
        return []
    lines = ["", "boundaries (the conversions from and to the activation replicated over the tensor group; "
             "the region's communication per step):"]
    for first, last, count, r in runs([r for r in plan.regions if r.strategy in ("megatron", "dsp", "tensor3d")
                                        and r.cost.comm_s]):
        where = first if count == 1 else f"{first} .. {last} (x{count}, each)"
        comm = ", ".join(f"{g} {_ms(v)}" for g, v in sorted(r.cost.comm_s.items()) if v)
        if r.strategy == "megatron":
            group = r.details.get("group", "tensor")
            text = (f"entry f (identity; backward all-reduce over {group}), exit g (all-reduce over {group}; "
                    f"backward identity)")
        elif r.strategy == "dsp":
            group = "tensor_seg" if plan.tensor_subgrids else "tensor"
            join = (f"all-reduce over {group}; backward identity" if r.details.get("join") == "sum" else
                    f"all-gather of the branches' columns over {group}; backward the own columns")
            text = f"fork (identity; backward all-reduce over {group}), join ({join})"
        else:
            text = r.details.get("boundary", "")
        lines.append(f"  {where}: {text}: {comm or 'none'}")
    return lines if len(lines) > 2 else []


def _layouts(plan: "Plan") -> list[str]:
    """What the split regions do: D&SP's branches on sub-grids, the 3D or cube layers
    and their boundaries, the pipeline's stages."""
    lines: list[str] = []
    split_branches = [r for r in plan.regions if r.strategy == "dsp"]
    if split_branches:
        lines.append("")
        lines.append("branches on sub-grids:")
        lines.extend(f"  {r.region}: {r.reason}" for r in split_branches)
    layered = [r for r in plan.regions if r.strategy in ("tensor3d", "cube3d")]
    if layered:
        lines.append("")
        if plan.regions_with("cube3d"):
            lines.append("cube layers (Bian et al.; orientation by data flow; Algorithms 1/3: all-gather A's rows "
                         "over the out axis and W over z, reduce-scatter the output's rows over the in axis; "
                         "backward (2/4): all-gather dC over the in axis, reduce-scatter dA over the out axis "
                         "and dW over z; biases on the diagonal ranks, Algorithms 7-8):")
        else:
            lines.append("3D layers (orientation by data flow; Algorithm 1: all-gather W over z, all-reduce the "
                         "output over the in axis; backward: all-reduce dI over the out axis, reduce-scatter dW "
                         "over z):")
        for r in layered:
            lines.append(f"  {r.region}: " + "; ".join(f"{layer['linear']} {layer['orientation']}"
                                                      for layer in r.details.get("layers", [])))
            lines.append(f"    boundary: {r.details.get('boundary', '-')}")
    if plan.pipeline:
        lines.append("")
        lines.extend(plan.pipeline_text())
    return lines


def _kept_whole(plan: "Plan") -> list[str]:
    """The regions a tensor or 3D plan left replicated, and why."""
    lines: list[str] = []
    kept_whole = [r for r in plan.regions if r.strategy == "replicate" and r.kind != "-"
                  and (plan.degree("tensor") > 1 or plan.grid is not None)]
    if kept_whole:
        lines.append("")
        lines.append("regions not split over the tensor group:")
        for first, last, count, r in runs(kept_whole, key=lambda r: r.reason):
            lines.append(f"  {first if count == 1 else f'{first} .. {last} (x{count})'}: {r.reason}")
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
    groups = [g for g in ("tensor", "x", "y", "z", "pipeline", "experts", "data")
              if any(g in c.comm_s for c in feasible)]
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
    strategy = {"3d": "tensor3d", "tensor": "megatron", "cube": "cube3d", "d&sp": "dsp"}.get(family.lower(),
                                                                                          family.lower())
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
    ``data``, ``megatron`` (or ``tensor``), ``dsp``, ``3d``, ``cube`` or ``pipeline``.
    Names the binding constraint of an infeasible family (the most frequent reason,
    and the configuration closest to fitting), or, for one that lost, its best
    configuration against the chosen one, group by group."""
    if family not in DECLARED:   # a registered family's name as it registered it
        family = {"tensor": "megatron", "axonn": "3d", "ptd-p": "pipeline", "d&sp": "dsp"}.get(family.lower(),
                                                                                            family.lower())
    known = FAMILIES + tuple(n for n in DECLARED if registered(n))
    if family not in known:
        raise ValueError(f"why_not: unknown family {family!r}; choose one of {', '.join(known)}")
    mine = [c for c in plan.candidates if _family(c, plan.world_size) == family]
    chosen = plan._chosen_candidate()
    if not mine:
        return f"{family}: not weighed: " + FAMILY_ABSENT.get(family, "a strategy of another family was forced, "
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

FAMILIES = ("data", "megatron", "dsp", "3d", "cube", "pipeline", "mixed", "experts", "context")
FAMILY_ABSENT = {
    "data": "the batch is the only thing to split; it is always weighed unless a strategy was forced",
    "megatron": "a strategy was forced, or the world has one rank",
    "dsp": "the model has no multi-branch region (fork/join branches or attention heads), or a strategy was forced",
    "3d": "the model has no linear chain or attention region, or a strategy was forced",
    "cube": "a strategy was forced",
    "pipeline": "the model has no repeated blocks to cut between stages, or a strategy was forced",
    "mixed": "no multi-branch region as wide as a tensor group and no 3D grid of one, or a strategy was forced",
    "experts": "the model has no routed mixture-of-experts layer, no data degree above 1 that an expert count "
               "shares a divisor with, or a strategy without 'experts' was forced",
    "context": "the model has no scaled_dot_product_attention to run as a ring, no data degree above 1 that "
               "divides the sequence, or a strategy without 'context' was forced",
}


def _family(c: MeshCandidate, world: int) -> str:
    if registered(c.form):
        return c.form
    if c.mesh.get("context", 1) > 1:
        return "context"
    if "experts" in c.form:
        return "experts"
    if c.form.startswith("mixed"):
        return "mixed"
    if c.form.startswith("pipeline"):
        return "pipeline"
    if c.form == "cube":
        return "cube"
    if "x" in c.mesh:
        return "3d"
    if c.subgrids > 1:
        return "dsp"
    return "megatron" if c.mesh.get("tensor", 1) > 1 else "data"


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
    if c.form == "cube":
        if "x" not in c.mesh:
            return "3D cube (Bian)"
        return f"3D cube (Bian) p={c.mesh['x']} data={c.mesh['data']}"
    if "x" in c.mesh:
        text = f"3D x={c.mesh['x']} y={c.mesh['y']} z={c.mesh['z']} data={c.mesh['data']}"
    else:
        text = " x ".join(f"{k}={v}" for k, v in c.mesh.items())
    if c.form.startswith("pipeline"):
        text += f", {c.form}" + (f", {c.reason}" if c.feasible and c.reason else "")
    if c.form.startswith("mixed") or c.form.startswith("experts"):
        text += f", {c.form}"
    if c.form == "replicate":
        text += ", replicated (every rank the whole batch)"
    if registered(c.form):
        text += f", {c.form}"
    if c.subgrids > 1:
        text += (f", {'D&SP-cSub' if c.csub else 'D&SP'} {c.subgrids} sub-grids "
                 f"({'topology-aware' if c.topology_aware else 'naive'})")
    return text


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _mb(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"

