"""Pipelines over stacks that repeat with a period: units of several unlike layers
(Jamba's Mamba and attention layers, an attention block and an MLP block in turn) are
the blocks the pipeline cuts between, never inside; each unit is priced by what it
holds. Hand-written stacks of period 2 and 3 (with a layer before or after the units),
and Hugging Face's Jamba, train on 2 gloo ranks in float64 as on one process."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
import shared_ranks
from autopar.api import _global_graph
from autopar.ir import regions
from autopar.passes.analysis.flops import node_flops
from autopar.passes.analysis.naming import module_paths
from autopar.strategies.pipeline.stages import partition

VOCAB, WIDTH, SEQ = 64, 32, 8


class Attn(nn.Module):
    """A pre-norm single-head attention block with its residual."""

    def __init__(self, d: int = WIDTH):
        super().__init__()
        self.norm, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return x + self.proj(weights @ v)


class Mlp(nn.Module):
    """A pre-norm MLP block with its residual (``hidden``: its width inside)."""

    def __init__(self, d: int = WIDTH, hidden: int = 64):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _layer(letter: str) -> nn.Module:
    return {"a": Attn, "m": Mlp, "w": lambda: Mlp(hidden=96)}[letter]()


class Periodic(nn.Module):
    """A language model whose ``layers`` are ``pattern`` (``a``: attention, ``m``: MLP,
    ``w``: a wider MLP) ``units`` times, after ``prefix`` and before ``suffix``."""

    def __init__(self, pattern: str = "am", units: int = 2, prefix: str = "", suffix: str = ""):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(_layer(c) for c in prefix + pattern * units + suffix)
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _ids():
    return torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))


def _blocks(model):
    ids = _ids()
    gm = _global_graph(model, (ids,), lm_loss, ids)
    return gm, regions(gm, "block")


def _layer_of(node) -> int | None:
    """The index in ``layers`` of the layer a node was traced in."""
    for path in module_paths(node):
        parts = path.split(".")
        if len(parts) >= 3 and parts[-2] == "layers" and parts[-1].isdigit():
            return int(parts[-1])
    return None


def test_a_stack_of_period_two_gives_one_block_per_unit():
    gm, found = _blocks(Periodic("am", 3))
    assert [r.id for r in found] == ["block:layers.0-1", "block:layers.2-3", "block:layers.4-5"]
    assert all(r.details["period"] == 2 and r.details["module_class"] == "Attn+Mlp" for r in found)
    assert found[1].details["layers"] == ["model.layers.2", "model.layers.3"]
    assert len({r.details["signature"] for r in found}) == 1
    # a unit is priced by what it holds: its attention and its MLP, not its first layer twice
    table = {n.name: n for n in gm.graph.nodes}
    per_layer: dict[int, float] = {}
    for n in gm.graph.nodes:
        if _layer_of(n) is not None and n.op != "get_attr":
            per_layer[_layer_of(n)] = per_layer.get(_layer_of(n), 0) + node_flops(gm, n)
    assert per_layer[0] != per_layer[1]
    assert found[0].details["flops"] == per_layer[0] + per_layer[1]
    assert sum(node_flops(gm, table[name]) for name in found[0].nodes) == per_layer[0] + per_layer[1]
    assert found[0].details["params"] == sum(p.numel() for m in (Attn(), Mlp()) for p in m.parameters())


def test_the_period_covering_the_stack_wins_over_a_shorter_run():
    # Attn, Mlp, Mlp repeated: two identical Mlps in a row are a run of period 1 covering
    # 2 layers; the period 3 covers all 6
    _, found = _blocks(Periodic("amm", 2))
    assert [r.id for r in found] == ["block:layers.0-2", "block:layers.3-5"]
    assert found[0].details["module_class"] == "Attn+Mlp+Mlp" and found[0].details["period"] == 3


def test_identical_layers_keep_one_block_per_layer():
    _, found = _blocks(Periodic("m", 4))
    assert [r.id for r in found] == [f"block:layers.{i}" for i in range(4)]
    assert all("period" not in r.details for r in found)


@pytest.mark.parametrize("prefix,suffix,ids", [
    ("w", "", ["block:layers.1-2", "block:layers.3-4"]),
    ("", "w", ["block:layers.0-1", "block:layers.2-3"]),
    ("", "a", ["block:layers.0-1", "block:layers.2-3"])])
def test_a_layer_outside_the_units_is_in_no_block(prefix, suffix, ids):
    _, found = _blocks(Periodic("am", 2, prefix, suffix))
    assert [r.id for r in found] == ids


def test_an_mlp_body_is_no_stack_of_units():
    # Linear, GELU, Linear twice repeats with period 3, but GELU holds no parameters: it is
    # part of a layer, not one (the MLP's Sequential stays one piece)
    from examples.models import MLP
    x = torch.randn(4, 32)
    gm = _global_graph(MLP(depth=2), (x,), None, None)
    assert regions(gm, "block") == []


def _stage_of_layers(model, stages: int) -> dict[int, set[int]]:
    gm, _ = _blocks(model)
    part = partition(gm, stages)
    table = {n.name: n for n in gm.graph.nodes}
    out: dict[int, set[int]] = {}
    for name, stage in part.stage_of.items():
        layer = _layer_of(table[name])
        if layer is not None:
            out.setdefault(layer, set()).add(stage)
    return out


@pytest.mark.parametrize("pattern,units,stages", [("am", 3, 2), ("amm", 2, 2), ("am", 4, 3)])
def test_stage_cuts_fall_between_units(pattern, units, stages):
    layers = _stage_of_layers(Periodic(pattern, units), stages)
    k = len(pattern)
    assert all(len(s) == 1 for s in layers.values()), layers   # no layer split over stages
    for unit in range(units):   # every layer of a unit on one stage
        assert len({next(iter(layers[unit * k + j])) for j in range(k)}) == 1, (unit, layers)
    assert {next(iter(s)) for s in layers.values()} == set(range(stages))


def test_the_plan_names_the_units_and_puts_odd_layers_on_the_ends():
    ids = _ids()
    plan = autopar.plan(Periodic("am", 2, "w", "w"), 2, (ids,), lm_loss, {"pipeline": 2, "microbatches": 2},
                        example_target=ids)
    assert plan.pipeline["blocks"] == ["block:layers.1-2", "block:layers.3-4"]
    assert plan.pipeline["assignment"] == [0, 1]
    layers = _stage_of_layers(Periodic("am", 2, "w", "w"), 2)
    assert layers[0] == {0} and layers[5] == {1}   # the odd first layer on the first stage, the last on the last
    assert "block:layers.1-2" in plan.explain()


def test_a_stack_without_a_repeating_unit_is_refused_naming_it():
    ids = _ids()
    with pytest.raises(autopar.PlanError, match=r"no repeated blocks to cut between .* units of a few children "
                                                r".* Its stacks of modules: layers: Attn, Mlp, Attn"):
        autopar.plan(Periodic("am", 1, suffix="a"), 2, (ids,), lm_loss, {"pipeline": 2}, example_target=ids)


# --- training on 2 ranks against one process ---------------------------------------------

# (pattern, units, prefix, suffix, recompute): with "amm" each stage holds one unit (whose
# two Mlps alone would be a run of period 1), recomputed in backward as one
HAND = [("am", 2, "", "", None), ("amm", 2, "", "", None), ("am", 2, "w", "w", None), ("amm", 2, "", "", "full")]


def hand_written_job(cases) -> list[dict]:
    from autopar.testing import compare_with_single_device, reported_in
    ids = _ids()
    rows = []
    for pattern, units, prefix, suffix, recompute in cases:
        row: dict = {}
        with reported_in(row, f"{prefix}{pattern}x{units}{suffix}"):
            report = compare_with_single_device(lambda: Periodic(pattern, units, prefix, suffix), (ids,), ids,
                                                lm_loss, {"pipeline": 2, "microbatches": 2}, dtype=torch.float64,
                                                recompute=recompute)
            row.update({k: report[k] for k in ("mesh", "output", "loss", "grad", "param")})
            row["recomputed"] = report.get("recomputed")
        rows.append(row)
    return rows


_HAND = shared_ranks.register(2, __name__, hand_written_job, (HAND,), timeout_s=300)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(HAND)), ids=["".join(map(str, c)) for c in HAND])
def test_hand_written_periodic_stacks_train_as_on_one_device(index):
    for rank_rows in _HAND():
        row = rank_rows[index]
        shared_ranks.assert_as_on_one_device(row, HAND[index])
        assert row["mesh"] == {"pipeline": 2, "data": 1, "tensor": 1}
        if HAND[index][-1] == "full":   # one unit per stage, recomputed as one
            assert row["recomputed"] == 1, row["recomputed"]


JAMBA = [{"pipeline": 2, "microbatches": 2}, "auto", {"data": 2}]


def _jamba_split_error() -> float:
    """The largest relative gradient difference (per tensor, as ``autopar.testing``
    measures) between Jamba's full-batch gradients and the sum of its two half-batches' on
    one process: Mamba's ``D`` and ``A_log`` gradients (about 1e-6) are sums of far larger
    terms that cancel, so the order of the sum moves them by about 5e-8 of themselves in
    float64. A plan that splits the batch (microbatches, data ranks) sums in that order."""
    from examples.peers.hf_models import build, logits_loss
    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build("jamba").double()

    def grads(parts):
        model.zero_grad()
        for rows in parts:
            (logits_loss(model(ids[rows]), ids[rows]) * (len(ids[rows]) / len(ids))).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    whole, halves = grads([slice(0, 4)]), grads([slice(0, 2), slice(2, 4)])
    return max(((whole[k] - halves[k]).abs().max() / whole[k].abs().max()).item() for k in whole)


def jamba_job(strategies) -> list[dict]:
    from examples.peers.hf_models import hf_job
    rows = hf_job([("jamba", s) for s in strategies])
    split = _jamba_split_error()
    for row in rows:
        row["split_error"] = split
    return rows


_JAMBA = shared_ranks.register(2, __name__ + ":extended", jamba_job, (JAMBA,), timeout_s=900, extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(JAMBA)), ids=[str(s) for s in JAMBA])
def test_jamba_trains_as_on_one_device(index):
    """Outputs and loss exactly; gradients within twice the single process's own
    difference between the whole batch and two halves (:func:`_jamba_split_error`),
    and the parameters after three AdamW steps, whose ``eps=1e-6`` is the size of those
    gradients, within 1e-6."""
    for rank_rows in _JAMBA():
        row = rank_rows[index]
        assert "error" not in row, row.get("traceback")
        assert 0 < row["split_error"] < 1e-6
        for kind, bound in (("output", 1e-12), ("loss", 1e-12), ("grad", 2 * row["split_error"] + 1e-12),
                            ("param", 1e-6)):
            assert row[kind][1] <= bound, (JAMBA[index], kind, row[kind])
        if JAMBA[index] != "auto":
            assert row["mesh"] == ({"pipeline": 2, "data": 1, "tensor": 1} if "pipeline" in JAMBA[index]
                                   else {"data": 2, "tensor": 1}), row["mesh"]


def test_jamba_is_cut_between_its_mamba_and_attention_units():
    pytest.importorskip("transformers")
    from examples.peers.hf_models import build, logits_loss
    ids = torch.randint(0, VOCAB, (4, 8))
    plan = autopar.plan(build("jamba"), 2, (ids,), logits_loss, {"pipeline": 2, "microbatches": 2},
                        example_target=ids)
    assert plan.pipeline["blocks"] == ["block:model.layers.0-1", "block:model.layers.2-3"]
    assert plan.pipeline["assignment"] == [0, 1]
