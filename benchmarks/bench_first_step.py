"""Benchmark (docs/benchmarks.md §16): time to the first training step against the model's depth.

A Hugging Face ``LlamaForCausalLM`` (hidden 512, intermediate 1376, 8 heads, 4 key/value
heads, vocabulary 1000; 8, 32 and 80 layers) trained on its own loss from keyword inputs
(``input_ids``, ``attention_mask``, ``labels``: batch 8 x 64 tokens) on 4 gloo ranks, in
fresh processes for every case (what a job pays: the first export of a process warms
torch up). Each rank runs::

    barrier; pm = autopar.compile(model, None, example_kwargs=batch, strategy=...)
    barrier; pm.step(**batch)                     # the first step: builds the programs, runs
    barrier; pm.step(**batch); barrier            # twice: the ordinary step

and reports ``pm.timings`` (compile's phases: checks, capture, analysis, planning, group
setup, module construction; the programs' phases: capture at the rank's batch, analysis,
rewrite, recompilation; the first step's run without its builds), the wall times of
compile and the first step (the slowest rank's: each phase starts after a barrier), and
the median ordinary step, which is part of the first step's run too. The figures are
rank 0's phases, and medians over ``--repeats`` launches.

Cases: ``auto`` (the planner's choice), ``tensor`` (``{"tensor": 2, "data": 2}``),
``pipeline`` (``{"pipeline": 2, "data": 2, "microbatches": 2}``).

    python benchmarks/bench_first_step.py [--layers 8 32 80] [--cases auto tensor] [--repeats 3]
    python benchmarks/bench_first_step.py --quick                # 2 and 4 layers, hidden 128: a smoke run
    python benchmarks/bench_first_step.py --profile --layers 32 --cases tensor   # cProfile of rank 0
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import parser

import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import time

import torch
import torch.distributed as dist

from autopar.runtime.launcher import launch

WORLD = 4
CASES = {"auto": "auto", "tensor": {"tensor": 2, "data": 2},
         "pipeline": {"pipeline": 2, "data": 2, "microbatches": 2}}
LAYERS = (8, 32, 80)
PHASES = [f"compile.{p}" for p in ("checks", "capture", "analysis", "planning", "groups", "module")] + \
    [f"program.{p}" for p in ("capture", "analysis", "rewrite", "recompile")] + ["first_step.run"]


def llama(layers: int, hidden: int):
    """The model and its keyword batch, from seed 0 (the same on every rank)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=hidden, intermediate_size=hidden * 43 // 16,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=128, use_cache=False)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 1000, (8, 64))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _timed(fn):
    """``fn()`` between two barriers: (its result, seconds on this rank)."""
    dist.barrier()
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def rank_job(layers: int, hidden: int, strategy, profile: bool) -> dict:
    import autopar
    torch.set_num_threads(1)
    model, batch = llama(layers, hidden)
    profiler = cProfile.Profile() if profile and dist.get_rank() == 0 else None
    if profiler is not None:
        profiler.enable()
    pm, compile_s = _timed(lambda: autopar.compile(model, None, example_kwargs=batch, strategy=strategy))
    _, first_s = _timed(lambda: pm.step(**batch))
    if profiler is not None:
        profiler.disable()
    steps = []
    for _ in range(2):
        pm.zero_grad(set_to_none=True)
        _, seconds = _timed(lambda: pm.step(**batch))
        dist.barrier()
        steps.append(seconds)
    report = {"timings": dict(pm.timings), "compile": _slowest(compile_s), "first_step": _slowest(first_s),
              "step": _slowest(statistics.median(steps)), "plan": _plan_text(pm.plan)}
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        report["profile"] = out.getvalue()
    return report


def _plan_text(plan) -> str:
    text = " x ".join(f"{k}={v}" for k, v in plan.mesh.items())
    return text + (f", m={plan.pipeline['microbatches']}" if plan.pipeline else "")


def run_case(layers: int, hidden: int, case: str, repeats: int, profile: bool = False) -> dict:
    reports = [launch(rank_job, WORLD, (layers, hidden, CASES[case], profile), timeout_s=3600)[0]
               for _ in range(repeats)]
    med = {key: statistics.median(r[key] for r in reports) for key in ("compile", "first_step", "step")}
    med["timings"] = {p: statistics.median(r["timings"].get(p, 0.0) for r in reports) for p in PHASES}
    med["plan"], med["layers"], med["case"], med["repeats"] = reports[0]["plan"], layers, case, repeats
    med["profile"] = reports[0].get("profile")
    return med


def table(rows: list[dict], markdown: bool = True) -> str:
    head = ["layers", "case", "plan", "compile s", "capture", "analysis", "planning", "groups", "module",
            "first step s", "rank capture", "rank analysis", "rewrite", "recompile", "run", "ordinary step s",
            "compile + first step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        t = r["timings"]
        cells = [str(r["layers"]), r["case"], r["plan"], f"{r['compile']:.2f}"] + \
            [f"{t[f'compile.{p}']:.2f}" for p in ("capture", "analysis", "planning", "groups", "module")] + \
            [f"{r['first_step']:.2f}"] + \
            [f"{t[f'program.{p}']:.2f}" for p in ("capture", "analysis", "rewrite", "recompile")] + \
            [f"{t['first_step.run']:.2f}", f"{r['step']:.2f}", f"{r['compile'] + r['first_step']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(rows: list[dict]) -> str:
    """Per case: (compile + first step) at each depth over the shallowest's, beside the
    same ratio of the ordinary step."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: r["layers"])
        base = mine[0]
        for r in mine[1:]:
            out.append(f"{case}: {r['layers']} layers / {base['layers']}: compile + first step "
                       f"{(r['compile'] + r['first_step']) / (base['compile'] + base['first_step']):.2f}x, "
                       f"ordinary step {r['step'] / base['step']:.2f}x")
    return "\n".join(out)


def main(argv=None) -> list[dict]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    p.add_argument("--hidden", type=int, default=512, help="the model's width (default 512)")
    p.add_argument("--repeats", type=int, default=1, help="launches per case; figures are their medians")
    p.add_argument("--profile", action="store_true", help="print a cProfile of rank 0's compile and first step")
    args = p.parse_args(argv)
    cases = args.cases or (["tensor"] if args.quick else list(CASES))
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; this benchmark has {list(CASES)}")
    layers, hidden = ([2, 4], 128) if args.quick else (args.layers, args.hidden)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}; hidden {hidden}, {WORLD} gloo ranks")
    rows = []
    for case in cases:
        for n in layers:
            row = run_case(n, hidden, case, args.repeats, args.profile)
            rows.append(row)
            if row["profile"]:
                print(row["profile"])
            print(table([row]).splitlines()[-1], flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}\n")
    print(table(rows))
    print(ratios(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "profile"} for r in rows], f, indent=2)
    return rows


if __name__ == "__main__":
    main()
