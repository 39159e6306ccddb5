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
    if text in ("auto", "data", "tensor") or text.isidentifier():   # a built-in word or a registered family's name
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
                             f", x=2,y=2,z=2, cube=2, pipeline=4,microbatches=8,schedule=1f1b or a registered "
                             f"family's name (family=NAME,KEY=VALUE for its options)")


def _add_calibrate_parser(sub) -> None:
    cmd = sub.add_parser("calibrate", help="measure this machine's backend and write a hardware profile",
                         description="Time matmuls, kernel launch, memory copies and every collective on WORLD "
                                     "local ranks, fit the cost model's figures (alpha and beta per collective "
                                     "and group size), print the fits and write a profile for "
                                     "autopar plan --preset / autopar.compile(hardware=...).")
    cmd.add_argument("--world", type=int, default=4, help="number of local ranks to measure with (default 4; 1 times "
                                                          "compute alone, the network figures then --base's)")
    cmd.add_argument("--backend", default="gloo", help="torch.distributed backend: gloo (CPU) or nccl (one GPU "
                                                       "per rank); default gloo")
    cmd.add_argument("--out", default=None, help="profile JSON to write (default <name>.json)")
    cmd.add_argument("--quick", action="store_true", help="fewer message sizes and matmuls (a few seconds)")
    cmd.add_argument("--name", default=None, help="the profile's name (default calibrated-<backend>-<world>)")
    cmd.add_argument("--base", default="cpu-gloo", help="preset to compare with in the table (default cpu-gloo)")
    cmd.add_argument("--no-cache", action="store_true",
                     help="do not store the profile as this machine's (by default autopar.compile and autopar plan "
                          "without hardware= use the last profile autopar calibrate measured here)")
    cmd.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                     help="the matmuls' dtype (default fp32; a GPU preset's peak is its bf16 one)")
    cmd.add_argument("--points", action="store_true", help="also print every measurement beside its fitted value")
    cmd.add_argument("--points-json", default=None, metavar="FILE",
                     help="also save every measurement beside its fitted value as JSON")


def _calibrate_main(args) -> int:
    """``autopar calibrate``: run :func:`autopar.calibrate.run_calibration`, print the table,
    write the profile (``Hardware.to_json()``, indent 2, sorted keys)."""
    from autopar.calibrate import run_calibration
    from autopar.runtime.launcher import LaunchError

    try:
        result = run_calibration(args.world, backend=args.backend, base=args.base, quick=args.quick,
                                 name=args.name, dtype=args.dtype)
    except (ValueError, LaunchError) as e:
        print(f"autopar calibrate: {e}", file=sys.stderr)
        return 2
    print(result.table(points=args.points))
    out = args.out or f"{result.hardware.name}.json"
    with open(out, "w") as f:
        json.dump(result.hardware.to_json(), f, indent=2, sort_keys=True)
        f.write("\n")
    if args.points_json:
        with open(args.points_json, "w") as f:
            json.dump(result.points_json(), f, indent=2)
            f.write("\n")
    print(f"\nwrote {out}: use it with autopar plan --preset {out} or autopar.compile(..., hardware={out!r})")
    if not args.no_cache:
        from autopar.cost.profiles import save_profile
        cached = save_profile(result.hardware, args.backend)
        print(f"cached as this machine's profile {cached}: autopar.compile and autopar plan use it without "
              f"hardware= (until the machine or torch changes)")
    return 0


def _out_name(args) -> str:
    """The default plan directory's suffix: the factory's function or the configuration."""
    if args.factory:
        return args.factory.rpartition(":")[2]
    if args.hf:
        path = os.path.abspath(args.hf)
        return os.path.basename(os.path.dirname(path) if os.path.basename(path) == "config.json" else path)
    return args.hf_model_type


def _progress_printer():
    """A search that runs more than a second prints how far it is, on stderr."""
    from autopar.driver.search import Progress

    def report(done: int, total: int, elapsed: float) -> None:
        end = "\n" if done == total else ""
        print(f"\rautopar plan: {done}/{total} configurations priced, {elapsed:.1f} s", end=end, file=sys.stderr,
              flush=True)

    return Progress(report)


def _planned(autopar, args):
    """The plan of what the arguments name: a factory, or a Hugging Face configuration."""
    memory_limit = None if args.memory_limit is None else args.memory_limit * 2**30
    if (args.hf is not None) + (args.hf_model_type is not None) + (args.factory is not None) != 1:
        raise ValueError("give one of FILE.py:FUNCTION, --hf CONFIG or --hf-model-type TYPE")
    if args.factory is None:
        if args.batch is None:
            raise ValueError("--hf / --hf-model-type need --batch SEQUENCESxTOKENS, e.g. --batch 512x8192")
        from autopar.hf_config import parse_overrides
        return autopar.plan_config(args.hf or args.hf_model_type, args.world, args.batch,
                                   overrides=parse_overrides(args.set), dtype=args.dtype,
                                   strategy=_parse_strategy(args.strategy), hardware=args.preset,
                                   memory_limit=memory_limit, progress=_progress_printer())
    if args.batch or args.set or args.dtype:
        raise ValueError("--batch, --set and --dtype belong to --hf / --hf-model-type; a factory makes its own "
                         "inputs")
    made = _load_factory(args.factory)()
    if not isinstance(made, tuple) or len(made) not in (3, 4):
        raise SystemExit("autopar plan: the factory must return (model, example_inputs, loss_fn[, example_target])")
    model, inputs, loss_fn = made[:3]
    target = made[3] if len(made) == 4 else None
    return autopar.plan(model, args.world, inputs, loss_fn, _parse_strategy(args.strategy), example_target=target,
                        hardware=args.preset, memory_limit=memory_limit, progress=_progress_printer())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autopar", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd = sub.add_parser("plan", help="plan a model for a simulated cluster and save the plan")
    plan_cmd.add_argument("factory", nargs="?", default=None,
                          help="FILE.py:FUNCTION returning (model, example_inputs, loss_fn[, target]); or give --hf "
                               "or --hf-model-type instead")
    plan_cmd.add_argument("--hf", default=None, metavar="CONFIG",
                          help="a Hugging Face config.json (or its directory): its causal LM built on the meta device")
    plan_cmd.add_argument("--hf-model-type", default=None, metavar="TYPE",
                          help="a transformers model type (llama, mixtral, qwen3, ...) with its default configuration")
    plan_cmd.add_argument("--set", default="", metavar="K=V,...",
                          help="configuration overrides for --hf / --hf-model-type, e.g. hidden_size=8192,"
                               "num_hidden_layers=80")
    plan_cmd.add_argument("--batch", default=None, metavar="SEQSxTOKENS",
                          help="with --hf / --hf-model-type: the global batch, e.g. 512x8192")
    plan_cmd.add_argument("--dtype", default=None, help="with --hf: bfloat16 (default unless the config says), "
                                                        "float16 or float32")
    plan_cmd.add_argument("--world", type=int, required=True, help="number of ranks to plan for")
    plan_cmd.add_argument("--preset", default=None, help="hardware preset name or JSON file, e.g. a profile written "
                                                         "by autopar calibrate (default: this machine's calibrated "
                                                         "profile if autopar calibrate cached one, else cpu-gloo)")
    plan_cmd.add_argument("--strategy", default="auto",
                          help="auto, data, tensor, data=2,tensor=2, a 3D grid x=2,y=2,z=2[,data=1], cube=2, or a "
                               "pipeline pipeline=4[,microbatches=8,schedule=gpipe|1f1b|interleaved,chunks=2,"
                               "data=..,tensor=..]")
    plan_cmd.add_argument("--out", default=None, help="directory to save the plan in (default plan_<factory>)")
    plan_cmd.add_argument("--ranks", type=int, default=8, help="save the rewritten graphs of this many ranks")
    plan_cmd.add_argument("--top", type=int, default=0, metavar="K",
                          help="also list the K best configurations weighed, communication split by group")
    plan_cmd.add_argument("--why-not", action="append", default=[], metavar="FAMILY",
                          help="say why a family of strategies lost or was infeasible: data, megatron, dsp, tensor3d, "
                               "cube, pipeline, mixed or experts (repeatable)")
    plan_cmd.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                          help="memory per device a plan may use, in GiB (default: the hardware's)")
    plan_cmd.add_argument("--no-save", action="store_true", help="print the plan without saving it")
    plan_cmd.add_argument("--check", default=None, metavar="GOLDEN_DIR",
                          help="compare the plan and its rank programs with a golden saved there; exit 1, printing "
                               "what changed, where they differ (AUTOPAR_ACCEPT=1 or --accept rewrites the golden)")
    plan_cmd.add_argument("--accept", action="store_true", help="with --check: write the golden from this plan")
    plan_cmd.add_argument("-v", "--verbose", action="store_true", help="log each pass and its time")
    _add_calibrate_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        return _calibrate_main(args)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")

    import autopar  # after argument parsing: importing torch takes a while

    try:
        plan = _planned(autopar, args)
        why_not = [plan.why_not(family) for family in args.why_not]
    except (autopar.PlanError, autopar.CaptureError, ValueError, OSError) as e:
        print(f"autopar plan: {e}", file=sys.stderr)
        return 2
    print(plan.explain())
    if args.top:
        print()
        print(plan.top(args.top))
    for text in why_not:
        print()
        print("why not " + text)
    if args.check:
        from autopar.planning.golden import PlanChangedError, accepting, check
        accepted = accepting(True if args.accept else None)
        try:
            check(plan, args.check, args.ranks, accepted)
        except PlanChangedError as e:
            print(f"\nautopar plan --check: {e}", file=sys.stderr)
            return 1
        print(f"\nautopar plan --check: the plan equals the golden at {args.check}" if not accepted else
              f"\nautopar plan --check: wrote the golden at {args.check}")
    if args.no_save or args.check:
        return 0
    out = args.out or f"plan_{_out_name(args)}"
    plan.save(out, max_ranks=args.ranks)
    print(f"\nsaved to {out}/ (plan.json, plan.txt, report.html, regions.dot, rank*.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
