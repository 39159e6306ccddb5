"""What the planner asks of the couplings found: whether a split of the batch would equal
the single device (:func:`split_conflict`), and what a plan does at each coupling."""
from __future__ import annotations

from autopar.passes.analysis.batch_rows.rows import Coupling


def split_conflict(found: list[Coupling], *, data: int = 1, rows_z: int = 1, microbatches: int = 1,
                   branches: bool = False, pipeline: bool = False) -> str | None:
    """Why a configuration that splits the batch this way would not equal the single
    device (None: it would). ``data``: ranks splitting the batch that the data pass
    joins (the exact remedies run there); ``rows_z``: the 3D grid's row split;
    ``microbatches``: passes over parts of the batch (a pipeline's or accumulation);
    ``branches``: D&SP's branches on other rows; ``pipeline``: the stages of a pipeline
    with data ranks (only the last stage runs the data pass)."""
    if not found:
        return None
    splits = []
    if microbatches > 1:
        splits.append(f"{microbatches} microbatches")
    if branches:
        splits.append("D&SP's branches on other rows")
    if rows_z > 1:
        splits.append(f"the 3D grid's rows over z = {rows_z}")
    if pipeline and data > 1:
        splits.append(f"a pipeline's stages over {data} data ranks")
    first_refused = next((c for c in found if not c.exact), None)
    if first_refused is not None and (data > 1 or splits):
        how = ", ".join(splits + ([f"{data} data ranks"] if data > 1 else []))
        return (f"rows of the batch meet at {first_refused.describe()}; splitting the batch over {how} would not "
                f"equal the single device. Plans that keep the batch whole (tensor, 3D over x and y, a pipeline "
                f"with one microbatch) are still possible")
    if splits:
        c = found[0]
        return (f"rows of the batch meet at {c.describe()}; autopar makes that exact across data ranks "
                f"({c.remedy}), not across {', '.join(splits)}. Use data (and tensor) parallelism, or a plan "
                f"that keeps the batch whole")
    return None


REMEDIES = {"gather": "each data rank scores its rows against every row: the operands all-gathered, their "
                      "gradients reduce-scattered, row-position targets offset",
            "all_reduce": "the statistic is the mean over the data ranks of each rank's (all-reduce forward and "
                          "backward)"}


def remedy_text(c: Coupling) -> str:
    """What a plan that splits the batch over data ranks does at ``c``."""
    if not c.exact:
        return "no exact split: plans that split the batch are refused"
    return REMEDIES[c.remedy]


def describe_all(found: list[Coupling]) -> list[str]:
    return [f"{c.kind}: {c.describe()} -> {remedy_text(c)}" for c in found]
