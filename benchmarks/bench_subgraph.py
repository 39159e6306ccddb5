"""Benchmark (docs/benchmarks.md §3): sub-graph parallelism (D&SP, D&SP-cSub) against data parallelism, 2 gloo ranks.

Three ``ParallelModule`` s of one model, compiled with ``{"data": 2}``,
``{"data": 2, "subgrids": 2}`` and the same with ``"csub": True``, run the same global
batch; a step is ``zero_grad`` + ``pm.step`` (forward, backward, gradient sync), timed
interleaved on rank 0 between barriers. Each row is one sub-graph form against data
parallelism on the same model; the note gives the cost model's predicted step for both
sides on the ``cpu-gloo`` preset, so prediction and measurement can be compared.

Goal: the planner's choice among the three (``strategy="auto"`` restricted to these
layouts, i.e. the lowest predicted step) is at most 1.10x the fastest measured. That is
the promise of a cost model: it need not predict times exactly, but it must not pick a
form that runs clearly slower.

    python benchmarks/bench_subgraph.py [--steps 40] [--quick] [--cases CASE ...]
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import cases_of, compare, interleaved, parser, print_rows, steps_of, write_json, zero_grad

import torch
import torch.distributed as dist

import autopar
from autopar.runtime.launcher import launch

CASES = ["inception-b32", "towers-b64", "transformer-b8"]
QUICK_CASES = ["inception-b32"]
FORMS = {"data": {"data": 2}, "dsp": {"data": 2, "subgrids": 2}, "csub": {"data": 2, "subgrids": 2, "csub": True}}
CHOICE_GOAL = 1.10


def make_case(name: str):
    """(model, inputs, target, loss) of a named case, from seed 0 on every rank."""
    import torch.nn.functional as F

    from examples.models import Inception, TinyTransformer, Towers, lm_loss
    torch.manual_seed(0)
    if name == "inception-b32":
        return Inception(), (torch.randn(32, 3, 8, 8),), torch.randint(0, 5, (32,)), F.cross_entropy
    if name == "towers-b64":
        return Towers(towers=4), (torch.randn(64, 16),), torch.randint(0, 4, (64,)), F.cross_entropy
    if name == "transformer-b8":
        return TinyTransformer(), (torch.randint(0, 64, (8, 16)),), torch.randint(0, 64, (8, 16)), lm_loss
    raise ValueError(f"unknown case {name!r}; cases: {CASES}")


def rank_job(cases: list[str], steps: int, warmup: int) -> list:
    torch.set_num_threads(1)
    rows = []
    for name in cases:
        model, inputs, target, loss_fn = make_case(name)
        modules = {form: autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                                         strategy=strategy, hardware="cpu-gloo")
                   for form, strategy in FORMS.items()}

        def stepper(pm):
            params = list(pm.parameters())

            def step():
                zero_grad(params)
                pm.step(*inputs, target=target)
            return step

        times = interleaved({form: stepper(pm) for form, pm in modules.items()}, steps, warmup, sync=dist.barrier)
        predicted = {form: pm.plan.step_s for form, pm in modules.items()}
        medians = {form: sorted(t)[len(t) // 2] for form, t in times.items()}
        chosen = min(predicted, key=predicted.__getitem__)
        fastest = min(medians, key=medians.__getitem__)
        for form in ("dsp", "csub"):
            rows.append(compare("subgraph", f"{name} {form}", times, ours=form, baseline="data", goal=float("inf"),
                                note=f"predicted {predicted[form] * 1e3:.2f} ms vs data {predicted['data'] * 1e3:.2f} ms"))
        rows.append(compare("subgraph", f"{name} choice={chosen}", times, ours=chosen, baseline=fastest,
                            goal=CHOICE_GOAL, note=f"planner's choice {chosen} against the fastest measured, {fastest}"))
    return rows


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None) -> list:
    cases = cases or (QUICK_CASES if quick else CASES)
    return launch(rank_job, 2, (cases, steps, warmup), timeout_s=900)[0]


def main(argv=None) -> list:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    steps, warmup = steps_of(args)
    rows = run(steps, warmup, args.quick, cases_of(args.cases, args.quick, CASES, QUICK_CASES))
    print_rows(f"sub-graph parallelism: D&SP and D&SP-cSub vs data parallel, 2 gloo ranks "
               f"({steps} steps, {warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
