"""The ``autopar`` command: plan a model without launching processes.

    autopar plan examples/factories.py:gpt2 --world 8 --preset a100-selene --out plan_gpt2

The factory is a function in a Python file returning ``(model, example_inputs, loss_fn)``
or ``(model, example_inputs, loss_fn, example_target)``. The plan is printed and saved
(plan JSON, explanation, the first ranks' rewritten graphs, the region drawing).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from typing import Sequence


def _load_factory(spec: str):
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise SystemExit(f"autopar plan: expected FILE.py:FACTORY, got {spec!r}")
    if not os.path.exists(path):
        raise SystemExit(f"autopar plan: no such file {path!r}")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise SystemExit(f"autopar plan: {path} has no function {name!r}")
    return getattr(module, name)


def _parse_strategy(text: str):
    if text in ("auto", "data", "tensor"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # data=2,tensor=2
        try:
            return {k: int(v) if v.isdigit() else {"true": True, "false": False}.get(v.lower(), v)
                    for k, v in (part.split("=") for part in text.split(","))}
        except ValueError:
            raise SystemExit(f"autopar plan: --strategy {text!r}: expected auto, data, tensor, data=2,tensor=2 "
                             f", x=2,y=2,z=2, cube=2 or pipeline=4,microbatches=8,schedule=1f1b")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autopar", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd = sub.add_parser("plan", help="plan a model for a simulated cluster and save the plan")
    plan_cmd.add_argument("factory", help="FILE.py:FUNCTION returning (model, example_inputs, loss_fn[, target])")
    plan_cmd.add_argument("--world", type=int, required=True, help="number of ranks to plan for")
    plan_cmd.add_argument("--preset", default=None, help="hardware preset name or JSON file (default cpu-gloo)")
    plan_cmd.add_argument("--strategy", default="auto",
                          help="auto, data, tensor, data=2,tensor=2, a 3D grid x=2,y=2,z=2[,data=1], cube=2, or a "
                               "pipeline pipeline=4[,microbatches=8,schedule=gpipe|1f1b|interleaved,chunks=2,"
                               "data=..,tensor=..]")
    plan_cmd.add_argument("--out", default=None, help="directory to save the plan in (default plan_<factory>)")
    plan_cmd.add_argument("--ranks", type=int, default=8, help="save the rewritten graphs of this many ranks")
    plan_cmd.add_argument("--top", type=int, default=0, metavar="K",
                          help="also list the K best configurations weighed, communication split by group")
    plan_cmd.add_argument("-v", "--verbose", action="store_true", help="log each pass and its time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")

    import autopar  # after argument parsing: importing torch takes a while

    factory = _load_factory(args.factory)
    made = factory()
    if not isinstance(made, tuple) or len(made) not in (3, 4):
        raise SystemExit("autopar plan: the factory must return (model, example_inputs, loss_fn[, example_target])")
    model, inputs, loss_fn = made[:3]
    target = made[3] if len(made) == 4 else None
    try:
        plan = autopar.plan(model, args.world, inputs, loss_fn, _parse_strategy(args.strategy),
                            example_target=target, hardware=args.preset)
    except (autopar.PlanError, autopar.CaptureError, ValueError) as e:
        print(f"autopar plan: {e}", file=sys.stderr)
        return 2
    print(plan.explain())
    if args.top:
        print()
        print(plan.top(args.top))
    out = args.out or f"plan_{args.factory.rpartition(':')[2]}"
    plan.save(out, max_ranks=args.ranks)
    print(f"\nsaved to {out}/ (plan.json, plan.txt, regions.dot, rank*.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
