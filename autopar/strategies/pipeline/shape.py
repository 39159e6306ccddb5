"""A pipeline's shape: what pricing ``stages`` stages needs that no degree changes
(:class:`PipelineShape`), found once per model and stage count (:func:`pipeline_shape`)
for every configuration of that stage count the pipeline family weighs; the graph is cut
between repeated blocks, balanced by FLOPs (:func:`autopar.strategies.pipeline.stages.partition`)."""
from __future__ import annotations

from autopar.ir import tensor_spec
from autopar.passes.analysis.flops import node_flops
from autopar.planning.model import ModelFacts, region_sizes
from autopar.planning.schedules import rank_of
from autopar.planning.strategy import PlanError
from autopar.strategies.shared.mesh import rule_gaps
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
        by_stage = part.nodes_by_stage()
        self.outside = [tuple(n for n in names if n not in in_region) for names in by_stage]
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
        self.passes = [_pass_shares(model, names) for names in by_stage]
        # weight-reading kernels per block of each stage: under recomputation a zero-bubble W
        # runs one backward per weight group, each re-running its block's forward
        blocks = [list(part.assignment).count(s) for s in range(stages)]
        self.weight_kernels = [sum(1 for n in names if _weight_kernel(model, n)) for names in by_stage]
        self.weight_groups = [k / max(b, 1) for k, b in zip(self.weight_kernels, blocks)]
        table = model.table
        self.carried = [float(sum(tensor_spec(table[v]).nbytes for v in values if tensor_spec(table[v]) is not None))
                        for values in boundary_values(model.gm, part)]

    def rank_params(self, p: int, tensor: int, schedule: str = "1f1b") -> tuple[list[float], float]:
        """Parameter elements per pipeline rank of ``p`` (split ones over the tensor
        group; stages placed as ``schedule`` places them), and the elements of the tied
        ones (read on several ranks)."""
        key = (p, tensor, rank_of(schedule, p, p * 2 - 1) if p > 1 else 0)  # the V layout or the loop
        cache = self.__dict__.setdefault("_rank_params", {})
        if key in cache:
            return list(cache[key][0]), cache[key][1]
        rank_params = [0.0] * p
        tied_elems = 0.0
        for where, sizes, vocab, elems in self.params:
            if sizes is not None and tensor > 1 and all(size % tensor == 0 for _, size in sizes):
                elems = elems / tensor * (-(-vocab // tensor) * tensor / vocab if vocab else 1)  # a padded vocabulary
            ranks = {rank_of(schedule, p, s) for s in where}
            for r in ranks:
                rank_params[r] += elems
            if len(ranks) > 1:
                tied_elems += elems
        cache[key] = (rank_params, tied_elems)
        return list(rank_params), tied_elems


def _reads_parameter(node, depth: int = 3) -> bool:
    """Whether ``node`` reads a parameter, directly or through a few views of one."""
    for arg in node.all_input_nodes:
        if arg.op == "get_attr":
            return True
        if depth and arg.op == "call_function" and len(arg.all_input_nodes) == 1 and _reads_parameter(arg, depth - 1):
            return True
    return node.op == "call_module"


def _weight_kernel(model: ModelFacts, name: str) -> bool:
    work = model.work.get(name)
    return work is not None and work.is_kernel and _reads_parameter(model.table[name])


def _pass_shares(model: ModelFacts, names: list[str]) -> tuple[float, float]:
    """A stage's ``(forward, weight-gradient)`` shares of its training FLOPs: a matmul
    runs once forward and twice backward (its input's and its weight's gradient, the
    second only where one operand is a parameter), any other kernel once each way
    (Qi et al. 2024 §2: F, B and W). The zero-bubble schedules price ``F``, ``I`` and
    ``W`` by them."""
    forward = weights = total = 0.0
    table = model.table
    for name in names:
        work = model.work.get(name)
        if work is None or not work.is_kernel:
            continue
        flops = float(work.flops) or float(work.bytes_moved) / 8  # a memory-bound kernel: its bytes as work
        forward += flops
        if work.is_matmul:
            total += 3 * flops
            if _reads_parameter(table[name]):
                weights += flops
        else:
            total += 2 * flops
    if total <= 0:
        return 0.5, 0.0
    return forward / total, weights / total


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
