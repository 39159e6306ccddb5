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
          "jamba", "qwen3", "olmo2"]
EQUAL_WITHIN = 1e-9
LOOSER = {
    "gpt_neo": "computes its attention scores in float32 (`query.to(torch.float32)`): the captured graph rounds "
               "them otherwise than eager PyTorch, 1e-12 on the loss in one process without a split",
    "llama4": "computes its norms and rotary in float32 (`x.float()`), whose rounding depends on the shapes a rank "
              "computes at",
    "olmo2": "computes its RMSNorm in float32 (`to(torch.float32)`), whose mean rounds otherwise when its input "
             "arrives gathered (a 3D grid); with the norms in float64 the 3D plan agrees within 2e-13",
    "jamba": "Mamba's `D` and `A_log` gradients are sums of terms that cancel to 1e-6 of their size: a split of "
             "the batch moves them by 6e-8 relative in one process without autopar, and AdamW's eps magnifies it",
}
"""Models whose own numerics are looser than float64's (a forward in float32 whatever the
model's dtype, gradients that cancel): equal within 1e-5, each with the reason."""


def label(strategy) -> str:
    if strategy == "auto":
        return "auto"
    return " ".join(f"{k}={v}" if not isinstance(v, bool) else k.replace("_parallel", "")
                    for k, v in strategy.items() if k != "microbatches")


def outcome(row: dict) -> tuple[str, str]:
    """``(verdict, detail)`` of one row: equal (``equal*``: within 1e-5, for a model of
    :data:`LOOSER`) / refused / unequal / error."""
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
    if worst <= EQUAL_WITHIN:
        return "equal", f"{detail} ({worst:.0e})"
    if row.get("model") in LOOSER and worst <= 1e-5:
        return "equal*", f"{detail} ({worst:.0e})"
    return "unequal", f"{detail} ({worst:.0e})"


def markdown(table: dict) -> str:
    """The table as docs/coverage.md shows it: a row per model, a column per strategy;
    ``=`` equal, ``=*`` equal within :data:`LOOSER`'s bound, ``(a)`` the attention split by
    the family, ``(a–)`` the model's attention left whole by a family that splits it,
    ``rN`` refused for the reason numbered N below the table."""
    keys = [label(s) for s in STRATEGIES]
    short = {"equal": "=", "equal*": "=*", "unequal": "UNEQUAL", "error": "ERROR"}
    splitting = ("tensor", "subgrids", "x")
    lines = ["| model | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    counts: dict = {}
    reasons: list = []
    for name, cells in table.items():
        row = []
        for key in keys:
            verdict, detail = cells.get(key, ("", ""))
            counts[verdict] = counts.get(verdict, 0) + 1
            if verdict == "refused":
                reason = detail.split(": ", 1)[-1] if detail.startswith(("strategy: ", "pipeline: ")) else detail
                reason = reason.split(" (", 1)[0].split("; ", 1)[0]
                if reason.startswith("region "):   # the same reason in every model: without the region's name
                    reason = reason.split(": ", 1)[-1]
                if reason not in reasons:
                    reasons.append(reason)
                row.append(f"r{reasons.index(reason) + 1}")
                continue
            cell = short.get(verdict, verdict)
            if verdict in ("unequal", "error"):
                cell += " " + detail.split(" (")[0][:80]
            elif key == "auto":
                mesh = detail.split(";", 1)[0].replace("mesh ", "")
                cell += f" {mesh}" + (" (a)" if "attention " in detail and "attention replicate" not in detail else "")
            elif any(key.startswith(f) or f" {f}=" in f" {key}" for f in splitting):
                attention = detail.split("attention ", 1)[1].split(" (")[0] if "attention " in detail else ""
                if attention:
                    cell += " (a)" if attention not in ("replicate",) else " (a–)"
            row.append(cell)
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())), ""]
    lines += [f"r{i + 1}. {reason}" for i, reason in enumerate(reasons)]
    return "\n".join(lines)


def survey_job(cases: list) -> list[dict]:
    from examples.peers.hf_models import hf_job
    return hf_job(cases)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--json", default=None)
    parser.add_argument("--from-json", default=None, help="print the markdown table of an earlier run")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            print(markdown(json.load(f)))
        return 0
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
    print(markdown(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
