"""Benchmark (docs/benchmarks.md §4): AxoNN 3D tensor parallelism on 8 gloo ranks (axonn §IV, Figure 3).

Two tables, each measured side by side (interleaved, between barriers, medians):

1. **Overlap, one optimisation at a time** (the paper's Figure 3 as a table): one
   transformer on a 2x2x2 grid with no overlap, then adding §IV-A (input-gradient
   all-reduce under the weight-gradient matmul), §IV-B (weight-gradient reduce-scatters
   deferred to the end of backward), §IV-C (next layer's weight all-gather issued ahead),
   and, with activation recomputation, §IV-D (all-gathered weights cached for the second
   forward) against recomputation without it. Each row's ratio is against the row with
   nothing overlapped; the note gives the communication hidden: ``1 − exposed/exposed
   without overlap``, where *exposed* is the time rank 0 spent blocked in the 3D layers'
   collectives (``pm.tensor3d_runtime.exposed_s``, synchronous calls and waits).
2. **1D, 2-D mesh and 3D plans of one model**: Megatron over 8 ranks, Megatron
   data 2 x tensor 4, AxoNN's 2x2x2 grid and Bian's 2x2x2 cube, each against the
   planner's predicted step, with the bytes each rank saves for backward in one step
   (tensors autograd keeps, parameters excluded: the activation memory the cube balances).

A step is ``zero_grad`` + ``pm.step``. Eight processes share this machine's cores, so
absolute times are dominated by scheduling; the ratios are what to read.

    python benchmarks/bench_tensor3d.py [--steps 20] [--quick]
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import compare, interleaved, parser, print_rows, write_json, zero_grad

import torch
import torch.distributed as dist

import autopar
from autopar.runtime.launcher import launch

GRID = {"x": 2, "y": 2, "z": 2}
OFF = {"all_reduce": False, "reduce_scatter": False, "all_gather": False, "cache": False}
LADDER = [  # (name, overlap, recompute)
    ("no overlap", OFF, False),
    ("+OAR (§IV-A)", {**OFF, "all_reduce": True}, False),
    ("+ORS (§IV-B)", {**OFF, "all_reduce": True, "reduce_scatter": True}, False),
    ("+OAG (§IV-C)", {"all_reduce": True, "reduce_scatter": True, "all_gather": True, "cache": False}, False),
    ("recompute, no cache", {"all_reduce": True, "reduce_scatter": True, "all_gather": True, "cache": False}, True),
    ("recompute +cache (§IV-D)", {"all_reduce": True, "reduce_scatter": True, "all_gather": True, "cache": True},
     True),
]
MESHES = [("1D tensor=8", {"data": 1, "tensor": 8}), ("2-D data=2 x tensor=4", {"data": 2, "tensor": 4}),
          ("3D 2x2x2", GRID), ("cube 2x2x2 (Bian)", {"cube": 2})]


def make_case(quick: bool):
    from examples.models import TinyTransformer, lm_loss
    torch.manual_seed(0)
    width = 64 if quick else 128
    model = TinyTransformer(vocab=128, width=width, heads=8, layers=2, block=32)
    ids = torch.randint(0, 128, (8, 32))
    return model, (ids,), torch.randint(0, 128, (8, 32)), lm_loss


def _stepper(pm, inputs, target):
    params = list(pm.parameters())

    def step():
        zero_grad(params)
        pm.step(*inputs, target=target)
    return step


def rank_job(steps: int, warmup: int, quick: bool) -> list:
    torch.set_num_threads(1)
    model, inputs, target, loss_fn = make_case(quick)
    rows = []
    ladder = {name: autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                                    strategy=GRID, overlap=overlap, recompute=recompute)
              for name, overlap, recompute in LADDER}
    times = interleaved({name: _stepper(pm, inputs, target) for name, pm in ladder.items()}, steps, warmup,
                        sync=dist.barrier)
    runs = warmup + steps
    exposed = {name: pm.tensor3d_runtime.exposed_s / runs for name, pm in ladder.items()}
    for name, _, _ in LADDER[1:]:
        reference = "recompute, no cache" if name.startswith("recompute +") else "no overlap"
        hidden = 1 - exposed[name] / exposed[reference] if exposed[reference] else 0.0
        rows.append(compare("tensor3d", f"overlap {name}", times, ours=name, baseline=reference, goal=float("inf"),
                            note=f"3D collectives exposed {exposed[name] * 1e3:.2f} ms/step vs "
                                 f"{exposed[reference] * 1e3:.2f} ms for {reference} ({hidden:.0%} hidden)"))
    meshes = {name: autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                                    strategy=strategy) for name, strategy in MESHES}
    times = interleaved({name: _stepper(pm, inputs, target) for name, pm in meshes.items()}, steps, warmup,
                        sync=dist.barrier)
    saved = {name: _saved_bytes(pm, inputs, target) for name, pm in meshes.items()}
    for name, _ in MESHES[1:]:
        rows.append(compare("tensor3d", f"plan {name}", times, ours=name, baseline=MESHES[0][0], goal=float("inf"),
                            note=f"predicted {meshes[name].plan.step_s * 1e3:.2f} ms vs "
                                 f"{meshes[MESHES[0][0]].plan.step_s * 1e3:.2f} ms for {MESHES[0][0]}; saved for "
                                 f"backward {saved[name] / 1024:.0f} KiB/rank vs {saved[MESHES[0][0]] / 1024:.0f}"))
    return rows


def _saved_bytes(pm, inputs, target) -> int:
    """Bytes of the distinct tensors autograd saves for backward during one step on this
    rank (parameters excluded)."""
    seen: dict[tuple, int] = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            seen[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pm.step(*inputs, target=target)
    zero_grad(list(pm.parameters()))
    return sum(seen.values())


def run(steps: int, warmup: int, quick: bool = False) -> list:
    return launch(rank_job, 8, (steps, warmup, quick), timeout_s=1200)[0]


def main(argv=None) -> list:
    args = parser(__doc__.splitlines()[0], default_steps=20).parse_args(argv)
    steps, warmup = (max(3, args.steps // 4), 2) if args.quick else (args.steps, 3)
    rows = run(steps, warmup, args.quick)
    print_rows(f"3D tensor parallelism on 8 gloo ranks ({steps} steps, {warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
