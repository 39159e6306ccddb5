"""The model-coverage suite: every model of :mod:`examples.zoo` captured, planned,
trained 3 steps on 4 gloo ranks and compared with single-device training.

``python -m examples.coverage`` runs it and prints the table of ``docs/coverage.md``
(``--write`` rewrites that file's table); ``tests/test_coverage.py`` runs the same job
in ``make test``. Each model is run with the plan ``"auto"`` picks and, for the Hugging
Face transformers, again with Megatron forced (``data=2 x tensor=2``), so the tensor
rewrite meets every model's attention and MLP spelling.

A run is *equal* when every tensor's relative error (``autopar.testing``: its largest
difference over its reference's largest magnitude) is within :data:`TOLERANCE` in float32:
the outputs, the loss and the gradient norms (2 and inf) to 2e-6, every gradient to 1e-5,
every parameter after 3 AdamW steps to 1e-3. Collectives only reorder sums, which leaves
outputs, loss and norms within ~3e-7 and gradients within ~4e-6 (ResNet's BatchNorm
weight under data parallelism; most within 1e-6). The parameters are looser because Adam
normalises each entry's gradient: an entry whose gradient is near zero moves by that
gradient's rounding (the key bias inside a fused in-projection: ~4e-4 of the tensor). A
tensor that is zero at the comparison's resolution (a key bias on its own, whose exact
gradient is zero, softmax ignoring a shift shared by all keys) is measured against the
largest of its kind (``autopar.testing.ZERO_BELOW``).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORLD = 4
MEGATRON = {"data": 2, "tensor": 2}
HF_TRANSFORMERS = ("gpt2", "bert", "llama", "t5", "vit")
DEFAULT_RUNS = [(name, "auto") for name in ("gpt2", "bert", "llama", "t5", "vit", "resnet", "mlp", "transformer",
                                             "inception", "towers")] + [(name, MEGATRON) for name in HF_TRANSFORMERS]


TOLERANCE = {"output": 2e-6, "loss": 2e-6, "grad_norm": 2e-6, "grad": 1e-5, "param": 1e-3}
"""The largest relative error over every tensor of each kind that a float32 run may show
and be equal to the single-device one (the module's docstring says why)."""


def is_equal(report: dict[str, Any]) -> bool:
    return all(report[kind][1] <= bound for kind, bound in TOLERANCE.items())


def _plan_summary(report: dict[str, Any]) -> str:
    mesh = " x ".join(f"{k}={v}" for k, v in report["mesh"].items() if v > 1) or "single rank"
    split = sorted(report["strategies"])
    return mesh + (f" ({', '.join(split)})" if split else "")


def coverage_job(runs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """On every rank: each ``(model name, strategy)`` compared with single-device training.
    A model that fails gives a row with its error instead of stopping the suite, unless its
    failure leaves the process group unusable (``autopar.testing.reported_in``)."""
    from autopar.testing import compare_with_single_device, reported_in
    from examples.zoo import ZOO
    rows = []
    for name, strategy in runs:
        case = ZOO[name]()
        start = time.perf_counter()
        row: dict[str, Any] = {"model": name, "strategy": strategy, "note": case.note, "equal": False}
        with reported_in(row, f"{name} under {strategy}"):
            report = compare_with_single_device(case.factory, case.inputs, case.target, case.loss_fn, strategy,
                                                kwargs=case.kwargs, steps=3)
            row.update({k: report[k] for k in ("tracer", "mesh", "strategies", "output", "loss", "grad", "grad_norm",
                                               "param", "worst_grad", "worst_param")})
            row["plan"] = _plan_summary(report)
            row["equal"] = is_equal(report)
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | strategy | tracer | plan chosen | equal | loss rel. / grads rel. / params abs. diff | time (s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        strategy = row["strategy"] if isinstance(row["strategy"], str) else \
            " x ".join(f"{k}={v}" for k, v in row["strategy"].items())
        if "error" in row:
            lines.append(f"| {row['model']} | {strategy} | - | - | **error** | {row['error'][:120]} | "
                         f"{row['seconds']:.1f} |")
            continue
        diffs = f"{row['loss'][1]:.1e} / {row['grad'][1]:.1e} / {row['param'][0]:.1e}"
        lines.append(f"| {row['model']} | {strategy} | {row['tracer']} | {row['plan']} | "
                     f"{'yes' if row['equal'] else '**no**'} | {diffs} | {row['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="run only these models (default: the whole suite)")
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/coverage.md")
    args = parser.parse_args(argv)
    from autopar.runtime.launcher import launch
    runs = [r for r in DEFAULT_RUNS if not args.models or r[0] in args.models]
    start = time.perf_counter()
    rows = launch(coverage_job, WORLD, (runs,), timeout_s=900)[0]
    text = table(rows)
    print(text)
    print(f"\n{len(rows)} runs on {WORLD} gloo ranks in {time.perf_counter() - start:.0f} s (with the spawn)")
    if args.write:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "coverage.md")
        doc = open(path).read()
        doc = re.sub(r"<!-- table -->.*<!-- /table -->", f"<!-- table -->\n{text}\n<!-- /table -->", doc, flags=re.S)
        open(path, "w").write(doc)
    return 0 if all(row["equal"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
