"""Planning context parallelism: the sequence split over a ``context`` mesh dimension.

Context parallelism rides on a ``data × tensor`` configuration (data parallelism or
Megatron; a pipeline's, priced by the registered pipeline family,
:meth:`~autopar.strategies.family.PlanContext.peer`): its mesh is ``data × context ×
tensor``, the ranks of one context group holding the same rows of the batch and a share
of their tokens (:mod:`.collectives`),
attention run as a ring over the group (:mod:`.ring`), everything else on the rank's
tokens (:mod:`.walk`). Gradients are averaged over ``data × context``.

* ``candidates``: under a forced ``{"context": c, ...}`` that configuration, checked (the
  degrees match the world, ``c`` divides the sequence, the batch divides over the data
  ranks); nothing under ``"auto"``, where
* ``follow_ups`` offers, for every data and Megatron configuration that cannot run (too
  big, or with a batch the data degree does not divide: from one that runs, the same
  tokens per rank plus the ring cannot be faster), each context degree ``c > 1`` that
  divides its data degree and the sequence: ``(d/c) × c × t``; only for a model
  whose every attention core runs on the rank's tokens (a ring without attention dropout
  or a mask computed from parameters, or attention written out without dropout,
  :mod:`.written`: another core runs on the whole sequence, which the pricing does not
  count) and none is written out in a form the rewrite cannot run (refused when forced).
* ``price``: Megatron's region table at data degree ``d·c`` (the same tokens per rank:
  compute, activations and gradient traffic), plus the attention's exchanges
  (:func:`.cost.ring_cost`, the ring or an all-gather of the keys and values, whichever
  is cheaper), then the memory levers (microbatches, recomputation, ZeRO over the
  ``data × context`` ranks, which average the gradients).
* ``to_plan``: the mesh with ``context``, ``plan.context`` = the sequence, whether its
  chunks are load-balanced, and the attention's mode.

The compile hooks add the rewrite (:func:`.rewrite.context_parallel_pass`, after the
tensor split) and move the gradients' buckets to ``data_context``.
"""
from __future__ import annotations

import dataclasses

from autopar.grid import MeshAxis
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.context.collectives import balanced_split
from autopar.strategies.context.cost import (attention_cores, every_core_rings, refused_cores, ring_cost,
                                             sequence_length)
from autopar.strategies.context.rewrite import context_parallel_pass
from autopar.strategies.family import (SPLIT, CompileHooks, PlanContext, Priced, RankBuild, RankPass, mesh_plan,
                                       rejected)
from autopar.strategies.shared.mesh import judge, price_mesh
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms

BASES = ("data", "megatron")


def check_forced(ctx: PlanContext, config: Strategy) -> Strategy:
    """A forced ``{"context": c, "data": d, "tensor": t}``: the degrees resolved against
    the world, the sequence and batch checked; a :class:`PlanError` names what does not fit."""
    c = config.context
    if ctx.world % c:
        raise PlanError(f"strategy: context={c} does not divide the {ctx.world} ranks; give a context degree "
                        f"dividing {ctx.world}")
    refused = refused_cores(ctx.model)
    if refused:
        core = refused[0]
        raise PlanError(f"strategy: context parallelism cannot run the attention written out at {core.softmax.name} "
                        f"(scores {core.scores.name} -> softmax {core.softmax.name}) on a rank's share of the "
                        f"sequence: it {core.problem} (docs/context.md, 'Attention written out'); drop 'context'")
    seq = sequence_length(ctx.model)
    if seq is None:
        raise PlanError("strategy: context parallelism splits the sequence attention runs over, and the model has "
                        "neither a scaled_dot_product_attention nor an attention written out (q @ k^T, softmax "
                        "over the keys, @ v) the rewrite can run (docs/context.md); drop 'context'")
    try:
        balanced_split(seq, c)
    except ValueError as e:
        raise PlanError(f"strategy: context={c}: {e}") from None
    if config.recompute == "selective":
        raise PlanError("strategy: recompute='selective' recomputes the attention cores, which context parallelism "
                        "runs as a ring; use 'full' or 'none' with 'context'")
    if config.sequence_parallel:
        raise PlanError("strategy: Megatron-SP splits the tokens over the tensor group, which context parallelism "
                        "already splits over the context group; drop 'sequence_parallel' or 'context'")
    if config.pipeline > 1:
        if (ctx.world // c) % config.pipeline:
            raise PlanError(f"strategy: pipeline={config.pipeline} x context={c} does not divide the {ctx.world} "
                            f"ranks")
        data, tensor = Strategy(config.data, config.tensor).resolve(ctx.world // (c * config.pipeline))
    else:
        data, tensor = dataclasses.replace(config, context=1).resolve(ctx.world // c)
    if ctx.model.batch % data:
        raise PlanError(f"strategy: the batch of {ctx.model.batch} rows is not divisible by the data degree {data}")
    return dataclasses.replace(config, data=data, tensor=tensor)


def _mesh(config: Strategy) -> dict[str, int]:
    mesh = {MeshAxis.DATA: config.data, MeshAxis.CONTEXT: config.context, MeshAxis.TENSOR: config.tensor}
    return {MeshAxis.PIPELINE: config.pipeline, **mesh} if config.pipeline > 1 else mesh


def _as_pipeline(ctx: PlanContext, config: Strategy) -> tuple[PlanContext, Strategy]:
    """The pipeline configuration a pipeline with context parallelism is priced as: the
    same tokens per rank with the context ranks counted as data ranks."""
    base = dataclasses.replace(config, context=1, data=config.data * config.context)
    return dataclasses.replace(ctx, forced=base), base


class ContextParallel(CompileHooks):
    """Context parallelism on a data × tensor configuration (the module docstring)."""

    name = "context"
    priced_late = True  # after the other families: the best so far spares weighing its levers

    def regions(self, model) -> list:
        return attention_cores(model)

    # ------------------------------------------------------------------ the search
    def candidates(self, ctx: PlanContext) -> list:
        forced = ctx.forced
        if forced is None or forced.kind() != "context":
            return []
        return [check_forced(ctx, forced)]

    def follow_ups(self, ctx: PlanContext, weighed: list[Priced]) -> list[Strategy]:
        """Under ``"auto"``: every data and Megatron configuration that cannot run (too big,
        or with an indivisible batch) at each context degree that divides its data degree
        and the sequence."""
        if ctx.forced is not None and not ctx.forced.levers_only:
            return []
        seq = sequence_length(ctx.model)
        if seq is None or not every_core_rings(ctx.model) or refused_cores(ctx.model) or \
                (ctx.levers is not None and ctx.levers.sequence_parallel):
            return []
        out, seen = [], set()
        for p in weighed:
            # from a configuration that runs, the same tokens per rank plus the ring cannot be faster
            if p.family not in BASES or not p.config.data or p.config.pipeline > 1 or p.feasible:
                continue
            d, t = p.config.data, p.config.tensor or 1
            for c in divisors(d):
                if c == 1 or seq % c or ctx.model.batch % (d // c) or (d // c, c, t) in seen:
                    continue
                seen.add((d // c, c, t))
                out.append(Strategy(d // c, t, context=c))
        return out

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, hw = ctx.model, ctx.hw
        d, c, t = config.data, config.context, config.tensor
        if config.pipeline > 1:   # the pipeline family's figures at data degree d·c, the ring's exchanges added
            base_ctx, base = _as_pipeline(ctx, config)
            priced = ctx.peer("pipeline").price(base_ctx, base, row_units=c)
            extra, mode = ring_cost(model, hw, d, c, t)
            extra /= config.pipeline   # a stage runs its share of the layers
            step = None if priced.step_s is None else priced.step_s + extra
            return dataclasses.replace(priced, family=self.name, config=config, mesh=_mesh(config), step_s=step,
                                       comm_s={**priced.comm_s, MeshAxis.CONTEXT: extra},
                                       form=f"{priced.form}, context {mode}")
        if model.batch % d:
            return rejected(self.name, config, _mesh(config), f"batch {model.batch} not divisible by data degree {d}")
        force = ctx.forced is not None and not ctx.forced.levers_only

        def at(m: int):
            table = price_mesh(model, hw, d * c * m, t, force, sequence=False)
            extra, _ = ring_cost(model, hw, d * m, c, t)
            table.total.comm_s[MeshAxis.CONTEXT] = extra
            table.step_s += extra
            return table
        table = at(1)
        space = levers.LeverSpace(rows=model.batch // d, data=d * c, split=t, at=at,
                                  data_comm=lambda one, z, m, compute: levers.zero_comm(
                                      one.param_elems, d * c, t, z, m, compute, hw),
                                  accumulate=not batch_norms(model), row_share=1 / c, recompute_modes=("none", "full"))
        table, config = levers.weigh(ctx, config, table, space)
        priced = judge(self.name, ctx, config, _mesh(config), table)
        return dataclasses.replace(priced, form=f"context {ring_cost(model, hw, d, c, t)[1]}")

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        c = priced.config.context
        if priced.config.pipeline > 1:
            base_ctx, base = _as_pipeline(ctx, priced.config)
            plan = ctx.peer("pipeline").to_plan(base_ctx, dataclasses.replace(priced, config=base, family="pipeline"))
            plan.mesh = _mesh(priced.config)
            # a microbatch: rows of a data rank (each spread over the context ranks)
            plan.pipeline["microbatch_size"] = ctx.model.batch // (priced.config.data * plan.pipeline["microbatches"])
            plan.step_s = priced.step_s
            plan.total.comm_s[MeshAxis.CONTEXT] = priced.comm_s[MeshAxis.CONTEXT]
        else:
            plan = mesh_plan(ctx, priced, priced.table)
        seq = sequence_length(ctx.model)
        cores = attention_cores(ctx.model)
        ranks = priced.config.data * c * priced.config.tensor
        plan.context = {"seq": seq, "balanced": balanced_split(seq, c), "mode": priced.form.rsplit("context ", 1)[1],
                        "rings": sum(core.rings for core in cores), "whole": sum(not core.rings for core in cores),
                        "written": sum(core.written and core.rings for core in cores),
                        "exchange_bytes": max((core.kv_elems * core.itemsize / ranks for core in cores), default=0.0),
                        "exposed_s": priced.comm_s.get(MeshAxis.CONTEXT, 0.0)}
        plan.context["summary"] = (f"{plan.context['mode']}: {plan.context['rings']} cores, "
                                   f"{plan.context['exchange_bytes'] / 2**20:.2f} MiB of keys and values per exchange, "
                                   f"{plan.context['exposed_s'] * 1e3:.3f} ms exposed per step; "
                                   + (f"{plan.context['written']} written out, their keys and values all-gathered; "
                                      if plan.context["written"] else "") +
                                   f"{plan.context['whole']} on the whole sequence")
        return plan

    # ------------------------------------------------------------------ compiling
    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        if plan.degree(MeshAxis.CONTEXT) == 1 or build.branch_only:
            return []
        # after the regions' split over the tensor group (and the experts'), which it rings inside
        return [RankPass(SPLIT, "context_parallel", context_parallel_pass,
                         {"degree": plan.degree(MeshAxis.CONTEXT), "group": MeshAxis.CONTEXT,
                          "seq": plan.context["seq"], "balanced": plan.context["balanced"],
                          "mode": plan.context["mode"], "local_batch": build.local_batch},
                         after=("tensor_parallel", "tensor_parallel_subgrid", "expert_parallel"))]

    def place(self, builder, build: RankBuild) -> None:
        """Every gradient averaged over the data ranks is averaged over ``data × context``
        instead; the loss travels there too, its targets counted over ``data`` (every rank
        of a context group holds the same rows' targets)."""
        if builder.plan.degree(MeshAxis.CONTEXT) == 1:
            return
        for name in builder.names():
            p = builder.placement(name)
            if p.bucket is not None and p.bucket.group == MeshAxis.DATA:
                builder.update(name, bucket=dataclasses.replace(p.bucket, group=builder.plan.replica_group))
        if builder.loss_bucket is not None and builder.loss_bucket.group == MeshAxis.DATA:
            builder.loss_bucket = dataclasses.replace(builder.loss_bucket, group=builder.plan.replica_group,
                                                      count_group=MeshAxis.DATA)


