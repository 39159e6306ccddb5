"""What the golden tests (``tests/golden/test_golden_*.py``, one file per family) build: a plan's
explain text and rank graphs from the example factories, and the fused kernels' source.
Update a golden on purpose only: ``EXPECTTEST_ACCEPT=1 pytest tests/golden/test_golden_<family>.py``
and read the diff."""
import torch

import autopar
from autopar.engine.executable import rank_graph_code
from examples.factories import transformer


def _plan_and_graph(factory, world, strategy, rank=0):
    model, inputs, loss_fn, target = factory()
    plan = autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target)
    gm = autopar.rank_graph(model, plan, rank, inputs, loss_fn, target)
    return plan.explain(), rank_graph_code(gm, plan, rank)


class _BiasGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


class _ScaleMaskSoftmax(torch.nn.Module):
    def forward(self, scores):
        causal = torch.ones(4, 4, dtype=torch.bool).tril()
        return torch.softmax((scores * 0.5).masked_fill(~causal, float("-inf")), dim=-1)


def _fused_source(model, x) -> str:
    from autopar.trace.capture import capture
    from autopar.passes.fusion.rewrite import FUSION, fusion_pass
    gm = fusion_pass(capture(model, (x,)))
    kernel, = gm.meta[FUSION].kernels
    return kernel.source


def _one_layer_transformer():
    from examples.models import TinyTransformer, lm_loss
    model, inputs, loss_fn, target = transformer()
    torch.manual_seed(0)
    return TinyTransformer(layers=1), inputs, lm_loss, target


def _rank_graphs(factory, world, strategy, ranks=(0, 1)):
    model, inputs, loss_fn, target = factory()
    plan = autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target)
    return [rank_graph_code(autopar.rank_graph(model, plan, r, inputs, loss_fn, target), plan, r) for r in ranks]

