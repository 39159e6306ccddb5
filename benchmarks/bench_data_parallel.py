"""Benchmark (docs/benchmarks.md §1): autopar's data-parallel plan against DistributedDataParallel, 2 gloo ranks.

Both sides start from the same weights and see the same data; a step is ``zero_grad``
+ forward + backward + gradient all-reduce, no optimizer step:

* autopar: ``pm.step(x, target=y)`` with ``strategy={"data": 2}``; every rank passes the
  *global* batch and the program takes its half;
* DDP: ``loss_fn(ddp(x_local), y_local).backward()`` on the rank's half, default
  settings (25 MiB buckets, first bucket 1 MiB).

Both ranks run one process each with one torch thread; every step is timed on rank 0
between two barriers, the sides alternating. Goal: autopar ≤ 1.05 × DDP. One
``launch`` runs every case.

    python benchmarks/bench_data_parallel.py [--steps 40] [--quick] [--cases CASE ...]
    python benchmarks/bench_data_parallel.py --breakdown transformer-256x4 --steps 60
"""
from __future__ import annotations

import copy

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import (cases_of, check_close, compare, extra_side, interleaved, make_case, parser, print_rows,
                    quartiles, steps_for, steps_of, write_json, zero_grad)

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import autopar
from autopar.runtime.launcher import launch

GOAL = 1.05
CASES = ["mlp-small", "transformer-small", "mlp-1024", "transformer-256x4"]
QUICK_CASES = ["mlp-small", "transformer-small"]


def sides(name: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y, loss_fn = make_case(name)
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=loss_fn, example_target=y,
                         strategy={"data": world, "tensor": 1})
    ddp = DistributedDataParallel(reference)
    x_local, y_local = x.chunk(world)[rank], y.chunk(world)[rank]
    pm_params, ddp_params = list(pm.parameters()), list(ddp.parameters())
    local_loss = loss_fn(ddp(x_local), y_local).detach()
    dist.all_reduce(local_loss)
    check_close(name, pm.step(x, target=y), local_loss / world)

    def step_autopar():
        zero_grad(pm_params)
        pm.step(x, target=y)

    def step_ddp():
        zero_grad(ddp_params)
        loss_fn(ddp(x_local), y_local).backward()

    return {"autopar": step_autopar, "ddp": step_ddp}, pm


def rank_job(cases: list[str], steps: int, warmup: int, quick: bool) -> list:
    """Runs on every rank; rank 0's timings are the ones returned."""
    torch.set_num_threads(1)
    rows = []
    for name in cases:
        step_fns, pm = sides(name)
        times = interleaved(step_fns, *steps_for(name, steps, warmup, quick), sync=dist.barrier)
        buckets = sum(len(b.buckets) for b in pm.gradient_buckets.values())
        rows.append(compare("data_parallel", name, times, ours="autopar", baseline="ddp", goal=GOAL,
                            note=f"autopar gradient buckets: {buckets}"))
    return rows


def breakdown_job(name: str, steps: int, warmup: int) -> str:
    """Where a data-parallel step's time goes, against two hand-written references:

    * ``local+flat``: the eager model on the local half, then autopar's reference
      ``sync_gradients`` (one flat all-reduce after backward, no overlap, no hooks);
    * ``autopar no-overlap``: ``pm.step`` with the bucket hooks disabled, so every bucket
      is launched by ``finish()`` after backward;
    * ``ddp+loss all-reduce``: DDP plus a blocking all-reduce of the loss between forward
      and backward: what a second collective per step costs (the loss average autopar's
      forward once ended with; the whole batch's target count a mean over counted
      targets needs, ``autopar.runtime.target_count``);
    * ``autopar no count all-reduce``: ``pm.step`` with the target count taken as this
      rank's count times the data degree, no collective (exact only where every rank
      counts as many targets, as in these cases: no ``ignore_index`` in their targets).
      An experiment on autopar's internals, for analysis only: the case's program must
      average over counted targets (``transformer-*``), and it is skipped when
      ``RankState.target_count`` no longer exists;
    * the latency of a barrier and of a 0-d all-reduce (what a collective of its own adds
      to every step).

    Every side is timed the way ``rank_job`` times its two, interleaved, paired ratios
    against DDP.
    """
    import time

    from autopar.runtime import groups as G
    from autopar.runtime.grad_sync import sync_gradients

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    step_fns, pm = sides(name)
    model, x, y, loss_fn = make_case(name)
    x_local, y_local = x.chunk(world)[rank], y.chunk(world)[rank]
    params = list(model.parameters())
    groups = {"data": dist.group.WORLD}

    def local_flat():
        zero_grad(params)
        (loss_fn(model(x_local), y_local) / world).backward()
        with G.use_groups(groups):
            sync_gradients(params, "data")

    ddp = DistributedDataParallel(copy.deepcopy(model))
    ddp_params = list(ddp.parameters())

    def ddp_loss_all_reduce():
        zero_grad(ddp_params)
        loss = loss_fn(ddp(x_local), y_local)
        dist.all_reduce(loss.detach().clone())
        loss.backward()

    def no_overlap():
        _loss_buckets(pm).enabled = False
        try:
            step_fns["autopar"]()
        finally:
            _loss_buckets(pm).enabled = True

    ladder = {"ddp": step_fns["ddp"], "autopar": step_fns["autopar"], "autopar no-overlap": no_overlap,
              "ddp+loss all-reduce": ddp_loss_all_reduce, "local+flat": local_flat}

    from autopar.ir import TARGET_COUNT
    state = pm._state
    if hasattr(state, "target_count") and any(TARGET_COUNT in p.meta for p in pm.runner.programs.values()):
        real_count = state.target_count

        def local_count(program, pieces, group):
            groups = state.groups
            state.groups = {**groups, group: None}   # a group of one: this rank's pieces, no collective
            try:
                count = real_count(program, pieces, group)
            finally:
                state.groups = groups
            return None if count is None else count * G.size_of(groups[group])

        def no_count_all_reduce():
            state.target_count = local_count
            try:
                step_fns["autopar"]()
            finally:
                del state.target_count   # the method again

        ladder["autopar no count all-reduce"] = no_count_all_reduce
    times = interleaved(ladder, steps, warmup, sync=dist.barrier)
    latency = {}
    for what, fn in [("barrier", dist.barrier), ("0-d all_reduce", lambda: dist.all_reduce(torch.zeros(())))]:
        samples = []
        for _ in range(200):
            dist.barrier()
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        latency[what] = sorted(samples)[len(samples) // 2]
    lines = [f"{name}: data=2 step, median of {steps} (ms), rank 0"]
    for side in ladder:
        paired = quartiles([a / b for a, b in zip(times[side], times["ddp"])])[1]
        lines.append(f"  {extra_side(times, side)}; paired ratio to ddp {paired:.3f}")
    lines += [f"  {what} latency {seconds * 1e6:.0f} us" for what, seconds in latency.items()]
    lines.append(f"  autopar buckets: {[len(b.params) for b in _loss_buckets(pm).buckets]} parameters each")
    return "\n".join(lines)


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None, world: int = 2) -> list:
    cases = cases or (QUICK_CASES if quick else CASES)
    return launch(rank_job, world, (cases, steps, warmup, quick), timeout_s=600)[0]


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--breakdown", metavar="CASE", help="print where a data-parallel step's time goes and exit")
    args = p.parse_args(argv)
    steps, warmup = steps_of(args)
    if args.breakdown:
        print(launch(breakdown_job, 2, (args.breakdown, steps, warmup), timeout_s=600)[0])
        return []
    rows = run(steps, warmup, args.quick, cases_of(args.cases, args.quick, CASES, QUICK_CASES))
    print_rows(f"data parallel: autopar data=2 vs DDP, 2 gloo ranks ({steps} steps, {warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()


def _loss_buckets(pm):
    """The data-parallel gradient buckets of a data plan (the one that carries the loss)."""
    return pm.gradient_buckets[pm.layout.loss_bucket]
