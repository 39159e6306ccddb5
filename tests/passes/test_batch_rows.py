"""Rows of the batch that meet (docs/batch_rows.md): every split of the batch is exact or
refused, naming the node.

Tier 1 (one process): the analysis finds each kind of meeting on small models and none on
the suite's models (a sequence as long as the batch included); the planner refuses the
splits it cannot make exact and prices the ones it can; explain says what it did.
Tier 2 (gloo ranks): a CLIP-style contrastive model (Hugging Face ``CLIPModel`` with its
labels made inside, and with the labels passed as the target), a retrieval dual encoder,
an MLP centred over the batch and a Llama-style LM with a hand-written masked mean over
very uneven padding, and losses that sum over the batch (alone, scaled, or beside a mean,
with gradient accumulation) equal the single device (float64: outputs, loss, every gradient,
parameters after 3 AdamW steps) under data parallelism on 2 ranks and under ``"auto"``
and the other families on 4, or are refused with a PlanError naming the node.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
import shared_ranks
from autopar.passes.analysis.batch_rows import couplings, find_batch_couplings_pass
from autopar.trace.capture import capture
from autopar.planning.strategy import PlanError
from examples import batch_rows as cases


def _found(model, *inputs, loss_fn=None, target=None):
    gm = capture(model, inputs, loss_fn, target)
    return [(c.kind, c.exact) for c in couplings(find_batch_couplings_pass(gm))]


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.fc(x))


X = torch.randn(6, 8)


@pytest.mark.parametrize("fn, kind, exact", [
    (lambda h: h @ h.t(), "pairwise", True),                       # read whole by the output
    (lambda h: h - h.mean(0), "batch_mean", True),
    (lambda h: h / h.sum(0, keepdim=True), "batch_sum", True),
    (lambda h: F.softmax(h, dim=0), "scan", False),
    (lambda h: h.cumsum(0), "scan", False),
    (lambda h: h[0], "index", False),
    (lambda h: h[:3], "index", False),
    (lambda h: torch.cat([h, h.flip(1)]), "concat", False),
    (lambda h: h.sort(dim=0).values, "scan", False),
    (lambda h: h / h.var(0), "reduce", False),
    (lambda h: h.t() @ h, "batch_sum", True),                      # a sum over the rows (a Gram matrix)
    (lambda h: h @ (h.t() @ h), "batch_sum", True),
    (lambda h: torch.einsum("bi,bj->ij", h, h).sum(0) + h, "batch_sum", True),
    (lambda h: h.t() @ h.flip(0), "scan", False),
    (lambda h: h[:, None, :] - h[None, :, :], "outer", False),
    (lambda h: h * torch.arange(h.shape[0])[:, None], "positional", False),
    (lambda h: h.chunk(2)[0], "index", False),
    (lambda h: h.flip(0), "scan", False),
    (lambda h: h.roll(1, 0), "scan", False),
    (lambda h: h - h.sum(0, keepdim=True) / h.shape[0], "batch_mean", True),   # each share divides by its own rows
    (lambda h: h * (h.shape[0] / 4.0), "positional", False),                   # the batch's size as a number
    (lambda h: h + torch.full((8,), h.shape[0]), "positional", False),
    (lambda h: h / torch.ones(h.shape[0]).sum(), "batch_sum", True),           # a count made at the rows' size
    (lambda h: h + torch.zeros(2, 8).index_add(0, (h[:, 0] > 0).long(), h).sum(0), "batch_sum", True),
    (lambda h: h + (torch.arange(8) < h.shape[0]).float(), "positional", False),
    (lambda h: h / (h.sum(0) / (h.shape[0] - 1)), "positional", False),        # not the rows' count itself
    (lambda h: torch.stack([h[h[:, 0].argsort()], h]).amax(0), "scan", False),  # sorted rows meet unsorted ones
    (lambda h: h.index_select(0, torch.arange(h.shape[0]).flip(0)), "scan", False),
], ids=["pairwise", "centred", "normalised-by-sum", "softmax-rows", "cumsum", "first-row", "slice", "cat",
        "sort", "var", "gram", "gram-used", "gram-einsum", "gram-flipped", "outer", "positions", "chunk", "flip",
        "roll", "sum-over-rows-count", "size-as-number", "size-as-fill", "count-of-ones", "rows-added-into-slots",
        "size-compared-with-tensor", "sum-over-rows-minus-one", "sorted-rows-stacked", "flipped-positions"])
def test_each_kind_of_meeting_is_found(fn, kind, exact):
    assert (kind, exact) in _found(_Fn(fn), X)


@pytest.mark.parametrize("fn", [
    lambda h: F.softmax(h, -1), lambda h: h - h.mean(-1, keepdim=True), lambda h: F.layer_norm(h, (8,)),
    lambda h: h.view(3, 2, 8).sum(1), lambda h: h[:, :4], lambda h: torch.cat([h, h], dim=1),
    lambda h: h.unsqueeze(1).expand(6, 3, 8).reshape(18, 8), lambda h: h.t().t(),
    lambda h: torch.zeros_like(h).scatter_add(-1, torch.arange(8).flip(0).expand_as(h), h),
    lambda h: h.new_zeros(h.shape).index_add(-1, torch.arange(8) % 3, h),
    lambda h: h + torch.zeros(h.shape[0], 8), lambda h: h.view(h.shape[0] * 2, 4).view(h.shape),
], ids=["softmax", "centred-features", "layer-norm", "pairs-of-rows-folded", "columns", "cat-features",
        "repeat-rows-major", "transpose-back", "scatter-within-rows", "index-add-within-rows", "zeros-of-rows",
        "size-in-views"])
def test_rows_kept_apart_are_not_a_meeting(fn):
    assert _found(_Fn(fn), X) == []


def test_the_loss_terms_say_which_are_sums():
    from autopar.ir import LOSS_TERMS
    gm = capture(nn.Linear(8, 3), (X,), lambda o, t: F.mse_loss(o, t) + 0.1 * o.pow(2).sum(), torch.randn(6, 3))
    find_batch_couplings_pass(gm)
    assert sorted(kind for _, kind in gm.meta[LOSS_TERMS]) == ["mean", "sum"]
    gm = capture(nn.Linear(8, 3), (X,), lambda o, t: (o - t).abs().amax(), torch.randn(6, 3))
    assert [c.kind for c in couplings(find_batch_couplings_pass(gm))] == ["reduce"]


def test_a_stage_reads_its_inputs_rows_from_the_whole_graph():
    """A sequence-first encoder returning batch-major logits, cut into two pipeline stages:
    the last stage's input is the sequence-first hidden state ``[8, 2, 32]``. Its walk
    starts from the rows the whole graph's found (dimension 1), not from the input's first
    dimension: the logits' rows are dimension 0 and no rows meet in its attention."""
    from autopar.api import _global_graph
    from autopar.ir import OUTPUT_ROWS
    from autopar.passes.analysis.analyse import analyse
    from autopar.strategies.pipeline.stages import split
    from examples.standard_layers import SEQ, VOCAB, model as layers_model
    for name in ("encoder_seq_first_export", "encoder_seq_first"):
        net = layers_model(name)
        ids = torch.randint(0, VOCAB, (2, SEQ))
        last = analyse(split(_global_graph(net, (ids,), None, None), 2)[-1].module)
        assert couplings(last) == [], name
        output = next(n for n in last.graph.nodes if n.op == "output").all_input_nodes[0]
        assert output.meta[OUTPUT_ROWS] == (0,), name


def test_the_loss_reduction_is_not_a_meeting_a_masked_mean_is():
    model = nn.Linear(8, 3)
    assert _found(model, X, loss_fn=F.cross_entropy, target=torch.randint(0, 3, (6,))) == []
    assert _found(model, X, loss_fn=lambda o, t: F.mse_loss(o, t, reduction="sum") / 7.0,
                  target=torch.randn(6, 3)) == []

    def masked(out, target):
        mask = (target >= 0).float()
        return (F.cross_entropy(out, target.clamp(min=0), reduction="none") * mask).sum() / mask.sum()
    assert _found(model, X, loss_fn=masked, target=torch.tensor([0, 1, -1, 2, -1, 1])) == [("masked_mean", True)]


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5_labels", "resnet", "bert_mlm"])
def test_the_suites_models_have_no_meeting(name):
    """The zoo's models split the batch as before; T5 at batch 8 has a sequence of 8 too, so
    its relative-position aranges are as long as the batch."""
    from examples.zoo import OWN_LOSS, ZOO
    case = (ZOO.get(name) or OWN_LOSS[name])()
    gm = capture(case.factory(), case.inputs, case.loss_fn, case.target, example_kwargs=case.kwargs,
                 model_loss="required" if case.loss_fn is None else None)
    assert couplings(find_batch_couplings_pass(gm)) == []


def test_a_sequence_as_long_as_the_batch_is_not_the_batch():
    """Positions along the sequence (``arange(T)``, the causal mask, rotary tables) are as long
    as the batch when T = B: they must not be read as the batch's rows."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
    ids = torch.randint(0, 64, (16, 16))
    gm = capture(model, (), example_kwargs={"input_ids": ids, "labels": ids}, model_loss="required")
    assert couplings(find_batch_couplings_pass(gm)) == []


@pytest.mark.parametrize("arch", ["gemma2", "bloom", "phi3"])
def test_causal_lms_with_padding_at_a_sequence_as_long_as_the_batch_have_no_meeting(arch):
    """Gemma 2 (soft-capped scores, rotary keys), BLOOM (ALiBi through baddbmm) and Phi-3, with
    a padding mask: their masks index the batch by position and the sequence by position."""
    import transformers as T
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  max_position_embeddings=32)
    model = {"gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**common, num_key_value_heads=2, head_dim=8)),
             "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4)),
             "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**common, num_key_value_heads=2, pad_token_id=0))}[arch]
    torch.manual_seed(0)
    ids, mask = torch.randint(3, 60, (8, 8)), torch.ones(8, 8, dtype=torch.long)
    mask[1, 4:] = 0
    gm = capture(model(), (), example_kwargs={"input_ids": ids, "attention_mask": mask, "labels": ids},
                 model_loss="required")
    assert couplings(find_batch_couplings_pass(gm)) == []


def test_the_contrastive_models_are_read_as_exact_pairwise_scores():
    for name in ("clip", "clip_target", "dual_encoder"):
        factory, inputs, target, loss_fn, kwargs = cases.CASES[name]()
        gm = capture(factory(), inputs, loss_fn, target, example_kwargs=kwargs,
                     model_loss="required" if loss_fn is None else None)
        found = couplings(find_batch_couplings_pass(gm))
        assert [(c.kind, c.remedy) for c in found] == [("pairwise", "gather")], (name, found)
        if name != "clip_target":   # labels arange(batch) made inside: offset by the rank's first row
            assert found[0].details["offset_targets"], found[0]


def _plan(name, world, strategy):
    factory, inputs, target, loss_fn, kwargs = cases.CASES[name]()
    return autopar.plan(factory(), world, inputs, loss_fn, strategy, example_target=target, example_kwargs=kwargs)


@pytest.mark.parametrize("strategy, split", [
    ({"data": 4, "microbatches": 2}, "2 microbatches"),
    ({"data": 4, "subgrids": 2}, "D&SP's branches"),
    ({"x": 2, "y": 1, "z": 2}, "rows over z = 2"),
])
def test_splits_without_an_exact_remedy_are_refused_naming_the_node(strategy, split):
    with pytest.raises(PlanError, match=rf"rows of the batch meet at matmul .module clip.*{split}"):
        _plan("clip", 4, strategy)


def test_a_meeting_without_remedy_refuses_every_batch_split_and_auto_keeps_the_batch_whole():
    class Sorted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))).sort(dim=0).values
    args = (Sorted(), 4, (torch.randn(8, 8),), F.mse_loss)
    with pytest.raises(PlanError, match=r"rows of the batch meet at sort.*4 data ranks.*keep the batch whole"):
        autopar.plan(*args, {"data": 4}, example_target=torch.randn(8, 8))
    plan = autopar.plan(*args, "auto", example_target=torch.randn(8, 8))
    assert plan.batch_parts() == 1 and plan.microbatches == 1 and not plan.pipeline, plan.mesh
    assert "rows of the batch meet at 1 node(s)" in plan.explain() and "keeps the batch whole" in plan.explain()


def test_the_plan_prices_and_explains_the_gather():
    plan = _plan("clip", 4, {"data": 4})
    text = plan.explain()
    assert "rows of the batch meet at 1 node(s)" in text and "splits the batch over 4 data ranks" in text
    assert "operands all-gathered" in text
    assert plan.batch_couplings[0]["kind"] == "pairwise" and plan.batch_couplings[0]["remedy"] == "gather"
    saved = autopar.planning.plan.Plan.from_json(plan.to_json())
    assert saved.batch_couplings == plan.batch_couplings


# ---------------------------------------------------------------------- tier 2: gloo ranks

WORLD_2 = [("clip", {"data": 2}), ("clip_target", {"data": 2}), ("dual_encoder", {"data": 2}),
           ("centred", {"data": 2}), ("masked_lm", {"data": 2}), ("summed_loss", {"data": 2}),
           ("mean_plus_sum", {"data": 2, "microbatches": 2}), ("running_norm", {"data": 2}),
           ("whitened", {"data": 2}), ("bag_retrieval", {"data": 2}), ("running_blocks", {"pipeline": 2}),
           ("conv_bn", {"data": 2}), ("counted_plus_penalty", {"data": 2}), ("size_scaled", {"data": 2})]
WORLD_4 = [("clip", "auto"), ("masked_lm", {"data": 2, "tensor": 2}), ("masked_lm", {"pipeline": 2, "data": 2}),
           ("gcn", "auto")]
EXTENDED = [("dual_encoder", "auto"), ("running_norm", "auto"), ("bag_retrieval", "auto"), ("clip_target", "auto"), ("centred", "auto"), ("masked_lm", "auto"), ("clip", {"data": 2, "tensor": 2}),
            ("dual_encoder", {"data": 4, "zero": 1}), ("centred", {"data": 4, "microbatches": 2}),
            ("clip", {"pipeline": 2, "microbatches": 2}), ("running_norm", {"data": 2, "microbatches": 2}),
            ("gcn", {"data": 4})]

_world_2 = shared_ranks.register(2, __name__, cases.equivalence_job, (WORLD_2,), timeout_s=600)
_world_4 = shared_ranks.register(4, __name__, cases.equivalence_job, (WORLD_4,), timeout_s=600)
_extended = shared_ranks.register(4, __name__ + ":extended", cases.equivalence_job, (EXTENDED,), timeout_s=900,
                                  extended=True)

REFUSED = {("masked_lm", "{'pipeline': 2, 'data': 2}"): "a pipeline's stages over 2 data ranks",
           ("centred", "{'data': 4, 'microbatches': 2}"): "not across 2 microbatches",
           ("clip", "{'pipeline': 2, 'microbatches': 2}"): "not across 2 microbatches",
           ("running_norm", "{'data': 2, 'microbatches': 2}"): "not across 2 microbatches",
           ("gcn", "{'data': 4}"): "4 data ranks would not equal the single device",
           ("size_scaled", "{'data': 2}"): "the model uses the batch's size as a number: its capture at 4 rows"}


def _check(case, reports):
    name, strategy = case
    refused = REFUSED.get((name, str(strategy)))
    for report in reports:
        if refused:
            assert "error" in report and refused in report["error"], report
            continue
        assert "error" not in report, report
        for key in ("output", "loss", "grad", "param"):
            assert report[key][1] < 1e-11, (key, report[key], report.get("worst_" + key), report["mesh"])
        assert report["grad_norm"][1] < 1e-12, report["grad_norm"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_2)), ids=[f"{m}-{s}" for m, s in WORLD_2])
def test_two_ranks_split_the_batch_exactly(index):
    """Before the analysis, CLIP under data 2 ran without an error and its loss was the mean
    of two per-rank contrastive losses (87% off the single device's)."""
    _check(WORLD_2[index], [reports[index] for reports in _world_2()])


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_4)), ids=[f"{m}-{s}" for m, s in WORLD_4])
def test_four_ranks_equal_or_refuse(index):
    _check(WORLD_4[index], [reports[index] for reports in _world_4()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[f"{m}-{s}" for m, s in EXTENDED])
def test_four_ranks_every_family(index):
    _check(EXTENDED[index], [reports[index] for reports in _extended()])


def test_a_statistic_the_forward_updates_in_place_is_captured_with_every_update():
    """Symbolic tracing runs ``self.mean.mul_(0.9)`` (constant arguments) instead of recording
    it: the capture sees the buffer changed and takes torch.export, which records the update
    under its torch.no_grad(); the mean over the batch it adds is a batch statistic, made
    exact over data ranks by an all-reduce."""
    factory, inputs, target, loss_fn, _ = cases.CASES["running_norm"]()
    model = factory()
    gm = capture(model, inputs, loss_fn, target)
    info = gm.meta["autopar.capture"]
    assert info.tracer == "export" and "changes model.mean in place" in info.symbolic_trace_error
    code = gm.code
    assert "mul_" in code and "add_" in code and "_set_grad_enabled(False)" in code
    assert torch.equal(model.mean, torch.zeros(16))   # the capture left the buffer as it was
    assert [(c.kind, c.remedy) for c in couplings(find_batch_couplings_pass(gm))] == [("batch_mean", "all_reduce")]


class _Towers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        return self.a(x), self.b(x)


_Y = torch.randn(6, 4)


@pytest.mark.parametrize("loss, found, terms", [
    (lambda o, t: F.kl_div(o[0].log_softmax(-1), t.softmax(-1), reduction="batchmean"), [], {"mean"}),
    (lambda o, t: (o[0] - t).pow(2).sum() / o[0].shape[0], [], {"mean"}),           # a sum over the rows' count
    (lambda o, t: F.mse_loss(o[0], t, reduction="sum") / 7.0, [], {"sum"}),
    (lambda o, t: ((o[0].mean(0) - o[1].mean(0)) ** 2).sum(), [("batch_mean", True)] * 2, {"mean"}),   # MMD
    (lambda o, t: (torch.log((o[0] @ o[1].T).exp().sum(-1)) - (o[0] * o[1]).sum(-1)).mean(),
     [("pairwise", True)], {"mean"}),                                                # InfoNCE by hand
    (lambda o, t: F.cross_entropy(o[0] @ o[1].T, torch.arange(6).flip(0)),            # labels folded to a constant
     [("pairwise", False), ("positional", False)], {"mean"}),
    (lambda o, t: F.triplet_margin_loss(o[0], o[1], o[1][torch.arange(6).roll(1)]), [("index", False)], {"mean"}),
    (lambda o, t: F.cosine_similarity(o[0].unsqueeze(1), o[1].unsqueeze(0), dim=2).mean(), [("outer", False)],
     set()),
    (lambda o, t: torch.cdist(o[0], o[1]).mean(), [("outer", False)], set()),
    (lambda o, t: (o[0].tril() * o[1]).sum(-1).mean(), [("positional", False)], {"mean"}),
    (lambda o, t: F.mse_loss(o[0], t) * F.l1_loss(o[1], t), [("batch_mean", True)] * 2, set()),
    (lambda o, t: F.pairwise_distance(o[0], o[1]).mean(), [], {"mean"}),
    (lambda o, t: F.mse_loss(o[0], t, reduction="sum") / 6.0, [], {"sum"}),   # a literal as large as the batch
    (lambda o, t: (o[0] - t).pow(2).sum() / t.numel(), [], {"mean"}),
    (lambda o, t: F.mse_loss(o[0], t) * o[0].shape[0], [("positional", False)], {"mean"}),
], ids=["kl-batchmean", "sum-over-rows", "scaled-sum", "mmd", "infonce", "flipped-labels", "rolled-negatives",
        "cosine-pairs", "cdist", "tril", "product-of-losses", "pairwise-distance", "sum-over-literal-batch",
        "sum-over-numel", "mean-times-batch-size"])
def test_losses_that_read_rows(loss, found, terms):
    """Each loss is a mean, a sum, exact by a remedy, or refused: never read as another."""
    from autopar.ir import LOSS_TERMS
    gm = find_batch_couplings_pass(capture(_Towers(), (X,), loss, _Y))
    assert [(c.kind, c.exact) for c in couplings(gm)] == found
    assert {kind for _, kind in gm.meta[LOSS_TERMS]} == terms
