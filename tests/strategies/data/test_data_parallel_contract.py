"""The user's contract on 4 gloo ranks in one launch: gradients accumulated over several
steps, a loss that sums over the batch, inputs without a batch dimension, a 4 x 1 mesh whose
dimensions are named (tensor, data) (read by its order it would be data 4 x tensor 1),
full state dicts loaded into shards and gathered back, and a disabled rewrite."""
import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import autopar
import shared_ranks
from examples.models import MLP, TinyTransformer, lm_loss


def _grads_close(pm, reference, tol=1e-5):
    grads = pm.full_gradients()
    worst = max((grads[n] - p.grad).abs().max().item() / max(p.grad.abs().max().item(), 1e-12)
                for n, p in reference.named_parameters())
    return worst < tol, worst


class Masked(nn.Module):
    """An MLP whose forward also takes a per-feature mask with no batch dimension."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP(width=16, hidden=32, depth=1, out=4)

    def forward(self, x, feature_mask):
        return self.mlp(x * feature_mask)


def _job():
    results = {}
    torch.manual_seed(0)
    x, y = torch.randn(8, 32), torch.randint(0, 8, (8,))

    # gradients accumulate over two steps without zero_grad, as in plain PyTorch
    model = MLP()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=F.cross_entropy, example_target=y,
                         strategy={"data": 4})
    pm.step(x, target=y)
    pm.step(x * 2, target=y)
    F.cross_entropy(reference(x), y).backward()
    F.cross_entropy(reference(x * 2), y).backward()
    results["accumulation"] = _grads_close(pm, reference)

    # state is there from compile on, before any call
    model = MLP()
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=F.cross_entropy, example_target=y,
                         strategy={"data": 2, "tensor": 2})
    results["state_before_first_call"] = (all(torch.equal(v, model.state_dict()[k])
                                              for k, v in pm.full_state_dict().items()), None)

    # a loss that sums over the batch
    def summed(out, target):
        return F.cross_entropy(out, target, reduction="sum")

    model = MLP()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=summed, example_target=y, strategy={"data": 2,
                                                                                                     "tensor": 2})
    loss = pm.step(x, target=y)
    ref_loss = summed(reference(x), y)
    ref_loss.backward()
    results["sum_loss"] = (abs(loss.item() - ref_loss.item()) < 1e-4 * abs(ref_loss.item()), loss.item())
    results["sum_grads"] = _grads_close(pm, reference)

    # an input without a batch dimension is given whole to every rank
    model = Masked()
    reference = copy.deepcopy(model)
    xm, mask = torch.randn(8, 16), (torch.rand(16) > 0.3).float()
    ym = torch.randint(0, 4, (8,))
    pm = autopar.compile(model, None, example_inputs=(xm, mask), loss_fn=F.cross_entropy, example_target=ym,
                         strategy={"data": 4})
    results["mask_output"] = torch.allclose(pm(xm, mask), reference(xm, mask), atol=1e-6)

    # a 2-D mesh named (tensor, data): the names, not the order, say which is which. It is
    # 4 x 1, not 2 x 2, so that reading the dimensions by position (or swapping the names)
    # gives data 4 x tensor 1 instead of tensor 4 x data 1
    mesh = init_device_mesh("cpu", (4, 1), mesh_dim_names=("tensor", "data"))
    ids, target = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    model = TinyTransformer()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, mesh, example_inputs=(ids,), loss_fn=lm_loss, example_target=target)
    pm.step(ids, target=target)
    lm_loss(reference(ids), target).backward()
    results["tensor_data_mesh"] = _grads_close(pm, reference)
    results["mesh_degrees"] = dict(pm.plan.mesh)
    groups = pm.process_groups
    results["mesh_groups"] = {name: dist.get_process_group_ranks(groups[name]) if name in groups else None
                              for name in ("tensor", "data")}

    # a full state dict loads into the shards and gathers back unchanged
    torch.manual_seed(5)
    other = TinyTransformer()
    state = other.state_dict()
    pm.load_full_state_dict(state)
    gathered = pm.full_state_dict()
    results["state_round_trip"] = (sorted(gathered) == sorted(state) and
                                   all(torch.equal(gathered[k], state[k]) for k in state), sorted(state)[:3])
    with torch.no_grad():
        results["state_outputs"] = (torch.allclose(pm(ids), other(ids), atol=1e-5), None)

    # with the tensor-parallel rewrite switched off, every tensor rank runs the whole
    # model: slower, still the same numbers
    os.environ["AUTOPAR_DISABLE_PASSES"] = "tensor_parallel"
    model = MLP()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=F.cross_entropy, example_target=y,
                         strategy={"data": 2, "tensor": 2})
    pm.step(x, target=y)
    F.cross_entropy(reference(x), y).backward()
    results["disabled_rewrite"] = _grads_close(pm, reference)
    del os.environ["AUTOPAR_DISABLE_PASSES"]
    return results


_LAUNCHED = shared_ranks.register(4, __name__, _job)  # one launch with other modules' jobs (tests/shared_ranks.py)


@pytest.fixture(scope="module")
def results():
    return _LAUNCHED()


@pytest.mark.multiprocess
@pytest.mark.parametrize("check", ["accumulation", "sum_loss", "sum_grads", "mask_output", "tensor_data_mesh",
                                   "state_round_trip", "state_outputs", "state_before_first_call",
                                   "disabled_rewrite"])
def test_contract(results, check):
    for rank_results in results:
        value = rank_results[check]
        assert (value[0] if isinstance(value, tuple) else value), (check, value)


@pytest.mark.multiprocess
def test_named_mesh_degrees(results):
    """The 4 x 1 mesh named (tensor, data) is tensor 4 x data 1: every rank's tensor group
    is the whole mesh (the 4 ranks its first dimension runs over)."""
    for rank_results in results:
        assert rank_results["mesh_degrees"] == {"data": 1, "tensor": 4}, rank_results["mesh_degrees"]
        assert rank_results["mesh_groups"]["tensor"] == [0, 1, 2, 3], rank_results["mesh_groups"]
