"""Ring attention's overlap on gloo ranks (docs/benchmarks.md §17).

Context parallelism's attention (:func:`autopar.strategies.context.ring.ring_attention`)
exchanges each rank's keys and values around the ring while it attends to the ones it
holds. This times one forward and backward of a causal attention layer split over the
context group, three ways, in one run on the same ranks: ``ring`` (each exchange in
flight during the step's attention), ``serial`` (the same ring, each exchange finished
before the step's attention starts) and ``allgather`` (the keys and values gathered once).
Medians of ``--steps`` timed calls after ``--warmup``; the ratio serial / ring is the
overlap's gain. Each rank runs one thread (``torch.set_num_threads(1)``).

    python benchmarks/bench_context.py [--ranks 2] [--steps 20] [--cases 512 1024 2048]
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from common import parser

from autopar.runtime.groups import use_groups
from autopar.runtime.launcher import launch
from autopar.strategies.context.collectives import take_tokens
from autopar.strategies.context.ring import ring_attention

HEADS, KV_HEADS, DIM, BATCH = 8, 8, 64, 1
MODES = ("ring", "serial", "allgather")


def job(lengths, steps, warmup):
    torch.set_num_threads(1)
    rows = []
    with use_groups({"context": dist.group.WORLD}):
        for seq in lengths:
            g = torch.Generator().manual_seed(0)
            whole = [torch.randn(BATCH, h, seq, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS)]
            q, k, v = (take_tokens(t, 2, 1, seq, "context", True).requires_grad_() for t in whole)
            grad = torch.randn_like(q)
            times = {m: [] for m in MODES}
            for i in range(warmup + steps):
                for mode in MODES:   # interleaved, so that each mode sees the same machine
                    dist.barrier()
                    start = time.perf_counter()
                    ring_attention(q, k, v, is_causal=True, seq=seq, group="context", balanced=True,
                                   mode=mode).backward(grad)
                    elapsed = torch.tensor([time.perf_counter() - start])
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # the step is the slowest rank's
                    if i >= warmup:
                        times[mode].append(float(elapsed))
            rows.append({"seq": seq, **{m: statistics.median(times[m]) for m in MODES}})
    return rows


def main(argv=None) -> int:
    p = parser(__doc__, default_steps=20)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args(argv)
    lengths = [int(c) for c in args.cases] if args.cases else ([512] if args.quick else [512, 1024, 2048])
    rows = launch(job, args.ranks, (lengths, 3 if args.quick else args.steps, 1 if args.quick else args.warmup),
                  timeout_s=1800)[0]
    print(f"{args.ranks} gloo ranks, causal attention, batch {BATCH}, {HEADS} heads of {DIM}, medians")
    print(f"{'seq':>6s} {'ring ms':>9s} {'serial ms':>10s} {'allgather ms':>13s} {'serial/ring':>12s}")
    for r in rows:
        print(f"{r['seq']:6d} {r['ring'] * 1e3:9.2f} {r['serial'] * 1e3:10.2f} {r['allgather'] * 1e3:13.2f} "
              f"{r['serial'] / r['ring']:12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
