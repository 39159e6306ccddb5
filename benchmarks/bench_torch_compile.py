"""Benchmark (docs/benchmarks.md §22): autopar's rank programs with and without
``compile(..., torch_compile=True)`` (Inductor's C++ on the CPU), alternating step by step
in one launch on 2 gloo ranks: torchtitan's Llama 3 debug model (6 layers, float32, batch
8 x 64) under data 2, tensor 2 and ZeRO-3 over 2. Each side is built, compiled and warmed
up (3 steps) first; a step is ``zero_grad`` + ``pm.step``, timed between two barriers.
Prints each side's median and the paired ratio (compiled / uncompiled). Needs ``make peers``.

    python benchmarks/bench_torch_compile.py [--steps 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
import common  # noqa: F401

import torch

from autopar.runtime.launcher import launch

STRATEGIES = ({"data": 2}, {"tensor": 2}, {"data": 2, "zero": 3})


def job(strategy: dict, steps: int) -> tuple[dict, list]:
    import torch.distributed as dist

    import autopar
    from examples.models import lm_loss
    from examples.peers import torchtitan_llama
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, torchtitan_llama.VOCAB, (8, 64), generator=generator)
    y = torch.randint(0, torchtitan_llama.VOCAB, (8, 64), generator=generator)
    pms = {}
    for compiled in (False, True):
        pm = autopar.compile(torchtitan_llama.llama3(6, 64), None, example_inputs=(x,), loss_fn=lm_loss,
                             example_target=y, strategy=strategy, torch_compile=compiled)
        for _ in range(3):   # compiled at the first call, then warm
            pm.step(x, target=y)
        pms[compiled] = pm
    times: dict = {False: [], True: []}
    for _ in range(steps):
        for compiled in (False, True):
            dist.barrier()
            start = time.perf_counter()
            for p in pms[compiled].parameters():
                p.grad = None
            pms[compiled].step(x, target=y)
            dist.barrier()
            times[compiled].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}, [b / a for a, b in zip(times[False], times[True])]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args(argv)
    for strategy in STRATEGIES:
        medians, ratios = launch(job, 2, (strategy, args.steps), timeout_s=900)[0]
        print(f"{strategy}: uncompiled {medians[False] * 1e3:.1f} ms, compiled {medians[True] * 1e3:.1f} ms, "
              f"paired ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
