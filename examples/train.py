"""Train one of the example models with autopar and check it against single-device training.

Local CPU ranks (gloo), launched by autopar's launcher:

    python examples/train.py --model gpt2 --world 4 --strategy auto

Under torchrun (NCCL on GPUs, gloo on CPUs) the same script joins the launched job:

    torchrun --nproc-per-node 4 examples/train.py --model transformer --strategy data=2,tensor=2

Every rank builds the same model from the same seed, compiles it, trains a few AdamW
steps on the same global batch, and rank 0 prints the plan and the largest differences
from the single-device model (outputs, loss, gradients, parameters after the steps).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autopar.runtime.launcher import init_from_env, launch  # noqa: E402
from autopar.testing import compare_with_single_device  # noqa: E402
from examples.factories import training_case  # noqa: E402


def parse_strategy(text: str):
    if text in ("auto", "data", "tensor"):
        return text
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


def worker(model_name: str, strategy, steps: int):
    factory, inputs, target, loss_fn = training_case(model_name)
    return compare_with_single_device(factory, inputs, target, loss_fn, strategy, steps=steps)


def report(result: dict, model_name: str) -> str:
    lines = [result["plan"], "", f"equivalence with single-device training ({model_name}, fp32):"]
    for key, what in (("output", "outputs"), ("loss", "loss"), ("grad", "gradients"),
                      ("param", "parameters after the AdamW steps")):
        absolute, relative = result[key]
        lines.append(f"  {what:<34} max abs diff {absolute:.2e}   max rel diff {relative:.2e}")
    ok = result["output"][1] < 1e-5 and result["loss"][1] < 1e-5 and result["grad"][1] < 1e-5 \
        and result["param"][0] < 5e-4
    lines.append("  => " + ("EQUAL to single-device training (within fp32 rounding)" if ok else "DIFFERENT"))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["mlp", "transformer", "gpt2"], default="gpt2")
    parser.add_argument("--world", type=int, default=4, help="local ranks to launch (ignored under torchrun)")
    parser.add_argument("--strategy", default="auto", help="auto, data, tensor, or data=2,tensor=2")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    strategy = parse_strategy(args.strategy)
    if "RANK" in os.environ:  # torchrun
        rank, _ = init_from_env()
        result = worker(args.model, strategy, args.steps)
        if rank == 0:
            print(report(result, args.model))
    else:
        results = launch(worker, args.world, (args.model, strategy, args.steps), timeout_s=600)
        print(report(results[0], args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
