"""What every rank of a ``compile`` agrees on before any process group is made: the
call (:func:`check_same_call_everywhere`), the hardware the plan is priced with
(:func:`agreed_hardware`) and the plan itself (:func:`agreed_plan`: rank 0's, broadcast and
checked by every other rank as a reviewed plan), and afterwards that every rank runs it
(:func:`check_same_plan_everywhere`). Each difference fails every rank with one error
naming what differs, instead of mismatched groups that would hang."""
from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import torch.distributed as dist
import torch.fx as fx

from autopar.cost import first_use, profiles
from autopar.cost.hardware import Hardware
from autopar.ir import CAPTURE, LOSS_TERMS, regions as regions_of
from autopar.planning.model import ModelFacts
from autopar.planning.plan import Plan
from autopar.planning.reviewed import PlanMismatchError, differences, mismatch_message
from autopar.driver.search import PlanError, made_for, plan_graph, training_flops
from autopar.runtime.groups import size_of
from autopar.trace.capture import CaptureError
from autopar.trace.inputs import CallLayout, example_signature

log = logging.getLogger("autopar")


def resolve_hardware(hardware, memory_limit: float | None) -> tuple[Hardware, str]:
    """(the hardware to price with, where it came from): ``hardware`` as given, or with
    None this machine's calibrated profile, else the default preset (cost.profiles)."""
    hw, source = profiles.resolve(hardware)
    if memory_limit is None:
        return hw, source
    if not memory_limit > 0:
        raise ValueError(f"memory_limit={memory_limit!r}: give the bytes per device a plan may use (> 0)")
    return dataclasses.replace(hw, memory_bytes=float(memory_limit)), source


def agreed_hardware(hardware, memory_limit: float | None, world: int, mesh,
                    measure_with: tuple | None = None) -> tuple[Hardware, str]:
    """``_hardware`` on every rank of the mesh alike. Without ``hardware=`` each rank
    resolves its own machine's cached profile (``cost.profiles``), which need not be its
    peers': another node has its own cache (or none), and a profile written by ``autopar
    calibrate`` while the ranks start is seen by some and not others; a profile's path
    is read on each node. The plan must be a function of what every rank agrees on, so
    the first rank of the mesh resolves it and the others price with its hardware (one
    broadcast per mesh dimension: the first rank of each group passes on what it holds,
    so the mesh's first rank's reaches every rank). A ``Hardware`` object is used as
    given (``compile`` checks it is the same on every rank). ``measure_with``: ``compile``
    and ``plan``, with which, where no profile is cached, every rank measures this
    machine first (:mod:`autopar.cost.first_use`)."""
    if hardware is None and measure_with is not None and _first_use(world):
        hw, source = first_use.calibrate_here(*measure_with)
        return resolve_hardware(hw, memory_limit)[0], source
    hw, source = resolve_hardware(hardware, memory_limit)
    if isinstance(hardware, Hardware) or world == 1 or not (dist.is_available() and dist.is_initialized()):
        return hw, source
    if mesh is None:
        groups = [None]
    else:
        groups = [mesh.get_group(dim) for dim in reversed(range(mesh.ndim))]
    for group in groups:
        if dist.get_world_size(group) == 1:
            continue
        first = dist.get_process_group_ranks(group)[0] if group is not None else 0
        carried = [(hw.to_json(), source)]
        dist.broadcast_object_list(carried, src=first, group=group)
        # the sender too prices with what it sent (from_json normalises: the same object everywhere)
        hw, source = Hardware.from_json(carried[0][0]), carried[0][1]
    return hw, source




def _first_use(world: int) -> bool:
    """Whether ``compile`` measures this machine now (:mod:`autopar.cost.first_use`): on
    ranks the mesh spans all of, over the backend whose profile ``compile`` reads, where
    the first rank has none cached and it is not turned off. Every rank of the default
    group answers alike."""
    if not (dist.is_available() and dist.is_initialized()) or world != dist.get_world_size():
        return False
    return first_use.needed()


def agreed_plan(reviewed: tuple, gm: fx.GraphModule, world: int, hw: Hardware, strategy, hardware, source: str, *,
                given_strategy: Any, degrees: dict | None) -> Plan:
    """One plan on every rank, by construction: where the mesh spans the default group,
    rank 0 plans (or checks the reviewed plan) and broadcasts the plan, and every other
    rank checks it against its own capture as it would a reviewed plan (the same world,
    model, batch, inputs, regions, couplings, FLOPs: ``planning.reviewed.differences``)
    and runs it. A planning error on rank 0 is raised on every rank, with its message.
    Elsewhere (a mesh over part of the ranks) each rank plans, and
    :func:`check_same_plan_everywhere` compares the plans. ``given_strategy`` and
    ``degrees``: as :func:`reviewed_or_planned` takes them."""
    if world == 1 or not dist.is_initialized() or world != dist.get_world_size():
        return reviewed_or_planned(reviewed, gm, world, hw, strategy, hardware, source, given_strategy=given_strategy,
                                   degrees=degrees)
    payload: list = [None]
    if dist.get_rank() == 0:
        try:
            made = reviewed_or_planned(reviewed, gm, world, hw, strategy, hardware, source,
                                       given_strategy=given_strategy, degrees=degrees)
        except Exception as error:  # noqa: BLE001 - every rank raises it (below)
            payload[0] = ("error", type(error).__name__, str(error))
            dist.broadcast_object_list(payload, src=0)
            raise
        payload[0] = ("plan", made.to_json())
        dist.broadcast_object_list(payload, src=0)
        return made
    dist.broadcast_object_list(payload, src=0)
    kind, *rest = payload[0]
    if kind == "error":
        name, message = rest
        error_type = {"PlanMismatchError": PlanMismatchError, "PlanError": PlanError, "ValueError": ValueError,
                      "CaptureError": CaptureError}.get(name, RuntimeError)
        raise error_type(message if error_type is not RuntimeError else f"{name}: {message}")
    rank0 = Plan.from_json(rest[0])
    try:
        return reviewed_or_planned((rank0, False), gm, world, hw, strategy, hardware, source, given_strategy="auto",
                                   degrees=degrees, announce=False)
    except PlanMismatchError as error:
        raise PlanMismatchError(f"rank {dist.get_rank()}: rank 0's plan does not fit the model, inputs or "
                                f"hardware this rank was given (give every rank the same): {error}") from None


def reviewed_or_planned(reviewed: tuple, gm: fx.GraphModule, world: int, hw: Hardware, strategy, hardware,
                         source: str, *, given_strategy: Any = "auto", degrees: dict | None = None,
                         announce: bool = True) -> Plan:
    """The reviewed plan where it fits this run (autopar.planning.reviewed), else a fresh
    one. ``reviewed``: (the plan given, whether to plan afresh where it does not fit);
    ``hw``, ``source``: the agreed hardware and where it came from, ``hardware``: as the
    call gave it (None: the plan's hardware is not checked). Keyword-only, what the check
    and its messages read: ``given_strategy``, the strategy the call gave (named when the
    reviewed plan runs instead), ``degrees``, the mesh's named dimensions (checked against
    the plan's), and ``announce``: say that a reviewed plan runs (not for rank 0's plan
    another rank checks)."""
    given, replan = reviewed
    if given is not None:
        capture_ = gm.meta.get(CAPTURE)
        facts = ModelFacts(gm, fusion=given.fusion)
        inputs, param_bytes = made_for(gm)
        couplings = [c.to_json() for c in facts.batch_couplings]
        found = differences(given, world=world, model_name=capture_.model_class if capture_ else type(gm).__name__,
                            global_batch=facts.batch, regions=[(r.id, r.kind) for r in regions_of(gm)],
                            couplings=couplings, hardware=None if hardware is None else hw.name, inputs=inputs,
                            param_bytes=param_bytes, flops_per_step=training_flops(facts, given.recompute),
                            degrees=degrees, loss_terms=[list(t) for t in gm.meta.get(LOSS_TERMS, [])])
        if not found:
            if given_strategy not in ("auto", None):
                warnings.warn(f"compile(plan=...): strategy={given_strategy!r} is not used; the reviewed plan is run",
                              stacklevel=4)
            if announce:
                log.info("compile(plan=...): running the reviewed plan (%s)", given.form or given.mesh)
            plan_ = Plan.from_json(given.to_json())  # a copy: compile attaches its artifacts to it
            # the loss's reductions (their kinds checked equal) under this capture's node names
            plan_.loss_terms = [list(t) for t in gm.meta.get(LOSS_TERMS, [])]
            plan_.batch_couplings = couplings
            return plan_
        if not replan:
            raise PlanMismatchError(mismatch_message(given, found))
        warnings.warn(mismatch_message(given, found, replanning=True), stacklevel=4)
    made = plan_graph(gm, world, hw, strategy)
    made.hardware_source = source
    return made




def gather_from_ranks(value, group) -> dict[int, Any]:
    """Every rank's ``value`` by global rank (an object all-gather over ``group``, None:
    the default group): what the consistency checks of ``compile`` compare."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, value, group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else range(len(everyone))
    return dict(zip(ranks, everyone))


def check_same_call_everywhere(world: int, mesh, strategy, example_inputs, example_target, hardware,
                                layout: CallLayout | None = None) -> None:
    """Before any group is made: every rank must call compile with the same mesh,
    strategy, hardware and example shapes. One all-gather over the default group (when
    the mesh spans it); on a difference every rank raises the same error, naming which
    ranks passed what, instead of building mismatched groups that would hang."""
    if world == 1 or not dist.is_initialized() or world != dist.get_world_size():
        return
    inputs, target = example_signature(example_inputs, example_target)
    mine = {"mesh": mesh_text(mesh), "strategy": repr(strategy), "hardware": repr(hardware),
            "example inputs": repr([x[0] if isinstance(x, tuple) else x for x in inputs]),
            "example keyword inputs": repr((layout.keywords.tensors, layout.keywords.constants) if layout else ())}
    everyone = gather_from_ranks(mine, None)
    for field in mine:
        values: dict[str, list[int]] = {}
        for r, theirs in everyone.items():
            values.setdefault(theirs[field], []).append(r)
        if len(values) > 1:
            said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {ranks if len(ranks) > 1 else ranks[0]}: {value}"
                             for value, ranks in values.items())
            raise PlanError(f"compile(): the ranks were given different {field}: {said}. Call compile with the "
                            f"same mesh, strategy, hardware and example inputs on every rank")


def check_same_plan_everywhere(plan_: Plan, group_map: dict) -> None:
    """Every rank must run the same plan; equal within each data group and each tensor
    group means equal everywhere on the mesh."""
    text = plan_.to_json()
    for name in ("data", "tensor", "segment", "replica", "x", "y", "pipeline"):
        group = group_map.get(name)
        if group is None or size_of(group) == 1:
            continue
        everyone = gather_from_ranks(text, group)
        bad = [r for r, theirs in everyone.items() if theirs != text]
        if bad:
            mine, theirs = text.splitlines(), everyone[bad[0]].splitlines()
            line = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            where = (f"; the plans' JSON first differs at line {line + 1}: here {mine[line:line + 1]}, on rank "
                     f"{bad[0]} {theirs[line:line + 1]}")
            raise PlanError(f"ranks {bad} planned differently from rank {dist.get_rank()} (different model, inputs "
                            f"or autopar version){where}; give every rank the same model, example inputs and "
                            f"strategy")




def mesh_text(mesh) -> str:
    if mesh is None:
        return f"None (the default group of {dist.get_world_size()} ranks)"
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    shape = " x ".join(f"{n}={mesh.size(i)}" for i, n in enumerate(names))
    return f"DeviceMesh {shape} over ranks {mesh.mesh.flatten().tolist()}"
