"""The parameter layout each family makes (``autopar.runtime.layout``, built by
``strategies.placement.build_layout``), read without launching ranks: the plan, the
global graph and the wrapper a rank's ParallelModule builds them from."""
import copy

import torch

import autopar
from autopar.api import _global_graph
from autopar.trace.capture import wrap_model
from autopar.runtime.layout import Bucket
from autopar.driver.rank_program import planned_shards
from autopar.strategies.pipeline.layout import parameter_holders
from autopar.strategies.placement import build_layout
from examples.factories import inception, mlp, transformer


def _layouts(factory, world, strategy, ranks, **options):
    model, inputs, loss_fn, target = factory()
    plan = autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target)
    gm = _global_graph(model, inputs, loss_fn, target)
    holders = parameter_holders(plan, gm) if plan.pipeline else None
    return plan, {r: build_layout(plan, r, wrap_model(copy.deepcopy(model), loss_fn, 0), planned_shards(plan, gm),
                                  holders=holders, **options) for r in ranks}


def test_megatron_cuts_the_split_parameters_and_averages_all_over_data():
    _, layouts = _layouts(transformer, 4, {"data": 2, "tensor": 2}, [0, 3])
    layout = layouts[3]
    qkv = layout.get("blocks.0.attn.qkv.weight")
    assert qkv.cut.norm_groups() == ("tensor",) and qkv.norm_groups == ("tensor",)
    assert qkv.cut.blocks == 3  # Q, K and V cut head by head
    full = torch.arange(96 * 32.).view(96, 32)
    assert layout.local_part("blocks.0.attn.qkv.weight", full).shape == (48, 32)
    assert layout.get("blocks.0.ln1.weight").cut is None
    assert {p.bucket.group for p in layout.unique()} == {"data"} and layout.loss_bucket == Bucket("data")
    # a tied weight is one placement under both names
    assert layout.get("tok.weight") is layout.get("lm_head.weight")
    assert layout.norm_keys() == [(), ("tensor",)]


def test_dsp_branches_live_on_their_sub_grid_and_csub_common_layers_on_sub_grid_0():
    plan, layouts = _layouts(inception, 4, {"data": 4, "subgrids": 2}, [0, 1])
    branch = next(name for name, p in layouts[0].placements.items() if p.home)
    (home,) = layouts[0].get(branch).home
    assert home[0] == "segment"
    at_home, away = (layouts[0], layouts[1]) if home[1] == 0 else (layouts[1], layouts[0])
    assert at_home.at_home(at_home.get(branch)) and at_home.get(branch).bucket.group == "subgrid"
    assert not away.current(away.get(branch)) and away.get(branch).bucket is None
    assert at_home.get(branch).norm_groups == ("segment",)
    _, csub = _layouts(inception, 4, {"data": 4, "subgrids": 2, "csub": True}, [0, 1])
    common = next(name for name, p in csub[0].placements.items() if p.home == (("segment", 0),))
    assert csub[0].get(common).bucket.group == "data" and csub[0].loss_bucket is not None
    assert csub[1].get(common).bucket is None and csub[1].loss_bucket is None


def test_3d_weights_are_summed_over_data_and_the_rest_averaged_over_replica():
    _, layouts = _layouts(mlp, 8, {"x": 2, "y": 2, "z": 2}, [0], deferred_reduce_scatter=True)
    layout = layouts[0]
    weight, bias = layout.get("body.0.weight"), layout.get("body.0.bias")
    assert weight.bucket.group == "data" and weight.bucket.divisor == 2 and not weight.bucket.hooks
    assert weight.norm_groups == ("x", "y", "z")
    assert bias.bucket.group == "replica" and layout.loss_bucket.group == "replica"


def test_a_pipeline_rank_holds_its_stages_and_ties_the_shared_weight():
    plan, layouts = _layouts(transformer, 4, {"pipeline": 2, "tensor": 2, "microbatches": 4}, [0, 2])
    first, last = layouts[0], layouts[2]  # positions 0 and 1
    assert first.get("blocks.0.ln1.weight").held and not last.get("blocks.0.ln1.weight").held
    tied = first.get("tok.weight")
    assert tied.held and last.get("tok.weight").held and tied.tied == "tied:0,1"
    assert tied.home == (("pipeline", 0),) and tied.copies_current == ("pipeline",)
    assert last.current(last.get("tok.weight")) and not last.at_home(last.get("tok.weight"))
    assert all("pipeline" in p.norm_groups for p in first.unique())
    # reduced from each stage's last backward on: hooks that count only armed parameters
    assert first.loss_bucket is None and {(p.bucket.hooks, p.bucket.armed) for p in first.unique() if p.held} == \
        {(True, True)}
    assert "not held" in str(last)
