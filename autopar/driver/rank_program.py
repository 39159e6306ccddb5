"""A rank's program: the rewrite passes a plan runs on a graph captured at the rank's
share of the batch (:func:`rewrite`), and the parameters the families split
(:func:`planned_shards`). That share, the executable module and the code dumps are in
:mod:`autopar.engine.executable`.

``compile`` plans on a capture of the global batch; every program a rank runs is a
second capture at its local batch (``docs/architecture.md``, "Why capture twice"),
rewritten here by the plan's passes: analysis, then the family's split (D&SP, Megatron,
AxoNN's 3D layers or Bian's cube), the random ops' plan-independent draws
(:mod:`autopar.passes.random_draws`), recomputation, the data-parallel pass and, when
the plan was priced with it, fusion.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.passes.analysis.analyse import analyse
from autopar.passes.manager import PassRunner
from autopar.ir import CAPTURE, PASSES_RUN
from autopar.planning.plan import Plan
from autopar.strategies.family import DRAWS, RECOMPUTE, RankBuild, RankPass, StageCut, order_passes
from autopar.strategies.registry import FAMILIES
from autopar.passes.fusion.rewrite import fusion_pass
from autopar.passes.random_draws import random_draws_pass
from autopar.passes.recompute import recompute_pass


def rewrite(gm: fx.GraphModule, plan_: Plan, rank: int, local_batch: int | None = None,
            recompute: bool | str = False, fusion: bool = False, zero_params: dict | None = None,
            stage: StageCut | None = None) -> fx.GraphModule:
    """Rank ``rank``'s program from a graph captured at its local batch: analysis, then
    the passes every family of the plan adds (:meth:`~autopar.strategies.family.Family.rank_passes`,
    ordered by their named stages and constraints, :func:`~autopar.strategies.family.order_passes`: D&SP's branches, the regions' split, ZeRO's reads, recomputation of
    the blocks (or the split regions of a model without blocks) under ``recompute``, only
    the attention cores under ``recompute="selective"``, the data-parallel pass), then fusion. A training graph
    (captured with its loss) keeps its loss local: the runner reduces the reported value
    over the data ranks while backward runs. A rank whose program is a part that takes no
    inputs (:meth:`Plan.partial_rank`: D&SP-cSub's ranks off sub-grid 0) gets that part.
    ``zero_params``: under ZeRO, the parameters the
    rank's layout shards (read through all-gathers, :mod:`autopar.strategies.data.zero`).
    ``stage``: the graph is that cut of the whole graph (a pipeline stage's program:
    every family splits only the stage's regions; its blocks recompute, megatron §3.5)."""
    if local_batch is None and stage is None:
        local_batch = plan_.global_batch // plan_.batch_parts()
    branch_only = stage is None and plan_.partial_rank(rank)
    build = RankBuild(rank, local_batch, gm.meta[CAPTURE].with_loss, branch_only,
                      stage=None if stage is None else stage.index, zero_params=zero_params)
    steps = [p for family in FAMILIES for p in family.rank_passes(plan_, build)]
    if plan_.random_sites:  # after the splits, before recomputation outlines the blocks
        steps.append(RankPass(DRAWS, "random_draws", random_draws_pass,
                              {"sites": plan_.random_sites, "batch": plan_.global_batch}))
    if recompute and not branch_only:
        if stage is None:
            regions = [r for family in FAMILIES for r in family.recompute_regions(plan_)]
            options = {"regions": regions, "blocks": True, "selective": recompute == "selective"}
        else:  # the stage's blocks, or with "selective" their attention cores
            options = {"regions": list(stage.block_nodes), "selective": recompute == "selective"}
        steps.append(RankPass(RECOMPUTE, "recompute", recompute_pass, options))
    if stage is None:
        passes = [("analysis", analyse, {"label": f"rank{rank}_analysis"})]
    else:  # the stage's part of the whole graph's vocab region (autopar.passes.analysis.vocab.stage_part)
        passes = [("analysis", analyse, {"label": f"rank{rank}_stage_analysis", "vocab": list(stage.vocab)}),
                  *stage.passes]
    passes += [(p.name, p.fn, p.options) for p in order_passes(steps)]
    if fusion:
        passes.append(("fusion", fusion_pass, {}))
    runner = PassRunner(passes, plain_names=True)
    gm = runner.run(gm, label=f"rank{rank}")
    gm.meta[PASSES_RUN] = ([] if stage is None else ["pipeline_stages"]) + [r.name for r in runner.records]
    return gm


def planned_shards(plan_: Plan, gm: fx.GraphModule) -> dict:
    """Every parameter the plan's families split, and how (by the captured graph's
    names): what each rank cuts before any rank program exists."""
    shards = {}
    for family in FAMILIES:
        shards.update(family.planned_shards(plan_, gm))
    return shards
