"""The run-time side of the family protocol (docs/architecture.md, "The family
interface"): what a family keeps on a rank while the rank's programs run.

A family that needs state at run time returns a :class:`RankRuntime` from its
``rank_runtime(plan, rank, options)`` compile hook (``autopar.strategies.family``):
ZeRO's sharded parameters and their gathers, the 3D layers' overlap state, the pipeline's
schedule runner, the experts' load counter. :class:`~autopar.engine.module.ParallelModule`
and the runners call every runtime at the same points of a call and know none of them by
name; every method has a do-nothing default, so a runtime says only what it does.

A call runs as: ``before_call`` (module) → ``begin`` (under the plan's process groups)
→ the programs inside ``contexts`` → ``after_backward`` after each backward →
``finish`` once the call's gradients are reduced. ``stage=True`` marks a pipeline
stage's programs (a family may run them without some of its state: the 3D layers'
overlap state serves only plans whose 3D regions have a z axis). A rank whose program is
a part that takes no inputs (``partial``: D&SP-cSub's ranks off sub-grid 0) gets the
call's results through ``outputs`` and ``loss``, which every runtime sees on every rank.
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager


class RankRuntime:
    """One family's state on one rank. ``name``: the family's; ``active``: whether the
    plan uses it (an inactive runtime only answers ``attributes``)."""

    name: str = ""
    active: bool = True
    # this rank runs a part of the program that takes no inputs: its forward is called
    # without the call's inputs, its backward seeded with zeros (no loss of its own)
    partial: bool = False

    # ------------------------------------------------------------------ building the rank
    def layout_options(self) -> dict[str, Any]:
        """Keyword arguments for building this rank's parameter layout (the families'
        ``place``), e.g. whether weight-gradient reductions are deferred."""
        return {}

    def attach(self, layout, root, parts: dict) -> None:
        """The parameters are installed on ``root`` as ``layout`` says; ``parts`` holds
        the cut parts of the parameters a family shards further (their full rows)."""

    def bucket_params(self) -> dict[str, Any]:
        """Parameters whose gradients a bucket reduces in place of the module tree's
        (by original name)."""
        return {}

    def bucket_shards(self) -> Any:
        """What a bucket that reduce-scatters into shards writes to (None: no shards)."""
        return None

    def rewrite_options(self) -> dict[str, Any]:
        """Keyword arguments of the rank-program rewrite (``RankBuild`` fields)."""
        return {}

    def runner(self, state, model) -> Any:
        """A runner in place of the single-program runner (a pipeline's schedule), or None."""
        return None

    def absent_shards(self) -> set[str]:
        """Parameters the plan splits that this rank's programs need not split (a branch
        that another sub-grid runs)."""
        return set()

    # ------------------------------------------------------------------ each call
    def before_call(self) -> None:
        """Before a forward or step, outside the process groups' context."""

    def begin(self, stage: bool) -> None:
        """Before a call's programs run, under the plan's process groups (may communicate)."""

    def contexts(self, stage: bool) -> list[ContextManager]:
        """Context managers the rank's programs run inside."""
        return []

    def after_backward(self) -> None:
        """After each backward of a call (each microbatch's)."""

    def finish(self) -> None:
        """Once a call's programs are done and its gradients reduced."""

    def outputs(self, state, value: Any) -> Any:
        """The call's outputs on this rank, under the plan's groups (``value``: what its
        program returned; None on a ``partial`` rank)."""
        return value

    def loss(self, state, program, loss: Any) -> Any:
        """The step's loss on this rank, under the plan's groups (``loss``: what it
        computed; None on a ``partial`` rank, whose ``program`` computes none)."""
        return loss

    # ------------------------------------------------------------------ user-facing
    def attributes(self) -> dict[str, Callable[[Any], Any]]:
        """Attributes this family adds to ``ParallelModule`` (name → getter of the
        attribute's value from the rank's :class:`~autopar.engine.runner.RankState`), e.g.
        ``zero_stats``; asked of inactive runtimes too, so the attribute exists on every
        plan (with the value that says the family is not in use)."""
        return {}


def active(runtimes) -> tuple[RankRuntime, ...]:
    """The runtimes the plan uses, in the registry's order."""
    return tuple(r for r in runtimes if r.active)
