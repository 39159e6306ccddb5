"""The peer suite's table: every model of :mod:`examples.peers.hf_models` under ``"auto"``
and under each family on 2 gloo ranks, in float64 against one process, and what each
plan split (docs/coverage.md, "Peer suite").

    python -m examples.peers.survey [model ...] [--json out.json]

One launch per model runs all of its strategies. Each row is ``equal`` (the largest
relative difference of outputs, loss, gradients and parameters after 3 steps within
1e-9), ``refused`` (a ``PlanError``: the reason), ``unequal`` or ``error`` (a bug), and
the families the plan's regions took."""
from __future__ import annotations

import argparse
import json
import sys
import time

STRATEGIES = ["auto", {"data": 2}, {"data": 2, "zero": 3}, {"tensor": 2},
              {"tensor": 2, "sequence_parallel": True}, {"pipeline": 2, "microbatches": 2}, {"context": 2},
              {"data": 2, "subgrids": 2}, {"x": 2}]
MODELS = ["gpt2", "cerebras_gpt", "gpt_neo", "gptj", "pythia", "bloom", "qwen2", "phi", "smollm2", "tinyllama",
          "stablelm2", "falcon3", "mistral", "t5", "bert", "roberta", "distilbert", "falcon", "rwkv", "llama4",
          "jamba"]
EQUAL_WITHIN = 1e-9


def label(strategy) -> str:
    if strategy == "auto":
        return "auto"
    return " ".join(f"{k}={v}" if not isinstance(v, bool) else k.replace("_parallel", "")
                    for k, v in strategy.items() if k != "microbatches")


def outcome(row: dict) -> tuple[str, str]:
    """``(verdict, detail)`` of one row: equal / refused / unequal / error."""
    if "error" in row:
        kind = row["error"].split(":", 1)[0]
        return ("refused" if kind == "PlanError" else "error"), row["error"].split(":", 1)[1].strip()[:160]
    worst = max(row[k][1] for k in ("output", "loss", "grad", "param"))
    split = sorted({s for s in row["regions"].values() if s not in ("replicate",)})
    attention = row.get("attention") or []
    detail = ", ".join(split) or "nothing split"
    if attention:
        detail += f"; attention {'/'.join(sorted(set(attention)))}"
    if row["strategy"] == "auto":
        detail = "mesh " + " × ".join(f"{k} {v}" for k, v in row["mesh"].items() if v > 1) + "; " + detail
    return ("equal" if worst <= EQUAL_WITHIN else "unequal"), f"{detail} ({worst:.0e})"


def survey_job(cases: list) -> list[dict]:
    from examples.peers.hf_models import hf_job
    return hf_job(cases)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from autopar.runtime.launcher import launch
    table = {}
    for name in args.models:
        start = time.perf_counter()
        try:
            rows = launch(survey_job, 2, ([(name, s) for s in STRATEGIES],), timeout_s=1800)[0]
        except Exception as error:  # noqa: BLE001 - a launch that failed: the whole model's row
            rows = [{"model": name, "strategy": s, "error": f"launch: {type(error).__name__}: {error}"}
                    for s in STRATEGIES]
        table[name] = {label(r["strategy"]): outcome(r) for r in rows}
        print(f"{name} ({time.perf_counter() - start:.0f} s)", flush=True)
        for key, (verdict, detail) in table[name].items():
            print(f"  {key:18s} {verdict:8s} {detail}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
