"""A pipeline's shape: what pricing ``stages`` stages needs that no degree changes
(:class:`PipelineShape`), found once per model and stage count (:func:`pipeline_shape`)
for every configuration of that stage count the pipeline family weighs; the graph is cut
between repeated blocks, balanced by FLOPs (:func:`autopar.strategies.pipeline.stages.partition`)."""
from __future__ import annotations

from autopar.ir import tensor_spec
from autopar.passes.analysis.flops import node_flops
from autopar.planning.model import ModelFacts, region_sizes
from autopar.planning.strategy import PlanError
from autopar.strategies.megatron.planner import rule_gaps
from autopar.strategies.pipeline.stages import StageError, boundary_values, parameter_stages, partition


class PipelineShape:
    """What pricing a pipeline of ``stages`` stages needs that no degree changes: the
    partition, which stage reads each parameter, the carried bytes at the full batch,
    each stage's nodes outside regions and its regions grouped by class (identical
    blocks priced once), and the regions kept whole (tied across stages)."""

    def __init__(self, model: ModelFacts, stages: int):
        flops = model.fact("pipeline.node_flops",
                           lambda: {n.name: float(node_flops(model.gm, n)) for n in model.gm.graph.nodes})
        self.part = part = partition(model.gm, stages, flops=flops)
        self.param_stages = parameter_stages(model.gm, part)
        self.keep_whole: dict[str, str] = dict(rule_gaps(model))
        names_of: dict[str, list[str]] = {}
        for n, rid in model.param_region.items():
            names_of.setdefault(rid, []).append(n)
        for r in model.regions:
            names = names_of.get(r.id, [])
            spread = sorted(set().union(*(self.param_stages.get(n, set()) for n in names)) if names else set())
            # a vocabulary split on the stages that compute its ends keeps the tie; one whose
            # weight another stage reads outside the region stays whole
            ends = {part.stage_of[n] for n in r.nodes if n in part.stage_of}
            if len(spread) > 1 and not (r.kind == "vocab" and set(spread) <= ends):
                self.keep_whole[r.id] = (f"its parameters are read by pipeline stages {spread} (tied); kept whole so "
                                         f"that every stage holds them the same way")
        # per region its stage; a tied embedding and head (a vocab region both ends of the
        # pipeline compute) every stage it spans, with its nodes there: split over the
        # vocabulary on each, the same rows of the tied weight (megatron §2.3), whose
        # gradient the tied group sums
        self.region_stage: dict[str, int | list[int]] = {}
        self.spanning: list[tuple[object, dict[int, list[str]]]] = []  # (region, its nodes per stage)
        groups: list[dict] = [{} for _ in range(stages)]
        for r in model.regions:
            spans = sorted({part.stage_of[n] for n in r.nodes if n in part.stage_of})
            if len(spans) > 1:
                self.region_stage[r.id] = spans
                self.spanning.append((r, {s: [n for n in r.nodes if part.stage_of.get(n) == s] for s in spans}))
                continue
            self.region_stage[r.id] = part.stage_of.get(r.nodes[0], 0)
            key = (model.region_class[r.id], r.id in self.keep_whole)
            rep, count = groups[self.region_stage[r.id]].get(key, (r, 0))
            groups[self.region_stage[r.id]][key] = (rep, count + 1)
        in_region = {name for r in model.regions for name in r.nodes}
        self.outside = [tuple(n for n in part.nodes_of(s) if n not in in_region) for s in range(stages)]
        self.outside_all = tuple(n for n in part.stage_of if n not in in_region)
        self.groups = [list(g.values()) for g in groups]
        # parameters grouped by (stages reading them, the split sizes of their region if it
        # can be split, None if not; its vocabulary, which is padded where t does not divide
        # it): what a rank holds is a sum over a few groups
        params: dict[tuple, float] = {}
        split_of = {r.id: (tuple(region_sizes(r)), r.details.get("vocab_size") if r.kind == "vocab" else None)
                    for r in model.regions if r.id not in self.keep_whole}
        for pname, where in self.param_stages.items():
            if pname not in model.params:
                continue
            rid = model.param_region.get(pname)
            key = (tuple(sorted(where)), *split_of.get(rid, (None, None)))
            params[key] = params.get(key, 0.0) + model.params[pname].numel()
        self.params = [(where, sizes, vocab, elems) for (where, sizes, vocab), elems in params.items()]
        table = model.table
        self.carried = [float(sum(tensor_spec(table[v]).nbytes for v in values if tensor_spec(table[v]) is not None))
                        for values in boundary_values(model.gm, part)]

    def rank_params(self, p: int, tensor: int) -> tuple[list[float], float]:
        """Parameter elements per pipeline rank of ``p`` (split ones over the tensor
        group), and the elements of the tied ones (read on several ranks)."""
        rank_params = [0.0] * p
        tied_elems = 0.0
        for where, sizes, vocab, elems in self.params:
            if sizes is not None and tensor > 1 and all(size % tensor == 0 for _, size in sizes):
                elems = elems / tensor * (-(-vocab // tensor) * tensor / vocab if vocab else 1)  # a padded vocabulary
            ranks = {s % p for s in where}
            for r in ranks:
                rank_params[r] += elems
            if len(ranks) > 1:
                tied_elems += elems
        return rank_params, tied_elems


def pipeline_shape(model: ModelFacts, stages: int) -> PipelineShape:
    """The shape of a ``stages``-stage pipeline, found once per model and stage count;
    raises :class:`PlanError` when the graph cannot be cut that way."""
    cache = model.memo("pipeline.shapes")
    if stages not in cache:
        try:
            cache[stages] = PipelineShape(model, stages)
        except StageError as e:
            cache[stages] = PlanError(str(e))
    if isinstance(cache[stages], PlanError):
        raise cache[stages]
    return cache[stages]
