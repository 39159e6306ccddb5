"""Benchmark (docs/benchmarks.md §2): autopar's Megatron plan against the same MLP parallelised by hand with
``torch.distributed.tensor.parallel``, 2 gloo ranks.

Both sides start from the same weights and see the same (replicated) batch; a step is
``zero_grad`` + forward + backward (the tensor-parallel all-reduces included), no
optimizer step:

* autopar: ``pm.step(x, target=y)`` with ``strategy={"tensor": 2}``: each Linear → GELU →
  Linear pair of the MLP becomes Megatron's column-split / row-split pair with f and g;
* DTensor: ``parallelize_module(model, init_device_mesh("cpu", (2,)), plan)`` with
  ``ColwiseParallel`` on every first Linear of a pair and ``RowwiseParallel`` on every
  second (the head stays replicated, as in autopar's plan), then
  ``loss_fn(model(x), y).backward()``.

The comparison is MLP-only: the transformer's fused QKV projection is split per head
by autopar, while ``ColwiseParallel`` would split the fused [3·width] block contiguously
(wrong heads, and the model's ``split(width)`` breaks on the local shard), so a DTensor
attention plan would need the model rewritten.

Both ranks run one process each with one torch thread; every step is timed on rank 0
between two barriers, the sides alternating. A third, reference side runs the
unsplit model on rank 0 alone (rank 1 idles in the barrier): it says whether splitting
pays at all on this machine and is not part of the ratio. Goal: autopar ≤ 1.05 × DTensor.

    python benchmarks/bench_tensor_parallel.py [--steps 40] [--quick]
"""
from __future__ import annotations

import copy

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import (cases_of, check_close, compare, extra_side, interleaved, make_case, parser, print_rows,
                    steps_for, steps_of, write_json, zero_grad)

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import autopar
from autopar.runtime.launcher import launch

GOAL = 1.05
CASES = ["mlp-small", "mlp-1024"]
QUICK_CASES = ["mlp-small"]


def megatron_plan(model) -> dict:
    """ColwiseParallel / RowwiseParallel on each Linear → GELU → Linear pair of an ``MLP``."""
    plan = {}
    for i in range(0, len(model.body), 3):
        plan[f"body.{i}"] = ColwiseParallel()
        plan[f"body.{i + 2}"] = RowwiseParallel()
    return plan


def sides(name: str, mesh):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y, loss_fn = make_case(name)
    eager = copy.deepcopy(model)
    hand = parallelize_module(copy.deepcopy(model), mesh, megatron_plan(model))
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=loss_fn, example_target=y,
                         strategy={"data": 1, "tensor": world})
    pm_params, hand_params, eager_params = list(pm.parameters()), list(hand.parameters()), list(eager.parameters())
    check_close(name, pm.step(x, target=y), loss_fn(hand(x), y))

    def step_autopar():
        zero_grad(pm_params)
        pm.step(x, target=y)

    def step_dtensor():
        zero_grad(hand_params)
        loss_fn(hand(x), y).backward()

    def step_eager_one_rank():
        if rank == 0:
            zero_grad(eager_params)
            loss_fn(eager(x), y).backward()

    return {"autopar": step_autopar, "dtensor": step_dtensor, "eager 1 rank": step_eager_one_rank}


def rank_job(cases: list[str], steps: int, warmup: int, quick: bool) -> list:
    """Runs on every rank; rank 0's timings are the ones returned."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rows = []
    for name in cases:
        times = interleaved(sides(name, mesh), *steps_for(name, steps, warmup, quick), sync=dist.barrier)
        rows.append(compare("tensor_parallel", name, times, ours="autopar", baseline="dtensor", goal=GOAL,
                            note="reference: " + extra_side(times, "eager 1 rank")))
    return rows


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None, world: int = 2) -> list:
    cases = cases or (QUICK_CASES if quick else CASES)
    return launch(rank_job, world, (cases, steps, warmup, quick), timeout_s=600)[0]


def main(argv=None) -> list:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    steps, warmup = steps_of(args)
    rows = run(steps, warmup, args.quick, cases_of(args.cases, args.quick, CASES, QUICK_CASES))
    print_rows(f"tensor parallel: autopar tensor=2 vs DTensor Colwise/Rowwise, 2 gloo ranks "
               f"({steps} steps, {warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
