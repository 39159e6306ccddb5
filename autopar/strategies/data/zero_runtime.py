"""ZeRO's run-time side on a rank (:mod:`autopar.strategies.data.zero` for the cut, the
layout and the graph pass): the shards, ZeRO-1/2's persistent full parameters, and
ZeRO-3's units, each all-gathered whole in one collective where the rank program
first reads one of its parameters, prefetched, freed when the next unit is read, and
its gradients reduce-scattered in one collective once backward has given them all (as
PyTorch's FSDP2 runs the modules it wraps, one per layer; torchtitan wraps each
transformer layer)."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.runtime.layout import zero_unit
from autopar.runtime._swap import SwapGlobal
from autopar.runtime.family_runtime import RankRuntime
from autopar.runtime.groups import get_group, size_of
from autopar.strategies.data import zero
from autopar.strategies.data.zero import RowShard, _row_numel, sharded_names


# ---------------------------------------------------------------------------- ZeRO-3's units
REDUCING = 2  # ZeRO-3's reduce-scatters in flight at most
_OUTSIDE = ("ZeRO-3 reduces its gradients inside pm.step(); a backward of the output of pm(x) is not "
            "supported under ZeRO-3: train with pm.step(...)")


class _Unit:
    """The sharded parameters of one unit (:func:`~autopar.runtime.layout.zero_unit`; one dtype, device and group),
    laid end to end: each rank's padded rows of every parameter, in order, are its part
    of one flat all-gather (and of one flat reduce-scatter of their gradients)."""

    def __init__(self, key: str, names: list[str], cuts: dict, shapes: dict, shards: dict):
        self.key, self.names = key, names
        self.cuts = [cuts[n] for n in names]
        self.shapes = [shapes[n] for n in names]
        self.shards = [shards[n] for n in names]
        self.sizes = [c.chunk * _row_numel(s) for c, s in zip(self.cuts, self.shapes)]
        self.offsets = [sum(self.sizes[:k]) for k in range(len(names))]
        self.total = sum(self.sizes)
        self.group = self.cuts[0].group   # its name: the groups in use are looked up at each call
        self.size = self.cuts[0].size

    def launch(self, async_op: bool):
        """``(work, flat)``: the all-gather of every rank's part."""
        part = torch.cat([c.pad(s.detach()) for c, s in zip(self.cuts, self.shards)])
        flat = part.new_empty(self.size * self.total)
        work = all_gather_flat(flat, part, group=get_group(self.group), async_op=async_op)
        return work, flat

    def unpack(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every parameter of the unit, whole, from the gathered ``flat``."""
        rows = flat.view(self.size, self.total)
        return {name: cut.unpad(rows[:, offset:offset + size], shape)
                for name, cut, shape, offset, size in zip(self.names, self.cuts, self.shapes, self.offsets, self.sizes)}

    def reduce(self, grads: dict[str, torch.Tensor]):
        """``(work, out)``: the reduce-scatter of the unit's gradients (a parameter without
        one this step sends zeros), into this rank's part."""
        blocks = [cut.padded_blocks(grads[name]) if name in grads else [self.shards[0].new_zeros(size)] * self.size
                  for name, cut, size in zip(self.names, self.cuts, self.sizes)]
        flat = torch.cat([param[k] for k in range(self.size) for param in blocks])
        out = flat.new_empty(self.total)
        work = reduce_scatter_flat(out, flat, group=get_group(self.group), async_op=True)
        return work, out

    def land(self, out: torch.Tensor, names: set) -> None:
        """Each shard's gradient from the reduce-scatter's ``out``, divided by its bucket's
        divisor, added to what it holds (microbatches and steps accumulate); ``names``: the
        parameters some use gave a gradient (the others keep none, as in one process)."""
        for name, shard, cut, shape, offset, size in zip(self.names, self.shards, self.cuts, self.shapes, self.offsets,
                                                         self.sizes):
            if not shard.requires_grad or name not in names:
                continue
            start, stop = cut.span
            grad = out[offset:offset + size].view(cut.chunk, *shape[1:])[:stop - start].div_(cut.divisor)
            shard.grad = grad.clone() if shard.grad is None else shard.grad.add_(grad)


class _Gather(torch.autograd.Function):
    """The full parameter from the shards (all-gathered by its unit); backward: its
    gradient handed to the state (:meth:`ZeroState.arrived`), which reduce-scatters each
    unit's gradients over the data group once they are all in, into the shards'."""

    @staticmethod
    def forward(ctx, shard, full, state, name):
        ctx.state, ctx.name = state, name
        return full

    @staticmethod
    def backward(ctx, grad):
        ctx.state.arrived(ctx.name, grad)
        return None, None, None, None


class ZeroState:
    """What a rank's ZeRO keeps (module docstring): the shards (the module tree's
    parameters), the persistent full parameters of ZeRO-1/2 with the shards' versions
    they were gathered at; under ZeRO-3 the units (:func:`~autopar.runtime.layout.zero_unit`), the one unit held
    whole now and the one prefetched, the gradients of each unit until its
    reduce-scatter, and the full parameters live in this call (for the notes autograd
    keeps instead of them).

    ZeRO-3, as FSDP runs it: the first read of a unit's parameter all-gathers the whole
    unit in one collective (or waits for its prefetch) and frees the unit held before it;
    forward then prefetches the unit the program reads after it, backward (whose notes
    read the units again, last first) the one the program reads before it, where forward
    kept notes of it; the order is the rank program's (each read names the next,
    :func:`~autopar.strategies.data.zero.zero_pass`). A unit's gradients are
    reduce-scattered in one collective, launched as soon as every use of its parameters
    in forward has given its gradient (a recomputed forward's reads are not uses: their
    gradients come through the first forward's), and landed in the shards' gradients;
    what is left lands after the backward (:meth:`after_backward`). A parameter no use
    gave a gradient keeps none (as in one process)."""

    def __init__(self, layout, root: nn.Module):
        self.root = root
        self.cuts: dict[str, RowShard] = {}
        self.shards: dict[str, nn.Parameter] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.full: dict[str, torch.Tensor] = {}   # persistent full parameters (ZeRO-1/2)
        for wrapper, name in sharded_names(layout).items():
            if name in self.cuts:
                continue
            self.cuts[name] = layout.get(name).zero
            self.shards[name] = root.get_parameter(wrapper)
        self._versions: int | None = None
        self.units: dict[str, _Unit] = {}          # ZeRO-3: parameter name -> its unit
        self._order: list[_Unit] = []               # every unit once, in the layout's order
        self._held: tuple[str, dict] | None = None  # the unit held whole now: (key, name -> full)
        self._prefetched: dict[str, tuple[Any, torch.Tensor]] = {}   # unit key -> (work, flat)
        self._next: dict[str, _Unit] = {}           # unit key -> the unit the program reads after it
        self._prev: dict[str, _Unit] = {}           # unit key -> the unit the program reads before it
        self._noted: set[str] = set()               # units forward kept notes of (backward reads them)
        self._uses: dict[str, int] = {}             # unit key -> uses whose gradient has not arrived
        self._grads: dict[str, dict[str, torch.Tensor]] = {}
        self._reducing: list[tuple[Any, torch.Tensor, _Unit, set]] = []  # (work, out, unit, names reduced)
        self._in_call = False
        self._live: dict[int, tuple[str, Any]] = {}  # storage pointer -> (name, weak ref to the full tensor)
        # forward: units all-gathered, and found prefetched; backward: units all-gathered again
        self.stats = {"gathered": 0, "prefetched": 0, "regathered": 0}

    def init_full(self, full_local: dict[str, torch.Tensor]) -> None:
        """The persistent full parameters from this rank's tensor-parallel parts (at
        install, no collective), their shapes, and ZeRO-3's units."""
        grouped: dict[tuple, list[str]] = {}
        for name, cut in self.cuts.items():
            value = full_local[name]
            self.shapes[name] = tuple(value.shape)
            if cut.persistent:
                self.full[name] = value.detach().clone().requires_grad_(self.shards[name].requires_grad)
            else:
                shard = self.shards[name]
                grouped.setdefault((zero_unit(name), shard.dtype, shard.device, cut.group), []).append(name)
        for (key, dtype, _, _), names in grouped.items():
            unit = _Unit(f"{key} ({dtype})" if sum(k[0] == key for k in grouped) > 1 else key, names, self.cuts,
                         self.shapes, self.shards)
            self.units.update((n, unit) for n in names)
            self._order.append(unit)
        self._versions = self._version_sum()

    def persistent_params(self) -> dict[str, torch.Tensor]:
        """The full parameters kept between uses, by layout name (what the buckets reduce)."""
        return dict(self.full)

    def bucket_shards(self) -> dict[int, tuple[nn.Parameter, RowShard]]:
        """``id(full parameter) -> (its shard, the cut)``: where a ZeRO bucket puts each gradient."""
        return {id(full): (self.shards[name], self.cuts[name]) for name, full in self.full.items()}

    # ------------------------------------------------------------------ step boundaries
    def _version_sum(self) -> int:
        return sum(p._version for p in self.shards.values())

    def refresh(self) -> None:
        """Before a program runs: all-gather the persistent full parameters again when any
        shard changed since (an optimizer step, a load), decided over the data group so
        that every rank gathers or none does. A collective when anything is sharded."""
        self._reset()
        self._in_call = True
        if not self.full:
            return
        device = next(iter(self.full.values())).device  # the flag goes where the parameters are
        changed = torch.tensor([float(self._version_sum() != self._versions)], device=device)
        group = get_group(next(iter(self.cuts.values())).group)
        if size_of(group) > 1:
            dist.all_reduce(changed, op=dist.ReduceOp.MAX, group=group)
        if not changed.item():
            return
        with torch.no_grad():
            for name, full in self.full.items():
                full.copy_(self.cuts[name].gather(self.shards[name], self.shapes[name]))
        self._versions = self._version_sum()

    def after_backward(self) -> None:
        """After each backward of a call: every unit's gradients reduce-scattered (those
        some use of which gave none yet too, in the units' order, the same on every rank)
        and landed in the shards' gradients."""
        for unit in self._order:
            if unit.key in self._grads:
                self._reduce(unit)
        self._uses.clear()
        while self._reducing:
            self._land_oldest()

    def finish(self) -> None:
        """After a call: its gradients landed, prefetches nobody read dropped, the unit
        held and the notes of this call let go."""
        self.after_backward()
        self._reset()

    def _reset(self) -> None:
        """Nothing of a call left (at its end; at the next call's start, what a call that
        failed left): its collectives waited for, its unit, notes and gradients dropped."""
        for work, _ in self._prefetched.values():
            work.wait()
        for work, *_ in self._reducing:
            work.wait()
        self._prefetched.clear()
        self._reducing.clear()
        self._uses.clear()
        self._grads.clear()
        self._noted.clear()
        self._held, self._in_call = None, False
        self._live.clear()

    # ------------------------------------------------------------------ reading parameters
    # (run as they are under torch.compile: their collectives and bookkeeping are between
    # the compiled parts of a program, compile(torch_compile=True))
    @torch._dynamo.disable
    def param(self, name: str, prefetch: Optional[str] = None) -> torch.Tensor:
        if name in self.full:
            return self.full[name]
        shard, unit = self.shards[name], self.units[name]
        forward = not _in_backward()
        if prefetch is not None and forward:
            self._learn(name, prefetch)
        full = self._whole(unit, forward)[name]
        if prefetch in self.units and self.units[prefetch] is not unit and forward:
            self._prefetch(self.units[prefetch])
        tracked = torch.is_grad_enabled() and shard.requires_grad
        out = _Gather.apply(shard, full, self, name) if tracked else full
        if tracked and forward:  # a recomputed read's gradient comes through the first forward's
            self._uses[unit.key] = self._uses.get(unit.key, 0) + 1
        if out.numel():
            self._live[out.untyped_storage().data_ptr()] = (name, weakref.ref(out))
        return out

    def _whole(self, unit: _Unit, forward: bool) -> dict[str, torch.Tensor]:
        """Every parameter of ``unit``, whole: the unit held, or gathered (its prefetch
        waited for) in place of it; then the unit the last forward read next (forward)
        or before it (backward) prefetched."""
        if self._held is not None and self._held[0] == unit.key:
            return self._held[1]
        found = self._prefetched.pop(unit.key, None)
        if found is not None:
            work, flat = found
            work.wait()
        else:
            _, flat = unit.launch(async_op=False)
        self.stats["regathered" if not forward else "prefetched" if found is not None else "gathered"] += 1
        whole = unit.unpack(flat)
        self._held = (unit.key, whole)
        following = (self._next if forward else self._prev).get(unit.key)
        if following is not None and (forward or following.key in self._noted):
            self._prefetch(following)
        return whole

    def _learn(self, name: str, following: str) -> None:
        """The program reads ``following`` after ``name``: where they are of two units,
        the order of the units (the same every call of a program, on every rank)."""
        mine, theirs = self.units.get(name), self.units.get(following)
        if mine is not None and theirs is not None and mine is not theirs:
            self._next[mine.key], self._prev[theirs.key] = theirs, mine
    def _prefetch(self, unit: _Unit) -> None:
        if unit.key in self._prefetched or (self._held is not None and self._held[0] == unit.key) \
                or not self._in_call:
            return
        self._prefetched[unit.key] = unit.launch(async_op=True)

    # ------------------------------------------------------------------ gradients
    def arrived(self, name: str, grad: torch.Tensor) -> None:
        """The gradient of one use of parameter ``name`` (:class:`_Gather`'s backward).
        Summed into its unit's, whose reduce-scatter is launched once every use has given
        one. ZeRO-3's gradients are reduced inside ``pm.step``, not in a backward run
        after ``pm(x)``."""
        unit = self.units[name]
        if not self._in_call:
            raise RuntimeError(_OUTSIDE)
        grads = self._grads.setdefault(unit.key, {})
        grads[name] = grad if name not in grads else grads[name] + grad
        self._uses[unit.key] = self._uses.get(unit.key, 0) - 1
        if self._uses[unit.key] <= 0:
            self._reduce(unit)

    def _reduce(self, unit: _Unit) -> None:
        grads = self._grads.pop(unit.key, None)
        self._uses.pop(unit.key, None)
        if grads:
            work, out = unit.reduce(grads)
            self._reducing.append((work, out, unit, set(grads)))
            # at most two in flight, as FSDP2 waits for the previous unit's: each holds its
            # unit's whole gradients until it lands
            while len(self._reducing) > REDUCING:
                self._land_oldest()

    def _land_oldest(self) -> None:
        work, out, unit, names = self._reducing.pop(0)
        work.wait()
        unit.land(out, names)

    # ------------------------------------------------------------------ what autograd keeps
    @contextlib.contextmanager
    def notes_for_backward(self):
        """While a ZeRO-3 program runs forward: a full parameter (or a view of it) that
        autograd keeps for backward is kept as a note (its name and view) and its unit
        all-gathered again when backward reads it, so that it is freed after its use."""
        if all(cut.persistent for cut in self.cuts.values()):  # nothing is gathered per use
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    @torch._dynamo.disable
    def _pack(self, t: torch.Tensor):
        if t.numel():
            entry = self._live.get(t.untyped_storage().data_ptr())
            if entry is not None and entry[1]() is not None and t.dtype == entry[1]().dtype:
                self._noted.add(self.units[entry[0]].key)
                return ("zero", entry[0], tuple(t.shape), t.stride(), t.storage_offset())
        return t

    @torch._dynamo.disable
    def _unpack(self, packed):
        if not (isinstance(packed, tuple) and packed and packed[0] == "zero"):
            return packed
        _, name, shape, stride, offset = packed
        if not self._in_call:
            raise RuntimeError(_OUTSIDE)
        full = self._whole(self.units[name], forward=False)[name]
        return full.as_strided(shape, stride, offset)


def _in_backward() -> bool:
    """Whether autograd's engine is running backward on this thread (a recomputed
    region's forward): no prefetch there, its next read is the next step's."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


class use_zero(SwapGlobal):
    """Make ``state`` the one the rank program's :func:`zero_param` reads (None: none)."""

    __slots__ = ()

    def __init__(self, state: Optional[ZeroState]):
        super().__init__(vars(zero), "_STATE", state)


class ZeroRuntime(RankRuntime):
    """ZeRO on a rank (:class:`~autopar.runtime.family_runtime.RankRuntime`): the
    :class:`ZeroState` over the installed shards, the persistent full parameters the
    buckets reduce, the gathers before a call and the notes for backward while it runs.
    Inactive without ZeRO (``pm.zero_stats`` is then None)."""

    name = "data"

    def __init__(self, plan):
        self.active = bool(plan.zero)
        self.state: ZeroState | None = None

    def attach(self, layout, root, parts: dict) -> None:
        self.state = ZeroState(layout, root)
        self.state.init_full(parts)
        self.sharded = sharded_names(layout)  # what the zero pass rewrites in each program

    def bucket_params(self) -> dict[str, torch.Tensor]:
        return self.state.persistent_params()

    def bucket_shards(self):
        return self.state.bucket_shards()

    def rewrite_options(self) -> dict:
        return {"zero_params": self.sharded}

    def contexts(self, stage: bool) -> list:
        return [use_zero(self.state), self.state.notes_for_backward()]

    def begin(self, stage: bool) -> None:
        self.state.refresh()

    def after_backward(self) -> None:
        self.state.after_backward()

    def finish(self) -> None:
        self.state.finish()

    def attributes(self) -> dict:
        return {"zero_stats": lambda state: None if self.state is None else dict(self.state.stats)}
