"""The 3D grid's parameter parts and the 3D layers' run-time state: what AxoNN's layer
(:func:`autopar.strategies.tensor3d.runtime.linear_3d`, axonn Algorithm 1) and Bian's cube
layer (:mod:`autopar.strategies.cube.collectives`) both run on.

A layer has an *in* axis, which splits the contraction dimension ``k`` (its input's
columns, the weight's rows), and an *out* axis, which splits ``n`` (the weight's columns,
its output's columns); rows of activations are split over z (and data). A plain layer has
in = y, out = x (Algorithm 1 as printed); a "transposed" one in = x, out = y, so it reads
a plain layer's output layout without any re-layout (axonn end of §III-B).

``Ŵ`` is this rank's flat ``1/Gz`` shard of its weight block (z-sharding for memory,
axonn §III-B); :class:`Grid3DShard` says how a parameter is cut, :func:`local_part` and
:func:`gather_part` move between full tensors and this rank's part (a vector the cube
stores diagonally: :func:`diagonal_block`).

Overlap (axonn §IV), each switchable through :class:`Overlap` and on by default:

* ``all_reduce`` (§IV-A): the input-gradient all-reduce of line 11 is issued
  asynchronously and waited on after the weight-gradient matmul of line 12;
* ``reduce_scatter`` (§IV-B): the weight-gradient reduce-scatters are issued
  asynchronously and waited on only after the whole backward pass, in
  :meth:`Tensor3DRuntime.finish` (``ParallelModule.step`` calls it before the data
  all-reduce and before any optimizer can read the gradients);
* ``all_gather`` (§IV-C): each layer issues the next layer's weight all-gather (the next
  in the graph's topological order, named in the rank graph) before its own matmul;
* ``cache`` (§IV-D): under activation checkpointing, the all-gathered weights of the
  first forward are kept for the recomputation forward instead of gathered again;
  ``cache_layers`` bounds how many layers' weights are held at once (the paper cached
  28 of 32 layers where all did not fit): the layers past it are gathered again when
  backward recomputes them (``stats["regathered"]``). The planner sets the bound where
  the cache does not fit (``Plan.gather_cache``, docs/memory.md).

The layers in flight keep their state in a :class:`Tensor3DRuntime`, the current one
(:func:`current_runtime`) installed for a block by :class:`use_runtime`.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch
import torch.distributed as dist

from autopar._torch_compat import all_gather_flat
from autopar.grid import Grid3D, MeshAxis
from autopar.runtime._swap import SwapGlobal
from autopar.runtime.groups import get_group, rank_in, size_of
from autopar.runtime.shards import cut_blocks, gather_blocks


# ---------------------------------------------------------------------------- groups
def _axes(transposed: bool) -> tuple[str, str]:
    """(in axis, out axis) of a layer."""
    return (MeshAxis.X, MeshAxis.Y) if transposed else (MeshAxis.Y, MeshAxis.X)


# ---------------------------------------------------------------------------- parameter parts
@dataclass(frozen=True)
class Grid3DShard:
    """How a parameter of a 3D layer is cut: a weight (``vector=False``) into its
    (out axis, in axis) block, then a flat ``1/Gz`` shard; a bias (``vector=True``) into
    its out-axis block, replicated over the in axis and z (``cube``: the block's ``1/Gz``
    piece on the ranks whose in and out coordinates agree, nothing elsewhere: Bian's
    diagonal storage, :mod:`autopar.strategies.cube.collectives`). ``out_dim`` is the weight's
    out-features dimension (0 for ``nn.Linear``, 1 for GPT-2's ``Conv1D``); ``blocks``
    > 1 cuts a fused projection (Q, K, V side by side) per block, as Megatron's split."""

    out_dim: int
    transposed: bool
    blocks: int = 1
    vector: bool = False
    cube: bool = False  # Bian's cube (runtime.cube): a vector is stored diagonally, 1/Gz of its block

    @property
    def axes(self) -> tuple[str, str]:
        return _axes(self.transposed)

    @property
    def grid_weight(self) -> bool:
        """Whether its gradient is summed over the whole grid by the layer (a weight's
        reduce-scatter over z; the cube's diagonal vectors' reduce over the cube), so
        the data ranks only add theirs (the 3D layout's weight bucket)."""
        return not self.vector or self.cube

    # the cut of :class:`autopar.runtime.layout.ParamLayout`
    def local(self, full: torch.Tensor, seat) -> torch.Tensor:
        return local_part(full, self, seat.grid, seat.coords)

    def gather(self, local: torch.Tensor, seat, full_shape) -> torch.Tensor:
        return gather_part(local.detach(), self, seat.grid, full_shape)

    def norm_groups(self) -> tuple[str, ...]:
        """A weight shard (and the cube's diagonal vectors) is split over the whole
        grid; AxoNN's bias blocks only over their out axis."""
        return (self.axes[1],) if self.vector and not self.cube else (MeshAxis.X, MeshAxis.Y, MeshAxis.Z)


def block_of(full: torch.Tensor, shard: Grid3DShard, grid: Grid3D, coords: dict[str, int]) -> torch.Tensor:
    """The (out axis, in axis) block of a full parameter that ``coords`` owns."""
    in_axis, out_axis = shard.axes
    g_in, g_out = getattr(grid, in_axis), getattr(grid, out_axis)
    n = full.shape[shard.out_dim]
    if n % (shard.blocks * g_out):
        raise ValueError(f"a {list(full.shape)} parameter: its {n} output features ({shard.blocks} block(s)) do not "
                         f"divide by G{out_axis} = {g_out}")
    block = cut_blocks(full, shard.out_dim, shard.blocks, g_out, coords[out_axis])
    if shard.vector:
        return block
    in_dim = 1 - shard.out_dim
    if full.shape[in_dim] % g_in:
        raise ValueError(f"a {list(full.shape)} weight: its {full.shape[in_dim]} input features do not divide by "
                         f"G{in_axis} = {g_in}")
    return block.chunk(g_in, in_dim)[coords[in_axis]]


def block_shape(full_shape, shard: Grid3DShard, grid: Grid3D) -> tuple[int, ...]:
    in_axis, out_axis = shard.axes
    shape = list(full_shape)
    shape[shard.out_dim] //= getattr(grid, out_axis)
    if not shard.vector:
        shape[1 - shard.out_dim] //= getattr(grid, in_axis)
    return tuple(shape)


def local_part(full: torch.Tensor, shard: Grid3DShard, grid: Grid3D, coords: dict[str, int]) -> torch.Tensor:
    """This rank's part of a full parameter: the bias block, or the weight block's flat z shard ``Ŵ``."""
    block = block_of(full, shard, grid, coords)
    if shard.vector and shard.cube:
        in_axis, out_axis = shard.axes
        if coords[in_axis] != coords[out_axis]:
            return block.new_empty(0)
        return block.chunk(grid.z)[coords[MeshAxis.Z]].clone()
    if shard.vector:
        return block.clone()
    if block.numel() % grid.z:
        raise ValueError(f"a weight block of {block.numel()} elements does not split into Gz = {grid.z} shards")
    return block.reshape(-1).chunk(grid.z)[coords[MeshAxis.Z]].clone()


def gather_part(local: torch.Tensor, shard: Grid3DShard, grid: Grid3D, full_shape) -> torch.Tensor:
    """The full parameter from every rank's part (a collective over z, in and out axes:
    every rank calls it)."""
    in_axis, out_axis = shard.axes
    if shard.vector and shard.cube:
        length = full_shape[0] // getattr(grid, out_axis)
        block = diagonal_block(local.detach(), length, get_group(in_axis), get_group(out_axis), get_group(MeshAxis.Z))
    elif shard.vector:
        block = local.detach()
    else:
        block = _all_gather_flat(local.detach(), get_group(MeshAxis.Z)).view(block_shape(full_shape, shard, grid))
        block = gather_blocks(block, 1 - shard.out_dim, 1, get_group(in_axis))
    return gather_blocks(block, shard.out_dim, shard.blocks, get_group(out_axis))


def diagonal_block(piece: torch.Tensor, length: int, group_in, group_out, group_z) -> torch.Tensor:
    """The out block (``length`` elements) of a vector Bian's cube stores diagonally, from
    this rank's ``piece`` (empty off the diagonal): broadcast over the in axis from the
    rank whose in coordinate is this rank's out coordinate, then all-gather over z
    (bian Algorithm 7 lines 1-2). A new tensor; every rank of the groups calls it."""
    holder = rank_in(group_out)
    piece = piece.clone() if rank_in(group_in) == holder else piece.new_empty(length // size_of(group_z))
    if size_of(group_in) > 1:
        dist.broadcast(piece, group=group_in, group_src=holder)
    return _all_gather_flat(piece, group_z)


# ---------------------------------------------------------------------------- overlap state
@dataclass(frozen=True)
class Overlap:
    """The overlap optimisations of axonn §IV (see the module docstring), each on by default."""

    all_reduce: bool = True       # §IV-A OAR
    reduce_scatter: bool = True   # §IV-B ORS
    all_gather: bool = True       # §IV-C OAG
    cache: bool = True            # §IV-D all-gather outputs kept for recomputation
    cache_layers: Optional[int] = None  # at most this many layers' weights cached at once (None: all)

    @staticmethod
    def parse(value) -> "Overlap":
        if value is None or value is True:
            return Overlap()
        if value is False:
            return Overlap(False, False, False, False)
        if isinstance(value, Overlap):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(asdict(Overlap()))
            if unknown:
                raise ValueError(f"overlap: unknown option(s) {sorted(unknown)}; the options are "
                                 f"{sorted(asdict(Overlap()))}")
            limit = value.get("cache_layers")
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
                raise ValueError(f"overlap['cache_layers']={limit!r}: give a number of layers >= 0, or None (all)")
            return Overlap(**{k: v if k == "cache_layers" else bool(v) for k, v in value.items()})
        raise ValueError(f"overlap={value!r}: expected True, False or a dict of {sorted(asdict(Overlap()))}")

    def with_cache_limit(self, layers: Optional[int]) -> "Overlap":
        """The plan's bound on the cache (``Plan.gather_cache``) unless the user gave one."""
        if layers is None or self.cache_layers is not None:
            return self
        return replace(self, cache_layers=layers)


class Tensor3DRuntime:
    """Per-``ParallelModule`` state of the 3D layers in flight: prefetched weight
    all-gathers (§IV-C), deferred weight-gradient reduce-scatters (§IV-B) and weights
    cached for recomputation (§IV-D)."""

    def __init__(self, overlap: Overlap = Overlap()):
        self.overlap = overlap
        self._prefetched: dict[int, tuple] = {}   # id(Ŵ) -> (work, buffer)
        self._cached: dict[int, torch.Tensor] = {}
        self._uncached: set[int] = set()  # checkpointed layers the full cache left out this step
        self._deferred: list[tuple] = []          # (Ŵ, work, gradient shard)
        # where each layer's W came from since construction (for tests and benchmarks):
        # gathered when needed, prefetched by the layer before (§IV-C), or cached for
        # recomputation; reduce-scatters deferred to the end of backward (§IV-B); weights
        # gathered again in a recomputation because the cache was full (``cache_layers``)
        self.stats = {"gathered": 0, "prefetched": 0, "cached": 0, "deferred": 0, "regathered": 0}
        # seconds this rank spent blocked in the 3D layers' collectives (synchronous ones
        # and waits on asynchronous ones): the communication overlap did not hide
        self.exposed_s = 0.0

    def begin(self) -> None:
        """Forget the last step's gathered weights (the optimizer has changed them)."""
        self._drain_prefetches()
        self._cached.clear()
        self._uncached.clear()

    def _drain_prefetches(self) -> None:
        for work, _ in self._prefetched.values():
            if work is not None:
                work.wait()
        self._prefetched.clear()

    def gathered(self, w_hat: torch.Tensor, shape, checkpointed: bool) -> torch.Tensor:
        """``W = all-gather_z(Ŵ)`` (line 2): prefetched, cached, or gathered now."""
        key = id(w_hat)
        if checkpointed and self.overlap.cache and key in self._cached:
            self.stats["cached"] += 1
            return self._cached.pop(key)
        found = self._prefetched.pop(key, None)
        start = time.perf_counter()
        if found is not None:
            work, buffer = found
            if work is not None:
                work.wait()
            w = buffer.view(shape)
            self.stats["prefetched"] += 1
        else:
            w = _all_gather_flat(w_hat.detach(), get_group(MeshAxis.Z)).view(shape)
            self.stats["gathered"] += 1
        self.exposed_s += time.perf_counter() - start
        if checkpointed and self.overlap.cache and torch.is_grad_enabled():
            limit = self.overlap.cache_layers
            if key in self._uncached:  # the recomputation of a layer the full cache left out
                self._uncached.discard(key)
                self.stats["regathered"] += 1
            elif limit is None or len(self._cached) < limit:
                self._cached[key] = w
            else:
                self._uncached.add(key)
        return w

    def prefetch(self, w_hat: torch.Tensor) -> None:
        """Issue ``Ŵ``'s all-gather over z now, for a later layer (§IV-C)."""
        key = id(w_hat)
        if key in self._prefetched or key in self._cached:
            return
        group = get_group(MeshAxis.Z)
        if size_of(group) == 1:
            return
        buffer = w_hat.new_empty(w_hat.numel() * size_of(group))
        work = all_gather_flat(buffer, w_hat.detach().contiguous(), group=group, async_op=True)
        self._prefetched[key] = (work, buffer)

    def defer(self, w_hat: torch.Tensor, work, shard: torch.Tensor) -> None:
        self.stats["deferred"] += 1
        self._deferred.append((w_hat, work, shard))

    def finish(self) -> None:
        """Wait for the deferred reduce-scatters and add each into its ``Ŵ.grad`` (in the
        order backward issued them); drop unused prefetches. Before any optimizer step."""
        start = time.perf_counter()
        for w_hat, work, shard in self._deferred:
            work.wait()
            if w_hat.grad is None:
                w_hat.grad = shard.view_as(w_hat)
            else:
                w_hat.grad.add_(shard.view_as(w_hat))
        self._deferred.clear()
        self._drain_prefetches()
        self.exposed_s += time.perf_counter() - start
        self._cached.clear()
        self._uncached.clear()

    @property
    def pending(self) -> int:
        return len(self._deferred)


_RUNTIME = Tensor3DRuntime()


class use_runtime(SwapGlobal):
    """Install ``runtime`` for 3D layers during a block (each ParallelModule owns one)."""

    __slots__ = ()

    def __init__(self, runtime: Tensor3DRuntime):
        super().__init__(globals(), "_RUNTIME", runtime)

def current_runtime() -> Tensor3DRuntime:
    return _RUNTIME


def _all_gather_flat(shard: torch.Tensor, group) -> torch.Tensor:
    if size_of(group) == 1:
        return shard
    out = shard.new_empty(shard.numel() * size_of(group))
    all_gather_flat(out, shard.contiguous(), group=group)
    return out
