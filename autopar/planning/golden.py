"""Golden plans for a user's CI: a model's plan and rank programs may not change unreviewed.

    plan = autopar.plan(model, 64, inputs, loss_fn, hardware="h100")
    autopar.testing.assert_plan_unchanged(plan, "tests/golden/my_model")

    autopar plan --hf config.json --world 64 --batch 256x4096 --preset h100 --check tests/golden/my_model

A golden is a directory as :meth:`Plan.save` writes it; compared are ``plan.json``
(without ``hardware_source``, which names the machine that planned) and the first ranks'
programs ``rank<r>.py``. A difference is reported as what changed in the plan's
decisions (mesh, schedule, each region's strategy), then a unified diff of each file
that differs (:data:`DIFF_LINES` lines at most per file). With the environment variable
``AUTOPAR_ACCEPT=1`` (as ``EXPECTTEST_ACCEPT`` for expecttest) or ``accept=True``, the
golden is written (or rewritten) instead and the check passes.
"""
from __future__ import annotations

import difflib
import json
import os
import re

from autopar.planning.plan import Plan

ACCEPT_ENV = "AUTOPAR_ACCEPT"
DIFF_LINES = 60
UNSTABLE = ("hardware_source",)  # plan.json keys left out of the comparison


class PlanChangedError(AssertionError):
    """The plan differs from its golden; the message says how and how to accept it."""


def _comparable(plan_json: str) -> str:
    data = json.loads(plan_json)
    for key in UNSTABLE:
        data.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _files(directory: str, ranks: int) -> dict[str, str]:
    out = {}
    path = os.path.join(directory, "plan.json")
    if os.path.isfile(path):
        with open(path) as f:
            out["plan.json"] = _comparable(f.read())
    for rank in range(ranks):
        path = os.path.join(directory, f"rank{rank}.py")
        if os.path.isfile(path):
            with open(path) as f:
                out[f"rank{rank}.py"] = f.read()
    return out


def decisions(plan_json: str) -> dict[str, object]:
    """What a reviewer decided on: the mesh and form, the pipeline's schedule and
    microbatches, the memory levers, and each region's strategy."""
    data = json.loads(plan_json)
    pipeline = data.get("pipeline") or {}
    out: dict[str, object] = {"mesh": data.get("mesh"), "zero": data.get("zero"),
                              "recompute": data.get("recompute"), "microbatches": data.get("microbatches")}
    if pipeline:
        out.update({"pipeline schedule": pipeline.get("schedule"),
                    "pipeline microbatches": pipeline.get("microbatches"), "pipeline chunks": pipeline.get("chunks")})
    out.update({f"region {r['region']}": r["strategy"] for r in data.get("regions", [])})
    return out


def _decision_lines(old: str, new: str) -> list[str]:
    before, after = decisions(old), decisions(new)
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, "(absent)") != after.get(key, "(absent)"):
            lines.append(f"  {key}: {before.get(key, '(absent)')} -> {after.get(key, '(absent)')}")
    return lines


def compare(plan: Plan, golden_dir: str, ranks: int = 8) -> str:
    """'' where ``plan`` (with its first ``ranks`` rank programs) equals the golden at
    ``golden_dir``; else a readable account of the differences."""
    ranks = min(ranks, plan.world_size)
    if getattr(plan, "artifact_source", None) is None and any(PLAN_FILES.match(n) and n.startswith("rank")
                                                               for n in (os.listdir(golden_dir)
                                                                         if os.path.isdir(golden_dir) else ())):
        raise ValueError("the plan was read back from JSON and cannot build its rank programs, which the golden "
                         "holds: check a plan made by autopar.plan, autopar.plan_config or compile")
    if not os.path.isdir(golden_dir):
        return f"no golden plan at {golden_dir}"
    before = _files(golden_dir, ranks)
    # what Plan.save would write of the compared files, built here without writing the rest
    now = {"plan.json": _comparable(plan.to_json())}
    if getattr(plan, "artifact_source", None) is not None:
        graphs, _ = plan.artifact_source(ranks)
        now.update((f"rank{rank}.py", code) for rank, code in graphs.items())
    changed = sorted(name for name in set(now) | set(before) if now.get(name) != before.get(name))
    if not changed:
        return ""
    parts = []
    if "plan.json" in changed and "plan.json" in before and "plan.json" in now:
        lines = _decision_lines(before["plan.json"], now["plan.json"])
        parts.append("decisions changed:\n" + "\n".join(lines) if lines else
                     "decisions unchanged; predicted costs or other fields changed")
    for name in changed:
        diff = list(difflib.unified_diff(before.get(name, "").splitlines(), now.get(name, "").splitlines(),
                                         f"golden/{name}", f"now/{name}", lineterm="", n=2))
        if len(diff) > DIFF_LINES:
            diff = diff[:DIFF_LINES] + [f"... {len(diff) - DIFF_LINES} more diff lines"]
        parts.append("\n".join(diff) if diff else f"{name}: missing on one side")
    return "\n".join(parts)


PLAN_FILES = re.compile(r"^(plan\.json|plan\.txt|report\.html|rank\d+\.py|regions\.(dot|svg)|timeline\.(txt|svg))$")


def write(plan: Plan, golden_dir: str, ranks: int = 8) -> None:
    """(Re)write the golden at ``golden_dir`` from ``plan``. An existing directory must
    be a plan's (hold ``plan.json``); only a plan directory's files are replaced, other
    files are left."""
    if os.path.isdir(golden_dir) and os.listdir(golden_dir):
        if not os.path.isfile(os.path.join(golden_dir, "plan.json")):
            raise PlanChangedError(f"{golden_dir} holds files but no plan.json: not a golden plan; give an empty or "
                                   f"new directory")
        for name in os.listdir(golden_dir):
            if PLAN_FILES.match(name):
                os.remove(os.path.join(golden_dir, name))
    plan.save(golden_dir, max_ranks=min(ranks, plan.world_size))


def accepting(accept: bool | None) -> bool:
    """``accept`` where given, else whether ``AUTOPAR_ACCEPT`` is 1, true or yes."""
    if accept is not None:
        return bool(accept)
    return os.environ.get(ACCEPT_ENV, "").strip().lower() in ("1", "true", "yes")


def check(plan: Plan, golden_dir: str, ranks: int = 8, accept: bool | None = None) -> str:
    """Compare with the golden (:func:`compare`); when accepting, write it instead and
    return ''. Raises :class:`PlanChangedError` where it differs."""
    golden_dir = os.fspath(golden_dir)
    if accepting(accept):
        write(plan, golden_dir, ranks)
        return ""
    found = compare(plan, golden_dir, ranks)
    if found:
        raise PlanChangedError(f"the plan of {plan.model} on {plan.world_size} ranks differs from its golden at "
                               f"{golden_dir}:\n{found}\nReview the change; to accept it, rerun with "
                               f"{ACCEPT_ENV}=1 (the golden is rewritten).")
    return ""
