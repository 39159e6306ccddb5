"""Cutting a traced graph into pipeline stages (``passes/pipeline_stages.py``): the stages,
run one after another in one process on the previous one's outputs, compute the whole
graph's loss and gradients; the balance is by forward FLOPs; bad partitions are named."""
import copy

import pytest
import torch

from autopar.api import _global_graph
from autopar.strategies.pipeline.stages import StageError, balance, blocks_of, split
from examples.models import TinyTransformer, gpt2, gpt2_loss, lm_loss


def _case(name, layers):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    target = torch.randint(0, 64, (4, 16))
    if name == "transformer":
        return TinyTransformer(layers=layers), ids, target, lm_loss
    return gpt2(layers=layers), ids, target, gpt2_loss


def _run_stages(stages, ids, target):
    carried = ()
    inputs = {"input_0": ids, "target": target}
    for stage in stages:
        args = list(carried) + [inputs[name] for name in stage.inputs]
        out = stage.module(*args)
        carried = out if isinstance(out, tuple) else (out,)
    return carried[0]


@pytest.mark.parametrize("name", ["transformer", "gpt2"])
@pytest.mark.parametrize("stages", [2, 4])
def test_stages_in_sequence_compute_the_whole_graph(name, stages):
    model, ids, target, loss_fn = _case(name, 4)
    gm = _global_graph(model, (ids,), loss_fn, target)
    whole = copy.deepcopy(gm)
    parts = split(gm, stages)
    assert [len(p.blocks) for p in parts] == [4 // stages] * stages
    assert [p.index for p in parts] == list(range(stages))
    placeholder_names = [n.name for n in whole.graph.nodes if n.op == "placeholder"]
    expected = whole(*[{"input_0": ids, "target": target}[n] if n in ("input_0", "target") else None
                       for n in placeholder_names])
    expected = expected[0] if isinstance(expected, tuple) else expected
    expected.backward()
    loss = _run_stages(parts, ids, target)
    loss.backward()
    assert torch.equal(loss, expected)
    grads = dict(whole.named_parameters())
    for qualified, p in gm.named_parameters():
        assert torch.allclose(p.grad, grads[qualified].grad, rtol=0, atol=1e-6), qualified
    # only the hidden state crosses a boundary between blocks; the embedding stage and the
    # loss stage own their ends
    for p in parts[:-1]:
        assert len(p.sends) >= 1
    assert "target" in parts[-1].inputs and "target" not in parts[0].inputs
    assert "input_0" in parts[0].inputs
    # every parameter is read by some stage
    seen = {id(gm.get_parameter(q)) for p in parts for q in p.params}
    assert seen == {id(p) for p in gm.parameters()}


def test_gpt2_tied_embedding_lives_on_the_first_and_the_last_stage():
    model, ids, target, loss_fn = _case("gpt2", 4)
    parts = split(_global_graph(model, (ids,), loss_fn, target), 2)
    first, last = set(parts[0].params), set(parts[-1].params)
    shared = first & last
    # torch.export names the tied weight once (the head's name)
    assert shared == {"model.lm_head.weight"}, shared


def test_balance_minimises_the_largest_stage():
    assert balance([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    # a heavy head on the last stage moves blocks to the first
    assert balance([1, 1, 1, 1], 2, after=2) == [0, 0, 0, 1]
    assert balance([3, 1, 1, 1], 2) == [0, 1, 1, 1]
    assert balance([1] * 6, 3) == [0, 0, 1, 1, 2, 2]


def test_more_stages_than_blocks_is_named():
    model, ids, target, loss_fn = _case("transformer", 2)
    gm = _global_graph(model, (ids,), loss_fn, target)
    assert len(blocks_of(gm)) == 2
    with pytest.raises(StageError, match=r"4 stages need at least 4 repeated blocks to cut between; the model has 2. "
                                         r"Use at most 2 stages"):
        split(gm, 4)
    with pytest.raises(StageError, match=r"assignment \[1, 0\] must give each of the 2 blocks a stage, in order"):
        split(gm, 2, [1, 0])
