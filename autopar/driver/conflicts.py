"""Whether a priced configuration would equal the single device: where rows of the batch
meet (:func:`batch_conflict`, docs/batch_rows.md) and where random ops draw
(:func:`random_conflict`, docs/random_draws.md). The search refuses a
configuration either names, and raises it as a ``PlanError`` where it was forced."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.ir import LOSS_TERMS, RANDOM_SITES
from autopar.passes.analysis.batch_rows import split_conflict
from autopar.passes.analysis.batch_rows.loss_terms import BATCH_CONSTANT
from autopar.planning.declared import DECLARED, region_owner
from autopar.strategies.family import PlanContext, Priced


def split_regions() -> set[str]:
    """The region strategies whose rewrites move a value's rows or parts where the random
    draws cannot follow them (a family's ``draws_follow``: D&SP's branches on other rows,
    the 3D grid's rows over z and columns in blocks, the experts' dispatched tokens)."""
    return {s for d in DECLARED.values() if not d.draws_follow for s in d.region_strategies}


def _followed() -> str:
    """How the random-draw refusal names what a region can run as instead (the families
    whose draws follow their split, by precedence from the least)."""
    return " or ".join(d.runs_as for d in sorted(DECLARED.values(), key=lambda d: d.precedence)
                       if d.draws_follow and d.runs_as)


def batch_conflict(ctx: PlanContext, priced: Priced) -> str | None:
    """Why a configuration's split of the batch would not equal the single device where
    rows of the batch meet (:func:`autopar.passes.analysis.batch_rows.split_conflict`), or None."""
    found = ctx.model.batch_couplings
    mesh, c = priced.mesh, priced.config
    terms = {kind for _, kind in ctx.model.gm.meta.get(LOSS_TERMS, [])}
    if BATCH_CONSTANT in terms and len(terms) > 1:   # settled on the ranks as a mean or a sum: either may mix
        terms = {"mean", "sum"}
    if terms == {"mean", "sum"} and (mesh.get(MeshAxis.PIPELINE, 1) > 1 or c.pipeline > 1) and \
            ((c.microbatches or 1) > 1 or mesh.get(MeshAxis.DATA, 1) > 1):
        return ("the loss adds sums over the batch to means over it, and a pipeline's earlier stages would not weigh "
                "their parts' sums; use data (and tensor) parallelism or a pipeline with one microbatch")
    if not found:
        return None
    pipeline = mesh.get(MeshAxis.PIPELINE, 1) > 1 or c.pipeline > 1
    microbatches = c.microbatches or 1
    if ctx.levers is not None and ctx.levers.microbatches:
        microbatches = max(microbatches, ctx.levers.microbatches)
    branches = c.subgrids > 1 or bool(c.tensor_subgrids) or \
        any((o := region_owner(getattr(r, "strategy", ""))) is not None and o.branches
            for r in (priced.table.regions if priced.table else []))
    why = split_conflict(found, data=mesh.get(MeshAxis.DATA, 1), rows_z=mesh.get(MeshAxis.Z, 1),
                         microbatches=microbatches, branches=branches, pipeline=pipeline)
    parts = mesh.get(MeshAxis.DATA, 1) * mesh.get(MeshAxis.Z, 1) * microbatches
    if why is None and parts > 1 and ctx.model.batch // parts < 2 and any(x.exact for x in found):
        return (f"rows of the batch meet at {found[0].describe()}; its exact form needs at least 2 rows on each of "
                f"the {parts} parts of the batch, and the batch has {ctx.model.batch}")
    return why


def random_conflict(ctx: PlanContext, priced: Priced) -> str | None:
    """Why a configuration cannot place the draws of a random op of the model so that they
    equal the single device's (:mod:`autopar.passes.random_draws`), or None: a random op
    autopar has no draw for, on more than one rank (unless every rank runs the whole
    model); any random op under context parallelism (its load-balanced sequence chunks);
    a random op inside a region the configuration runs as D&SP, a 3D grid or the cube, or
    expert-parallel."""
    sites = ctx.model.gm.meta.get(RANDOM_SITES, [])
    if not sites or ctx.world == 1:
        return None
    unsupported = next((s for s in sites if s["kind"] == "unsupported"), None)
    if unsupported is not None and priced.form != "replicate":
        return (f"random op {unsupported['node']} ({unsupported['op']}) has no draw in autopar that is the same "
                f"under every plan: split over ranks it would draw other numbers, rows sharing them; replace it (a "
                f"draw from torch.rand and the like), or run the model on one rank")
    folded = next((s for s in sites if s.get("folded")), None)
    parts = priced.mesh.get(MeshAxis.DATA, 1) * priced.mesh.get(MeshAxis.Z, 1) * \
        max(priced.config.microbatches or 1, 1)
    if folded is not None and (parts > 1 or priced.mesh.get(MeshAxis.PIPELINE, 1) > 1):
        return (f"random op {folded['node']} ({folded['op']}): the batch's rows sit inside dimension "
                f"{folded['folded'][0]} of its value after another dimension; autopar places a random op's draws "
                f"on rows outermost only, so the batch stays whole")
    if priced.mesh.get(MeshAxis.CONTEXT, 1) > 1:
        return (f"random op {sites[0]['node']} ({sites[0]['op']}): context parallelism splits the sequence in "
                f"load-balanced chunks, in which autopar does not place a random op's draws")
    nodes = {r.id: set(r.nodes) for r in ctx.model.regions}
    moved = split_regions()
    for choice in (priced.table.regions if priced.table else []):
        if choice.strategy in moved:
            inside = next((s for s in sites if s["node"] in nodes.get(choice.region, ())), None)
            if inside is not None:
                return (f"random op {inside['node']} ({inside['op']}) lies in region {choice.region}, which this "
                        f"configuration runs as {choice.strategy}: autopar places random draws on rows and "
                        f"contiguous splits only; the region can run {_followed()}")
    return None
