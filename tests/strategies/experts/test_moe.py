"""Sparse mixture-of-experts: Hugging Face ``MixtralForCausalLM`` (top-2 routing over 4
experts whose weights are 3-D tensors applied by a grouped matmul) captured, planned and
trained on 4 gloo ranks like the single-device model, under data × tensor (the
attention heads and every expert's MLP split Megatron-style, the router replicated), a
2-stage pipeline, and with the router's load-balancing loss under tensor 4 and data 4.
One spawn runs every case."""
import pytest
import torch
import torch.nn as nn

import shared_ranks

HIDDEN, EXPERTS, INTERMEDIATE = 32, 4, 64


def mixtral_config(kv_heads: int = 2, router_logits: bool = False):
    from transformers import MixtralConfig
    return MixtralConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, intermediate_size=INTERMEDIATE, max_position_embeddings=16,
                         num_local_experts=EXPERTS, num_experts_per_tok=2, use_cache=False,
                         output_router_logits=router_logits, router_aux_loss_coef=0.02)


def mixtral():
    from transformers import MixtralForCausalLM
    return MixtralForCausalLM(mixtral_config())


class MixtralWithAux(nn.Module):
    """Mixtral returning its logits and its router's load-balancing loss (the router
    logits themselves are [tokens, experts], not batch-major, so they stay inside)."""

    def __init__(self, kv_heads: int = 4):
        super().__init__()
        from transformers import MixtralForCausalLM
        self.model = MixtralForCausalLM(mixtral_config(kv_heads, router_logits=True))

    def forward(self, input_ids):
        out = self.model(input_ids)
        return out.logits, out.aux_loss


class FusedGateUpMLP(nn.Module):
    """A gated MLP with one fused gate/up projection (as Phi-3 writes it, and as each
    Mixtral expert is): a column linear holding 2 blocks."""

    def __init__(self):
        super().__init__()
        self.gate_up = nn.Linear(16, 2 * 32, bias=False)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


def loss_with_aux(output, target):
    from examples.zoo import logits_loss
    logits, aux = output
    return logits_loss(logits, target) + 0.02 * aux


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def _diff(a, b) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def _aux_job(strategy) -> dict:
    """Loss and gradients of one ``pm.step`` with the aux loss against the single device's
    whole batch; ``aux_matters``: how far the mean of the 4 batch shards' losses (what
    DDP computes: the load-balancing loss is not a mean over rows) is from it."""
    import copy

    import autopar
    from autopar.testing import _fingerprint
    x, y = _batch(1)
    torch.manual_seed(0)
    model = MixtralWithAux()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, example_inputs=(x,), loss_fn=loss_with_aux, example_target=y, strategy=strategy)
    loss = pm.step(x, target=y)
    whole = loss_with_aux(reference(x), y)
    shards = [loss_with_aux(reference(x[i:i + 1]), y[i:i + 1]) for i in range(4)]
    per_shard = torch.stack(shards).mean()
    expected = whole
    expected.backward()
    grads = pm.full_gradients()
    return {"mesh": dict(pm.plan.mesh), "loss": _diff(loss, expected),
            "aux_matters": _diff(whole, per_shard),
            "grad": max(_diff(grads[n], p.grad) for n, p in reference.named_parameters()),
            # what this rank computed, compared between ranks (test_every_rank_agrees)
            "computed": {"loss": _fingerprint(loss), "grad": {n: _fingerprint(g) for n, g in grads.items()}}}


# what a row keeps of compare_with_single_device's report: the differences from the single
# device, the worst tensors, and what this rank computed (compared between ranks)
_COMPARED = ("output", "loss", "grad", "grad_norm", "param", "worst_grad", "worst_param", "computed")


def moe_job(cases) -> list[dict]:
    import autopar
    from autopar.testing import _fingerprint, compare_with_single_device
    from examples.zoo import logits_loss
    x, y = _batch(1)
    other, _ = _batch(2)  # other tokens: other experts chosen
    rows = []
    for strategy in cases:
        if isinstance(strategy, tuple) and strategy[0] == "aux":
            rows.append({"case": strategy, **_aux_job(strategy[1])})
            continue
        if isinstance(strategy, tuple) and strategy[0] == "fused":
            g = torch.Generator().manual_seed(3)
            report = compare_with_single_device(FusedGateUpMLP, (torch.randn(8, 16, generator=g),),
                                                torch.randn(8, 16, generator=g), nn.functional.mse_loss, strategy[1])
            rows.append({"case": strategy, **{k: report[k] for k in ("mesh", "strategies", *_COMPARED)}})
            continue
        report = compare_with_single_device(mixtral, (x,), y, logits_loss, strategy)
        row = {"case": strategy, **{k: report[k] for k in ("mesh", "strategies", "tracer", *_COMPARED)}}
        if strategy != {"tensor": 2}:  # the routing check below is the capture's, one plan is enough
            rows.append(row)
            continue
        # the routing is computed in the graph, not baked from the example: a fresh
        # compile answers other tokens as the single-device model does
        torch.manual_seed(0)
        model = mixtral()
        reference = mixtral()
        reference.load_state_dict(model.state_dict())
        pm = autopar.compile(model, example_inputs=(x,), loss_fn=logits_loss, example_target=y, strategy=strategy)
        with torch.no_grad():
            logits = pm(other).logits
            row["other_tokens"] = _diff(logits, reference(other).logits)
        row["computed"] = {**row["computed"], "other_tokens": _fingerprint(logits)}
        row["regions"] = {r.region: r.strategy for r in pm.plan.regions}
        row["experts_shape"] = tuple(dict(pm.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"].shape) \
            if pm.plan.degree("tensor") > 1 else None
        rows.append(row)
    return rows


# "auto" picks one of these plans on 4 ranks (checked by hand); every plan is run explicitly
# (data parallelism trains Mixtral in the aux-loss case, against the whole batch's)
CASES = [{"tensor": 2}, {"pipeline": 2}, ("aux", {"tensor": 4}), ("aux", "data"), ("fused", {"tensor": 4})]


# the 4-rank launch is shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = shared_ranks.register(4, __name__, moe_job, (CASES,), timeout_s=900)


@pytest.fixture(scope="module")
def rows():
    return _LAUNCHED()


def _close(row) -> bool:
    """Every tensor within the coverage suite's float32 tolerances (examples/coverage.py)."""
    from examples.coverage import is_equal
    return is_equal(row)


@pytest.mark.multiprocess
def test_mixtral_trains_like_the_single_device_model_under_every_plan(rows):
    trained = [r for r in rows[0] if not isinstance(r["case"], tuple)]
    assert [r["case"] for r in trained] == CASES[:2]
    for row in trained:
        assert row["tracer"] == "export"
        assert _close(row), row
    routed = next(r for r in trained if r["case"] == {"tensor": 2})
    assert routed["other_tokens"] < 1e-5, routed


@pytest.mark.multiprocess
def test_megatron_splits_attention_and_every_experts_mlp_and_keeps_the_router(rows):
    row = next(r for r in rows[0] if r["case"] == {"tensor": 2})
    assert row["mesh"] == {"data": 2, "tensor": 2}
    experts = [rid for rid in row["regions"] if rid.startswith("linear_chain:model.layers.") and rid.endswith(".mlp.experts")]
    attention = [rid for rid in row["regions"] if rid.startswith("attention:")]
    assert len(experts) == 2 and len(attention) == 2
    assert all(row["regions"][rid] == "megatron" for rid in experts + attention)
    # every expert keeps half of its gate and half of its up rows: [experts, 2 * 64 / 2, hidden]
    assert row["experts_shape"] == (EXPERTS, INTERMEDIATE, HIDDEN)


@pytest.mark.multiprocess
def test_the_pipeline_plan_has_two_stages(rows):
    by_case = {str(r["case"]): r for r in rows[0]}
    assert by_case[str({"pipeline": 2})]["mesh"].get("pipeline") == 2


@pytest.mark.multiprocess
def test_router_aux_loss_is_the_single_device_one_without_data_parallelism(rows):
    tensor = next(r for r in rows[0] if r["case"] == ("aux", {"tensor": 4}))
    assert tensor["mesh"] == {"data": 1, "tensor": 4}
    assert tensor["loss"] < 1e-5 and tensor["grad"] < 1e-5, tensor


@pytest.mark.multiprocess
def test_router_aux_loss_under_data_parallelism_is_the_whole_batchs(rows):
    """Each replica's load-balancing statistics are of its own rows; autopar makes them
    the whole batch's (their mean over the data ranks, strategies/data/rewrite.py
    ``sync_router_statistics``), so the loss and gradients are the single device's, not
    the mean of the replicas' losses (which DDP would give)."""
    data = next(r for r in rows[0] if r["case"] == ("aux", "data"))
    assert data["mesh"] == {"data": 4, "tensor": 1}
    assert data["aux_matters"] > 1e-4  # the two readings really differ on this batch
    assert data["loss"] < 1e-5 and data["grad"] < 1e-5, data


@pytest.mark.multiprocess
def test_a_fused_gate_up_projection_is_split_block_by_block(rows):
    row = next(r for r in rows[0] if r["case"] == ("fused", {"tensor": 4}))
    assert row["mesh"] == {"data": 1, "tensor": 4} and row["strategies"] == {"megatron"}
    assert _close(row), row


@pytest.mark.multiprocess
def test_every_rank_agrees(rows):
    """Every rank computed exactly what rank 0 did, case by case: the compiled model's
    outputs, loss, every gradient, the gradient norms and every trained parameter (their
    fingerprints, ``autopar.testing._fingerprint``), and under tensor 2 the logits of other
    tokens; the aux-loss cases their loss and gradients."""
    for rank, rank_rows in enumerate(rows[1:], 1):
        assert [r["case"] for r in rank_rows] == [r["case"] for r in rows[0]]
        for row, first in zip(rank_rows, rows[0]):
            mine, theirs = _flat(row["computed"]), _flat(first["computed"])
            assert mine == theirs, (rank, row["case"], sorted(k for k in theirs if mine.get(k) != theirs[k]))


def _flat(computed: dict) -> dict:
    """``{(kind, tensor name): fingerprint}`` of a row's ``computed``."""
    return {(kind, name): value for kind, entry in computed.items()
            for name, value in (entry.items() if isinstance(entry, dict) else [("", entry)])}


def test_the_experts_are_one_linear_chain_per_layer_with_two_blocks():
    """Analysis alone (no ranks): each layer's experts give a linear chain whose column
    is the fused gate/up grouped matmul (2 blocks) and whose row is the down one; the
    router's softmax is no attention core and its linear no chain."""
    from autopar.api import _global_graph
    from autopar.ir import regions
    from examples.zoo import logits_loss
    x, y = _batch(1)
    gm = _global_graph(mixtral(), (x,), logits_loss, y)
    chains = regions(gm, "linear_chain")
    assert len(chains) == 2
    for chain in chains:
        assert chain.details["experts"] == EXPERTS and chain.details["blocks"] == 2
        assert chain.details["hidden"] == INTERMEDIATE
    assert len(regions(gm, "attention")) == 2
    assert all(r.details["kv_heads"] == 2 and r.details["heads"] == 4 for r in regions(gm, "attention"))


def test_the_eager_experts_loop_is_refused_at_capture_not_baked():
    """transformers' ``experts_implementation="eager"`` loops over the experts the
    example routed to (a data-dependent loop): capture refuses it with an error naming
    the line, rather than tracing one routing."""
    from autopar.trace.capture import CaptureError, capture
    from examples.zoo import logits_loss
    config = mixtral_config()
    config._experts_implementation = "eager"
    from transformers import MixtralForCausalLM
    x, y = _batch(1)
    with pytest.raises(CaptureError, match="for expert_idx in expert_hit") as error:
        capture(MixtralForCausalLM(config), (x,), logits_loss, y)
    assert 'experts_implementation="grouped_mm"' in str(error.value)
