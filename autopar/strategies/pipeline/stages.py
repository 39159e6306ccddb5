"""Rewrite pass: cut a traced graph into pipeline stages at repeated-block boundaries
(megatron §2.2; the blocks are the ``block`` regions of
:mod:`autopar.passes.analysis.repeated_blocks`: one per layer of a stack of identical
layers, one per unit of ``period`` layers of a stack that repeats with a period, such as
Jamba's Mamba and attention layers, so no cut falls inside a unit).

:func:`balance` chooses the cut: ``S`` contiguous groups of blocks minimising the most
expensive stage, the nodes before the first block (the embedding) counted on the first
stage and the nodes after the last (the head and the loss) on the last. :func:`split`
then makes one GraphModule per stage:

* a node belongs to the stage of its block; nodes before the first block to stage 0,
  after the last to the last stage (a stack's layers outside its run of units, a first
  layer unlike the others or a last one short of a unit, with them: priced there, and
  the balance counts them); any other node (a residual add between blocks) to
  the latest stage among its inputs, so data only flows forward;
* a stage's placeholders are the graph inputs it reads (every rank has the whole batch,
  so inputs are never sent) and, first, the values earlier stages computed that it or a
  later stage reads (the *carried* values, in graph order: the hidden state, and
  anything like a mask the embedding stage built for every block);
* its outputs are the carried values the next stage receives (its own and those it
  passes on unchanged), or the graph's outputs on the last stage;
* a parameter (``get_attr``) is copied into every stage that reads it: a weight tied
  between the embedding and the head lives on the first and the last stage, whose
  gradients the runtime sums (:attr:`Stage.params` says which stage reads which).

Running the stages one after another, each on the previous one's outputs, computes
exactly what the whole graph does (``tests/strategies/pipeline/test_pipeline_stages.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from autopar.ir import REGIONS, regions, tensor_spec
from autopar.passes.analysis.flops import node_flops
from autopar.passes.analysis.repeated_blocks import describe_stacks


class StageError(ValueError):
    """A partition the model does not allow; the message names the argument."""


@dataclass
class Stage:
    """One pipeline stage: its program and what flows in and out of it."""

    index: int
    module: fx.GraphModule
    blocks: list[str]                 # the block regions it runs, in order
    receives: list[str]               # carried values it takes from the stage before (names in the whole graph)
    inputs: list[str]                 # the graph inputs it reads
    sends: list[str]                  # carried values it gives the next stage ([] on the last)
    params: list[str] = field(default_factory=list)  # qualified names of the parameters it reads
    cost: float = 0.0                 # forward FLOPs
    block_nodes: dict[str, list[str]] = field(default_factory=dict)  # its blocks' node names (one block alone
    #                                   is no repetition: analysing the stage on its own would not find it)

    def describe(self) -> str:
        return (f"stage {self.index}: blocks {', '.join(self.blocks) or '-'}; receives {', '.join(self.receives) or '-'}"
                f"; reads inputs {', '.join(self.inputs) or '-'}; sends {', '.join(self.sends) or '-'}; "
                f"{len(self.params)} parameter(s); {self.cost:.3g} forward FLOPs")


def blocks_of(gm: fx.GraphModule) -> list:
    """The block regions of the largest group of repeated blocks, in graph order."""
    found = regions(gm, "block")
    if not found:
        return []
    groups: dict[str, list] = {}
    for r in found:
        groups.setdefault(r.details["group"], []).append(r)
    group = max(groups.values(), key=len)
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(group, key=lambda r: order[r.nodes[0]])


def balance(costs: list[float], stages: int, before: float = 0.0, after: float = 0.0) -> list[int]:
    """Stage index of each block: contiguous groups, at least one block per stage,
    minimising the largest stage cost (``before`` added to the first, ``after`` to the
    last); ties go to the earliest cut."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise StageError(f"pipeline: {stages} stages need at least {stages} repeated blocks to cut between; the "
                         f"model has {n}. Use at most {n} stages (p·v for the interleaved schedule)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(i: int, j: int, s: int) -> float:  # blocks i..j-1 on stage s
        return prefix[j] - prefix[i] + (before if s == 0 else 0.0) + (after if s == stages - 1 else 0.0)

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]  # best[s][j]: first j blocks on s stages
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], cost(i, j, s - 1))
                if value < best[s][j] - 1e-12:
                    best[s][j], cut[s][j] = value, i
    assignment = [0] * n
    j = n
    for s in range(stages, 0, -1):
        i = cut[s][j]
        for b in range(i, j):
            assignment[b] = s - 1
        j = i
    return assignment


@dataclass
class Partition:
    """Which stage computes each node of a graph (before any program is built)."""

    stages: int
    blocks: list                      # the block regions, in graph order
    assignment: list[int]             # each block's stage
    stage_of: dict[str, int]          # computing node name -> stage
    flops: dict[str, float]           # node name -> forward FLOPs

    def nodes_of(self, stage: int) -> list[str]:
        return [name for name, s in self.stage_of.items() if s == stage]

    def nodes_by_stage(self) -> list[list[str]]:
        """:meth:`nodes_of` of every stage, in one pass."""
        out: list[list[str]] = [[] for _ in range(self.stages)]
        for name, s in self.stage_of.items():
            out[s].append(name)
        return out

    def stage_flops(self) -> list[float]:
        out = [0.0] * self.stages
        for name, s in self.stage_of.items():
            out[s] += self.flops.get(name, 0.0)
        return out


def partition(gm: fx.GraphModule, stages: int, assignment: list[int] | None = None,
              flops: dict[str, float] | None = None) -> Partition:
    """The stage of every computing node of ``gm`` (analysed: it has block regions) for
    ``stages`` stages; ``assignment`` gives each block's stage (default :func:`balance`
    by forward FLOPs; ``flops``: each node's, when the caller has them already)."""
    blocks = blocks_of(gm)
    if not blocks:
        stacks = describe_stacks(gm)
        raise StageError("pipeline: the model has no repeated blocks to cut between (two or more consecutive "
                         "children of one ModuleList or Sequential alike one by one, or units of a few children "
                         "alike unit by unit, each child of a unit holding parameters); pipelining needs them. "
                         + (f"Its stacks of modules: {stacks}" if stacks else "It has no ModuleList or Sequential"))
    block_of = {name: b for b, r in enumerate(blocks) for name in r.nodes}
    nodes = list(gm.graph.nodes)
    first = min(i for i, n in enumerate(nodes) if n.name in block_of)
    last = max(i for i, n in enumerate(nodes) if n.name in block_of)
    if flops is None:
        flops = {n.name: float(node_flops(gm, n)) for n in nodes}
    if assignment is None:
        costs = [sum(flops[name] for name in r.nodes) for r in blocks]
        before = sum(flops[n.name] for n in nodes[:first])
        after = sum(flops[n.name] for n in nodes[last + 1:])
        assignment = balance(costs, stages, before, after)
    elif len(assignment) != len(blocks) or sorted(set(assignment)) != list(range(stages)) or \
            list(assignment) != sorted(assignment):
        raise StageError(f"pipeline: the assignment {list(assignment)} must give each of the {len(blocks)} blocks a "
                         f"stage, in order, using every stage 0..{stages - 1}")
    stage: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.op in ("placeholder", "get_attr", "output"):
            continue
        if n.name in block_of:
            stage[n.name] = assignment[block_of[n.name]]
        elif i < first:
            stage[n.name] = 0
        elif i > last:
            stage[n.name] = stages - 1
        else:  # between blocks: the latest stage among its inputs, so data only flows forward
            stage[n.name] = max((stage[a.name] for a in n.all_input_nodes if a.name in stage), default=0)
    # a switch of the grad mode (torch.no_grad() around a running statistic's update) runs
    # in the stage of the ops it brackets: one turning it off with the op after it, one
    # turning it back on with the op before it
    computing = [n for n in nodes if n.name in stage and not _grad_mode(n)]
    order = {n.name: i for i, n in enumerate(nodes)}
    for n in nodes:
        if n.name in stage and n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            after = n.args[0] is False if n.args else False
            near = [m for m in computing if (order[m.name] > order[n.name]) == after]
            if near:
                stage[n.name] = stage[(near[0] if after else near[-1]).name]
    for n in nodes:   # the mode read to be restored: where it is restored
        if n.name in stage and n.op == "call_function" and n.target is torch.is_grad_enabled:
            users = [u for u in n.users if u.name in stage]
            if users:
                stage[n.name] = min(stage[u.name] for u in users)
    return Partition(stages, blocks, list(assignment), stage, flops)


def _grad_mode(node: fx.Node) -> bool:
    """A switch of the grad mode or a read of it (no value of the model's)."""
    return node.op == "call_function" and node.target in (torch._C._set_grad_enabled, torch.is_grad_enabled)


def boundary_values(gm: fx.GraphModule, part: Partition) -> list[list[str]]:
    """For each boundary ``s → s+1``, the names of the values carried across it (computed
    at or before ``s`` and read after it), in graph order."""
    nodes = list(gm.graph.nodes)
    last_use: dict[str, int] = {}
    for n in nodes:
        at = part.stages - 1 if n.op == "output" else part.stage_of.get(n.name)
        if at is None:
            continue
        for a in n.all_input_nodes:
            last_use[a.name] = max(last_use.get(a.name, -1), at)
    carried: list[list[str]] = [[] for _ in range(part.stages - 1)]
    for n in nodes:   # one pass, each value on every boundary from its stage to its last reader's
        if n.name in part.stage_of:
            for s in range(part.stage_of[n.name], min(last_use.get(n.name, -1), part.stages - 1)):
                carried[s].append(n.name)
    return carried


def parameter_stages(gm: fx.GraphModule, part: Partition) -> dict[str, set[int]]:
    """Qualified parameter name → the stages that read it (a tied weight: several)."""
    out: dict[str, set[int]] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            for user in n.users:
                if user.name in part.stage_of:
                    out.setdefault(n.target, set()).add(part.stage_of[user.name])
        elif n.op == "call_module" and n.name in part.stage_of:
            for k, _ in gm.get_submodule(n.target).named_parameters():
                out.setdefault(f"{n.target}.{k}", set()).add(part.stage_of[n.name])
    params = dict(gm.named_parameters(remove_duplicate=False))
    return {name: stages for name, stages in out.items() if name in params}


def _writes_first_argument(node: fx.Node) -> bool:
    """Whether ``node`` changes its first argument in place (``mul_``, ``copy_``,
    ``index_put_``: an ATen op whose schema writes it, or a method named with ``_``)."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        first = schema.arguments[0] if schema.arguments else None
        return bool(first is not None and first.alias_info is not None and first.alias_info.is_write)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return node.op in ("call_method", "call_function") and name.endswith("_") and not name.endswith("__")


def buffer_stages(gm: fx.GraphModule, part: Partition) -> dict[str, tuple[set[int], set[int]]]:
    """Each buffer the forward changes in place (a running mean under ``no_grad``): the
    stages that change it and the stages that read it otherwise. An in-place op's result
    is the buffer again (``b.mul_(m).add_(x)``)."""
    buffers = {name for name, _ in gm.named_buffers()}
    out: dict[str, tuple[set[int], set[int]]] = {}
    for n in gm.graph.nodes:
        if n.op != "get_attr" or n.target not in buffers:
            continue
        writes, reads = set(), set()
        todo = [n]
        while todo:
            value = todo.pop()
            for user in value.users:
                at = part.stage_of.get(user.name)
                if at is None:
                    continue
                if user.args and user.args[0] is value and _writes_first_argument(user):
                    writes.add(at)
                    todo.append(user)
                else:
                    reads.add(at)
        if writes:
            w, r = out.setdefault(n.target, (set(), set()))
            w |= writes
            r |= reads
    return out


def split(gm: fx.GraphModule, stages: int, assignment: list[int] | None = None) -> list[Stage]:
    """The stage programs of ``gm`` (analysed: it has block regions) for ``stages`` stages;
    ``assignment`` gives each block's stage (default :func:`balance` by forward FLOPs)."""
    part = partition(gm, stages, assignment)
    blocks, assignment, flops = part.blocks, part.assignment, part.flops
    nodes = list(gm.graph.nodes)
    stage: dict[fx.Node, int] = {n: part.stage_of[n.name] for n in nodes if n.name in part.stage_of}
    output = next(n for n in nodes if n.op == "output")
    used_at: dict[fx.Node, set[int]] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            used_at.setdefault(a, set()).add(stages - 1 if n is output else stage[n])

    out: list[Stage] = []
    for s in range(stages):
        carried_in = [n for n in nodes if n in stage and stage[n] < s and max(used_at.get(n, {-1})) >= s]
        carried_out = [n for n in nodes if n in stage and stage[n] <= s and max(used_at.get(n, {-1})) > s]
        mine = [n for n in nodes if stage.get(n) == s]
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for n in carried_in:
            env[n] = graph.placeholder(n.name)
            env[n].meta.update(n.meta)
        inputs = [n for n in nodes if n.op == "placeholder" and any(u in mine or (u is output and s == stages - 1)
                                                                    for u in n.users)]
        for n in inputs:
            env[n] = graph.node_copy(n)
        params = []

        def value(a: fx.Node) -> fx.Node:
            if a not in env:
                if a.op != "get_attr":
                    raise StageError(f"pipeline: stage {s} reads {a.name}, which no stage before it sends; this is a "
                                     f"bug in the partition")
                env[a] = graph.node_copy(a)  # just before its first reader
                params.append(a.target)
            return env[a]
        for n in mine:
            env[n] = graph.node_copy(n, value)
            if n.op == "call_module":  # symbolic tracing: parameters behind module calls
                params += [f"{n.target}.{k}" for k, _ in gm.get_submodule(n.target).named_parameters()]
        if s == stages - 1:
            graph.output(fx.map_arg(output.args[0], value))
        else:
            graph.output(tuple(env[n] for n in carried_out) if len(carried_out) != 1 else env[carried_out[0]])
        graph.lint()
        module = fx.GraphModule(gm, graph, class_name=f"Stage{s}")
        module.meta.update({k: v for k, v in gm.meta.items() if not k.startswith(REGIONS)})
        out.append(Stage(
            index=s, module=module, blocks=[r.id for b, r in enumerate(blocks) if assignment[b] == s],
            receives=[n.name for n in carried_in], inputs=[n.name for n in inputs],
            sends=[] if s == stages - 1 else [n.name for n in carried_out],
            params=sorted(dict.fromkeys(params)), cost=sum(flops[n.name] for n in mine),
            block_nodes={r.id: list(r.nodes) for b, r in enumerate(blocks) if assignment[b] == s}))
    for st in out:  # what the next stage receives is what this one sends
        if st.index + 1 < stages and st.sends != out[st.index + 1].receives:
            raise StageError(f"pipeline: stage {st.index} sends {st.sends} but stage {st.index + 1} receives "
                             f"{out[st.index + 1].receives}; this is a bug in the partition")
    return out


def carried_bytes(stage: Stage, gm: fx.GraphModule) -> int:
    """Bytes one microbatch sends from ``stage`` to the next (megatron §4.1: b·s·h for the
    hidden state), from the capture's shapes."""
    table = {n.name: n for n in gm.graph.nodes}
    return sum(tensor_spec(table[name]).nbytes for name in stage.sends if tensor_spec(table[name]) is not None)
