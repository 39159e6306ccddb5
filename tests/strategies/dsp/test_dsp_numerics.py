"""D&SP and D&SP-cSub on real gloo ranks against the single-device model (SUPER §III-B/C).

Three models, each with both modes, on 2 and 4 ranks, with 2 and 4 sub-grids, in the
topology-aware and the naive rank order (on 4 ranks the CNN's and the towers' naive
order, and float32 runs of float64 cases, in the extended suite):

* an Inception-style CNN: three conv branches of different cost joined by a concat over
  channels (explicit branches);
* towers: three or four MLP towers of unequal depth joined by a sum, so the branch
  assignment balances unequal costs (and 3 branches do not divide 2 sub-grids);
* the plain-PyTorch transformer and Hugging Face GPT-2, whose attention heads are the
  branches (SUPER Fig. 5): query, key and value sliced by heads, the context
  concatenated back.

Tolerances: in fp32, outputs, loss and the first step's gradients agree to 1e-5
relative (the branches run on ``g`` times more rows per rank, so their kernels may pick
other algorithms: rounding differs, nothing else). Over several AdamW steps those
rounding differences can flip a ReLU and grow, so the parameters after 3 steps are
compared in float64, where both modes agree with the single device to ~1e-13.
"""
import pytest

import shared_ranks
from autopar.testing import equivalence_job

F64 = {"dtype": "float64"}


def _both_orders(model, data, g, csub):
    return [(model, {"data": data, "subgrids": g, "csub": csub}, F64),
            (model, {"data": data, "subgrids": g, "csub": csub, "topology_aware": False}, F64)]


WORLD_2 = [
    ("inception", {"data": 2, "subgrids": 2}), ("towers", {"data": 2, "subgrids": 2}),
    ("transformer", {"data": 2, "subgrids": 2}),
    ("inception", {"data": 2, "subgrids": 2}, F64),
    ("towers", {"data": 2, "subgrids": 2, "topology_aware": False}, F64),
    ("transformer", {"data": 2, "subgrids": 2}, F64),
    # cSub; with 2 ranks both orders are the same placement
    ("inception", {"data": 2, "subgrids": 2, "csub": True}, F64),
    ("towers", {"data": 2, "subgrids": 2, "csub": True}, F64),
    ("transformer", {"data": 2, "subgrids": 2, "csub": True}, F64),
]
WORLD_4 = [
    # both rank orders on the transformer (the naive order of the CNN and the towers, and
    # float32 runs of the float64 cases: the extended suite)
    *_both_orders("inception", 4, 2, False)[:1], *_both_orders("inception", 4, 2, True)[:1],
    *_both_orders("towers", 4, 2, False)[:1], *_both_orders("towers", 4, 2, True)[:1],
    *_both_orders("transformer", 4, 2, False), *_both_orders("transformer", 4, 2, True),
    # Hugging Face GPT-2 (captured by torch.export; sdpa with a per-sample mask, tied head)
    ("gpt2", {"data": 4, "subgrids": 2}, F64), ("gpt2", {"data": 4, "subgrids": 2, "csub": True,
                                                         "topology_aware": False}, F64),
    # one branch (tower, or head) per rank: sub-grids of one rank, both orders the same
    ("towers4", {"data": 4, "subgrids": 4}, F64), ("towers4", {"data": 4, "subgrids": 4, "csub": True}, F64),
    ("transformer", {"data": 4, "subgrids": 4}, F64), ("transformer", {"data": 4, "subgrids": 4, "csub": True}, F64),
    # the planner's own choice: on A100s this launch-bound CNN gets sub-grids (of the
    # tensor group in a mixed plan since the data split pays the targets' count)
    ("inception", "auto", {"dtype": "float64", "hardware": "a100-selene"}),
]

WORLD_4_EXTENDED = [
    ("inception", {"data": 4, "subgrids": 2}), ("towers", {"data": 4, "subgrids": 2, "topology_aware": False}),
    ("transformer", {"data": 4, "subgrids": 2, "csub": True}),
    *_both_orders("inception", 4, 2, False)[1:], *_both_orders("inception", 4, 2, True)[1:],
    *_both_orders("towers", 4, 2, False)[1:], *_both_orders("towers", 4, 2, True)[1:],
]

# one launch per world size, shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = {world: shared_ranks.register(world, __name__, equivalence_job, (cases,), timeout_s=600)
             for world, cases in ((2, WORLD_2), (4, WORLD_4))}
_EXTENDED = shared_ranks.register(4, __name__ + ":extended", equivalence_job, (WORLD_4_EXTENDED,), timeout_s=600,
                                  extended=True)


def _reports(world, cases):
    return _LAUNCHED[world]()


def _check(report):
    fp64 = len(report["case"]) > 2 and report["case"][2].get("dtype") == "float64"
    assert report["output"][1] < (1e-12 if fp64 else 1e-5), report
    assert report["loss"][1] < (1e-12 if fp64 else 1e-5), report
    assert report["grad"][1] < (1e-12 if fp64 else 1e-5), report
    assert report["grad_norm"][1] < (1e-12 if fp64 else 1e-5), report
    if fp64:
        assert report["param"][0] < 1e-12, report


def _name(case):
    return "-".join(str(part) for part in case).replace(" ", "")


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_2)), ids=[_name(c) for c in WORLD_2])
def test_dsp_world_2(index):
    for rank_reports in _reports(2, WORLD_2):
        _check(rank_reports[index])


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_4)), ids=[_name(c) for c in WORLD_4])
def test_dsp_world_4(index):
    for rank_reports in _reports(4, WORLD_4):
        _check(rank_reports[index])
    if WORLD_4[index][1] == "auto":
        plan = _reports(4, WORLD_4)[0][index]["plan"]
        assert "2 sub-grids of 2 rank(s), topology-aware order" in plan or "D&SP over 2 sub-grids of it" in plan, plan


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(WORLD_4_EXTENDED)), ids=[_name(c) for c in WORLD_4_EXTENDED])
def test_dsp_world_4_extended(index):
    for rank_reports in _EXTENDED():
        _check(rank_reports[index])


def test_chained_fork_joins_split_one_after_another():
    """GPT-NeoX's parallel residual: each block is a fork/join whose join is the next
    block's fork. Splitting block 0 replaces that join; block 1 then finds its fork under
    the analysis's name (a KeyError on the join's name before). Rank 0's program under
    D&SP-cSub holds the segmented collectives of both blocks."""
    import torch
    import transformers
    import autopar
    cfg = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, vocab_size=128, max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = transformers.GPTNeoXForCausalLM(cfg)
    ids = torch.zeros(8, 16, dtype=torch.long, device="meta")
    kwargs = {"input_ids": ids, "labels": ids}
    plan = autopar.plan(model, 4, (), None, {"data": 4, "subgrids": 2, "csub": True}, example_kwargs=kwargs)
    assert len(plan.region_details("dsp")) == 2
    code = str(autopar.rank_graph(model, plan, 0, (), None, None, example_kwargs=kwargs).code)
    assert code.count("segmented_broadcast(") == 2 and code.count("segmented_reduce(") == 2, code[:3000]
