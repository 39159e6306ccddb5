"""Expert parallelism's rewrite of a rank's graph (autopar/strategies/experts/rewrite.py)
on 4 real gloo ranks: Hugging Face Mixtral (2 layers, 4 experts, top-2, float32)
captured on each rank's share of the batch, its routed layers rewritten to dispatch
tokens to the rank holding their expert (one expert per rank), against the
single-device model on the same share: the loss, every replicated parameter's gradient,
and the experts' gradients summed over the ranks (each expert sees every rank's tokens
routed to it), within float32 rounding (1e-5 of the largest value). The pass alone, its
slices made by hand (extended suite); through ``compile``: tests/strategies/experts/test_experts_compile.py.
"""
import copy

import pytest
import torch
import torch.distributed as dist

import shared_ranks

EXPERTS = 4


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    config = MixtralConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, max_position_embeddings=16,
                           num_local_experts=EXPERTS, num_experts_per_tok=2, use_cache=False)
    return MixtralForCausalLM(config)   # float32: torch's grouped matmul takes no float64


def rewrite_job() -> dict:
    from autopar.passes.analysis.analyse import analyse
    from autopar.trace.capture import capture
    from autopar.ir import regions
    from autopar.runtime import groups as G
    from autopar.strategies.experts.rewrite import expert_parallel_pass
    from examples.zoo import logits_loss
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = _mixtral()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(5)
    ids, target = torch.randint(0, 64, (world, 8), generator=g), torch.randint(0, 64, (world, 8), generator=g)
    x, y = ids[rank:rank + 1], target[rank:rank + 1]
    gm = analyse(capture(copy.deepcopy(model), (x,), logits_loss, y))
    layers = regions(gm, "experts")
    for region in layers:   # this rank holds expert `rank` of each layer
        path = region.details["chain"].split(":", 1)[1]
        experts = gm.get_submodule("model." + path)
        for name, full in list(experts.named_parameters()):
            setattr(experts, name, torch.nn.Parameter(full.detach()[rank:rank + 1].clone()))
        expert_parallel_pass(gm, region, "experts")
    code = gm.code
    with G.use_groups({"experts": dist.group.WORLD}):
        loss = gm(x, y)
        loss.backward()
    expected = logits_loss(reference(x), y)
    expected.backward()
    got = dict(gm.named_parameters())
    replicated, experts_grad = 0.0, 0.0
    for name, p in reference.named_parameters():
        mine = got["model." + name]
        if ".experts." in name:
            total = p.grad.clone()
            dist.all_reduce(total)   # every rank's tokens routed to this expert
            grad = mine.grad if mine.grad is not None else torch.zeros_like(mine)
            scale = total[rank:rank + 1].abs().max().item() + 1e-12
            experts_grad = max(experts_grad, (grad - total[rank:rank + 1]).abs().max().item() / scale)
        else:
            scale = p.grad.abs().max().item() + 1e-12
            replicated = max(replicated, (mine.grad - p.grad).abs().max().item() / scale)
    return {"layers": len(layers), "loss": abs(loss.item() - expected.item()), "replicated": replicated,
            "experts": experts_grad, "calls": code.count("expert_parallel_mlp("),
            "grouped_mm_left": code.count("grouped_mm")}


# the rewrite alone (tests/strategies/experts/test_experts_compile.py runs it through compile in make test)
_LAUNCHED = shared_ranks.register(4, __name__, rewrite_job, timeout_s=300, extended=True)


@pytest.mark.multiprocess
@pytest.mark.extended
def test_mixtral_with_one_expert_per_rank_equals_the_single_device_model():
    for report in _LAUNCHED():
        assert report["layers"] == 2 and report["calls"] == 2 and report["grouped_mm_left"] == 0, report
        assert report["loss"] < 1e-5, report
        assert report["replicated"] < 1e-5 and report["experts"] < 1e-5, report
