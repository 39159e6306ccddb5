"""The families the planner weighs, in the order it weighs them (:mod:`autopar.driver.search`),
and :func:`register_family`, the one way a family joins them.

The order is part of the plan: the configurations weighed are listed in it, and a tie
goes to the earlier configuration (data before Megatron's smaller tensor degrees before
larger ones, D&SP, AxoNN's grids, Bian's cube, PTD-P, then mixed plans, so that a mixed
plan is taken only when it is predicted faster than every single-family one; expert
parallelism and context parallelism last: they ride on the data, Megatron (and pipeline)
configurations; replication after them all, weighed only when nothing else is feasible).
A family registered later goes after the built-in ones, before replication.

A family is an object with the methods of :class:`autopar.strategies.family.Family`
(subclass :class:`~autopar.strategies.family.CompileHooks` for the defaults) and a
declaration to the generic layers (:class:`autopar.planning.declared.Language`: its
strategy keys, pins, axes, and how plans and explanations show it): the built-in ones
live in their packages under ``autopar/strategies/`` (``planner.py`` and
``language.py``); one written anywhere else registers the same way
(``examples/custom_family.py``, docs/architecture.md "Adding a family"). This module and
:mod:`autopar.planning.declared` are where family names map to families.
"""
from __future__ import annotations

from typing import Callable, Sequence

from autopar.planning.declared import DECLARED, Declared, Language, declare
from autopar.strategies.context import language as context_language
from autopar.strategies.context.planner import ContextParallel
from autopar.strategies.cube import language as cube_language
from autopar.strategies.cube.planner import Cube
from autopar.strategies.data import language as data_language
from autopar.strategies.data.planner import DataParallel
from autopar.strategies.dsp import language as dsp_language
from autopar.strategies.dsp.planner import DSP
from autopar.strategies.experts import language as experts_language
from autopar.strategies.experts.planner import ExpertParallel
from autopar.strategies.family import Family
from autopar.strategies.megatron import language as megatron_language
from autopar.strategies.megatron.planner import Megatron
from autopar.strategies.mixed import language as mixed_language
from autopar.strategies.mixed.planner import Mixed
from autopar.strategies.pipeline import language as pipeline_language
from autopar.strategies.pipeline.planner import Pipeline
from autopar.strategies.replicate import language as replicate_language
from autopar.strategies.replicate.planner import Replicate
from autopar.strategies.tensor3d import language as tensor3d_language
from autopar.strategies.tensor3d.planner import Tensor3D

FAMILIES: list[Family] = []
"""Every registered family, in the order the planner weighs them (kept in place: the
planner, the compiler and the runtime read this list)."""

REQUIRED = ("regions", "candidates", "price", "to_plan", "follow_ups", "step_floor", "fallbacks", "finish_plan",
            "planned_shards", "rank_passes", "recompute_regions", "place", "parameter_holders", "rank_code",
            "rank_runtime")
_LAST_RESORT = ("replicate",)   # weighed only when nothing else is feasible: stays last


def register_family(family: Family, *, keys: Sequence[str] = (), explain: Callable | None = None,
                    by_name: bool = True, language: Language | None = None) -> Family:
    """Add ``family`` to the families the planner weighs under ``"auto"``, the compiler
    asks about each rank's program and the runtime runs (after those registered before
    it, before replication); returns it.

    ``by_name``: ``strategy="NAME"`` (or ``{"family": "NAME", key: value, ...}`` with the
    option ``keys`` it takes, read back by ``Strategy.option``; a memory lever among them
    when the family prices it) forces it. Its plans carry ``Plan.family`` (saved in
    plan.json; compiling such a plan in a process that has not registered the family is
    refused). ``explain(plan) -> list[str]``: its lines in ``Plan.explain()``. Those
    make its declaration (:class:`~autopar.planning.declared.Declared`); a family that
    declares more (its own strategy keys, pins, axes, explanation: every hook of
    :class:`~autopar.planning.declared.Language`) passes its ``language`` instead, as the
    built-in families do. Registering the same object again does nothing; another object
    under a registered name is refused."""
    missing = [m for m in REQUIRED if not callable(getattr(family, m, None))]
    name = getattr(family, "name", None)
    if not isinstance(name, str) or not name or not name.replace("&", "").isalnum() and not name.isidentifier():
        raise TypeError(f"register_family: {family!r} needs a `name`, a word (as plans and explain() show it)")
    if missing:
        raise TypeError(f"register_family: family {name!r} lacks {missing}; subclass "
                        f"autopar.strategies.family.CompileHooks for the defaults")
    same = [f for f in FAMILIES if f.name == name]
    if same:
        if same[0] is family:
            return family
        raise ValueError(f"register_family: a family named {name!r} is already registered ({same[0]!r})")
    if language is not None and language.name != name:
        raise ValueError(f"register_family: the language of {name!r} declares the name {language.name!r}")
    declare(language if language is not None else Declared(name, tuple(keys), explain, by_name))
    at = next((i for i, f in enumerate(FAMILIES) if f.name in _LAST_RESORT), len(FAMILIES))
    FAMILIES.insert(at, family)
    return family


def unregister_family(name: str) -> None:
    """Take the registered family ``name`` out again (a test's or a notebook's cleanup);
    the built-in families stay."""
    if name in BUILT_IN:
        raise ValueError(f"unregister_family: {name!r} is a built-in family")
    FAMILIES[:] = [f for f in FAMILIES if f.name != name]
    DECLARED.pop(name, None)


for _family, _language in ((DataParallel(), data_language), (Megatron(), megatron_language),
                          (DSP(), dsp_language), (Tensor3D(), tensor3d_language), (Cube(), cube_language),
                          (Pipeline(), pipeline_language), (Mixed(), mixed_language),
                          (ExpertParallel(), experts_language), (ContextParallel(), context_language),
                          (Replicate(), replicate_language)):
    register_family(_family, language=_language.LANGUAGE)
del _family, _language
BUILT_IN = tuple(f.name for f in FAMILIES)

__all__ = ["FAMILIES", "register_family", "unregister_family"]
