"""Padded vocabularies: a vocabulary the tensor degree does not divide is padded (as
Megatron-LM's ``--make-vocab-size-divisible-by``) instead of refused.

On 4 gloo ranks against the single-device model in float64 (outputs, loss, every
gradient, the gradient norm and the parameters after 3 AdamW steps), a vocabulary of 63
with the LM head tied to the embedding and with its own weight and bias:

* 1D Megatron on ``tensor=4`` (16 rows per rank, the last rank's 16th row padding) and on
  ``data=2 × tensor=2`` (32 rows per rank);
* mixed plans whose trunk runs on an AxoNN grid of the tensor group (``2 × 1 × 2``, the
  rows split over z, and ``2 × 2 × 1``), the vocabulary Megatron-split over the grid's
  four ranks (the whole-3D family keeps it replicated, priced);
* PTD-P with the tied embedding and head split over the vocabulary on both ends of the
  pipeline (``pipeline=2 × tensor=2``, two microbatches);
* ZeRO-3 over ``data=2`` of the padded shards of ``tensor=2``.

In the same launch: the padded rows stay zero in the parameters, their gradients and the
optimizer's state; the state dict has the original 63 rows; a checkpoint saved on
``tensor=2`` loads into ``tensor=4`` (another padding); the rank program's cross-entropy
masks the padded logits. Without ranks: the cut and its checkpoint boxes, the planner
splitting a vocabulary no degree divides (GPT-3 175B with GPT-2's 50,257 on 3072 A100s
takes tensor 8, the vocabulary padded to 50,264), and the plan's explanation.
"""
import pytest
import torch

import autopar
import shared_ranks
from autopar.runtime.layout import Seat
from autopar.engine.checkpoint_chunks import placements
from autopar.strategies.shared.tensor_rewrite import ParamShard, padded_vocab
from autopar.testing import equivalence_job

V63 = {"dtype": "float64", "vocab": 63}
UNTIED = {**V63, "tied": False}
GRID_2X1X2 = {"tensor3d": {"x": 2, "y": 1, "z": 2}}
GRID_2X2 = {"tensor3d": {"x": 2, "y": 2}}
CASES = [
    ("transformer", {"data": 1, "tensor": 4}, V63),
    ("transformer", {"data": 1, "tensor": 4}, UNTIED),
    ("transformer", {"data": 2, "tensor": 2}, V63),
    ("transformer", {"data": 2, "tensor": 2}, UNTIED),
    ("transformer", {"data": 1, "tensor": 4, "regions": {"kind:attention": GRID_2X1X2, "kind:linear_chain": GRID_2X1X2,
                                                         "kind:vocab": "megatron"}}, UNTIED),
    ("transformer", {"data": 1, "tensor": 4, "regions": {"kind:attention": GRID_2X2, "kind:linear_chain": GRID_2X2,
                                                         "kind:vocab": "megatron"}}, V63),
    ("transformer", {"pipeline": 2, "tensor": 2, "microbatches": 2}, V63),
    # the padded shards under ZeRO-3's row shards over the data group
    ("transformer", {"data": 2, "tensor": 2, "zero": 3}, UNTIED),
]


def _build(strategy, seed=0):
    from examples.factories import training_case
    factory, inputs, target, loss_fn = training_case("transformer", vocab=63, tied=False)
    torch.manual_seed(seed)
    pm = autopar.compile(factory().double(), None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy=strategy)
    return pm, torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-6), inputs, target


def _train(pm, optimizer, inputs, target):
    optimizer.zero_grad()
    pm.step(*inputs, target=target)
    optimizer.step()


def padded_rows_job(root):
    """Two steps on ``data=2 × tensor=2`` (32 rows per rank, the second tensor rank's last
    one padding): what the padded rows hold, the full shapes, the rank program; a
    checkpoint loaded into ``tensor=4`` (16 rows per rank)."""
    pm, optimizer, inputs, target = _build({"data": 2, "tensor": 2})
    for _ in range(2):
        _train(pm, optimizer, inputs, target)
    params = dict(pm.named_parameters())
    padding = {}  # what the padded row holds, per parameter and tensor
    for name in ("tok.weight", "lm_head.weight", "lm_head.bias"):
        p = params[name]
        tensors = {"param": p, "grad": p.grad, **optimizer.state[p]}
        padding[name] = {k: v[-1].abs().max().item() for k, v in tensors.items() if v.dim()}
    report = {"local_shapes": {n: list(params[n].shape) for n in ("tok.weight", "lm_head.weight", "lm_head.bias")},
              "padding": padding, "tensor_rank": pm.plan.rank_coordinates(torch.distributed.get_rank())["tensor"],
              "full_shapes": {k: list(v.shape) for k, v in pm.full_state_dict().items()
                              if k.startswith(("tok.", "lm_head."))},
              "code": pm.rank_graph_code()}
    autopar.save_checkpoint(pm, f"{root}/padded", optimizer)
    saved = pm.full_state_dict()
    other, other_optimizer, _, _ = _build({"data": 1, "tensor": 4}, seed=1)
    autopar.load_checkpoint(other, f"{root}/padded", other_optimizer)
    loaded = other.full_state_dict()
    report["loaded"] = sorted(k for k in saved if not torch.equal(saved[k], loaded[k]))
    _train(pm, optimizer, inputs, target)
    _train(other, other_optimizer, inputs, target)
    after, other_after = pm.full_state_dict(), other.full_state_dict()
    report["continued"] = max((after[k] - other_after[k]).abs().max().item() for k in after)
    return report


_EQUIVALENCE = shared_ranks.register(4, __name__, equivalence_job, (CASES,), timeout_s=600)
_PADDED = shared_ranks.register(4, __name__ + ".rows", padded_rows_job, (shared_ranks.scratch_dir("padded"),),
                                timeout_s=120)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{list(c[1])[0]}-{i}" for i, c in enumerate(CASES)])
def test_padded_vocabulary_matches_single_device(index):
    for rank_reports in _EQUIVALENCE():
        report = rank_reports[index]
        for key in ("output", "loss", "grad", "grad_norm"):
            assert report[key][1] < 1e-12, report
        assert report["param"][0] < 1e-12, report
    plan = _EQUIVALENCE()[0][index]["plan"]
    # the vocabulary is split, padded (63 on 2 or 4 ranks), never kept whole
    assert [line.split()[2] for line in plan.splitlines() if line.startswith("vocab:")] == ["megatron"], plan
    assert "vocab 63 padded to 64" in plan, plan


@pytest.mark.multiprocess
def test_padded_rows_stay_zero_and_the_model_sees_the_original_vocabulary():
    reports = _PADDED()
    for report in reports:
        assert report["local_shapes"] == {"tok.weight": [32, 32], "lm_head.weight": [32, 32], "lm_head.bias": [32]}
        assert report["full_shapes"] == {"tok.weight": [63, 32], "lm_head.weight": [63, 32], "lm_head.bias": [63]}
        assert report["loaded"] == [] and report["continued"] < 1e-12, report
        # the cross-entropy leaves the columns past 63 out of the softmax
        assert "vocab_parallel_cross_entropy" in report["code"] and "vocab_size = 63" in report["code"]
    last = [r for r in reports if r["tensor_rank"] == 1]
    assert len(last) == 2
    for report in last:  # row 63 of the padded 64: zero in the parameter, its gradient, Adam's moments
        for name, held in report["padding"].items():
            assert set(held) == {"param", "grad", "exp_avg", "exp_avg_sq"} and max(held.values()) == 0.0, name
    # rank 0's last row is a real one (row 31), moved by the steps
    assert all(r["padding"]["tok.weight"]["param"] > 0 for r in reports if r["tensor_rank"] == 0)


def test_padded_cut_and_its_checkpoint_boxes():
    shard = ParamShard(0, 1, "tensor", padded_vocab(63, 4))
    assert shard.padded_to == 64 and padded_vocab(64, 4) == 64 and padded_vocab(50257, 8) == 50264
    full = torch.arange(63 * 3, dtype=torch.float64).view(63, 3)
    parts = [shard.local(full, Seat({"tensor": r}, {"tensor": 4})) for r in range(4)]
    assert [list(p.shape) for p in parts] == [[16, 3]] * 4
    assert torch.equal(torch.cat(parts)[:63], full) and not parts[3][-1].any()
    # a checkpoint's index arithmetic sees the padding held by no element: the last rank
    # saves rows 48..62, the others 16 rows each
    boxes = [[(b.offsets, b.sizes) for b in placements((16, 3), (3, 1), (63, 3),
                                                        lambda x, r=r: shard.local(x, Seat({"tensor": r},
                                                                                          {"tensor": 4})))]
             for r in range(4)]
    assert boxes == [[((16 * r, 0), (16, 3))] for r in range(3)] + [[((48, 0), (15, 3))]]
    with pytest.raises(ValueError, match="longer along dim 0 than its padded length 64"):
        shard.pad(torch.zeros(65, 3))


def test_a_vocabulary_no_degree_divides_is_padded_and_split():
    from examples.factories import training_case
    factory, inputs, target, loss_fn = training_case("transformer", vocab=63)
    plan = autopar.plan(factory(), 4, inputs, loss_fn, {"data": 1, "tensor": 4}, example_target=target)
    vocab = next(r for r in plan.regions if r.kind == "vocab")
    assert vocab.strategy == "megatron" and vocab.details == {"vocab": 63, "padded_vocab": 64, "rows_per_rank": 16}
    assert "vocab:tok: vocab 63 padded to 64 (16 rows per rank)" in plan.explain()
    # the whole-3D family keeps the vocabulary replicated, priced; a mixed plan splits it
    grid = autopar.plan(factory(), 4, inputs, loss_fn, {"x": 2, "y": 2, "z": 1, "data": 1}, example_target=target)
    assert next(r for r in grid.regions if r.kind == "vocab").strategy == "replicate"


@pytest.mark.extended  # a planning of 3072 devices (the suite's padded vocabularies run on ranks above)
def test_gpt3_with_gpt2_vocabulary_plans_with_tensor_parallelism():
    """GPT-3 175B with GPT-2's vocabulary (50,257: no tensor degree divides it) on 3072
    A100s: a tensor degree above 1 all the same (4 on the fitted Selene preset; 8 on
    the preset's unfitted estimates), the embedding and head split over it, padded to
    the next multiple of the degree."""
    from examples.factories import gpt_meta
    model, inputs, loss_fn, target = gpt_meta(vocab=50257)
    plan = autopar.plan(model, 3072, inputs, loss_fn, example_target=target, hardware="a100-selene")
    t = plan.degree("tensor")
    assert t in (2, 4, 8), plan.explain()
    vocab = [r for r in plan.regions if r.kind == "vocab"]
    assert vocab and all(r.strategy == "megatron" for r in vocab)
    padded = -(-50257 // t) * t
    assert f"vocab 50257 padded to {padded} ({padded // t} rows per rank)" in plan.explain()
