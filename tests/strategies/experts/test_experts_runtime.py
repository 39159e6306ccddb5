"""Expert parallelism's dispatch and combine (autopar/strategies/experts/collectives.py) on
4 real gloo ranks against the single-device layer: Hugging Face Mixtral's experts (8 of
them, top-2, float64) with each rank routing its own tokens. With the experts spread
over expert groups of 2 and of 4 ranks, every rank's layer output, the gradients of its
tokens and routing weights, and (reduced over the ranks that hold the same experts) the
experts' weight gradients equal the single-device layer's; also when the routing sends
every token to the experts of one rank, so that the others receive none.
"""
import pytest
import torch
import torch.distributed as dist

import shared_ranks

EXPERTS, HIDDEN, INNER, TOKENS, TOP_K = 8, 8, 12, 6, 2


def _experts(count: int):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=INNER, num_local_experts=count)
    return MixtralExperts(config).double()


def _routing(rank: int, skewed: bool):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    logits = torch.randn(TOKENS, EXPERTS, generator=g, dtype=torch.float64)
    if skewed:   # only experts 0 and 1: the ranks holding the others receive nothing
        logits[:, 2:] = -1e9
    weights, index = torch.softmax(logits, -1).topk(TOP_K, -1)
    weights = weights / weights.sum(-1, keepdim=True)
    return x, index, weights, torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)


def _max(a, b) -> float:
    return (a.detach() - b.detach()).abs().max().item() if a.numel() else 0.0


def dispatch_job(cases) -> list[dict]:
    from autopar.strategies.experts.collectives import combine, dispatch
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for degree, skewed in cases:
        torch.manual_seed(0)
        full = _experts(EXPERTS)
        for p in full.parameters():
            torch.nn.init.normal_(p, std=0.3)
        x, index, weights, probe = _routing(rank, skewed)
        # the single-device layer on this rank's tokens; its weight gradients summed over all ranks
        xr, wr = x.clone().requires_grad_(), weights.clone().requires_grad_()
        expected = full(xr, index, wr)
        (expected * probe).sum().backward()
        global_grads = {n: p.grad.clone() for n, p in full.named_parameters()}
        for g in global_grads.values():
            dist.all_reduce(g)
        # expert parallelism: groups of `degree` consecutive ranks, each holding EXPERTS/degree experts
        groups = [dist.new_group(list(range(s, s + degree))) for s in range(0, world, degree)]
        replicas = [dist.new_group(list(range(r, world, degree))) for r in range(degree)]
        group, replica = groups[rank // degree], replicas[rank % degree]
        per = EXPERTS // degree
        first = (rank % degree) * per
        local = _experts(per)
        with torch.no_grad():
            for name, p in local.named_parameters():
                p.copy_(getattr(full, name)[first:first + per])
        xe, we = x.clone().requires_grad_(), weights.clone().requires_grad_()
        rows, ids, routing = dispatch(xe, index, EXPERTS, group)
        ones = torch.ones(rows.shape[0], 1, dtype=rows.dtype)
        got = combine(local(rows, ids.unsqueeze(1), ones), routing, we, group, rows)
        (got * probe).sum().backward()
        expert_grad = 0.0
        for name, p in local.named_parameters():
            grad = p.grad.clone() if p.grad is not None else torch.zeros_like(p)   # no rows: no gradient
            if dist.get_world_size(replica) > 1:
                dist.all_reduce(grad, group=replica)   # the ranks holding the same experts
            expert_grad = max(expert_grad, _max(grad, global_grads[name][first:first + per]))
        out.append({"case": (degree, skewed), "output": _max(got, expected), "grad_x": _max(xe.grad, xr.grad),
                    "grad_weights": _max(we.grad, wr.grad), "grad_experts": expert_grad, "rows": routing.rows})
    try:   # 6 experts over 4 ranks: refused before any collective, on every rank
        dispatch(torch.zeros(2, HIDDEN), torch.zeros(2, TOP_K, dtype=torch.long), 6, dist.group.WORLD)
        out.append({"refused": None})
    except ValueError as e:
        out.append({"refused": str(e)})
    return out


CASES = [(2, False), (4, False), (4, True)]
_LAUNCHED = shared_ranks.register(4, __name__, dispatch_job, (CASES,), timeout_s=300)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"experts{d}{'-skewed' if s else ''}" for d, s in CASES])
def test_dispatch_and_combine_equal_the_single_device_layer(index):
    reports = [rank_reports[index] for rank_reports in _LAUNCHED()]
    for report in reports:
        assert report["output"] < 1e-12, report
        assert report["grad_x"] < 1e-12 and report["grad_weights"] < 1e-12, report
        assert report["grad_experts"] < 1e-12, report
    degree, skewed = CASES[index]
    # every (token, slot) pair was processed once, somewhere in its expert group
    for start in range(0, 4, degree):
        assert sum(r["rows"] for r in reports[start:start + degree]) == degree * TOKENS * TOP_K
    if skewed:   # experts 0 and 1 live on the first rank of each group: the others got no rows
        assert [r["rows"] for r in reports] == [4 * TOKENS * TOP_K, 0, 0, 0]


@pytest.mark.multiprocess
def test_an_expert_count_the_degree_does_not_divide_is_refused():
    for report in _LAUNCHED():
        assert report[-1] == {"refused": "expert parallelism over 4 ranks: 6 experts are not divisible by 4; give an "
                                         "expert degree that divides the expert count"}
