"""Planning D&SP and D&SP-cSub (SUPER §III-B/C): multi-branch regions on sub-grids.

The data ranks form ``g`` sub-grids (topology-aware: interleaved, one node holding
every sub-grid's position, SUPER §V; naive: contiguous). Each multi-branch region
(:func:`~autopar.strategies.shared.branches.subgraph_regions`: explicit fork/join
branches, or attention heads) runs its branches on the sub-grids, balanced by cost
(``shared.branch_cost.assign_branches``,
``head_widths``); the layers between them stay data parallel over all ranks (D&SP) or
run on sub-grid 0 only (cSub). A configuration's step is

    the common layers' data × tensor pricing at ``tensor = 1``
    (:func:`autopar.strategies.shared.mesh.price_mesh`) over ``data`` (D&SP) or
    ``data / g`` (cSub) batch shards, with each split region's data-parallel compute
    replaced by its D&SP price: the branches' compute on their sub-grid plus the
    segmented split/join collectives (``dsp.cost.dsp_region_cost`` /
    ``dsp_heads_cost``; message counts inside and between nodes by SUPER eqs 3-7)
  + the exposed gradient all-reduce of every parameter but the branches' (those are
    synchronised inside their sub-grid), axonn eq 3.

``"auto"`` weighs every ``g`` dividing the world up to the fewest branches of any
region, both rank orders, D&SP and cSub (cSub only for graphs torch.export captured,
whose branch ops have the batch baked in); never for a model with batch-normalising
batch norms (:func:`autopar.strategies.shared.batch_norms.batch_norms`).
"""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.ir import CAPTURE, tensor_spec
from autopar.planning.model import ModelFacts, exposed_data_comm
from autopar.planning.plan import Cost, Plan, RegionChoice
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.dsp import layout as dsp_layout
from autopar.strategies.dsp.cost import dsp_heads_cost, dsp_region_cost, head_widths, split_messages
from autopar.strategies.dsp.rewrite import csub_branch_program, heads_unsplittable, dsp_pass
from autopar.strategies.dsp.runtime import DspRankRuntime
from autopar.strategies.family import (BRANCHES, CompileHooks, PlanContext, Priced, RankBuild, RankPass, RegionTable,
                                       mesh_plan, rejected)
from autopar.strategies.shared.mesh import check_forced_sizes, judge, price_mesh
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms, check_batch_norms
from autopar.strategies.shared.branches import branches_of, subgraph_regions, unsplittable


def batch_baked(gm: fx.GraphModule) -> bool:
    """Whether D&SP (branches on more rows than the common layers) cannot run this graph:
    explicit branches captured by torch.export, whose views and constants hold the batch.
    Attention cores (matmuls, softmax, sdpa) hold none; cSub keeps the rows unchanged."""
    capture = gm.meta.get(CAPTURE)
    exported = capture is not None and capture.tracer != "symbolic_trace"
    return exported and any(r.kind == "fork_join" for r in subgraph_regions(gm))


def branch_count(region) -> int:
    return region.details["heads"] if region.kind == "attention" else len(region.details["branches"])


def price_dsp(model: ModelFacts, hw: Hardware, data: int, g: int, topology_aware: bool, csub: bool,
                   common_hw: Hardware):
    """D&SP (or D&SP-cSub) choices for the regions of
    :func:`~autopar.strategies.shared.branches.subgraph_regions`, and the
    compute they replace in the common layers' pricing (SUPER §III-B/C; priced by
    ``dsp.cost.dsp_region_cost`` and ``dsp.cost.dsp_heads_cost``). The common layers
    split the batch ``data`` ways, or ``data / g`` ways in cSub (on sub-grid 0), priced
    with ``common_hw``."""
    common_parts = data // g if csub else data
    found = subgraph_regions(model.gm)
    if not found:
        raise PlanError(f"strategy: subgrids={g} asks for D&SP, but the model has no multi-branch region (several "
                        f"branches from one value rejoined by a sum or a concat, or attention heads); use data or "
                        f"tensor parallelism")
    table = model.table
    name = "D&SP-cSub" if csub else "D&SP"
    order = "topology-aware" if topology_aware else "naive"
    # SUPER eqs 3-7: messages of one segmented split on this placement
    messages = split_messages(data, g, hw.devices_per_node, topology_aware)
    counted = (f"messages per split/join {messages.intra_node} intra-node, {messages.inter_node} inter-node "
               f"({hw.devices_per_node} per node)")
    choices, replaced = [], {}
    for r in found:
        d = r.details
        if branch_count(r) < g:
            raise PlanError(f"region {r.id}: {branch_count(r)} {'heads' if r.kind == 'attention' else 'branches'} "
                            f"cannot fill {g} sub-grids; force subgrids <= {branch_count(r)}")
        if r.kind == "attention":
            why = heads_unsplittable(r, table)
            if why is not None:
                raise PlanError(why)
            core = [model.work[n] for n in d["core"]]
            bundle = sum(tensor_spec(table[n]).nbytes for n in d["core_inputs"])
            out = tensor_spec(table[d["core"][-1]]).nbytes
            cost = dsp_heads_cost(core, bundle, out, data, g, hw, topology_aware=topology_aware, csub=csub)
            dp = model.seconds(d["core"], hw, 1 / data)
            common = model.seconds(d["core"], common_hw, 1 / common_parts)
            widths = head_widths(d["heads"], g)
            starts = [sum(widths[:s]) for s in range(g)]
            share = ", ".join(f"s{s}:heads {starts[s]}-{starts[s] + widths[s] - 1}" for s in range(g))
            details = {"subgrids": g, "heads": widths, "branch_params": [], "topology_aware": topology_aware}
            params_per_rank = 0
        else:
            why = unsplittable(r)
            if why is not None:
                raise PlanError(why)
            b = branches_of(model, r)
            cost = dsp_region_cost(b.works, b.counts, b.fork_bytes, b.join_bytes, d["join_op"], data, g, hw,
                                   topology_aware=topology_aware, csub=csub)
            dp = model.seconds(r.nodes, hw, 1 / data)
            common = model.seconds(r.nodes, common_hw, 1 / common_parts)
            share = ", ".join(f"s{s}:{[b for b, o in enumerate(cost.assignment) if o == s]}" for s in range(g))
            details = {"subgrids": g, "assignment": list(cost.assignment), "branch_params": b.params,
                       "topology_aware": topology_aware}
            params_per_rank = cost.branch_param_elems_per_rank
        details.update(intra_node_messages=messages.intra_node, inter_node_messages=messages.inter_node)
        replaced[r.id] = common
        choices.append(RegionChoice(
            r.id, r.kind, "dsp",
            Cost(cost.compute_s, dict(cost.comm_s), cost_model.training_memory(params_per_rank, 0.0)),
            {"data": dp}, f"{name} over {g} sub-grids ({order} order); branches {share}; {counted}", details))
    return choices, replaced


def merge(model: ModelFacts, hw: Hardware, config: Strategy, table: RegionTable, dsp: list[RegionChoice],
          replaced: dict[str, float]) -> RegionTable:
    """The common layers' table with the split regions' D&SP choices in place of their
    data-parallel compute: one row per region (an attention region whose heads are
    split keeps its projections' compute beside the split core; explicit branches were
    priced among the nodes outside regions), the branches' parameters taken out of the
    data all-reduce (they are synchronised inside their sub-grid)."""
    total = table.total
    total.compute_s -= sum(replaced.values())
    for c in dsp:
        total = total + Cost(c.cost.compute_s, c.cost.comm_s, 0.0)
    split = {c.region: c for c in dsp}
    rows = []
    for c in table.regions[:-1]:
        d = split.pop(c.region, None)
        if d is not None:
            d.cost.compute_s += c.cost.compute_s - replaced[c.region]
            d.cost.memory_bytes += c.cost.memory_bytes
            d.alternatives = {"data": c.cost.compute_s + c.cost.total_comm_s}
        rows.append(d or c)
    outside = table.regions[-1]
    outside.cost.compute_s -= sum(replaced[rid] for rid in split)
    branch_elems = sum(model.params[name].numel() for c in dsp for names in c.details["branch_params"]
                       for name in names)
    all_elems = sum(p.numel() for p in model.params.values())
    stride = config.subgrids if config.topology_aware and config.csub else 1
    common_parts = config.data // config.subgrids if config.csub else config.data
    total.comm_s[MeshAxis.DATA] = exposed_data_comm(common_parts, stride, (all_elems - branch_elems) * 4,
                                             total.compute_s, hw)
    return RegionTable(rows + list(split.values()) + [outside], total, total.compute_s + total.total_comm_s,
                       table.param_elems, table.activation_bytes, table.largest_params)


class DSP(CompileHooks):
    """D&SP and D&SP-cSub: ``g`` sub-grids of the data ranks (``tensor = 1``)."""

    name = "dsp"
    region_strategy = "dsp"  # RegionChoice.strategy of its split regions

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        """The branches split over the sub-grids; under cSub off sub-grid 0, a program
        of this sub-grid's branches only (the other families add nothing then)."""
        dsp_regions = plan.region_details(self.region_strategy, build.stage)
        if not dsp_regions:
            return []
        if plan.mixed:  # each rank of the tensor group a sub-grid, or g sub-grids of t/g (docs/mixed_plans.md)
            subgrid = plan.tensor_subgrid_coordinates(build.rank)[0]
            group = MeshAxis.TENSOR_SEG if plan.tensor_subgrids else MeshAxis.TENSOR
            return [RankPass(BRANCHES, "dsp", dsp_pass, {
                "dsp_regions": dsp_regions, "subgrid": subgrid, "group": group, "over_tensor": True})]
        subgrid = plan.subgrid_coordinates(build.rank)[0]
        if build.branch_only:
            return [RankPass(BRANCHES, "csub_branches", csub_branch_program,
                             {"dsp_regions": dsp_regions, "subgrid": subgrid})]
        return [RankPass(BRANCHES, "dsp", dsp_pass,
                         {"dsp_regions": dsp_regions, "subgrid": subgrid, "csub": plan.csub})]

    def place(self, builder, build: RankBuild) -> None:
        if builder.plan.mixed:
            dsp_layout.place_over_tensor(builder)
        elif plan_uses_dsp(builder.plan):
            dsp_layout.place(builder)

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> DspRankRuntime:
        """cSub's outputs and loss from sub-grid 0; a mixed plan's branches of other sub-grids."""
        return DspRankRuntime(plan, rank, self.region_strategy)

    def finish_plan(self, ctx: PlanContext, plan: Plan) -> None:
        """Refuse gradient accumulation under cSub (the sub-grids off sub-grid 0 run their
        branches on rows sub-grid 0 sends once per step)."""
        if plan.microbatches > 1 and plan.csub:
            raise PlanError(f"strategy: microbatches={plan.microbatches} with D&SP-cSub is not in this version (the "
                            f"sub-grids off sub-grid 0 run their branches on rows sub-grid 0 sends once per step); "
                            f"drop 'csub' or 'microbatches'")

    def regions(self, model: ModelFacts) -> list:
        return subgraph_regions(model.gm)

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        model, world, forced = ctx.model, ctx.world, ctx.forced
        if forced is None:
            branching = self.regions(model)
            if not branching or batch_norms(model):
                return []
            fewest = min(branch_count(r) for r in branching)
            modes = (True,) if batch_baked(model.gm) else (False, True)
            return [Strategy(world, 1, g, topology_aware, csub) for g in divisors(world) if 1 < g <= fewest
                    for csub in modes for topology_aware in (True, False)]
        if forced.kind() != "dsp":
            return []
        if forced.subgrids > 1:
            check_batch_norms(model, "D&SP runs branches on other rows")
        data, tensor = forced.resolve(world)
        if forced.csub and forced.subgrids == 1:
            raise PlanError("strategy: csub=True (D&SP-cSub) needs subgrids > 1")
        if tensor != 1 or data % forced.subgrids:
            raise PlanError(f"strategy: D&SP with subgrids={forced.subgrids} needs tensor=1 and a data degree it "
                            f"divides (got data={data}, tensor={tensor})")
        if not forced.csub and batch_baked(model.gm):
            raise PlanError(f"strategy: D&SP of explicit branches needs a model torch.fx.symbolic_trace captures in "
                            f"this version; {ctx.name} was captured by torch.export, which bakes the batch size "
                            f"into the branch ops (they run on more rows than the common layers). Use csub=True "
                            f"(D&SP-cSub runs them on the common layers' rows)")
        check_forced_sizes(model, data, tensor)
        return [dataclasses.replace(forced, data=data, tensor=tensor)]

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, data, g = ctx.model, config.data, config.subgrids
        mesh = {MeshAxis.DATA: data, MeshAxis.TENSOR: 1}
        if model.batch % data:
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by data degree {data}")
        # cSub: the common layers are data parallel over sub-grid 0 only
        common_parts = data // g if config.csub else data
        # cSub: only sub-grid 0's ranks run the common layers while the others wait for
        # their split, so where ranks share a host's cores those get the waiting ranks'
        # share (as a pipeline's stages in their turn, Hardware.while_busy)
        common_hw = ctx.hw.while_busy(common_parts) if config.csub and ctx.hw.host_cores else ctx.hw
        table = price_mesh(model, common_hw, common_parts, 1, ctx.forced is not None)
        try:
            dsp, replaced = price_dsp(model, ctx.hw, data, g, config.topology_aware, config.csub, common_hw)
        except PlanError as e:
            if ctx.forced is not None:
                raise
            return rejected(self.name, config, mesh, str(e))
        table = merge(model, ctx.hw, config, table, dsp, replaced)
        table, config = with_levers(ctx, config, table)
        return judge(self.name, ctx, config, mesh, table)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        return mesh_plan(ctx, priced, priced.table)


def with_levers(ctx: PlanContext, config: Strategy, table: RegionTable) -> tuple[RegionTable, Strategy]:
    """The D&SP configuration with the memory levers it runs with
    (:func:`autopar.strategies.shared.levers.weigh`): accumulation and recomputation, its
    table read per microbatch by :func:`autopar.strategies.shared.levers.scaled`; no ZeRO
    (the sub-grids' ranks hold different branches) and no accumulation under cSub."""
    model, hw = ctx.model, ctx.hw
    branch_elems = sum(model.params[name].numel() for c in table.regions if c.strategy == "dsp"
                       for names in c.details["branch_params"] for name in names)
    common = config.data // config.subgrids if config.csub else config.data
    stride = config.subgrids if config.topology_aware and config.csub else 1

    def data_comm(one, zero, m, compute):
        return exposed_data_comm(common, stride, (one.param_elems - branch_elems) * 4, compute, hw)

    space = levers.LeverSpace(rows=model.batch // common, data=config.data, split=1,
                              at=lambda m: levers.scaled(table, m), data_comm=data_comm, zero_stages=(0,),
                              accumulate=not config.csub and not batch_norms(model))
    return levers.weigh(ctx, config, table, space)


def plan_uses_dsp(plan: Plan) -> bool:
    return bool(plan.region_details(DSP.region_strategy)) or plan.csub
