"""A mixed plan's choice measured on 4 gloo ranks: does the plan ``"auto"`` picks for a
model whose parts want different families beat the single-family plans it weighed?

    python benchmarks/bench_mixed.py [--steps 6] [--warmup 2] [--json out.json]

The model is ``examples.models.TowerTrunk`` (attention between dense mixtures of four
expert towers; vocabulary 256, h = 256, 4 heads, 2 blocks, 32 tokens, batch 8), for
which ``"auto"`` on the ``cpu-gloo`` preset picks a pipeline of mixed stages (D&SP of the
towers over the tensor pair in both stages). The benchmark forces that plan (its region
choices as pins) and the fastest single-family configurations the planner weighed,
compiles each on the same 4 local gloo ranks, times training steps (``pm.step``; median
over ``--steps`` after warm-up, all ranks starting together) and prints predicted and
measured side by side, with each plan's measured ratio to the fastest measured one.
"""
from __future__ import annotations

import argparse
import json
import sys

from common import REPO_ROOT

import torch  # noqa: E402

WORLD = 4
assert REPO_ROOT  # common put the repo root on sys.path


def model_case():
    from examples.models import TowerTrunk, lm_loss
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (8, 32), generator=g)
    target = torch.randint(0, 256, (8, 32), generator=g)

    def factory():
        torch.manual_seed(0)
        return TowerTrunk(vocab=256, width=256, heads=4, layers=2, block=32)
    return factory, (ids,), target, lm_loss


def pins_of(plan) -> dict:
    """The forced strategy that reproduces a mixed plan: its degrees and each region's
    choice as a pin (regions inside a D&SP region left to it)."""
    specs = {"dsp": "dsp", "megatron": "megatron", "replicate": "replicate"}
    regions = {}
    for r in plan.regions[:-1]:
        if r.strategy == "tensor3d":
            regions[r.region] = {"tensor3d": dict(plan.tensor_grid)}
        elif "inside D&SP region" not in r.reason:
            regions[r.region] = specs[r.strategy]
    s = {"data": plan.mesh["data"], "tensor": plan.mesh["tensor"], "regions": regions}
    if plan.pipeline:
        pp = plan.pipeline
        s.update(pipeline=pp["stages"], microbatches=pp["microbatches"], schedule=pp["schedule"])
        if pp["chunks"] > 1:
            s["chunks"] = pp["chunks"]
    return s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--single", type=int, default=4, help="how many single-family plans to measure")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import autopar
    from autopar.runtime.launcher import launch
    from autopar.planning.explain import _family, _mesh_text
    from bench_fidelity import measure_job, strategy_of  # benchmarks/ is on the path (this script's folder)
    factory, inputs, target, loss_fn = model_case()
    plan = autopar.plan(factory(), WORLD, inputs, loss_fn, example_target=target)
    print(f"auto on cpu-gloo: {plan.mesh}, {plan.form or 'single family'}, predicted {plan.step_s * 1e3:.1f} ms",
          flush=True)
    single = sorted((c for c in plan.candidates if c.feasible and "mixed" not in c.form), key=lambda c: c.step_s)
    data = next(c for c in plan.candidates if c.feasible and c.mesh == {"data": WORLD, "tensor": 1} and
                c.subgrids == 1 and not c.form)
    rows = [("auto: " + (plan.form or "single family"), pins_of(plan) if plan.mixed else strategy_of(
        plan._chosen_candidate()), plan.step_s)]
    rows += [(f"{_family(c, WORLD)}: {_mesh_text(c)}", strategy_of(c), c.step_s)
             for c in single[:args.single] + ([] if data in single[:args.single] else [data])]
    measured = launch(measure_job, WORLD, ([s for _, s, _ in rows], None, args.steps, args.warmup, model_case),
                      timeout_s=3000)[0]
    best = min(measured)
    print(f"{'plan':96s} {'predicted':>10s} {'measured':>10s} {'/ fastest':>9s}")
    out = []
    for (name, strategy, predicted), m in zip(rows, measured):
        print(f"{name[:96]:96s} {predicted * 1e3:8.1f}ms {m * 1e3:8.1f}ms {m / best:8.2f}x")
        out.append({"plan": name, "strategy": strategy, "predicted_s": predicted, "measured_s": m})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
