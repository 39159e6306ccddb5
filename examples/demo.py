"""`make demo`: Hugging Face GPT-2 (random weights) on 4 local CPU ranks, planned by autopar.

Runs the plan autopar chooses itself and a forced data x tensor plan, prints each plan
and the check against single-device training, and saves the forced plan for review.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.runtime.launcher import launch  # noqa: E402
from examples.factories import gpt2  # noqa: E402
from examples.train import report, worker  # noqa: E402

if __name__ == "__main__":
    for strategy in ("auto", {"data": 2, "tensor": 2}):
        print(f"=== GPT-2 on 4 gloo ranks, strategy={strategy} " + "=" * 30)
        results = launch(worker, 4, ("gpt2", strategy, 3), timeout_s=600)
        print(report(results[0], "gpt2"))
        print()
    model, inputs, loss, target = gpt2()
    plan = autopar.plan(model, 4, inputs, loss, {"data": 2, "tensor": 2}, example_target=target)
    out = plan.save("plan_dump_gpt2")
    print(f"saved the data x tensor plan to {out}/: plan.json, plan.txt, regions.dot, rank0.py ... rank3.py")
