"""Bad input gets a clear error naming the region, argument or construct."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
import shared_ranks
from autopar.passes.manager import PassError
from examples.coverage import is_equal
from examples.models import MLP, TinyTransformer, lm_loss


def _transformer(heads=4, width=32):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return TinyTransformer(width=width, heads=heads), (ids,), lm_loss, torch.randint(0, 64, (4, 16))


def test_forced_tensor_degree_not_dividing_heads_names_region_and_sizes():
    model, inputs, loss, target = _transformer(heads=3, width=48)
    with pytest.raises(autopar.PlanError, match=r"region attention:blocks.0.attn: attention heads = 3 is not divisible "
                                                r"by the tensor degree 2"):
        autopar.plan(model, 2, inputs, loss, {"tensor": 2}, example_target=target)


def test_forced_tensor_degree_not_dividing_hidden_width():
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 8))
    with pytest.raises(autopar.PlanError, match=r"region linear_chain:0: hidden width = 6 is not divisible "
                                                r"by the tensor degree 4"):
        autopar.plan(model, 4, (torch.randn(4, 8),), strategy={"tensor": 4})


def test_auto_never_picks_a_degree_that_does_not_divide():
    model, inputs, loss, target = _transformer(heads=3, width=48)
    plan = autopar.plan(model, 2, inputs, loss, "auto", example_target=target)
    attention = [r for r in plan.regions if r.kind == "attention"]
    assert plan.degree("tensor") == 1 or all(r.strategy == "replicate" for r in attention)
    if plan.degree("tensor") > 1:
        assert all("not divisible" in r.reason for r in attention)


def test_world_size_not_matching_forced_degrees():
    with pytest.raises(autopar.PlanError, match=r"data=2 x tensor=2 do not match the world size 8"):
        autopar.plan(MLP(), 8, (torch.randn(8, 32),), strategy={"data": 2, "tensor": 2})


def test_batch_not_divisible_by_data_degree_names_argument():
    with pytest.raises(autopar.PlanError, match=r"example_inputs: the batch 6 is not divisible by the data degree 4"):
        autopar.plan(MLP(), 4, (torch.randn(6, 32),), strategy={"data": 4})


def test_auto_skips_data_degrees_that_do_not_divide_the_batch():
    plan = autopar.plan(MLP(), 4, (torch.randn(6, 32),))
    assert 6 % plan.degree("data") == 0
    assert any("batch 6 not divisible by data degree 4" in c.reason for c in plan.candidates)


def test_dsp_of_heads_with_a_position_bias_per_head_is_refused_at_planning():
    """T5 adds a relative position bias with a row per head to the attention scores:
    D&SP of heads (which splits only the query, key and value) is refused when planning,
    naming the region and the value (and so "auto" lists the D&SP configurations as
    rejected for it), instead of a plan whose rewrite fails on every rank."""
    from examples.zoo import ZOO
    from autopar.planning.strategy import PlanError
    c = ZOO["t5"]()
    with pytest.raises(PlanError, match=r"region attention:encoder\.block\.0\.layer\.0\.SelfAttention: .* row per "
                                        r"head \(a position bias per head\)"):
        autopar.plan(c.factory(), 4, c.inputs, c.loss_fn, {"data": 4, "tensor": 1, "subgrids": 2},
                     example_target=c.target, example_kwargs=dict(c.kwargs))


def test_unknown_strategy_is_explained():
    with pytest.raises(autopar.PlanError, match=r"expected 'auto', 'data', 'tensor' or a dict"):
        autopar.plan(MLP(), 2, (torch.randn(4, 32),), strategy="pipeline-ish")
    with pytest.raises(autopar.PlanError, match=r"unknown mesh dimension\(s\) \['pipe'\]"):
        autopar.plan(MLP(), 2, (torch.randn(4, 32),), strategy={"pipe": 2})


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x).nonzero()
        return x


def test_model_neither_tracer_captures_names_class_and_construct():
    with pytest.raises(autopar.CaptureError) as info:
        autopar.plan(DataDependent(), 1, (torch.randn(2, 4),))
    message = str(info.value)
    assert "could not capture model DataDependent" in message
    assert "symbolic_trace failed" in message and "torch.export(strict=False) failed" in message
    assert "if x.sum() > 0:" in message  # the construct, with its file and line
    assert "test_errors.py" in message


def test_loss_without_target_is_explained():
    with pytest.raises(ValueError, match="example_target"):
        autopar.capture(MLP(), (torch.randn(2, 32),), F.cross_entropy)


def test_an_output_without_the_batch_is_all_reduced_or_refused_under_data():
    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).mean(0)

    class First(Pooled):
        def forward(self, x):
            return self.fc(x)[0]

    # a mean over the batch is the whole batch's: each rank's mean, averaged over the data ranks
    plan = autopar.plan(Pooled(), 2, (torch.randn(4, 4),), strategy={"data": 2})
    code = autopar.rank_graph(Pooled(), plan, 0, (torch.randn(4, 4),)).code
    assert "batch_statistic(mean, 'data')" in code
    # one row of the batch lives on one rank only
    with pytest.raises(autopar.PlanError, match=r"rows of the batch meet at getitem: .*row 0"):
        autopar.plan(First(), 2, (torch.randn(4, 4),), strategy={"data": 2})


def _step_with_other_batch():
    """The error each rank ends with: its own, or (a rank still leaving compile when the
    other already raised in step) the other's, quoted in a RankFailureError."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 32), torch.randint(0, 8, (8,))
    try:
        pm = autopar.compile(MLP(), None, example_inputs=(x,), loss_fn=F.cross_entropy, example_target=y,
                             strategy={"data": 2})
        pm.step(torch.randn(7, 32), target=torch.randint(0, 8, (7,)))
        return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


@pytest.mark.multiprocess
def test_call_time_batch_not_divisible_is_an_error_on_every_rank():
    for error in _LAUNCHED["other_batch"]():
        assert "input 0: batch 7 is not divisible by the data degree 2" in error, error


def test_dsp_errors_name_region_and_limits():
    from examples.models import Towers
    x = torch.randn(8, 16)
    with pytest.raises(autopar.PlanError, match=r"region fork_join:towers.0.0: 3 branches cannot fill 4 sub-grids"):
        autopar.plan(Towers(), 4, (x,), strategy={"data": 4, "subgrids": 4})
    with pytest.raises(autopar.PlanError, match=r"D&SP with subgrids=2 needs tensor=1"):
        autopar.plan(Towers(), 4, (x,), strategy={"data": 2, "tensor": 2, "subgrids": 2})
    with pytest.raises(autopar.PlanError, match=r"subgrids=2 asks for D&SP, but the model has no multi-branch region"):
        autopar.plan(MLP(), 2, (torch.randn(4, 32),), strategy={"data": 2, "subgrids": 2})
    with pytest.raises(autopar.PlanError, match=r"region attention:blocks.0.attn: 4 heads cannot fill 8 sub-grids"):
        autopar.plan(TinyTransformer(), 8, (torch.randint(0, 64, (8, 16)),), strategy={"data": 8, "subgrids": 8})
    with pytest.raises(autopar.PlanError, match=r"csub=True \(D&SP-cSub\) needs subgrids > 1"):
        autopar.plan(Towers(), 2, (x,), strategy={"data": 2, "csub": True})
    with pytest.raises(autopar.PlanError, match=r"D&SP of explicit branches needs a model torch.fx.symbolic_trace captures.*Use csub=True"):
        _export_only_dsp()


def _export_only_dsp():
    from autopar.trace.capture import capture
    from autopar.passes.analysis.analyse import analyse
    from autopar.cost.hardware import get_hardware
    from autopar.driver.search import plan_graph
    from examples.models import Inception
    gm = analyse(capture(Inception(), (torch.randn(4, 3, 8, 8),), tracer="export"))
    plan_graph(gm, 2, get_hardware(None), {"data": 2, "subgrids": 2})


class _RolledAttention(nn.Module):
    """Attention whose queries go through ``torch.roll``, an op with no split rule."""

    def __init__(self, width=16, heads=4):
        super().__init__()
        self.qkv, self.proj, self.heads, self.width = nn.Linear(width, 3 * width), nn.Linear(width, width), heads, width
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(self.width, dim=2))
        q = q + torch.roll(q, 1, -1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(x)))


def test_region_with_an_op_without_split_rule_falls_back_to_replication(caplog):
    x = torch.randn(4, 8, 16)
    with caplog.at_level("WARNING", logger="autopar.planning"):
        plan = autopar.plan(_RolledAttention(), 2, (x,), strategy={"tensor": 2})
    attention = next(r for r in plan.regions if r.kind == "attention")
    assert attention.strategy == "replicate"
    assert "node roll (aten.roll) has no split rule; the region stays replicated within the tensor group" in attention.reason
    assert any("attention:qkv" in m and "roll" in m for m in caplog.messages)
    assert [r.strategy for r in plan.regions if r.kind == "linear_chain"] == ["megatron"]  # the rest still splits
    assert "roll" in plan.explain()


def _rolled_training():
    from autopar.testing import compare_with_single_device
    torch.manual_seed(0)
    x, y = torch.randn(4, 8, 16), torch.randn(4, 8, 16)
    return compare_with_single_device(_RolledAttention, (x,), y, F.mse_loss, {"data": 1, "tensor": 2})


@pytest.mark.multiprocess
def test_fallback_region_trains_like_the_single_device_model():
    for report in _LAUNCHED["rolled"]():
        assert report["strategies"] == {"megatron"}
        assert is_equal(report), report


def _call_time_errors():
    from examples.factories import training_case
    factory, inputs, target, loss = training_case("transformer")
    torch.manual_seed(0)
    pm = autopar.compile(factory(), None, example_inputs=inputs, loss_fn=loss, example_target=target,
                         strategy={"data": 1, "tensor": 2})
    seen = {"shorter sequence": pm.step(inputs[0][:, :8], target=target[:, :8]).item()}
    for name, call in {"two inputs": lambda: pm.step(inputs[0], inputs[0], target=target),
                       "float ids": lambda: pm.step(inputs[0].float(), target=target),
                       "flat ids": lambda: pm(inputs[0].flatten()),
                       "too long": lambda: pm.step(torch.cat([inputs[0]] * 2, 1), target=torch.cat([target] * 2, 1))
                       }.items():
        try:
            call()
            seen[name] = "no error"
        except Exception as e:  # noqa: BLE001
            seen[name] = f"{type(e).__name__}: {e}"
    return seen


@pytest.mark.multiprocess
def test_call_time_inputs_unlike_the_example_are_explained_on_every_rank():
    for seen in _LAUNCHED["call_time"]():
        assert isinstance(seen["shorter sequence"], float)  # new shapes: the program is rebuilt, same plan
        assert "ValueError: the model was called with 2 input(s); it was compiled with 1 example input(s)" \
            in seen["two inputs"]
        assert "ValueError: input 0: dtype float32 differs from the example's int64" in seen["float ids"]
        assert "ValueError: input 0: shape [64] has 1 dimensions, the example's [4, 16] has 2" in seen["flat ids"]
        assert "CaptureError: inputs of shapes [[4, 32]] differ from the example's [[4, 16]]: autopar builds each " \
               "rank's program again for new shapes (the plan is kept), and the model cannot run at these shapes" \
            in seen["too long"]


def _different_meshes():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2,))
    x = torch.randn(4, 32)
    strategy = {"data": 2} if dist.get_rank() == 0 else {"tensor": 2}
    errors = []
    for kwargs in ({"mesh": mesh if dist.get_rank() == 0 else None}, {"mesh": None, "strategy": strategy}):
        try:
            autopar.compile(MLP(), example_inputs=(x,), **kwargs)
            errors.append("no error")
        except autopar.PlanError as e:
            errors.append(str(e))
    return errors


# every 2-rank check of this module runs in the test session's one 2-rank launch (tests/shared_ranks.py)
_LAUNCHED = {name: shared_ranks.register(2, f"{__name__}:{name}", job) for name, job in (
    ("other_batch", _step_with_other_batch), ("rolled", _rolled_training), ("call_time", _call_time_errors),
    ("meshes", _different_meshes))}


@pytest.mark.multiprocess
def test_ranks_given_different_meshes_or_strategies_all_get_the_same_error():
    results = _LAUNCHED["meshes"]()
    assert results[0] == results[1]
    mesh_error, strategy_error = results[0]
    assert mesh_error.startswith("compile(): the ranks were given different mesh: rank 0: DeviceMesh dim0=2 over "
                                 "ranks [0, 1]; rank 1: None (the default group of 2 ranks)")
    assert "rank 0: {'data': 2}; rank 1: {'tensor': 2}" in strategy_error


def test_parameters_of_a_dtype_collectives_cannot_train_are_named():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight.data = model[1].weight.data.to(torch.float8_e4m3fn)
    with pytest.raises(autopar.PlanError, match=r"parameter 1.weight is float8_e4m3fn: autopar averages gradients"):
        autopar.compile(model, None, example_inputs=(torch.randn(2, 4),))


class _ConvBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
                                    for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.mean((2, 3))


def test_batch_norm_in_training_keeps_the_batch_whole():
    x = torch.randn(8, 4, 6, 6)
    with pytest.raises(autopar.PlanError, match=r"a pipeline runs microbatches, and batch norm .* normalises over the "
                                                r"rows it sees in training mode"):
        autopar.plan(_ConvBlocks(), 2, (x,), strategy={"pipeline": 2, "data": 1})
    plan = autopar.plan(_ConvBlocks(), 4, (x,))
    assert not plan.pipeline and plan.subgrids == 1
    # in eval mode it normalises with running statistics, per sample: the planner pipelines it
    assert autopar.plan(_ConvBlocks().eval(), 4, (x,)).pipeline


class _NamedMesh:
    """A 2-D mesh's shape and names, what ``compile`` reads of a ("data", "tensor") mesh
    to fix the degrees (a live DeviceMesh needs a process group)."""

    def __init__(self, data: int, tensor: int):
        self.ndim, self.mesh_dim_names, self._sizes = 2, ("data", "tensor"), (data, tensor)

    def size(self, dim: int) -> int:
        return self._sizes[dim]


def test_a_2d_mesh_keeps_the_strategys_other_keys():
    from autopar.api import _strategy_from_mesh
    mesh = _NamedMesh(2, 2)
    assert _strategy_from_mesh(mesh, "auto") == {"data": 2, "tensor": 2}
    merged = _strategy_from_mesh(mesh, {"data": 2, "tensor": 2, "zero": 1, "microbatches": 2})
    assert merged == {"data": 2, "tensor": 2, "zero": 1, "microbatches": 2}
    parsed = autopar.Strategy.parse(merged)
    assert (parsed.data, parsed.tensor, parsed.zero, parsed.microbatches) == (2, 2, 1, 2)
    assert _strategy_from_mesh(mesh, {"zero": 3}) == {"zero": 3, "data": 2, "tensor": 2}
    with pytest.raises(ValueError, match="contradict"):
        _strategy_from_mesh(mesh, {"data": 4, "tensor": 1})
