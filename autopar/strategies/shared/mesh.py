"""Pricing a ``data × tensor`` mesh: the region table every family builds on.

For a factorisation ``world = data × tensor`` each region (vocab, attention, linear
chain) is priced two ways — split Megatron-style over the tensor group, or replicated
within it — and the cheaper is kept. Regions meet at replicated activations in 1D
Megatron, so the per-region choice is the exact optimum of the factorisation. The step is

    compute (1 forward + backward per kernel, :meth:`ModelFacts.seconds`, over d·t ranks
    where split, d where replicated)
  + tensor communication: per split region Megatron's g in forward and f in backward,
    each an all-reduce of the region's boundary activation (megatron §2.3, axonn eq 3;
    3 of them recomputing, megatron §3.5)
  + the exposed part of the data-parallel gradient all-reduce
    (:func:`autopar.planning.model.exposed_data_comm`, axonn eq 3 over the data group at
    stride t).

A factorisation is infeasible when the data degree does not divide the global batch or
the memory per rank (16 bytes per parameter plus the activations kept for backward,
``cost.training_memory``) exceeds the device's. When no region pays for its
communication, every region the degree divides is split (a tensor group that splits
nothing only repeats work); regions holding an op no split rule covers stay whole
(:func:`rule_gaps`, probed with the Megatron rewrite's rules). A forced ``{"data": d,
"tensor": t}`` splits every region Megatron can split and checks the sizes first
(:func:`check_forced_sizes`). A vocabulary ``t`` does not divide is split padded, priced
at ``ceil(V/t)`` rows per rank (:func:`autopar.planning.model.split_factor`); its row of
the plan says so.

Megatron's sequence parallelism (Korthikanti et al. §4.2.2, docs/sequence.md) is weighed
in :func:`price_mesh`: the activations outside the regions divided by ``t``, one
all-gather more per split region in backward (:func:`sequence_regather_s`); taken where a
configuration does not fit without it.

Shared by the families: :class:`DataTensor` is the data and Megatron families' common
base (they differ in the tensor degrees they offer), D&SP prices its common layers with
:func:`price_mesh`, a pipeline each stage's regions, replication its one configuration,
expert and context parallelism their data × tensor part; :func:`judge` turns a region
table into a priced configuration.
"""
from __future__ import annotations

import dataclasses
import logging

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.ir import tensor_spec
from autopar.planning.forms import replicated
from autopar.planning.model import (ModelFacts, exposed_data_comm, padded_vocab, padding_details, region_sizes,
                                    split_factor)
from autopar.planning.plan import Cost, Plan, RegionChoice
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.family import CompileHooks, PlanContext, Priced, RegionTable, mesh_plan, rejected, too_big
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms
from autopar.strategies.shared.tensor_rewrite import regions_without_rules

log = logging.getLogger("autopar.planning")


def rule_gaps(model: ModelFacts) -> dict[str, str]:
    """Region id → why it stays replicated: it holds an op that no split rule covers
    (:func:`autopar.strategies.shared.tensor_rewrite.regions_without_rules`), so splitting it
    would all-gather unpriced values mid-region. Found once per model, probing each
    region at the smallest degree that divides its sizes, and logged."""
    return model.fact("megatron.rule_gaps", lambda: _find_rule_gaps(model))


def _find_rule_gaps(model: ModelFacts) -> dict[str, str]:
    by_degree: dict[int, list[str]] = {}
    for r in model.regions:
        sizes = [size for _, size in region_sizes(r)]
        # (a region with no size to divide, a vocabulary, splits at any degree: padded)
        degree = next((k for k in range(2, max(sizes, default=2) + 1) if all(s % k == 0 for s in sizes)), 0)
        if degree:
            by_degree.setdefault(degree, []).append(r.id)
    gaps: dict[str, str] = {}
    for degree, ids in sorted(by_degree.items()):
        gaps.update(regions_without_rules(model.gm, ids, degree))
    for rid, why in gaps.items():
        log.warning("region %s: %s", rid, why)
    return gaps


def check_forced_batch(model: ModelFacts, data: int) -> None:
    """A forced data degree must divide the batch."""
    if model.batch % data:
        raise PlanError(f"example_inputs: the batch {model.batch} is not divisible by the data degree {data}; "
                        f"give a batch that is a multiple of {data}, or another strategy")


def check_forced_sizes(model: ModelFacts, data: int, tensor: int) -> None:
    """A forced data degree must divide the batch, a forced tensor degree every region's
    split sizes: name the argument or region otherwise."""
    check_forced_batch(model, data)
    for r in model.regions:
        for what, size in region_sizes(r):
            if tensor > 1 and size % tensor:
                raise PlanError(f"region {r.id}: {what} = {size} is not divisible by the tensor degree "
                                f"{tensor}; force a tensor degree that divides it or use strategy='auto'")


def split_cost(model: ModelFacts, hw: Hardware, r, data: int, tensor: int, recompute: bool = False,
               sequence: bool = False) -> Cost:
    """Region ``r`` split Megatron-style over ``tensor`` ranks on its ``B/data`` rows: its
    compute over ``data·tensor`` and g's forward and f's backward all-reduce of its
    boundary activation (megatron §2.3, axonn eq 3; 3 of them recomputing, §3.5). A
    padded vocabulary computes its ``V'/t`` rows per rank (:func:`split_factor`). With
    ``sequence`` (Megatron-SP) the all-reduces are reduce-scatters and all-gathers of the
    same volume, and backward gathers the region's input again (:func:`sequence_regather_s`)."""
    comm = 2 * cost_model.all_reduce_time(tensor, model.boundary[r.id] / data, hw) * (1.5 if recompute else 1)
    if sequence:
        comm += sequence_regather_s(model, hw, r, data, tensor)
    scale = split_factor(r, tensor) / (data * tensor)
    return Cost(model.seconds(r.nodes, hw, scale, recompute), {MeshAxis.TENSOR: comm}, 0.0)


def _choose(model: ModelFacts, hw: Hardware, r, data: int, tensor: int, force_split: bool,
            keep_whole: dict[str, str], *, recompute: bool, sequence: bool = False) -> RegionChoice:
    """One region split over the tensor group or replicated, whichever is cheaper (or as
    forced); its memory is filled in by :func:`price_mesh`. ``recompute``, ``sequence``:
    how each is priced, as :func:`price_mesh` takes them."""
    divisible = all(size % tensor == 0 for _, size in region_sizes(r))
    replicate = Cost(model.seconds(r.nodes, hw, 1 / data, recompute), {}, 0.0)
    options = {"replicate": replicate}
    if tensor > 1 and divisible:
        options["megatron"] = split_cost(model, hw, r, data, tensor, recompute, sequence)
    seconds = {k: c.compute_s + c.total_comm_s for k, c in options.items()}
    if r.id in keep_whole:
        options = {"replicate": replicate}
        seconds = {"replicate": replicate.compute_s}
        chosen, reason = "replicate", keep_whole[r.id]
    elif force_split and "megatron" in options:
        chosen, reason = "megatron", "split wherever the tensor degree divides"
    elif tensor == 1:
        chosen, reason = "replicate", "tensor degree 1: data parallel only"
    elif not divisible:
        sizes = ", ".join(f"{n} {s}" for n, s in region_sizes(r))
        chosen, reason = "replicate", f"{sizes} not divisible by tensor degree {tensor}"
    else:
        chosen = min(sorted(seconds), key=seconds.__getitem__)
        reason = "cheapest predicted step time"
    if chosen == "megatron" and padded_vocab(r, tensor):
        reason += f"; vocab {r.details['vocab_size']} padded to {padded_vocab(r, tensor)}"
    return RegionChoice(r.id, r.kind, chosen, options[chosen], seconds, reason,
                        padding_details(r, tensor) if chosen == "megatron" else {})


def sequence_regather_s(model: ModelFacts, hw: Hardware, r, rows_scale: float, tensor: int) -> float:
    """Megatron-SP's price beyond Megatron's: backward gathers a split region's input
    again (each rank kept its chunk of it, Korthikanti et al. §4.2.2), one all-gather of
    the boundary activation of the ``1/rows_scale`` of the batch a rank runs; not
    overlapped with compute in this runtime."""
    return cost_model.all_gather_time(tensor, model.boundary[r.id] / rows_scale / tensor, hw)


def sequence_choice(ctx: PlanContext, tensor: int, rows: int) -> bool | None:
    """Megatron-SP for a configuration whose tensor groups have ``tensor`` ranks, each
    running ``rows`` rows of the batch at a time: True forced, False forced off or
    impossible (one rank; no token dimension divides, :func:`sequence_splits`), None:
    :func:`price_mesh` weighs it."""
    forced = ctx.levers.sequence_parallel if ctx.levers is not None else None
    if tensor < 2 or forced is False or not sequence_splits(ctx.model, tensor, rows):
        return False
    return forced


def sequence_splits(model: ModelFacts, tensor: int, rows: int) -> bool:
    """Whether every region's row output (attention's out projection, a linear chain's
    last linear) has a token dimension, any but the last, that ``tensor`` divides on a
    rank running ``rows`` of the batch's rows: where the rewrite splits the tokens
    (:mod:`autopar.strategies.shared.sequence_split`; elsewhere it keeps Megatron's
    all-reduce). The global graph's shapes are read both ways a rank's may differ: a
    dimension the batch's size divides may hold the rows (``[batch, seq]``, or flattened
    ``[batch·seq]``: scaled to the rank's rows) or not (a sequence as long as the batch),
    and the rows lie in one dimension at most: a shape counts where under each reading
    some dimension divides (``[2048, 8192, h]`` at batch 2048 and one row per rank: the
    8192 tokens if the first holds the rows, the 2048 if the second does)."""
    memo = model.memo("megatron.sequence_splits")
    if (tensor, rows) not in memo:
        def splits(shape) -> bool:
            # the rows lie in at most one dimension, any one the batch's size divides; the
            # shape splits where under each such reading some dimension divides
            dims = list(shape[:-1])
            readings = [None] + [i for i, d in enumerate(dims) if model.batch and d % model.batch == 0]
            return all(any(s % tensor == 0 and s >= tensor
                           for s in (d // model.batch * rows if i == r else d for i, d in enumerate(dims)))
                       for r in readings)
        shapes = [tensor_spec(model.table[row]).shape for r in model.regions
                  if (row := r.details.get("out_proj") or r.details.get("row")) in model.table]
        memo[tensor, rows] = bool(shapes) and all(splits(shape) for shape in shapes)
    return memo[tensor, rows]


def price_mesh(model: ModelFacts, hw: Hardware, data: int, tensor: int, force_split: bool,
               keep_whole: dict[str, str] | None = None, recompute: bool = False,
               sequence: bool | None = False) -> RegionTable:
    """The region table, total cost and step of ``data × tensor``; ``keep_whole``:
    region id → why it stays replicated whatever the tensor degree; ``recompute``: the
    regions' forward runs twice (a pipeline's blocks, megatron §3.5); ``sequence``:
    Megatron-SP, the activations outside the regions (norms, residual adds, dropout)
    split over the tensor group along the sequence (Korthikanti et al. §4.2.2: their
    ``10sbh`` per layer becomes ``10sbh/t``), the regions' g and f priced as before (a
    reduce-scatter and an all-gather move what an all-reduce moves) and each split
    region's input gathered again in backward (:func:`sequence_regather_s`); None: weighed,
    taken where the configuration does not fit without it and needs less with it (it
    costs time, so a configuration that fits runs without it)."""
    if sequence is None:
        without = price_mesh(model, hw, data, tensor, force_split, keep_whole, recompute, False)
        if without.total.memory_bytes <= hw.memory_bytes:
            return without
        split = price_mesh(model, hw, data, tensor, force_split, keep_whole, recompute, True)
        return split if split.total.memory_bytes < without.total.memory_bytes else without
    keep_whole = {**(rule_gaps(model) if tensor > 1 else {}), **(keep_whole or {})}
    choices: list[RegionChoice] = []
    in_region: set[str] = set()
    split_param_elems = 0
    tensor_comm = activations = compute = 0.0
    for r in model.regions:
        in_region.update(r.nodes)
        choice = _choose(model, hw, r, data, tensor, force_split, keep_whole, recompute=recompute, sequence=sequence)
        split = choice.strategy == "megatron"
        pad = split_factor(r, tensor) if split else 1  # a padded vocabulary's rows are held and computed
        params = model.region_param_elems(r.id) * pad
        if split:
            split_param_elems += params
        act = model.activation_bytes(r.nodes, pad / data / (tensor if split else 1))
        activations += act
        choice.cost.memory_bytes = cost_model.training_memory(params / tensor if split else params, act)
        compute += choice.cost.compute_s
        tensor_comm += choice.cost.comm_s.get(MeshAxis.TENSOR, 0.0)
        choices.append(choice)
    outside = [n.name for n in model.gm.graph.nodes if n.name not in in_region]
    outside_compute = model.seconds(outside, hw, 1 / data)
    compute += outside_compute
    total_params = sum(p.numel() for p in model.params.values())
    unpadded = sum(model.region_param_elems(c.region) for c in choices if c.strategy == "megatron")
    local_params = total_params - unpadded + split_param_elems / tensor
    split_outside = tensor if sequence and tensor > 1 and split_param_elems else 1
    outside_act = model.activation_bytes(outside, 1 / data / split_outside)
    activations += outside_act
    exposed = exposed_data_comm(data, tensor, local_params * 4, compute, hw)
    memory = cost_model.training_memory(local_params, activations)
    outside_params = total_params - sum(model.region_param_elems(r.id) for r in model.regions)
    choices.append(RegionChoice("(outside regions)", "-", "replicate",
                                Cost(outside_compute, {}, cost_model.training_memory(outside_params, outside_act)),
                                {}, "not in a splittable region"))
    total = Cost(compute, {MeshAxis.TENSOR: tensor_comm, MeshAxis.DATA: exposed}, memory)
    return RegionTable(choices, total, compute + tensor_comm + exposed, local_params, activations,
                       model.largest_params, sequence=bool(sequence and split_param_elems))


class DataTensor(CompileHooks):
    """``data × tensor`` on every tensor degree :meth:`offers` (the base of the data and
    Megatron families: they differ only in the tensor degrees they take)."""

    name = "megatron"

    def offers(self, tensor: int) -> bool:
        return tensor > 1

    def regions(self, model: ModelFacts) -> list:
        return list(model.regions)

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        if ctx.forced is None:
            return [Strategy(ctx.world // t, t) for t in divisors(ctx.world) if self.offers(t)]
        if ctx.forced.kind() != "mesh":
            return []
        data, tensor = ctx.forced.resolve(ctx.world)
        if not self.offers(tensor):
            return []
        check_forced_sizes(ctx.model, data, tensor)
        return [dataclasses.replace(ctx.forced, data=data, tensor=tensor)]

    def table(self, ctx: PlanContext, config: Strategy) -> RegionTable | Priced:
        """The region table of ``config`` on the whole batch of each data rank, before
        the memory levers, or its rejection (the batch does not divide, nothing splits);
        the experts family builds on it."""
        model, data, tensor = ctx.model, config.data, config.tensor
        mesh = {MeshAxis.DATA: data, MeshAxis.TENSOR: tensor}
        if model.batch % data:
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by data degree {data}")
        sequence = sequence_choice(ctx, tensor, model.batch // data)
        table = price_mesh(model, ctx.hw, data, tensor, ctx.forced is not None, sequence=sequence)
        if tensor > 1 and not any(c.strategy == "megatron" for c in table.regions):
            # No region pays for its communication on its own, but a tensor group that
            # splits nothing only repeats work: price splitting every region that divides.
            table = price_mesh(model, ctx.hw, data, tensor, True, sequence=sequence)
            gaps = [c.region for c in table.regions if c.region in rule_gaps(model)]
            if not any(c.strategy == "megatron" for c in table.regions) and not (ctx.forced is not None and gaps):
                return rejected(self.name, config, mesh, f"no region can be split over tensor={tensor}" +
                                (f" (regions {gaps} hold ops with no split rule)" if gaps else ""))
            # forced degrees whose regions all fell back: the tensor group replicates them
        return table

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        table = self.table(ctx, config)
        if isinstance(table, Priced):
            return table
        table, config = with_levers(ctx, config, table, config.data, config.tensor)
        return judge(self.name, ctx, config, {MeshAxis.DATA: config.data, MeshAxis.TENSOR: config.tensor}, table)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        return mesh_plan(ctx, priced, priced.table)


def with_levers(ctx: PlanContext, config: Strategy, table: RegionTable, data: int, tensor: int
                ) -> tuple[RegionTable, Strategy]:
    """The configuration with the memory levers (docs/memory.md) it runs with
    (:func:`autopar.strategies.shared.levers.weigh`): each microbatch count re-priced by
    :func:`price_mesh` at one microbatch's rows; ZeRO over the data ranks."""
    model, hw = ctx.model, ctx.hw
    split = any(c.strategy == "megatron" for c in table.regions)
    space = levers.LeverSpace(
        rows=model.batch // data, data=data, split=tensor,
        at=lambda m: price_mesh(model, hw, data * m, tensor, split,
                                sequence=sequence_choice(ctx, tensor, model.batch // (data * m))),
        data_comm=lambda one, z, m, compute: levers.zero_comm(one.param_elems, data, tensor, z, m, compute, hw),
        accumulate=not batch_norms(model))
    return levers.weigh(ctx, config, table, space)


def judge(family: str, ctx: PlanContext, config: Strategy, mesh: dict[str, int], table: RegionTable) -> Priced:
    """A priced data × tensor (or D&SP) configuration, feasible when its memory fits."""
    why = too_big(table.total.memory_bytes, ctx.hw, table.note)
    if why is not None:
        return rejected(family, config, mesh, why, step_s=table.step_s, memory_bytes=table.total.memory_bytes)
    return Priced(family, config, mesh, table.step_s, table.total.memory_bytes, True,
                  comm_s=dict(table.total.comm_s), table=table,
                  form="replicate" if replicated(mesh, table.regions) else "")
