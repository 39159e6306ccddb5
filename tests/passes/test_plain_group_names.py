"""A rank program names its groups as plain strings: the families build graph arguments
with :class:`autopar.grid.MeshAxis` members, and the rank program's pass runner turns them
into their values after every pass, in the program's graph and in every graph module
inside it (a block the recompute pass rebuilt), so no code says ``MeshAxis.TENSOR``."""
import pytest
import torch.fx as fx

import autopar
from autopar.driver.rank_program import rewrite
from autopar.trace.capture import capture
from examples.factories import training_case

GROUPS = ("tensor", "x", "y", "z")


def _graphs(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """The program's graph modules and the blocks its checkpointed calls run (``fn.body``)."""
    graphs = [m for m in gm.modules() if isinstance(m, fx.GraphModule)]
    return graphs + [n.target.body for n in gm.graph.nodes if isinstance(getattr(n.target, "body", None),
                                                                          fx.GraphModule)]


@pytest.mark.parametrize("strategy,recompute", [({"data": 1, "tensor": 2}, "full"),
                                                ({"data": 1, "tensor": 2}, "selective"),
                                                ({"x": 2, "y": 1, "z": 1}, "full")])
def test_no_program_code_names_a_mesh_axis_member(strategy, recompute):
    factory, inputs, target, loss_fn = training_case("transformer")
    model = factory()
    plan = autopar.plan(model, 2, inputs, loss_fn, strategy, example_target=target)
    gm = rewrite(capture(model, inputs, loss_fn, target), plan, 1, recompute=recompute)
    graphs = _graphs(gm)
    assert len(graphs) > 1, "the recompute pass rebuilt no block"
    if recompute == "full":   # whole blocks: they read the split regions' groups too
        assert all(any(a in GROUPS for n in m.graph.nodes for a in n.args) for m in graphs[1:])
    for m in graphs:
        assert "MeshAxis" not in m.code, m.code
        assert all(type(a) is str for n in m.graph.nodes for a in n.args if a in GROUPS)
