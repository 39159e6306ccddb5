"""Benchmark (docs/benchmarks.md §5): pipeline schedules on 4 gloo ranks (megatron §2.2, Figures 4 and 12-13).

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

*p = 2, one rank per core* (``--p2``, also part of the full run): 1F1B on 2 ranks with
m = 2, 4 and 8 microbatches of 8 rows (width 256, 4 blocks), the three interleaved in
one launch; each row gives the measured bubble's median beside (p − 1)/m and whether it
lies within −0.05/+0.15 of it (the excess is the point-to-point transfers and the
stages' unequal speed, which the formula leaves out), and the summary line whether it
falls as m grows. It depends on how busy the machine is, so it is a benchmark, not a
test.

    python benchmarks/bench_pipeline.py [--steps 10] [--quick] [--p2]
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


P2_COUNTS = (2, 4, 8)
P2_BAND = (-0.05, 0.15)  # measured − (p−1)/m: the band the figures are read against


def p2_bubble_job(steps: int, warmup: int) -> dict:
    """On each of 2 ranks: 1F1B with m = 2, 4, 8 (8 rows per microbatch, width 256, 4
    blocks, 64 tokens), the three steps interleaved; rank 0 returns the rows."""
    from examples.models import TinyTransformer, lm_loss
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    modules, spans, batches = {}, {}, {}
    for m in P2_COUNTS:
        torch.manual_seed(0)
        ids = torch.randint(0, 64, (8 * m, 64))
        key = f"p=2 1F1B m={m}"
        modules[key] = autopar.compile(TinyTransformer(width=256, layers=4, block=64), None, example_inputs=(ids,),
                                       loss_fn=lm_loss, example_target=ids,
                                       strategy={"pipeline": 2, "microbatches": m, "schedule": "1f1b"})
        spans[key], batches[key] = [], ids

    def stepper(key):
        pm, ids = modules[key], batches[key]
        params = list(pm.parameters())

        def step():
            zero_grad(params)
            pm.step(ids, target=ids)
            spans[key].append(pm.pipeline_executor.span)
        return step

    times = interleaved({key: stepper(key) for key in modules}, steps, warmup, sync=dist.barrier)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {k: v[warmup:] for k, v in spans.items()})
    if dist.get_rank() != 0:
        return {}
    rows, medians = [], {}
    for m in P2_COUNTS:
        key = f"p=2 1F1B m={m}"
        measured = measured_bubbles([{"spans": r[key]} for r in everyone])
        medians[m] = statistics.median(measured)
        predicted = modules[key].plan.pipeline["bubble_fraction"]
        q1, _, q3 = statistics.quantiles(measured, n=4, method="inclusive") if len(measured) > 1 else (0, 0, 0)
        within = P2_BAND[0] <= medians[m] - predicted <= P2_BAND[1]
        rows.append(compare("pipeline", key, times, ours=key, baseline=f"p=2 1F1B m={P2_COUNTS[0]}",
                            goal=float("inf"),
                            note=f"bubble predicted (p-1)/m {predicted:.3f}, measured median {medians[m]:.3f} "
                                 f"(IQR {q3 - q1:.3f}); within {P2_BAND[0]:+.2f}/{P2_BAND[1]:+.2f}: "
                                 f"{'yes' if within else 'NO'}"))
    falling = all(medians[a] > medians[b] for a, b in zip(P2_COUNTS, P2_COUNTS[1:]))
    return {"rows": rows, "falling": falling, "medians": medians}


def run_p2(steps: int, warmup: int) -> list:
    """The bubble on 2 ranks, one per core: see the module docstring."""
    result = launch(p2_bubble_job, 2, (steps, warmup), timeout_s=1800)[0]
    medians = " > ".join(f"{result['medians'][m]:.3f}" for m in P2_COUNTS)
    print(f"p=2 measured bubble falls as m grows (m = {', '.join(map(str, P2_COUNTS))}): "
          f"{'yes' if result['falling'] else 'NO'} ({medians})")
    return result["rows"]


def run(steps: int, warmup: int, quick: bool = False) -> list:
    counts = (4, 8) if quick else (4, 8, 16)
    result = launch(rank_job, P, (steps, warmup, quick, counts), timeout_s=1800)[0]
    print("peak bytes saved for backward per rank (measured | predicted activations):")
    for key, measured, predicted in result["memory"]:
        print(f"  {key:22s} " + " ".join(f"{b / 1024:7.0f}" for b in measured) + " KiB | "
              + " ".join(f"{b / 1024:7.0f}" for b in predicted) + " KiB (with parameters and optimizer state)")
    return result["rows"] + run_p2(steps, warmup)


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0], default_steps=10)
    p.add_argument("--p2", action="store_true", help="only the bubble on 2 ranks (1F1B, m = 2, 4, 8)")
    args = p.parse_args(argv)
    steps, warmup = (max(3, args.steps // 3), 1) if args.quick else (args.steps, 2)
    if args.p2:
        rows = run_p2(steps, warmup)
        print_rows(f"pipeline bubble, p=2 on 2 gloo ranks ({steps} steps, {warmup} warm-up)", rows)
    else:
        rows = run(steps, warmup, args.quick)
        print_rows(f"pipeline schedules, p={P} on 4 gloo ranks and p=2 on 2 ({steps} steps, {warmup} warm-up)",
                   rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
