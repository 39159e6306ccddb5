"""Mixture-of-experts layers written densely (every expert on every token, the row scaled by
a routing weight that is zero where the router did not pick: Hugging Face's Llama 4,
``examples/dense_experts.py``): the analysis proves the zeros and reads an ``experts``
region (``form: "dense"``), expert parallelism dispatches only the picked pairs, and the
model trains as on one device; a layer whose weights are not zero off the picks is not
read as routed and stays data- or tensor-parallel. The batch rule behind Llama 4's data
parallelism: ``x.repeat(E, 1)`` lays whole copies of the batch one after another."""
import pytest
import torch

import shared_ranks
from autopar.api import _global_graph, plan
from autopar import PlanError
from autopar.ir import regions
from examples.dense_experts import FORMS, UNREAD, DenseMoELM, dense_experts_job, lm_loss
from examples.peers import hf_models


def _experts(form: str, top_k: int):
    ids = torch.randint(0, 64, (4, 8))
    return regions(_global_graph(DenseMoELM(form, top_k), (ids,), lm_loss, ids), "experts")


@pytest.mark.parametrize("form,top_k", [(f, k) for f in FORMS for k in (1, 2)])
def test_a_dense_layer_whose_unpicked_weights_are_zero_is_routed(form, top_k):
    found = _experts(form, top_k)
    assert [r.id for r in found] == ["experts:blocks.0.moe", "experts:blocks.1.moe"]
    for r in found:
        d = r.details
        assert d["form"] == "dense" and d["weighted"] == "input" and d["top_k"] == top_k and d["experts"] == 4, d
        assert d["unread"] is None and d["activation"]["name"] == ("gelu" if form == "softmax_matmul" else "silu")
        assert len(d["shared"]) == 1, d   # the shared expert beside the routed ones


def test_weights_not_zero_off_the_picks_are_not_routed():
    assert _experts("not_zero", 1) == []
    ids = torch.randint(0, 64, (4, 8))
    with pytest.raises(PlanError, match="no routed mixture-of-experts layer"):
        plan(DenseMoELM("not_zero", 1), 4, (ids,), loss_fn=lm_loss, example_target=ids,
             strategy={"data": 4, "experts": 2})


class _Tiled(torch.nn.Module):
    """The batch's rows tiled (``repeat``/``tile`` along them) and read back several ways."""

    def __init__(self, read: str):
        super().__init__()
        self.read, self.proj = read, torch.nn.Linear(8, 8)

    def forward(self, x):
        tiled = x.repeat(3, 1) if self.read != "tile" else torch.tile(x, (3, 1))
        if self.read == "first_copy":      # the first rows of the tiled value: another share on each rank
            return self.proj(tiled[: x.shape[0] // 2])
        if self.read == "groups":          # groups of 3 consecutive rows, across the copies' boundaries
            return self.proj(tiled.view(-1, 3, 8).sum(1))
        return self.proj(tiled.view(3, -1, 8)).sum(0)   # the copies, rows in dimension 1


@pytest.mark.parametrize("read", ["view", "tile"])
def test_tiled_copies_of_the_batch_keep_its_rows(read):
    x = torch.randn(8, 8)
    made = plan(_Tiled(read), 2, (x,), loss_fn=lambda out, t: (out - t).pow(2).mean(), example_target=x,
                strategy={"data": 2})
    assert made.mesh["data"] == 2


@pytest.mark.parametrize("read", ["first_copy", "groups"])
def test_tiled_rows_read_across_copies_are_refused_under_data_parallelism(read):
    x = torch.randn(8, 8)
    with pytest.raises(PlanError, match="rows of the batch meet"):
        plan(_Tiled(read), 2, (x,), loss_fn=lambda out, t: out.pow(2).mean(), example_target=x,
             strategy={"data": 2})


@pytest.mark.parametrize("loss", ["cross_entropy", "mse", "summed"])
def test_a_loss_over_tiled_rows_is_refused_under_data_parallelism(loss):
    """Copies of the batch read as one dimension by the loss (not viewed apart first)."""
    import torch.nn.functional as F
    x, t = torch.randn(8, 6), torch.randint(0, 5, (8,))
    losses = {"cross_entropy": lambda o, t: F.cross_entropy(o.repeat(2, 1), t.repeat(2)),
              "mse": lambda o, t: (torch.tile(o, (2, 1)) - F.one_hot(t, 5).float().repeat(2, 1)).pow(2).mean(),
              "summed": lambda o, t: F.cross_entropy(o.repeat(2, 1), t.repeat(2), reduction="sum") / 16}
    with pytest.raises(PlanError, match="rows of the batch meet at (repeat|tile)"):
        plan(torch.nn.Linear(6, 5), 2, (x,), loss_fn=losses[loss], example_target=t, strategy={"data": 2})


CASES = [("sigmoid_bmm", 1, {"data": 2, "experts": 2}), ("zeros", 2, {"data": 2, "experts": 2}),
         ("not_zero", 1, {"tensor": 2})]
EXTENDED = [("softmax_matmul", 2, {"data": 2, "experts": 2}), ("sigmoid_bmm", 2, {"tensor": 2}),
            ("not_zero", 1, {"data": 2}), ("softmax_matmul", 1, "auto")]
_TWO = shared_ranks.register(2, __name__, dense_experts_job, (CASES,), timeout_s=300)
_TWO_EXTENDED = shared_ranks.register(2, __name__ + ":extended", dense_experts_job, (EXTENDED,), timeout_s=300,
                                      extended=True)


def _check(row):
    shared_ranks.assert_as_on_one_device(row, (row["form"], row["strategy"]))
    moe = {strategy for region, strategy in row["regions"].items() if region.startswith("experts:")}
    if isinstance(row["strategy"], dict) and row["strategy"].get("experts"):
        assert moe == {"experts"}, row["regions"]
    if row["form"] in UNREAD:
        assert not moe, row["regions"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{f}-top{k}-{s}" for f, k, s in CASES])
def test_dense_experts_train_as_on_one_device(index):
    for rank_rows in _TWO():
        _check(rank_rows[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[f"{f}-top{k}-{s}" for f, k, s in EXTENDED])
def test_dense_experts_train_as_on_one_device_extended(index):
    for rank_rows in _TWO_EXTENDED():
        _check(rank_rows[index])


# Hugging Face's Llama 4 (complex rotary, fused experts applied by bmm, top-1 sigmoid
# routing, a shared expert). Its norms and rotary compute in float32 (``x.float()``), whose
# rounding depends on the shapes a rank computes at: the tensor plans agree to float32's
# rounding (with those upcasts removed tensor 2 agrees within 1e-14); the others exactly.
LLAMA4 = [("llama4", {"data": 4, "experts": 2}), ("llama4", {"data": 2, "tensor": 2, "experts": 2}),
          ("llama4", {"data": 2, "tensor": 2}), ("llama4", "auto")]
_LLAMA4_DATA = shared_ranks.register(2, __name__ + ".llama4:extended", hf_models.hf_job, ([("llama4", {"data": 2})],),
                                     timeout_s=300, extended=True)
_LLAMA4 = shared_ranks.register(4, __name__ + ".llama4:extended", hf_models.hf_job, (LLAMA4,), timeout_s=600,
                                extended=True)


def _check_llama4(row):
    assert "error" not in row, row.get("traceback")
    tensor = row["mesh"].get("tensor", 1) > 1
    shared_ranks.assert_as_on_one_device(row, row["strategy"], floor=1e-5 if tensor else 0.0)
    if isinstance(row["strategy"], dict) and row["strategy"].get("experts"):
        assert "experts" in row["strategies"], row
    if tensor:
        assert set(row["attention"]) == {"megatron"}, row


@pytest.mark.extended
@pytest.mark.multiprocess
def test_llama4_trains_data_parallel_as_on_one_device():
    for rank_rows in _LLAMA4_DATA():
        _check_llama4(rank_rows[0])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(LLAMA4)), ids=[str(s) for _, s in LLAMA4])
def test_llama4_trains_expert_and_tensor_parallel_as_on_one_device(index):
    for rank_rows in _LLAMA4():
        _check_llama4(rank_rows[index])
