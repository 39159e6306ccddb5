"""Where a plan's predicted step and memory go: the rows that close its region table
(:meth:`autopar.planning.plan.Plan.explain`, the report's page), read from the plan's
fields alone.

The cost model composes every plan's step as ``step_s = total.compute_s +
sum(total.comm_s) + step_overhead_s``, the totals being one rank's per step: without a
pipeline every rank's (they run the same program on their part), with one the slowest
pipeline rank's (its time per microbatch sets the step, megatron §2.2).
:func:`step_reconciliation` splits that sum into the region rows on that rank and the
named terms the rows do not hold: the nodes outside regions, recomputation, the
pipeline's point-to-point sends, bubble and its stages' rest, the data group's gradient
sync, the per-step exchanges over the batch group, the runtime's fixed cost.
:func:`memory_reconciliation` splits the rank's predicted memory into parameters,
gradients, optimizer state and activations (:attr:`Plan.breakdown`,
:mod:`autopar.driver.breakdown`). Each ends with what no term holds
(:attr:`Reconciliation.unattributed`), 0 where the terms follow the cost model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autopar.grid import MeshAxis

OUTSIDE = "(outside regions)"


@dataclass
class Term:
    """One part of a reconciliation: ``key`` names it for programs (``"regions.compute"``,
    ``"comm.data"``, ``"pipeline.bubble"``...), ``label`` for readers; ``value`` in
    seconds or bytes."""

    key: str
    label: str
    value: float


@dataclass
class Reconciliation:
    """The parts of ``total`` (the plan's step in seconds, or its memory per rank in
    bytes) on the rank ``where`` says."""

    where: str
    total: float
    terms: list[Term] = field(default_factory=list)

    @property
    def unattributed(self) -> float:
        """``total`` less the terms: what the terms miss (0 up to float rounding)."""
        return self.total - sum(t.value for t in self.terms)

    def add(self, key: str, label: str, value: float, always: bool = False) -> None:
        """Add a term, unless it is 0 (to float rounding of the total) and not ``always``."""
        if always or abs(value) > 1e-9 * abs(self.total):
            self.terms.append(Term(key, label, value))


def slow_rank(plan) -> int | None:
    """The pipeline rank whose time per microbatch sets the step (None without a pipeline)."""
    if not plan.pipeline:
        return None
    rank_s = plan.pipeline["rank_s"]
    return max(range(len(rank_s)), key=rank_s.__getitem__)


def stage_ranks(plan) -> list[int]:
    pp = plan.pipeline
    return pp.get("stage_ranks") or [s % pp["stages"] for s in range(pp["stages"] * pp["chunks"])]


def on_rank(plan, choice, rank: int | None) -> str:
    """Whether region row ``choice`` runs on pipeline rank ``rank``: ``"all"`` (no
    pipeline, or its stage is the rank's), ``"shared"`` (a region several stages compute,
    one of them the rank's: a tied vocabulary), ``""`` (another rank's)."""
    if rank is None:
        return "all"
    where, ranks = choice.details.get("stage"), stage_ranks(plan)
    if isinstance(where, int):
        return "all" if ranks[where] == rank else ""
    if isinstance(where, list):
        mine = [ranks[s] == rank for s in where]
        return "all" if all(mine) else "shared" if any(mine) else ""
    return ""


def _kinds(rows) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def step_reconciliation(plan) -> Reconciliation:
    """The predicted step as the sum of the region rows on the rank and named terms
    (module docstring)."""
    rank = slow_rank(plan)
    if rank is None:
        where = "every rank"
    else:
        mine = [s for s, r in enumerate(stage_ranks(plan)) if r == rank]
        where = (f"pipeline rank {rank} (stage{'s' if len(mine) > 1 else ''} "
                 f"{', '.join(map(str, mine))}; the slowest pipeline rank, whose time per microbatch sets the step)")
    rec = Reconciliation(where, plan.step_s)
    rows = [r for r in plan.regions if r.region != OUTSIDE and on_rank(plan, r, rank) == "all"]
    shared = [r for r in plan.regions if r.region != OUTSIDE and on_rank(plan, r, rank) == "shared"]
    outside = next((r for r in plan.regions if r.region == OUTSIDE), None)
    groups = sorted({*plan.total.comm_s, *(g for r in rows for g in r.cost.comm_s)})  # JSON sorts them too
    row_comm = {g: sum(r.cost.comm_s.get(g, 0.0) for r in rows) for g in groups}
    row_compute = sum(r.cost.compute_s for r in rows)
    scope = ("regions (the rows above, a folded row N times)" if rank is None else
             f"regions on its stages ({_kinds(rows)} of the rows above)")
    rec.add("regions.compute", f"{scope}: compute", row_compute, always=True)
    for g in groups:
        rec.add(f"regions.comm.{g}", f"{scope}: communication over {g}", row_comm[g])
    if rank is None:
        _rest_without_pipeline(plan, rec, outside, row_compute, row_comm)
    else:
        _rest_of_pipeline(plan, rec, rank, shared, row_compute, row_comm)
    rec.add("runtime", "the runtime's fixed cost per step", plan.step_overhead_s)
    return rec


def _rest_without_pipeline(plan, rec: Reconciliation, outside, row_compute: float, row_comm: dict) -> None:
    """The terms beside the rows of a plan without a pipeline."""
    outside_s = outside.cost.compute_s if outside is not None else 0.0
    rec.add("outside.compute", "nodes outside regions: compute", outside_s, always=outside is not None)
    why = []
    if plan.recompute:
        why.append("recomputation: the blocks' forward run again in backward")
    if plan.selective_recompute:
        why.append("selective recomputation: the attention cores' forward run again in backward")
    if plan.mixed and plan.tensor_grid:
        why.append("less the work saved where 3D regions meet")
    rec.add("compute.rest", "; ".join(why) or "compute in no region row",
            plan.total.compute_s - row_compute - outside_s)
    for g, total in sorted(plan.total.comm_s.items(), key=lambda kv: (kv[0] in ("data", "context"), kv[0])):
        rest = total - row_comm.get(g, 0.0)
        if g in ("data", "context"):
            _data_terms(plan, rec, g, rest)
            continue
        why = []
        if plan.recompute:
            why.append(f"recomputation: the forward's collectives over {g} again")
        if plan.mixed and plan.tensor_grid:
            why.append("less the conversions saved where 3D regions meet")
        rec.add(f"comm.{g}", "; ".join(why) or f"communication over {g} in no region row", rest)


def _rest_of_pipeline(plan, rec: Reconciliation, rank: int, shared, row_compute: float, row_comm: dict) -> None:
    """The terms beside the rows of a pipeline plan's slowest rank: the rest of its
    stages' figures, the zero-bubble weight passes' extra, the sends, the bubble, the
    data group."""
    pp = plan.pipeline
    m = pp["microbatches"]
    stages = sum(s for s, r in zip(pp["stage_s"], stage_ranks(plan)) if r == rank)  # per microbatch, comm included
    bubble = pp["bubble_s"]
    sends = plan.total.comm_s.get(MeshAxis.PIPELINE, 0.0) - bubble
    extra = pp["rank_s"][rank] * m - stages * m - sends  # the weight passes' own work (ZB schedules)
    # the stage figures' compute and tensor part on the rank, beyond its region rows
    names = ", ".join(r.region for r in shared)
    rest = plan.total.compute_s - extra - row_compute
    rec.add("stages.rest.compute", "the rest of its stages: nodes outside regions, "
            + (f"its part of {names}, " if names else "") + "the executor's per-pass actions: compute"
            + (" (below the rows: the stages priced with the host's cores their waiting stages leave)"
               if rest < 0 else ""), rest, always=True)
    # the stages' figures price every collective inside a stage (tensor, 3D axes, D&SP
    # groups) as one, the experts family adds its all-to-alls apart
    inner = [g for g in row_comm if g not in ("pipeline", "data", "context", "experts")]
    inside = sum(v for g, v in plan.total.comm_s.items() if g not in ("pipeline", "data", "context", "experts"))
    rec.add("stages.rest.comm", f"the rest of its stages: communication inside them"
            + (f" ({names}'s part)" if names else ""), inside - sum(row_comm[g] for g in inner))
    if "experts" in plan.total.comm_s:
        rec.add("stages.rest.comm.experts", "expert all-to-alls beyond the rows on this rank (over a pipeline "
                "the experts family prices every layer's as exposed for (m + p - 1)/(m*p) of the step)",
                plan.total.comm_s["experts"] - row_comm.get("experts", 0.0))
    rec.add("pipeline.weight_passes", "zero-bubble weight passes beyond the stage figures (the blocks' forward again "
            "per weight group when recomputing, one autograd call per group)", extra)
    rec.add("pipeline.sends", "point-to-point sends to and from the neighbouring stages", sends)
    rec.add("pipeline.bubble", f"pipeline bubble ({pp.get('bubble_rule', '(p-1)/(v*m)')})", bubble, always=True)
    for g in ("data", "context"):
        if g in plan.total.comm_s:
            _data_terms(plan, rec, g, plan.total.comm_s[g] - row_comm.get(g, 0.0))


def _data_terms(plan, rec: Reconciliation, group: str, rest: float) -> None:
    """The data (or context) group's communication beyond the rows: the gradients' sync
    (ZeRO's exchanges), a pipeline's tied weights, the batch group's per-step terms."""
    if group == "context":
        rec.add("comm.context", "keys and values exchanged over the context ranks, exposed", rest)
        return
    b = plan.breakdown or {}
    batch, tied = b.get("batch_s", 0.0), b.get("tied_s", 0.0)
    ranks = "data x context" if plan.degree(MeshAxis.CONTEXT) > 1 else "data"
    zero = ("" if not plan.zero else
            f"; ZeRO-{plan.zero}: the gradients reduce-scattered, the updated shards all-gathered" if plan.zero < 3 else
            "; ZeRO-3: the parameters all-gathered in forward and backward, the gradients reduce-scattered, per "
            "microbatch")
    when = "after the last microbatch" if plan.pipeline else "exposed after overlapping the backward"
    rec.add("comm.data", f"gradient sync over the {ranks} ranks, {when}{zero}", rest - batch - tied)
    rec.add("comm.data.tied", "tied weights' gradients summed over their stages' ranks", tied)
    what = [w for w, on in (("the loss's targets counted", b.get("counts_targets", True)),
                            ("the remedies where rows of the batch meet (docs/batch_rows.md)", plan.batch_couplings))
            if on]
    rec.add("comm.data.batch", f"{' and '.join(what) or 'per-step exchanges'} over the ranks splitting the batch",
            batch)


MEMORY_LABELS = {
    "parameters": "parameters (fp32, 4 B each)",
    "gathered": "ZeRO-3: the two largest units (layers) gathered whole",
    "gradients": "gradients (4 B each)",
    "optimizer": "optimizer state (AdamW's two moments, 8 B each)",
    "activations": "activations saved for backward",
    "gathered_weights": "3D layers' all-gathered weights kept for backward",
    "experts_spread": "experts spread over their group: the state of those not held",
}


def memory_reconciliation(plan) -> Reconciliation | None:
    """The rank's predicted memory by part (:attr:`Plan.breakdown`); None for a plan
    made before the parts were recorded."""
    b = plan.breakdown or {}
    if "memory" not in b:
        return None
    rank = b.get("memory_rank")
    where = "every rank" if rank is None else f"pipeline rank {rank} (the most of any pipeline rank)"
    rec = Reconciliation(where, plan.total.memory_bytes)
    d = plan.degree(MeshAxis.DATA) * plan.degree(MeshAxis.CONTEXT)
    shard = {"parameters": 3, "gradients": 2, "optimizer": 1}
    parts = b["memory"]  # in MEMORY_LABELS' order (JSON sorts the keys), then any other
    for key in [*(k for k in MEMORY_LABELS if k in parts), *sorted(set(parts) - set(MEMORY_LABELS))]:
        value, label = parts[key], MEMORY_LABELS.get(key, key)
        if key == "parameters":
            label = f"parameters: {b.get('param_elems', 0.0):.4g} elements on the rank, fp32 (4 B each)"
        if key in shard and plan.zero >= shard[key] and d > 1 and (key != "gradients" or _grads_sharded(plan)):
            label += f", 1/{d} of them (ZeRO-{plan.zero})"
        if key == "activations":
            label += _activations_note(plan, rank)
        rec.add(f"memory.{key}", label, value, always=key in ("parameters", "gradients", "optimizer", "activations"))
    return rec


def _grads_sharded(plan) -> bool:
    m = plan.pipeline["microbatches"] if plan.pipeline else plan.microbatches
    return plan.zero >= 3 or m == 1


def _activations_note(plan, rank: int | None) -> str:
    if rank is not None:
        flight = plan.pipeline["in_flight"][rank]
        return (f" ({sum(flight)} {'microbatch' if plan.pipeline['chunks'] == 1 else 'chunk-microbatch'}(es) in "
                f"flight"
                + ("; recomputing: each one's stage inputs, one block's activations" if plan.recompute else "")
                + "; the rank's memory less its state)")
    m = plan.microbatches
    rows = plan.global_batch // max(plan.batch_parts(), 1) // m
    return (f" ({'one microbatch' if m > 1 else 'the batch'} of {rows} row(s)"
            + ("; recomputing: the blocks' inputs, one block's activations" if plan.recompute else "")
            + ("; the attention cores' dropped (selective recomputation)" if plan.selective_recompute else "") + ")")
