"""The export memo (autopar/trace/memo.py ``ExportMemo``): a capture that repeats an
earlier one of the same model (same state, same input shapes and constants, same loss)
is replayed from the exported program instead of traced again; anything that can change
the graph makes a fresh capture, and each replay is a module of its own."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.trace.capture import capture
from autopar.trace.memo import EXPORTS
from autopar.ir import CAPTURE, SPEC


class _Branchy(nn.Module):
    """Exported (``symbolic_trace`` cannot branch on a shape), with branches on the
    shape and on a plain attribute, as Hugging Face models have."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.scale = 1.0

    def forward(self, x, mask):
        h = self.norm(self.fc(x))
        if self.scale != 1.0:
            h = h * self.scale
        if x.shape[0] > 4:
            return h
        return h * mask


def _ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _capture(model, x, mask, **kw):
    return capture(model, (x, mask), tracer="export", **kw)


def test_a_repeated_capture_is_replayed_and_each_replay_is_its_own_module():
    model, x, ones = _Branchy(), torch.randn(4, 8), torch.ones(4, 8)
    first = _capture(model, x, ones)
    assert first.meta[CAPTURE].tracer == "export"
    hits = EXPORTS.hits
    second = _capture(model, torch.randn(4, 8), torch.zeros(4, 8))  # other values, same shapes
    assert EXPORTS.hits == hits + 1
    assert second is not first and second.graph is not first.graph
    assert _ops(second) == _ops(first) and second.meta[CAPTURE] == first.meta[CAPTURE]
    assert [n.meta.get(SPEC) for n in second.graph.nodes] == [n.meta.get(SPEC) for n in first.graph.nodes]
    # the parameters are the model's own, as a fresh export's are
    assert second.get_parameter("model.fc.weight") is model.fc.weight
    # rewriting one replay leaves the next one whole
    for node in list(second.graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.mul.Tensor:
            node.meta["autopar.test"] = "touched"
    second.graph.erase_node(next(n for n in second.graph.nodes if n.op == "output"))
    third = _capture(model, x, ones)
    assert _ops(third) == _ops(first)
    assert all("autopar.test" not in n.meta for n in third.graph.nodes)
    # the batch norm's running statistics are left as they were, replayed or not
    assert torch.equal(model.norm.running_mean, torch.zeros(8)) and int(model.norm.num_batches_tracked) == 0


def test_anything_that_can_change_the_graph_makes_a_fresh_capture():
    model, x, ones = _Branchy(), torch.randn(4, 8), torch.ones(4, 8)
    masked = _ops(_capture(model, x, ones))
    hits = EXPORTS.hits
    assert _ops(_capture(model, torch.randn(6, 8), torch.ones(6, 8))) != masked  # other shapes: the other branch
    model.scale = 2.0  # a plain attribute the forward reads
    assert _ops(_capture(model, x, ones)) != masked
    model.eval()  # the mode (batch norm's statistics)
    _capture(model, x, ones)
    model.train()
    model.fc.weight = nn.Parameter(torch.randn(8, 8))  # another parameter object
    _capture(model, x, ones)
    _capture(model, x, ones, loss_fn=F.mse_loss, example_target=torch.randn(4, 8))  # with a loss
    with torch.no_grad():
        _capture(model, x, ones)  # another grad mode
    assert EXPORTS.hits == hits


def test_the_model_is_not_kept_alive_by_the_memo():
    import gc
    import weakref
    model = _Branchy()
    _capture(model, torch.randn(4, 8), torch.ones(4, 8))
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
