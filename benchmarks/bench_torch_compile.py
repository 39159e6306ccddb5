"""Benchmark (docs/benchmarks.md §22): autopar's rank programs with and without
``compile(..., torch_compile=True)`` (Inductor: C++ on the CPU, Triton on a GPU),
alternating step by step in one launch: torchtitan's Llama 3 debug model (6 layers,
float32, batch 8 x 64) under data, tensor and ZeRO-3 over the ranks (2 gloo ranks by
default; ``--device cuda`` runs NCCL ranks, one per GPU, ``--world`` of them; on one rank,
data 1: the whole model as one program). Each side is built, compiled and warmed up (3
steps) first; a step is ``zero_grad`` + ``pm.step``, timed between two barriers (after the
GPU's queue drains). Prints each side's median and the paired ratio (compiled /
uncompiled). Needs ``make peers``.

    python benchmarks/bench_torch_compile.py [--steps 15] [--device cpu|cuda] [--world 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
import common  # noqa: F401

import torch

from autopar.runtime.launcher import launch


def strategies(world: int) -> tuple[dict, ...]:
    if world == 1:
        return ({"data": 1},)
    return ({"data": world}, {"tensor": world}, {"data": world, "zero": 3})


def job(strategy: dict, steps: int, device: str = "cpu") -> tuple[dict, list]:
    import torch.distributed as dist

    import autopar
    from examples.models import lm_loss
    from examples.peers import torchtitan_llama
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, torchtitan_llama.VOCAB, (8, 64), generator=generator).to(device)
    y = torch.randint(0, torchtitan_llama.VOCAB, (8, 64), generator=generator).to(device)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    pms = {}
    for compiled in (False, True):
        pm = autopar.compile(torchtitan_llama.llama3(6, 64).to(device), None, example_inputs=(x,), loss_fn=lm_loss,
                             example_target=y, strategy=strategy, torch_compile=compiled)
        for _ in range(3):   # compiled at the first call, then warm
            pm.step(x, target=y)
        pms[compiled] = pm
    times: dict = {False: [], True: []}
    for _ in range(steps):
        for compiled in (False, True):
            sync()
            start = time.perf_counter()
            for p in pms[compiled].parameters():
                p.grad = None
            pms[compiled].step(x, target=y)
            sync()
            times[compiled].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}, [b / a for a, b in zip(times[False], times[True])]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--world", type=int, default=None,
                        help="ranks (default: 2 on the CPU; on a GPU machine min(2, GPUs))")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_torch_compile: --device cuda needs a CUDA device; none here")
    world = args.world or (min(2, torch.cuda.device_count()) if args.device == "cuda" else 2)
    rows = []
    for strategy in strategies(world):
        medians, ratios = launch(job, world, (strategy, args.steps, args.device),
                                 backend="nccl" if args.device == "cuda" else "gloo", timeout_s=900)[0]
        rows.append({"strategy": strategy, "world": world, "device": args.device, "uncompiled_ms": medians[False] * 1e3,
                     "compiled_ms": medians[True] * 1e3, "paired_ratio": statistics.median(ratios)})
        print(f"{strategy}: uncompiled {medians[False] * 1e3:.1f} ms, compiled {medians[True] * 1e3:.1f} ms, "
              f"paired ratio {statistics.median(ratios):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
