"""Benchmark: expert parallelism against data parallelism for one routed
mixture-of-experts layer, measured on 4 gloo ranks and predicted by the cost model
(autopar/strategies/experts/cost.py), side by side; and predicted on the Selene preset
for layers of real models.

    python benchmarks/bench_experts.py [--steps 20] [--warmup 3] [--profile cal.json] [--quick]
    python benchmarks/bench_experts.py --compile [--profile cal.json]

Measured (4 local gloo ranks, each routing its own tokens through Hugging Face Mixtral's
experts, float32, one training step = forward + backward of the layer + the experts'
gradient all-reduce where the side has one; sides interleaved, every step after a barrier,
rank 0's medians):

* ``data``: every rank holds all ``E`` experts; their gradients are all-reduced over the 4
  ranks (one flat buffer, after backward);
* ``experts 2``: expert groups of 2 ranks, ``E/2`` experts each (the dropless all-to-all
  dispatch and combine of :mod:`autopar.strategies.experts.collectives`); gradients
  all-reduced over the 2 ranks holding the same experts;
* ``experts 4``: one group of 4, ``E/4`` experts each, no gradient all-reduce.

Predicted: the same three with the calibrated profile (``--profile``; default: the
``cpu-gloo`` preset), and on ``a100-selene`` for Mixtral-8x7B's layer and a 64-expert
layer at its data degrees, where the layer's weights, not its tokens, are what costs.
The layer here is the ``expert_layer_numbers`` of tokens × hidden × inner × E × k; the
routing is random (near uniform, the planning assumption; the measured rows per rank are
printed beside).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import REPO_ROOT

import torch

assert REPO_ROOT
WORLD = 4


def _experts(count: int, hidden: int, inner: int):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    config = MixtralConfig(hidden_size=hidden, intermediate_size=inner, num_local_experts=count)
    config._experts_implementation = "grouped_mm"
    return MixtralExperts(config)


def measure_job(tokens: int, hidden: int, inner: int, experts: int, top_k: int, steps: int, warmup: int) -> dict:
    import torch.distributed as dist
    from autopar.strategies.experts.collectives import combine, dispatch
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    full = _experts(experts, hidden, inner)
    for p in full.parameters():
        torch.nn.init.normal_(p, std=0.02)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, hidden, generator=g)
    weights, index = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, -1)
    probe = torch.randn(tokens, hidden, generator=g)
    groups = {degree: [dist.new_group(list(range(s, s + degree))) for s in range(0, WORLD, degree)]
              for degree in (2, 4)}
    replicas = {2: [dist.new_group([r, r + 2]) for r in range(2)]}
    sides, loads = {}, {}

    def data_step():
        for p in full.parameters():
            p.grad = None
        out = full(x.requires_grad_(), index, weights)
        (out * probe).sum().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in full.parameters()])
        dist.all_reduce(flat)
    sides["data"] = data_step

    for degree in (2, 4):
        per = experts // degree
        first = (rank % degree) * per
        local = _experts(per, hidden, inner)
        with torch.no_grad():
            for name, p in local.named_parameters():
                p.copy_(getattr(full, name)[first:first + per])
        group = groups[degree][rank // degree]
        replica = replicas[degree][rank % degree] if degree in replicas else None

        def ep_step(local=local, group=group, replica=replica, degree=degree):
            for p in local.parameters():
                p.grad = None
            rows, ids, routing = dispatch(x.requires_grad_(), index, experts, group)
            out = combine(local(rows, ids.unsqueeze(1), torch.ones(rows.shape[0], 1)), routing, weights, group, rows)
            (out * probe).sum().backward()
            loads[degree] = routing.rows
            if replica is not None:
                flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                                  for p in local.parameters()])
                dist.all_reduce(flat, group=replica)
        sides[f"experts {degree}"] = ep_step

    times = {name: [] for name in sides}
    for repetition in range(warmup + steps):
        for name, fn in sides.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            dist.barrier()
            if repetition >= warmup:
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    every_load = [None] * WORLD
    dist.all_gather_object(every_load, loads)
    return {"medians": medians, "loads": every_load}


COMPILED = ({"data": 4}, {"data": 4, "experts": 2}, {"data": 4, "experts": 4}, "auto")


def compile_job(steps: int, warmup: int, hardware, quick: bool) -> dict:
    """A Hugging Face Mixtral through ``autopar.compile`` under data parallelism, expert
    degrees 2 and 4, and ``"auto"``: each side's training step (``pm.step``: forward,
    backward, gradient synchronisation), interleaved, rank 0's medians, beside the plan's
    predicted step."""
    import copy
    import torch.distributed as dist
    import autopar
    from examples.zoo import logits_loss
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, inner, experts = (64, 128, 8) if quick else (128, 512, 8)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=256, hidden_size=width, intermediate_size=inner, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, num_local_experts=experts, num_experts_per_tok=2, use_cache=False))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (8, 32), generator=g)
    sides = {}
    for strategy in COMPILED:
        pm = autopar.compile(copy.deepcopy(model), example_inputs=(ids,), loss_fn=logits_loss, example_target=ids,
                             strategy=strategy, hardware=hardware)
        sides[str(strategy)] = pm
    times = {name: [] for name in sides}
    for repetition in range(warmup + steps):
        for name, pm in sides.items():
            dist.barrier()
            start = time.perf_counter()
            pm.step(ids, target=ids)
            dist.barrier()
            if repetition >= warmup:
                times[name].append(time.perf_counter() - start)
            for p in pm.parameters():
                p.grad = None
    loads = {name: pm.expert_load() for name, pm in sides.items()}
    return {"medians": {name: statistics.median(t) for name, t in times.items()},
            "predicted": {name: pm.plan.step_s for name, pm in sides.items()},
            "forms": {name: f"{pm.plan.mesh} {pm.plan.form}".strip() for name, pm in sides.items()},
            "loads": loads, "model": f"Mixtral, 2 layers, {experts} experts {width} -> {inner}, top-2, batch 8 x 32"}


def compiled(args) -> int:
    from autopar.runtime.launcher import launch
    steps = 5 if args.quick else args.steps
    result = launch(compile_job, WORLD, (steps, args.warmup, args.profile, args.quick), timeout_s=1800)[0]
    print(f"{result['model']} through autopar.compile on {WORLD} gloo ranks; {steps} interleaved steps, medians; "
          f"predicted with {args.profile or 'the machine profile (or the cpu-gloo preset)'}")
    print(f"{'strategy':30s} {'plan':32s} {'measured':>10s} {'/ data':>7s} {'predicted':>10s} {'/ data':>7s}  "
          f"rows per rank (last step)")
    base, predicted_base = result["medians"][str(COMPILED[0])], result["predicted"][str(COMPILED[0])]
    for name, measured in result["medians"].items():
        predicted = result["predicted"][name]
        load = next(iter(result["loads"][name].values()), "-")
        print(f"{name:30s} {result['forms'][name]:32s} {measured * 1e3:8.2f}ms {measured / base:7.2f} "
              f"{predicted * 1e3:8.2f}ms {predicted / predicted_base:7.2f}  {load}")
    fastest = min((n for n in result["medians"] if n != "auto"), key=result["medians"].get)
    print(f"auto chose {result['forms']['auto']}; measured fastest of the forced: {fastest}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", default=None, help="a calibrated profile (default: the cpu-gloo preset)")
    parser.add_argument("--quick", action="store_true", help="a smaller layer, 5 steps: a smoke run")
    parser.add_argument("--compile", action="store_true", help="a whole Mixtral through autopar.compile: data, "
                                                              "expert degrees 2 and 4, auto")
    args = parser.parse_args(argv)
    if args.compile:
        return compiled(args)
    from autopar.cost.hardware import get_hardware
    from autopar.runtime.launcher import launch
    from autopar.strategies.experts.cost import MoELayer, expert_layer_numbers
    tokens, hidden, inner, experts, top_k = (64, 64, 128, 8, 2) if args.quick else (512, 256, 512, 16, 2)
    steps = 5 if args.quick else args.steps
    result = launch(measure_job, WORLD, (tokens, hidden, inner, experts, top_k, steps, args.warmup),
                    timeout_s=1800)[0]
    hw = get_hardware(args.profile or "cpu-gloo")
    layer = MoELayer(tokens, hidden, inner, experts, top_k)
    print(f"one MoE layer on {WORLD} gloo ranks: {experts} experts (gated, {hidden} -> {inner} -> {hidden}), "
          f"top-{top_k}, {tokens} tokens per rank, fp32; {steps} interleaved steps, medians; predicted with {hw.name}")
    print(f"{'side':12s} {'measured':>10s} {'/ data':>7s} {'predicted':>10s} {'/ data':>7s}   "
          f"{'a2a':>8s} {'grads':>8s} {'compute':>8s}   rows per rank (measured)")
    base = result["medians"]["data"]
    predicted_base = expert_layer_numbers(layer, 1, WORLD, hw).step_s
    for name, measured in result["medians"].items():
        degree = 1 if name == "data" else int(name.split()[1])
        n = expert_layer_numbers(layer, degree, WORLD, hw)
        rows = [load.get(degree) for load in result["loads"]] if degree > 1 else [tokens * top_k] * WORLD
        print(f"{name:12s} {measured * 1e3:8.2f}ms {measured / base:7.2f} {n.step_s * 1e3:8.2f}ms "
              f"{n.step_s / predicted_base:7.2f}   {n.all_to_all_s * 1e3:6.2f}ms {n.gradient_s * 1e3:6.2f}ms "
              f"{n.compute_s * 1e3:6.2f}ms   {rows}")
    selene = get_hardware("a100-selene")
    print("\npredicted on a100-selene (bf16), per layer and step on one GPU:")
    print(f"{'layer':44s} {'data':>6s} {'EP':>4s} {'data step':>10s} {'EP step':>9s} {'EP/data':>8s} "
          f"{'EP a2a':>8s} {'data grads':>10s} {'expert GiB (data/EP)':>21s}")
    for label, moe, data in (("Mixtral-8x7B (E 8, k 2, 4096 -> 14336)", MoELayer(4096, 4096, 14336, 8, 2, bytes=2), 8),
                             ("Mixtral-8x7B, data 64", MoELayer(4096, 4096, 14336, 8, 2, bytes=2), 64),
                             ("64 experts (k 6, 2048 -> 1408)", MoELayer(4096, 2048, 1408, 64, 6, bytes=2), 8),
                             ("64 experts, data 64", MoELayer(4096, 2048, 1408, 64, 6, bytes=2), 64)):
        dp = expert_layer_numbers(moe, 1, data, selene)
        ep_degree = min(moe.experts, data, 8)
        ep = expert_layer_numbers(moe, ep_degree, data, selene)
        print(f"{label:44s} {data:6d} {ep_degree:4d} {dp.step_s * 1e3:8.1f}ms {ep.step_s * 1e3:7.1f}ms "
              f"{ep.step_s / dp.step_s:8.2f} {ep.all_to_all_s * 1e3:6.1f}ms {dp.gradient_s * 1e3:8.1f}ms "
              f"{dp.params_per_rank * 2 / 2**30:9.2f} / {ep.params_per_rank * 2 / 2**30:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
