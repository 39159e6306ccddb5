"""Where a rank's tensors come from (docs/guide/large_models.md).

A rank never copies the whole model. :func:`meta_twin` makes a copy of the user's
model with every parameter and buffer on the meta device (shapes only): the module tree
the rank's parameters are installed into, and the model the rank captures its programs
from (capture reads shapes: :func:`autopar.trace.capture.capture` runs a model that
holds meta tensors on meta examples). :func:`install` then gives each parameter of
that tree what the rank holds of it (:class:`~autopar.runtime.layout.ParamLayout`): the rank's
part of the user's tensor when the model was built for real, else an uninitialised
tensor of the part's shape on the rank's device; a split parameter is never allocated
at its full size.

A model compiled from the meta device has no values until
:func:`autopar.engine.init_weights.init_weights` (the model's own initialisation,
replayed one module at a time) or a load
(``pm.load_pretrained``, ``pm.load_full_state_dict``, ``autopar.load_checkpoint``).

:func:`check_same_model`: every rank must be given the same model, and one built for
real the same weights on every rank (each rank cuts its part from its own copy);
``compile`` compares a fingerprint of every parameter and buffer across the ranks.
"""
from __future__ import annotations

import copy
import hashlib
import os
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar._torch_compat import own_parameters
from autopar.runtime.layout import ParamLayout
from autopar.trace.meta import holds_meta

META = torch.device("meta")


class NotInitialisedError(RuntimeError):
    """A model compiled from the meta device was run before its weights were given values."""


# ---------------------------------------------------------------------------- the rank's device
def resolve_device(device, mesh, model: nn.Module, examples: Iterable) -> torch.device:
    """The device the rank's tensors go on: ``device`` when given; else that of the
    model's first parameter that holds storage; for a model whose parameters are on the
    meta device, the mesh's device type (a GPU: ``LOCAL_RANK``'s, else the current one),
    else the first example tensor's device that is not meta, else the CPU."""
    if device is not None:
        return torch.device(device)
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    kind = getattr(mesh, "device_type", None)
    if kind is None and dist.is_available() and dist.is_initialized() and str(dist.get_backend()) == "nccl":
        kind = "cuda"
    if kind not in (None, "cpu"):
        if "LOCAL_RANK" in os.environ:
            return torch.device(kind, int(os.environ["LOCAL_RANK"]))
        cuda = next((x.device for x in examples if isinstance(x, torch.Tensor) and x.device.type == kind), None)
        return cuda or torch.device(kind, torch.cuda.current_device() if kind == "cuda" else 0)
    for x in examples:
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return x.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------- the module tree
def meta_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are meta tensors of the same
    shapes, dtypes and ``requires_grad`` (tied parameters stay tied): no storage is copied."""
    memo: dict[int, object] = {}
    for t in (*model.parameters(), *model.buffers()):
        stand_in = torch.empty_like(t, device=META)
        memo[id(t)] = nn.Parameter(stand_in, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
            else stand_in
    return copy.deepcopy(model, memo)


def valued_names(model: nn.Module) -> set[str]:
    """The names of the parameters and buffers of ``model`` that hold values (not meta)."""
    return {name for name, t in (*model.named_parameters(remove_duplicate=False),
                                 *model.named_buffers(remove_duplicate=False)) if t.device.type != "meta"}


def install(twin: nn.Module, layout: ParamLayout, source: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Give every parameter and buffer of ``twin`` (a :func:`meta_twin` of ``source``, in
    the rank's module tree) what this rank holds of it, on ``device``: its part of
    ``source``'s tensor of the same name (the user's model) when that holds a value, else
    an uninitialised tensor of the part's shape. Returns, for the ZeRO-sharded
    parameters, the rank's cut part before its rows (what ZeRO-1/2 keeps whole)."""
    values = {**dict(source.named_parameters(remove_duplicate=False)),
              **dict(source.named_buffers(remove_duplicate=False))}
    owners = _owners(twin)
    parts: dict[str, torch.Tensor] = {}
    done: set[int] = set()
    for name, stand_in in [*twin.named_parameters(remove_duplicate=False), *twin.named_buffers()]:
        if id(stand_in) in done:
            continue
        done.add(id(stand_in))
        full = values.get(name)
        full = None if full is None or full.device.type == "meta" else full.detach()
        local = _rank_part(layout, name, stand_in, full, device, parts)
        if isinstance(stand_in, nn.Parameter):
            local = nn.Parameter(local, requires_grad=stand_in.requires_grad and layout.holds(name))
        for module, attr, store in owners[id(stand_in)]:
            getattr(module, store)[attr] = local
    return parts


def _rank_part(layout: ParamLayout, name: str, stand_in: torch.Tensor, full: torch.Tensor | None,
               device: torch.device, parts: dict) -> torch.Tensor:
    """What the rank holds of one tensor: its part (of ``full`` when given, else
    uninitialised), an empty tensor where it holds none (another pipeline stage's)."""
    placement = layout.get(name)
    dtype = stand_in.dtype
    if not layout.holds(name):
        return torch.empty(0, dtype=dtype, device=device)
    if full is None:  # shapes only: the cuts below give the part's shape
        full = torch.empty(placement.full_shape if placement is not None else stand_in.shape, dtype=dtype,
                           device=META)
    part = full if placement is None or placement.cut is None else placement.cut.local(full, layout.seat)
    if placement is not None and placement.zero is not None:
        # ZeRO-1/2 keep the cut part whole; ZeRO-3 needs its shape only
        parts[placement.names[0]] = _materialised(part, device) if placement.zero.persistent else \
            torch.empty(part.shape, dtype=dtype, device=META)
        part = placement.zero.local(part)
    return _materialised(part, device)


def _materialised(part: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``part`` copied to ``device`` (its own storage), or an uninitialised tensor of its
    shape there when it is a meta tensor."""
    if part.device.type == "meta":
        return torch.empty(part.shape, dtype=part.dtype, device=device)
    return part.to(device=device, copy=True)


def _owners(root: nn.Module) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """``id(tensor) -> [(module, attribute, "_parameters" or "_buffers")]`` for every
    parameter and buffer of ``root`` (a tied one under each module that holds it)."""
    owners: dict[int, list] = {}
    for module in root.modules():
        for attr, p in own_parameters(module):
            if p is not None:
                owners.setdefault(id(p), []).append((module, attr, "_parameters"))
        for attr, b in module._buffers.items():
            if b is not None:
                owners.setdefault(id(b), []).append((module, attr, "_buffers"))
    return owners


# ---------------------------------------------------------------------------- identical weights
def fingerprints(model: nn.Module, device: torch.device = torch.device("cpu"),
                 width: int = 4096) -> tuple[list[str], torch.Tensor]:
    """(names, ``[n, 2]`` int64) for every parameter and buffer of ``model`` (each once,
    in model order): two checksums of its bits (their sum, and their sum weighted by
    position; int64 arithmetic wraps), cheap: the bits seen as rows of ``width``, each
    reduced along both dimensions once (the weighted sum of element ``k = j·width + i``
    is ``width·Σ_j j·row_j + Σ_i (i+1)·column_i``), no temporary of the tensor's size."""
    names, sums = [], []
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        bits = _as_integers(t.detach().reshape(-1))
        n = bits.numel()
        whole = n // width * width
        body = bits[:whole].view(-1, width)
        rows = body.sum(1, dtype=torch.int64)
        columns = body.sum(0, dtype=torch.int64)
        tail = bits[whole:].to(torch.int64)
        plain = rows.sum() + tail.sum()
        weighted = (width * (torch.arange(rows.numel(), dtype=torch.int64, device=t.device) * rows).sum()
                    + (torch.arange(1, width + 1, dtype=torch.int64, device=t.device) * columns).sum()
                    + (tail * torch.arange(whole + 1, n + 1, dtype=torch.int64, device=t.device)).sum())
        names.append(name)
        sums.append(torch.stack([plain, weighted]).to(device))
    return names, torch.stack(sums) if sums else torch.zeros((0, 2), dtype=torch.int64, device=device)


def _as_integers(flat: torch.Tensor) -> torch.Tensor:
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    size = flat.element_size()
    if flat.is_complex():
        flat, size = torch.view_as_real(flat).reshape(-1), size // 2
    return flat.contiguous().view(kinds[size]) if size in kinds else flat.to(torch.float64).view(torch.int64)


def check_same_model(model: nn.Module, group=None) -> None:
    """Raise on every rank of ``group`` (None: the default group), naming the first tensor
    and the ranks that differ, when the ranks were given different models: some built on
    the meta device and others for real, different parameters or buffers (names, shapes,
    dtypes), or different values of a model built for real. A collective."""
    valued = not holds_meta(model)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    names = [n for n, _ in tensors]
    listing = "\n".join(f"{n} {list(t.shape)} {t.dtype}" for n, t in tensors).encode()
    wire = torch.device("cuda", torch.cuda.current_device()) if str(dist.get_backend(group)) == "nccl" \
        else torch.device("cpu")
    header = torch.tensor([len(names), int.from_bytes(hashlib.sha256(listing).digest()[:7], "little"), int(valued)],
                          dtype=torch.int64, device=wire)
    high, low = header.clone(), header.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    if high[2] != low[2]:
        raise ValueError("compile(): some ranks were given a model with weights and others one on the meta device; "
                         "give every rank the same: build it on the meta device everywhere and call "
                         "pm.init_weights(seed=...) or pm.load_pretrained(path)")
    if not torch.equal(high, low):
        raise ValueError("compile(): the ranks were given different models (their parameters' or buffers' names, "
                         "shapes or dtypes differ); build the same model on every rank")
    if not valued or not names:
        return
    local = fingerprints(model, wire)[1]
    high, low = local.clone(), local.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    differs = (high != low).any(dim=1).nonzero().flatten().tolist()
    if not differs:
        return
    first = differs[0]
    everyone = [torch.empty_like(local[first]) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, local[first].contiguous(), group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(everyone)))
    classes: dict[tuple, list[int]] = {}
    for r, value in zip(ranks, everyone):
        classes.setdefault(tuple(value.tolist()), []).append(r)
    said = " vs ".join(f"ranks {rs}" if len(rs) > 1 else f"rank {rs[0]}" for rs in classes.values())
    more = f" (and {len(differs) - 1} more)" if len(differs) > 1 else ""
    raise ValueError(f"compile(): the ranks were given different weights: {names[first]} differs between {said}"
                     f"{more}. Every rank must hold the same model: seed every rank alike (torch.manual_seed) before "
                     f"building it, or build it on the meta device and call pm.init_weights(seed=...) or "
                     f"pm.load_pretrained(path)")


__all__ = ["NotInitialisedError", "check_same_model", "fingerprints", "install", "meta_twin",
           "resolve_device", "valued_names"]
