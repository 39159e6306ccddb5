"""Benchmark (docs/benchmarks.md §18): zero-bubble pipelines (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024) against 1F1B and the interleaved 1F1B.

1. **Measured on 4 gloo ranks**: one 8-block transformer cut into p = 4 stages, the same
   global batch, under 1F1B, interleaved 1F1B (v = 2), ZB-H1, the interleaved
   zero-bubble schedule (v = 2) and ZB-V, with m = 4, 8 and 16 microbatches, all fifteen
   side by side in one launch (interleaved repetitions, barriers, medians). Each row gives
   the step against 1F1B at the same m, the measured bubble beside two predictions: the
   planner's (its cost model's F, I and W on the simulated timeline) and the timeline
   simulated with the pass times measured in this run (the medians of each kind's
   actions), which separates the simulator from the cost model.
2. **Predicted on the presets**: GPT-3-shaped models (h = 4096..12288, s = 2048) forced
   to a pipeline of 8 ranks with m microbatches on the A100 (``a100-selene``) and H100
   presets; the planner's predicted gain of each schedule over 1F1B at the same layout,
   beside the gains Qi et al. report (ZB-H1 up to 23 % at 1F1B's memory, ZB-H2 up to
   31 % with twice the memory).

Four processes share this machine's two cores, so a rank that waits lends its core to
another: a bubble there is not idle hardware, and what decides the step is the total work
(which the split adds to). **p = 2 on 2 ranks, one per core** (1F1B, ZB-H1, ZB-V at m = 2,
4, 8) is where a bubble is idle time, as on GPUs.

    python benchmarks/bench_zero_bubble.py [--steps 10] [--quick] [--presets-only]
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import compare, interleaved, parser, print_rows, write_json, zero_grad

import statistics

import torch
import torch.distributed as dist

import autopar
from autopar.planning.timeline import simulate
from autopar.runtime.launcher import launch
from autopar.testing import measured_bubbles
from bench_pipeline import make_case  # the same 8-block transformer

P = 4
SCHEDULES = [("1F1B", "1f1b", 1), ("interleaved v=2", "interleaved", 2), ("ZB-H1", "zb-h1", 1),
             ("interleaved ZB v=2", "interleaved-zb", 2), ("ZB-V", "zbv", 2)]


def _pass_medians(traces: list) -> dict[str, float]:
    """Median seconds of each kind of action over every rank's trace."""
    kinds: dict[str, list[float]] = {}
    for trace in traces:
        for kind, seconds in trace:
            kinds.setdefault(kind, []).append(seconds)
    return {k: statistics.median(v) for k, v in kinds.items()}


def rank_job(steps: int, warmup: int, quick: bool, counts: tuple[int, ...], schedules=SCHEDULES) -> dict:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    model, inputs, target, loss_fn = make_case(quick)
    modules, spans, traces = {}, {}, {}
    p = dist.get_world_size()
    for label, name, v in schedules:
        for m in counts:
            key = f"{label} m={m}"
            modules[key] = autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                                           strategy={"pipeline": p, "microbatches": m, "schedule": name, "chunks": v})
            spans[key], traces[key] = [], []

    def stepper(key):
        pm = modules[key]
        params = list(pm.parameters())

        def step():
            zero_grad(params)
            pm.step(*inputs, target=target)
            ex = pm.pipeline_executor
            spans[key].append(ex.span)
            traces[key].append([(a.kind, end - start) for a, start, end in ex.trace])
        return step

    times = interleaved({key: stepper(key) for key in modules}, steps, warmup, sync=dist.barrier)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"spans": {k: v[warmup:] for k, v in spans.items()},
                                      "traces": {k: [a for t in v[warmup:] for a in t] for k, v in traces.items()}})
    if dist.get_rank() != 0:
        return {}
    rows = []
    for label, name, v in schedules:
        for m in counts:
            key = f"{label} m={m}"
            measured = statistics.median(measured_bubbles([{"spans": r["spans"][key]} for r in everyone]))
            passes = _pass_medians([r["traces"][key] for r in everyone])
            forward = passes["F"]
            backward = passes.get("B", passes.get("I", 0.0) + passes.get("W", 0.0))
            timeline = simulate(name, p, m, v, forward=forward, backward=backward, input_grad=passes.get("I"),
                                weight_grad=passes.get("W"))
            plan = modules[key].plan
            rows.append(compare(f"zero bubble p={p}", key, times, ours=key, baseline=f"1F1B m={m}", goal=float("inf"),
                                note=f"passes {', '.join(f'{k} {x * 1e3:.2f}' for k, x in sorted(passes.items()))} "
                                     f"ms; bubble measured {measured:.3f}, simulated from measured passes "
                                     f"{timeline.bubble_fraction:.3f}, planner {plan.pipeline['bubble_fraction']:.3f}; "
                                     f"predicted step {plan.step_s * 1e3:.1f} ms"))
    return {"rows": rows}


P2_SCHEDULES = [("1F1B", "1f1b", 1), ("ZB-H1", "zb-h1", 1), ("ZB-V", "zbv", 2)]
GPT3_SHAPES = [("GPT-3 6.7B", 32, 4096, 32), ("GPT-3 13B", 40, 5120, 40), ("GPT-3 175B", 96, 12288, 96)]


def presets(quick: bool) -> list[str]:
    """The planner's predicted gain of each schedule over 1F1B (module docstring, 2)."""
    from examples.factories import gpt_meta
    lines = []
    shapes = GPT3_SHAPES[:1] if quick else GPT3_SHAPES
    for hardware in ("a100-selene", "h100"):
        for label, layers, width, heads in shapes:
            tensor = 1 if width <= 5120 else 8
            world = 8 * tensor
            for m in (16, 32, 64):
                model, inputs, loss, target = gpt_meta(layers, width, heads, m, vocab=51200)
                steps = {}
                for name, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("interleaved-zb", 2), ("zbv", 2)):
                    plan = autopar.plan(model, world, inputs, loss, {"pipeline": 8, "tensor": tensor, "data": 1,
                                                                     "microbatches": m, "schedule": name},
                                        example_target=target, hardware=hardware)
                    steps[name] = plan.step_s
                gains = ", ".join(f"{n} {steps['1f1b'] / s - 1:+.1%}" for n, s in steps.items() if n != "1f1b")
                lines.append(f"{hardware:12s} {label:11s} p=8 t={tensor} m={m:3d}: 1F1B {steps['1f1b']:.2f} s; "
                             f"over 1F1B: {gains}")
    return lines


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0], default_steps=10)
    p.add_argument("--presets-only", action="store_true", help="only the predicted gains on the presets")
    p.add_argument("--p2-only", action="store_true", help="only p = 2 on 2 ranks")
    args = p.parse_args(argv)
    steps, warmup = (max(3, args.steps // 3), 1) if args.quick else (args.steps, 2)
    rows = []
    if not args.presets_only:
        counts = (4, 8) if args.quick else (4, 8, 16)
        if not args.p2_only:
            rows = launch(rank_job, P, (steps, warmup, args.quick, counts), timeout_s=3000)[0]["rows"]
            print_rows(f"zero-bubble schedules, p={P} on 4 gloo ranks ({steps} steps, {warmup} warm-up)", rows)
        two = launch(rank_job, 2, (steps, warmup, args.quick, (2, 4, 8), P2_SCHEDULES), timeout_s=3000)[0]["rows"]
        print_rows(f"zero-bubble schedules, p=2 on 2 gloo ranks, one per core ({steps} steps, {warmup} warm-up)", two)
        rows += two
    if not args.p2_only:
        print("predicted gain over 1F1B on the presets (Qi et al. 2024 report up to +23 % for ZB-H1 at 1F1B's "
              "memory, +31 % for ZB-H2 with twice the memory):")
        for line in presets(args.quick):
            print("  " + line)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
