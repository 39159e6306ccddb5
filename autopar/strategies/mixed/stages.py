"""A pipeline's stages as mixed plans: PTD-P with any family inside its stages
(``docs/mixed_plans.md``), priced for the pipeline family's schedule."""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.planning.schedules import rank_of
from autopar.strategies.family import PlanContext, RegionTable
from autopar.strategies.mixed.pricer import MixedPricer
from autopar.strategies.mixed.structure import node_order
from autopar.strategies.shared.branches import branches_of, branching_regions
from autopar.strategies.shared.stage_ends import spread_over_ends


class StagePlans:
    """A pipeline's stages as mixed plans (PTD-P with any family inside its stages,
    ``docs/mixed_plans.md``): the programme of :class:`MixedPricer` over the whole graph
    at one microbatch's rows (``scale = data·m``), its choices summed per stage. A stage
    cut is a replicated boundary (the carried activation is sent whole), so the
    programme's only cross-region credit, AxoNN's split-over-y link, is not taken across
    it: the credits are left out of the stage figures (a conservative price). Regions
    the pipeline keeps whole (tied across stages) and multi-branch regions a cut splits
    are replicated. Recomputing (megatron §3.5) adds one more forward (a third of a
    region's compute) and the all-reduce of g recomputed (half of a region's
    communication), as Megatron's stages price it."""

    def __init__(self, ctx: PlanContext, shape, tensor: int, grid: Grid3D | None, subgrids: int = 0):
        self.ctx, self.shape, self.tensor, self.grid, self.subgrids = ctx, shape, tensor, grid, subgrids
        model = ctx.model
        stage_of = shape.part.stage_of
        self.whole = dict(shape.keep_whole)
        # a tied embedding and head: its nodes on every stage it spans (shape.spanning)
        self.spanning = {r.id: parts for r, parts in shape.spanning}
        # each region's stage as the pipeline found it (a list for a tied vocabulary's ends);
        # a multi-branch region's, that of its first node in graph order
        self.stage = dict(shape.region_stage)
        order = node_order(model)
        for fj in branching_regions(model):
            spans = sorted({stage_of[n] for n in fj.nodes if n in stage_of})
            if len(spans) > 1:
                self.whole[fj.id] = f"pipeline stages {spans} cut it; its branches run whole"
            self.stage[fj.id] = stage_of.get(min(fj.nodes, key=order.__getitem__), 0)
        self.uses: dict[int, set[str]] = {}  # per scale: the families the programme chose

    def tensor_grid(self, scale: int) -> dict:
        """The plan's ``tensor_grid`` at ``scale``: the grid, where a region uses it."""
        g = self.grid
        return {MeshAxis.X: g.x, MeshAxis.Y: g.y} if g is not None and "tensor3d" in self.uses.get(scale, ()) else {}

    def pricer(self, scale: int) -> MixedPricer:
        """The programme at ``scale`` (its grid without z: the stages' rows stay whole)."""
        g = self.grid
        return MixedPricer(self.ctx, scale, self.tensor, None if g is None else Grid3D(g.x, g.y, 1, scale),
                           self.whole, self.subgrids)

    def figures(self, scale: int, p: int, recompute: bool, schedule: str = "1f1b"):
        """Per stage (for one microbatch of ``1/scale`` of the batch): seconds, their
        communication, the activation bytes saved; per pipeline rank the parameter
        elements it holds, and the elements of the parameters several ranks hold."""
        model, hw, shape = self.ctx.model, self.ctx.hw, self.shape
        path, _ = self.pricer(scale).solve()
        self.uses[scale] = {name for _, name in path}
        stages = len(shape.outside)
        stage_s, stage_comm, stage_act = [0.0] * stages, [0.0] * stages, [0.0] * stages
        covered: set[str] = set()
        factor: dict[str, float] = {}  # parameter (or region) -> the share of it a rank holds
        for step, name in path:
            r = step.region
            if name == "open":
                continue  # its nodes outside the tensor regions are the stage's outside nodes
            option = step.options[name]
            parts = self.spanning.get(r.id)
            again = recompute and parts is None  # the runtime recomputes blocks only, not a tied vocabulary
            comm = option.cost.total_comm_s * (1.5 if again else 1.0)
            compute = option.cost.compute_s * (4 / 3 if again else 1.0)
            ends = (spread_over_ends(model, hw, parts, compute, comm, option.activations) if parts is not None
                    else [(self.stage[r.id], compute, comm, option.activations)])
            for st, c, m, a in ends:
                stage_s[st] += c + m
                stage_comm[st] += m
                stage_act[st] += a
            if step.branching:  # D&SP: the region's nodes and parameters are its option's
                covered.update(r.nodes)
                b = branches_of(model, r)
                share = option.params / max(sum(b.counts), 1)
                factor.update({pn: share for names in b.params for pn in names})
            else:
                factor.setdefault(r.id, option.params / max(model.region_param_elems(r.id), 1))
        for s in range(stages):
            rest = [n for n in shape.outside[s] if n not in covered]
            stage_s[s] += model.seconds(rest, hw, 1 / scale)
            stage_act[s] += model.activation_bytes(rest, 1 / scale)
        rank_params, tied = [0.0] * p, 0.0
        for pname, where in shape.param_stages.items():
            if pname not in model.params:
                continue
            share = factor.get(pname, factor.get(model.param_region.get(pname), 1.0))
            elems = model.params[pname].numel() * share
            ranks = {rank_of(schedule, p, st) for st in where}
            for rank in ranks:
                rank_params[rank] += elems
            if len(ranks) > 1:
                tied += elems
        return stage_s, stage_comm, stage_act, rank_params, tied

    def table(self, scale: int) -> RegionTable:
        """The region table at one microbatch's rows, each row with its ``stage``."""
        table = self.pricer(scale).table()
        for row in table.regions[:-1]:
            row.details = {**row.details, "stage": self.stage.get(row.region, 0)}
        return table
