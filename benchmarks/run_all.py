"""Run the eight benchmarks and print one summary table (``make bench``).

    python benchmarks/run_all.py [--steps 40] [--quick] [--json results.json] [--markdown]

Each benchmark runs its cases side by side with its baseline (see its module
docstring); the 2-rank ones run inside one ``launch`` each. The load average is printed
before and after, because other processes on the machine widen the IQRs.
"""
from __future__ import annotations

import os
import platform
import time

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import format_rows, parser, print_rows, steps_of, write_json

import torch  # noqa: E402

import bench_compile_overhead  # noqa: E402
import bench_data_parallel  # noqa: E402
import bench_fusion  # noqa: E402
import bench_peers  # noqa: E402
import bench_pipeline  # noqa: E402
import bench_subgraph  # noqa: E402
import bench_tensor3d  # noqa: E402
import bench_tensor_parallel  # noqa: E402


def machine() -> str:
    gloo = torch.distributed.is_available() and torch.distributed.is_gloo_available()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
            f"{platform.python_version()}, torch {torch.__version__}, gloo {'yes' if gloo else 'no'}, "
            f"CUDA {'yes' if torch.cuda.is_available() else 'no'}")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true", help="also print the summary as a markdown table")
    args = p.parse_args(argv)
    steps, warmup = steps_of(args)
    print(f"machine: {machine()}")
    print(f"before: {load()}")
    start = time.perf_counter()
    rows, seconds = [], {}
    for title, module in [("compile overhead (1 rank, vs eager)", bench_compile_overhead),
                          ("data parallel (2 ranks, vs DDP)", bench_data_parallel),
                          ("tensor parallel (2 ranks, vs DTensor)", bench_tensor_parallel),
                          ("sub-graph parallel (2 ranks, vs data parallel)", bench_subgraph),
                          ("3D tensor parallel (8 ranks, overlap ladder and 1D/2-D/3D plans)", bench_tensor3d),
                          ("pipeline schedules (4 ranks, GPipe/1F1B/interleaved vs m; bubble on 2)",
                           bench_pipeline),
                          ("fused Triton kernels (1 GPU, vs eager and torch.compile)", bench_fusion),
                          ("peers (4 ranks, torchtitan's Llama 3 vs its own FSDP2 x TP with SP)", bench_peers)]:
        began = time.perf_counter()
        part = module.run(steps, warmup, args.quick)
        seconds[title] = time.perf_counter() - began
        print_rows(f"{title}: {steps} steps, {warmup} warm-up ({seconds[title]:.0f} s)", part)
        rows += part
    print(f"\nafter: {load()}; total {time.perf_counter() - start:.0f} s")
    print("\n== summary (ratio = median autopar / median baseline; a step is zero_grad + forward + backward "
          "+ gradient sync, no optimizer step) ==")
    print(format_rows(rows))
    if args.markdown:
        print()
        print(format_rows(rows, markdown=True))
    missed = [f"{r.benchmark}/{r.case} {r.ratio:.3f}x > {r.goal:.2f}x" for r in rows if not r.met]
    print("\ngoals missed: " + ("; ".join(missed) if missed else "none"))
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
