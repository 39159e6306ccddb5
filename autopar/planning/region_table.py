"""The region table of :meth:`autopar.planning.plan.Plan.explain`: one row per region
(identical repeated blocks folded), what its figures are per, and the rows that close
it: the predicted step and the rank's memory as sums of named terms
(:mod:`autopar.planning.totals`). The text is golden (``tests/golden/test_golden_*.py``)."""
from __future__ import annotations

from autopar.planning.totals import OUTSIDE, Reconciliation, memory_reconciliation, stage_ranks, step_reconciliation


def runs(regions, key=None):
    """The rows of a region table, consecutive regions that read the same (identical
    repeated blocks) folded into one: ``(first id, last id, count, representative)``."""
    key = key or (lambda r: (r.kind, r.strategy, round(r.cost.compute_s, 12),
                             tuple(sorted((k, round(v, 12)) for k, v in r.cost.comm_s.items())),
                             round(r.cost.memory_bytes, 3),
                             tuple(sorted((k, round(v, 12)) for k, v in r.alternatives.items())), r.reason))
    found: list[list] = []
    for r in regions:
        if found and key(found[-1][0]) == key(r) and r.kind != "-":
            found[-1].append(r)
        else:
            found.append([r])
    out = []
    for run in found:  # two rows read as easily as one; three and more are folded
        if len(run) >= 3:
            out.append((run[0].region, run[-1].region, len(run), run[0]))
        else:
            out.extend((r.region, r.region, 1, r) for r in run)
    return out


def ms_figure(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def mib_figure(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f}"


def _stage(plan, first, last) -> str:
    """The stage column of a row: its stage and pipeline rank, a tied region's stages, a
    folded run's first to last, every stage for the nodes outside regions."""
    if first.region == OUTSIDE:
        return "all"
    ranks = stage_ranks(plan)
    a, b = first.details.get("stage"), last.details.get("stage")
    if isinstance(a, list):
        return ", ".join(f"{s} (rank {ranks[s]})" for s in a)
    if a is None:
        return "-"
    if a == b or not isinstance(b, int):
        return f"{a} (rank {ranks[a]})"
    spread = {ranks[s] for s in range(a, b + 1)}
    return f"{a}..{b} (ranks {min(spread)}..{max(spread)})"


def region_table(plan) -> list[str]:
    """One row per region, its units and what it is per said above it, then the step
    and the memory as sums (:func:`reconciliation_lines`)."""
    if plan.grid is not None:
        groups = ["x", "y", "z", "data"]
    else:
        groups = ["tensor", "data"] + sorted({k for r in plan.regions for k in r.cost.comm_s} - {"tensor", "data"})
    overhead = plan.overhead_s > 0  # the column of the host's part of compute + comm
    staged = bool(plan.pipeline)
    header = ("region", "kind", "strategy", *(("stage",) if staged else ()), "compute ms",
              *(f"comm {g} ms" for g in groups), *(("of which host ms",) if overhead else ()), "memory MiB",
              "alternatives ms")
    rows = [header]
    by_name = {r.region: r for r in plan.regions}
    for first, last, count, r in runs(plan.regions):
        alts = ", ".join(f"{k} {ms_figure(v)}" for k, v in sorted(r.alternatives.items()) if k != r.strategy)
        name = r.region if count == 1 else f"{first} .. {last} (x{count}, each)"
        rows.append((name, r.kind, r.strategy, *((_stage(plan, r, by_name[last]),) if staged else ()),
                     ms_figure(r.cost.compute_s), *(ms_figure(r.cost.comm_s.get(g, 0.0)) for g in groups),
                     *((ms_figure(r.cost.overhead_s),) if overhead else ()), mib_figure(r.cost.memory_bytes),
                     alts or "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = preamble(plan)
    for i, row in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines + reconciliation_lines(plan)


def preamble(plan, folded: bool = True) -> list[str]:
    """What the table's figures are per, and their units (``folded``: the table folds
    identical repeated blocks into one row)."""
    m = plan.pipeline["microbatches"] if plan.pipeline else plan.microbatches
    rows = plan.pipeline["microbatch_size"] if plan.pipeline else plan.global_batch // max(plan.batch_parts(), 1) // m
    steps = f"per step ({m} microbatches)" if m > 1 else "per step"
    where = ("on each rank of the stage that runs the region (stage: its pipeline stage and rank; the nodes "
             "outside regions: every stage's together)" if plan.pipeline else "on every rank")
    return [f"regions: compute, communication and the alternatives weighed in ms {steps}, {where}"
            + ("; a folded row \"first .. last (xN, each)\" gives one of its N identical blocks" if folded else ""),
            f"memory in MiB: the region's parameters on the rank at 16 B each (fp32 weight and gradient, AdamW's two "
            f"moments; before ZeRO) and the activations one microbatch of {rows} row(s) saves in it for backward "
            f"(before recomputation); the rank's memory by part {'closes the table' if folded else 'is below'}"]


def reconciliation_lines(plan) -> list[str]:
    """The predicted step and the rank's memory as sums of the terms of
    :func:`~autopar.planning.totals.step_reconciliation` and
    :func:`~autopar.planning.totals.memory_reconciliation`."""
    step = step_reconciliation(plan)
    lines = ["", f"the step on {step.where}, ms per step:"]
    lines += _sum_lines(step, "predicted step", ms_figure)
    memory = memory_reconciliation(plan)
    if memory is None:
        return lines + [f"memory per rank {mib_figure(plan.total.memory_bytes)} MiB (its parts are not in this plan: "
                        f"it was made before they were recorded; plan again to see them)"]
    lines.append(f"memory on {memory.where}, MiB:")
    return lines + _sum_lines(memory, "predicted memory per rank", mib_figure)


def _sum_lines(rec: Reconciliation, total: str, fmt) -> list[str]:
    """The terms, one a line, figure first, then what no term holds (where it shows at
    the figures' precision) and the total."""
    terms = [("", fmt(t.value), t.label) for t in rec.terms]
    rest = rec.unattributed
    if abs(rest) > 1e-9 * abs(rec.total) and fmt(rest).lstrip("-") != fmt(0.0):
        terms.append(("", fmt(rest), "not attributed to a term above"))
    terms.append(("=", fmt(rec.total), total))
    figure = max(len(value) for _, value, _ in terms)
    return [f"  {mark:1} {value.rjust(figure)}  {label}" for mark, value, label in terms]
