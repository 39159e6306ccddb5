"""The pipeline part of a plan's explanation (:meth:`autopar.planning.plan.Plan.explain`,
placed by the pipeline's declaration, :mod:`autopar.strategies.pipeline.language`):
its stages and their ranks, the schedule with its bubble, memory per rank, every
schedule of its chunks priced alike (why the others lost), and the timeline."""
from __future__ import annotations

from autopar.planning.explain import _mb, _ms


def pipeline_text(plan: "Plan") -> list[str]:
    """The pipeline part of :func:`explain`: stages, schedule, bubble, memory, the
    schedules weighed, timeline."""
    pp = plan.pipeline
    p, v, m = pp["stages"], pp["chunks"], pp["microbatches"]
    ranks = pp.get("stage_ranks") or [s % p for s in range(p * v)]
    where = " (stages r and 2p-1-r on rank r, a V)" if ranks[-1] == 0 else f" (stage c*{p} + r on rank r)"
    lines = [f"pipeline (megatron sec. 2.2): {p * v} stages on {p} pipeline ranks"
             + (f", {v} chunks per rank{where}" if v > 1 else "")
             + f"; schedule {pp['schedule']}, {m} microbatch(es) of {pp['microbatch_size']} row(s); predicted "
             f"bubble {pp.get('bubble_rule', '(p-1)/(v*m)')} = {pp['bubble_fraction']:.3f} ({_ms(pp['bubble_s'])}); "
             f"scatter/gather {'on' if pp['scatter_gather'] else 'off'}"]
    for s in range(p * v):
        blocks = [b for b, a in zip(pp["blocks"], pp["assignment"]) if a == s]
        ends = (" + embedding" if s == 0 else "") + (" + head and loss" if s == p * v - 1 else "")
        sends = (f"; sends {pp['p2p_bytes'][s] / 2**10:.1f} KiB per microbatch" if s < p * v - 1 else "")
        lines.append(f"  stage {s} (rank {ranks[s]}): {', '.join(blocks)}{ends}; {_ms(pp['stage_s'][s])} per "
                     f"microbatch{sends}")
    if pp["tied"]:
        lines.append(f"  tied parameters (gradients summed over their stages' ranks): {', '.join(pp['tied'])}")
    shown = range(p) if p <= 8 else [0, 1, p - 2, p - 1]
    lines.append("  per rank: " + "; ".join(
        (f"... rank {r}" if p > 8 and r == p - 2 else f"rank {r}") + f" {_ms(pp['rank_s'][r])}/microbatch, "
        f"{sum(pp['in_flight'][r])} in flight, {_mb(pp['memory_bytes'][r])} "
        f"({_mb(pp['memory_bytes_recompute'][r])} recomputing)" for r in shown))
    rivals = pp.get("schedules") or []
    if len(rivals) > 1:  # Qi et al. 2024: why the others lost
        lines.append(f"  schedules at m={m} (step, bubble, memory per rank): " + "; ".join(
            f"{r['schedule']} {_ms(r['step_s'])}, {_ms(r['bubble_s'])}, {_mb(r['memory_bytes'])}"
            + (" (chosen)" if r["schedule"] == pp["schedule"] else "" if r["fits"] else " (does not fit)")
            for r in rivals))
    split = any(a in pp["schedule"] for a in ("zb", "zbv"))
    if p <= 8 and m * v <= 32:
        lines.append("timeline (unit: one chunk's forward; " + ("input and weight passes I, W 1 unit each):"
                                                                 if split else "backward = 2 units):"))
        lines.extend("  " + line for line in plan.timeline().text().splitlines())
    else:
        lines.append(f"timeline: {p} ranks x {m * v} chunk-passes, too wide to print here; plan.save() writes "
                     f"timeline.txt and timeline.svg")
    return lines
