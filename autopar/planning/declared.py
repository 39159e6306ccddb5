"""The families registered with :func:`autopar.register_family`, as the strategy
language and the plan's explanations read them: each one's name, the option keys it
takes when forced by name, and its lines in ``Plan.explain()``. Filled by
:mod:`autopar.strategies.registry`; read by :mod:`autopar.planning.strategy` (parsing),
:mod:`autopar.planning.explain`, the search and the reviewed-plan checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Declared:
    """A family registered through :func:`autopar.register_family` whose strategy is
    forced by its name: ``strategy="NAME"`` or ``{"family": "NAME", OPTION: value, ...}``
    with the option ``keys`` it declares (a memory lever of :data:`autopar.planning.strategy.LEVER_KEYS` among them
    when it prices the levers; the others are refused); ``explain``: its lines in
    :meth:`Plan.explain` (``explain(plan) -> list[str]``)."""

    name: str
    keys: tuple[str, ...] = ()
    explain: Any = None
    by_name: bool = True   # False: weighed and run, never forced by name


DECLARED: dict[str, Declared] = {}
"""Every registered family that is not built in, by name (filled by :func:`autopar.register_family`)."""

BUILT_IN_KINDS = ("mesh", "pipeline", "mixed", "cube", "3d", "dsp", "experts", "context")
"""What :meth:`Strategy.kind` names for the strategies its own keys describe."""


def declare(family: Declared) -> None:
    """Let ``Strategy.parse`` read ``family``'s name and keys (:class:`Declared`)."""
    if family.name in BUILT_IN_KINDS or family.name in ("auto", "data", "tensor"):
        raise ValueError(f"register_family: the name {family.name!r} is taken by a built-in strategy; choose another")
    DECLARED[family.name] = family


__all__ = ["BUILT_IN_KINDS", "DECLARED", "Declared", "declare"]
