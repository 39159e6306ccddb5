"""Benchmark 6: pipeline schedules on 4 gloo ranks (megatron §2.2, Figures 4 and 12-13).

One 8-block transformer cut into p = 4 stages, the same global batch, run under GPipe,
1F1B and interleaved 1F1B (v = 2 chunks per rank, 8 stages) with m = 4, 8 and 16
microbatches; all nine side by side (interleaved repetitions, barriers, medians). Each
row gives the step time against GPipe at the same m, the predicted bubble
(p − 1)/(v·m) beside the measured one, and the planner's predicted step.

*Measured bubble*: per step, (makespan − busy)/busy averaged over the ranks, the
makespan from the first rank's first action to the last rank's last action on the
machine's one monotonic clock, busy the time in actions less the time blocked in
receives (``autopar.testing.measured_bubbles``).

*Memory*: the most bytes autograd holds saved for backward at once on each rank during
one step (parameters excluded; ``PipelineExecutor.track_memory``): GPipe keeps every
microbatch's activations, 1F1B at most p − r of them.

Four processes share this machine's two cores, so a rank that waits lends its core to
another: absolute times and the measured bubble are what this machine gives, the
trends are what to read. Denormal floats are flushed (see docs/pipelining.md).

    python benchmarks/bench_pipeline.py [--steps 10] [--quick]
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import compare, interleaved, parser, print_rows, write_json, zero_grad

import statistics

import torch
import torch.distributed as dist

import autopar
from autopar.runtime.launcher import launch
from autopar.testing import measured_bubbles

P = 4
SCHEDULES = [("GPipe", "gpipe", 1), ("1F1B", "1f1b", 1), ("interleaved v=2", "interleaved", 2)]


def make_case(quick: bool):
    from examples.models import TinyTransformer, lm_loss
    torch.manual_seed(0)
    width = 64 if quick else 128
    model = TinyTransformer(vocab=64, width=width, heads=4, layers=8, block=32)
    ids = torch.randint(0, 64, (16, 32))
    return model, (ids,), torch.randint(0, 64, (16, 32)), lm_loss


def rank_job(steps: int, warmup: int, quick: bool, counts: tuple[int, ...]) -> dict:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    model, inputs, target, loss_fn = make_case(quick)
    modules, spans = {}, {}
    for label, name, v in SCHEDULES:
        for m in counts:
            key = f"{label} m={m}"
            modules[key] = autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn,
                                           example_target=target,
                                           strategy={"pipeline": P, "microbatches": m, "schedule": name, "chunks": v})
            spans[key] = []

    def stepper(key):
        pm = modules[key]
        params = list(pm.parameters())

        def step():
            zero_grad(params)
            pm.step(*inputs, target=target)
            spans[key].append(pm.pipeline_executor.span)
        return step

    times = interleaved({key: stepper(key) for key in modules}, steps, warmup, sync=dist.barrier)
    peaks = {}
    for key, pm in modules.items():
        pm.pipeline_executor.track_memory = True
        pm.step(*inputs, target=target)
        zero_grad(list(pm.parameters()))
        peaks[key] = pm.pipeline_executor.peak_saved_bytes
        pm.pipeline_executor.track_memory = False
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"spans": {k: v[warmup:] for k, v in spans.items()}, "peaks": peaks})
    if dist.get_rank() != 0:
        return {}
    rows, memory = [], []
    for label, _, v in SCHEDULES:
        for m in counts:
            key = f"{label} m={m}"
            measured = measured_bubbles([{"spans": r["spans"][key]} for r in everyone])
            plan = modules[key].plan
            peaks_kib = "/".join(f"{r['peaks'][key] / 1024:.0f}" for r in everyone)
            rows.append(compare("pipeline", key, times, ours=key, baseline=f"GPipe m={m}", goal=float("inf"),
                                note=f"bubble predicted {(P - 1) / (v * m):.3f}, measured "
                                     f"{statistics.median(measured):.3f}; predicted step "
                                     f"{plan.step_s * 1e3:.1f} ms; peak saved for backward per rank "
                                     f"{peaks_kib} KiB"))
            memory.append((key, [r["peaks"][key] for r in everyone],
                           list(plan.pipeline["memory_bytes"])))
    return {"rows": rows, "memory": memory}


def run(steps: int, warmup: int, quick: bool = False) -> list:
    counts = (4, 8) if quick else (4, 8, 16)
    result = launch(rank_job, P, (steps, warmup, quick, counts), timeout_s=1800)[0]
    print("peak bytes saved for backward per rank (measured | predicted activations):")
    for key, measured, predicted in result["memory"]:
        print(f"  {key:22s} " + " ".join(f"{b / 1024:7.0f}" for b in measured) + " KiB | "
              + " ".join(f"{b / 1024:7.0f}" for b in predicted) + " KiB (with parameters and optimizer state)")
    return result["rows"]


def main(argv=None) -> list:
    args = parser(__doc__.splitlines()[0], default_steps=10).parse_args(argv)
    steps, warmup = (max(3, args.steps // 3), 1) if args.quick else (args.steps, 2)
    rows = run(steps, warmup, args.quick)
    print_rows(f"pipeline schedules, p={P} on 4 gloo ranks ({steps} steps, {warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
