"""Random draws that do not depend on the plan (docs/random_draws.md).

Every random op of a program draws from autopar's counter-based streams, keyed by the
seed, the call, the op and each element's index in the whole value
(:mod:`autopar.runtime.rng`, :mod:`autopar.passes.random_draws`).

Tier 1 (one process): a rank's part of a draw is that part of the whole batch's draw, for
rows, splits and both; no two rows share draws; the analysis finds every random op in
every spelling and no dropout in eval mode; the rank programs say where each draw's
value sits. Tier 2 (gloo ranks): the same model trains to the same losses and parameters
(float64, 3 AdamW steps) on one rank, under data 2, data 4, tensor 2, data x tensor, a
pipeline and "auto" (nn.Dropout, a VAE's randn_like, label dropout, noise and timesteps
drawn in forward, GPT-2 with attention dropout); the whole batch's dropout mask is the
same under every plan and its rows all differ.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
import shared_ranks
from autopar.passes.analysis.random_sites import find_random_sites_pass, sites
from autopar.runtime import rng
from autopar.trace.capture import capture
from examples import random_draws as cases


# ---------------------------------------------------------------- a rank's part of a draw
def _states(seed=7, calls=3):
    states = rng.RandomStates(seed)
    states.calls = calls
    return states


@pytest.mark.parametrize("draw", ["uniform", "normal", "mask", "bernoulli", "randint", "exponential"])
def test_a_ranks_part_of_a_draw_is_that_part_of_the_whole_batchs(draw):
    def make(shape, layout):
        if draw == "uniform":
            return rng.uniform(shape, 4, layout, dtype=torch.float64)
        if draw == "normal":
            return rng.normal(shape, 4, layout, dtype=torch.float32)
        if draw == "mask":
            return rng.keep_mask(shape, 0.3, 4, layout)
        if draw == "bernoulli":
            return rng.bernoulli(0.5, shape, 4, layout, dtype=torch.float32)
        if draw == "exponential":
            return rng.exponential(shape, 4, layout, 2.0, dtype=torch.float64)
        return rng.randint(0, 1000, shape, 4, layout)

    states = _states()
    with rng.use_random_states(states):
        whole = make((12, 6, 10), (None, None, None))
        parts = []
        for first in range(0, 12, 4):   # three data ranks' rows
            with rng.rows(first, 4, 12):
                parts.append(make((4, 6, 10), (("rows", 1), None, None)))
        assert torch.equal(torch.cat(parts), whole)
        # rows folded with the sequence ([rows * 6, 10]) and a split of the last dimension over a group
        with rng.rows(4, 4, 12):
            folded = make((24, 10), (("rows", 6), None))
        assert torch.equal(folded, whole[4:8].reshape(24, 10))
    assert len({tuple(row.flatten().tolist()) for row in whole}) == 12   # no two rows share draws


def test_draws_change_with_the_call_the_site_and_the_seed():
    shape, layout = (4, 32), (None, None)
    with rng.use_random_states(_states(calls=1)):
        first = rng.uniform(shape, 0, layout)
        other_site = rng.uniform(shape, 1, layout)
    with rng.use_random_states(_states(calls=2)):
        next_call = rng.uniform(shape, 0, layout)
    with rng.use_random_states(_states(seed=8, calls=1)):
        other_seed = rng.uniform(shape, 0, layout)
    with rng.use_random_states(_states(calls=1)):
        again = rng.uniform(shape, 0, layout)
    assert torch.equal(first, again)
    for other in (other_site, next_call, other_seed):
        assert not torch.equal(first, other)
    assert 0.4 < first.mean() < 0.6 and first.min() >= 0 and first.max() < 1
    with rng.use_random_states(_states()):
        z = rng.normal((4096,), 2, (None,), dtype=torch.float64)
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1


def test_multinomial_and_randperm_draw_valid_samples():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]])
    with rng.use_random_states(_states()):
        picked = rng.multinomial(probs, 2, False, 5, (None, None))
        many = rng.multinomial(probs, 500, True, 6, (None, None))
        perm = rng.randperm(10, 7)
    assert sorted(picked[0].tolist()) == [1, 2] and len(set(picked[1].tolist())) == 2
    assert set(many[0].tolist()) <= {1, 2} and many[1].bincount(minlength=4)[3] > many[1].bincount(minlength=4)[0]
    assert sorted(perm.tolist()) == list(range(10))


# ---------------------------------------------------------------- finding the random ops
class _Everything(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop, self.drop2d, self.alpha = nn.Dropout(0.1), nn.Dropout2d(0.2), nn.AlphaDropout(0.1)
        self.off = nn.Dropout(0.0)

    def forward(self, x):
        h = self.drop(x) + F.dropout(x, 0.2, True) + self.off(x) + F.dropout(x, 0.5, False)
        h = h + torch.rand_like(x) + torch.randn(x.shape) + torch.bernoulli(torch.sigmoid(x))
        h = h + torch.randint(0, 3, (x.shape[0], 1)).float() + self.alpha(x)
        h = h + torch.empty_like(x).uniform_(-1, 1) + torch.normal(x, 0.1)
        h = h + self.drop2d(x[:, :, None, None]).flatten(1)
        q = h.view(x.shape[0], 2, 2, 4)
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_every_random_op_is_found_in_either_spelling_and_none_in_eval_mode(tracer):
    x = torch.randn(4, 16)
    model = _Everything()
    gm = capture(model, (x,), tracer="export" if tracer == "export" else "auto")
    assert gm.meta["autopar.capture"].tracer == ("export" if tracer == "export" else "symbolic_trace")
    kinds = sorted(s["kind"] for s in sites(find_random_sites_pass(gm)))
    assert kinds == sorted(["dropout", "dropout", "uniform", "normal", "bernoulli", "randint", "alpha_dropout",
                            "uniform", "normal", "feature_dropout", "sdpa"]), kinds
    # in eval mode the modules draw nothing; what the forward asks for explicitly still draws
    kinds = sorted(s["kind"] for s in sites(find_random_sites_pass(capture(model.eval(), (x,)))))
    assert kinds == sorted(["dropout", "uniform", "normal", "bernoulli", "randint", "uniform", "normal", "sdpa"])


def test_the_rank_programs_say_where_each_draw_sits():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 8), nn.Dropout(0.1))
    x = torch.randn(4, 8)

    def code(strategy):
        plan = autopar.plan(model, 2, (x,), strategy=strategy)
        return autopar.rank_graph(model, plan, 0, (x,)).code

    text = code({"tensor": 2})   # between the column and row linears: split over the tensor group
    assert "_site = 0, _at = (None, ('split', 'tensor'))" in text and "_site = 1, _at = (None, None)" in text
    text = code({"data": 2})     # each data rank's rows of the batch
    assert "_site = 0, _at = (('rows', 1), None)" in text and "_site = 1, _at = (('rows', 1), None)" in text
    text = code({"tensor": 2, "sequence_parallel": True})   # after the row linear, on its tokens' split
    assert "_site = 1, _at = (('split', 'tensor'), None)" in text


# ---------------------------------------------------------------- on ranks
MAIN_2 = [("dropout_mlp", {"data": 2}), ("dropout_mlp", {"tensor": 2}), ("vae", {"data": 2}),
          ("label_dropout", {"data": 2}), ("gpt2_dropout", {"pipeline": 2, "microbatches": 2}),
          ("timestep_blocks", {"pipeline": 2, "microbatches": 2})]
MAIN_4 = [("vae", {"data": 4}), ("gpt2_dropout", {"data": 2, "tensor": 2}), ("noisy_targets", "auto")]
EXTENDED_2 = [("noisy_targets", {"tensor": 2}), ("label_dropout", {"data": 2, "microbatches": 2}),
              ("noisy_targets", {"data": 2}), ("gpt2_dropout", {"data": 2}), ("gpt2_dropout", {"tensor": 2}),
              ("gpt2_dropout", {"pipeline": 2, "microbatches": 2, "schedule": "zb-h1"})]
EXTENDED_4 = [("dropout_mlp", "auto"), ("vae", "auto"), ("label_dropout", "auto"), ("gpt2_dropout", "auto"),
              ("gpt2_dropout", {"pipeline": 2, "data": 2, "microbatches": 2}), ("dropout_mlp", {"data": 4, "zero": 3})]

_main_2 = shared_ranks.register(2, __name__, cases.train_job, (MAIN_2,), timeout_s=600)
_main_4 = shared_ranks.register(4, __name__, cases.train_job, (MAIN_4,), timeout_s=600)
_masks_2 = shared_ranks.register(2, __name__ + ":masks", cases.mask_rows_job, ({"data": 2},))
_masks_4 = shared_ranks.register(4, __name__ + ":masks", cases.mask_rows_job, ("auto",))
_extended_2 = shared_ranks.register(2, __name__ + ":extended", cases.train_job, (EXTENDED_2,), timeout_s=900,
                                    extended=True)
_extended_4 = shared_ranks.register(4, __name__ + ":extended", cases.train_job, (EXTENDED_4,), timeout_s=900,
                                    extended=True)

_ONE_RANK: dict = {}


def _one_rank(name: str) -> dict:
    """The model trained by autopar on one process (no process group): the reference."""
    if name not in _ONE_RANK:
        _ONE_RANK[name] = cases.train(name, "auto")
    return _ONE_RANK[name]


# Hugging Face computes its loss in float32 whatever the model's dtype (its logits upcast):
# plans that sum in another order differ there by float32's rounding; other draws would
# differ by far more (1e-2 and up)
TOLERANCE = {"gpt2_dropout": 1e-5}


def _check(case, per_rank):
    name, strategy = case
    reference = _one_rank(name)
    tolerance = TOLERANCE.get(name, 1e-11)
    for rank, result in enumerate(per_rank):
        assert result["losses"] == pytest.approx(reference["losses"], rel=tolerance, abs=tolerance), (case, rank)
        for key, value in reference["state"].items():
            got = result["state"][key]
            scale = value.abs().max().item() if value.is_floating_point() else 1.0
            assert (got - value).abs().max().item() <= tolerance * max(scale, 1.0), (case, rank, key)
    if strategy != "auto":
        assert per_rank[0]["mesh"] != {"data": 1, "tensor": 1}


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(MAIN_2)), ids=[f"{n}-{s}" for n, s in MAIN_2])
def test_two_ranks_train_as_one(index):
    _check(MAIN_2[index], [reports[index] for reports in _main_2()])


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(MAIN_4)), ids=[f"{n}-{s}" for n, s in MAIN_4])
def test_four_ranks_train_as_one(index):
    _check(MAIN_4[index], [reports[index] for reports in _main_4()])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED_2)), ids=[f"{n}-{s}" for n, s in EXTENDED_2])
def test_two_ranks_train_as_one_extended(index):
    _check(EXTENDED_2[index], [reports[index] for reports in _extended_2()])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED_4)), ids=[f"{n}-{s}" for n, s in EXTENDED_4])
def test_four_ranks_train_as_one_extended(index):
    _check(EXTENDED_4[index], [reports[index] for reports in _extended_4()])


@pytest.mark.multiprocess
def test_no_two_rows_share_a_mask_and_every_plan_draws_the_same():
    one = cases.mask_rows_job("auto")
    for masks in (_masks_2(), _masks_4()):
        for result in masks:
            assert torch.equal(result["mask"], one["mask"]) and torch.equal(result["second"], one["second"])
    rows = {tuple(row.tolist()) for row in one["mask"]}
    assert len(rows) == cases.BATCH                              # every row its own mask
    assert not torch.equal(one["mask"], one["second"])            # fresh masks on each call
    assert 0.35 < one["mask"].double().mean() < 0.65
