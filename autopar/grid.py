"""The rank grid: every rank's coordinates and every process group, from one place.

A plan lays its ranks out as one tensor viewed by named dimensions, outermost first (as
picotron's process-group manager does): ``data × tensor`` for Megatron,
``pipeline × data × tensor`` for PTD-P, ``data × z × y × x`` for AxoNN's grid and
Bian's cube (x innermost, axonn §V-B), and ``position × subgrid`` (topology-aware) or
``subgrid × position`` for D&SP (SUPER §IV-B). Rank ``i`` of the grid is the ``i``-th
member: the world's ranks in order, or the ranks of the user's mesh.

A family names the groups it communicates over (:class:`GroupSpec`): the ranks that
differ only along some dimensions, in the order those dimensions give (the first
outermost), optionally restricted to some coordinates of one of them (the pipeline
positions that share a tied weight). :meth:`RankGrid.process_groups` creates them: the
grid's own dimensions through one ``DeviceMesh`` (PyTorch's piece, which on NCCL can
split communicators), the others with ``new_group`` in one fixed order on every rank.
Nothing else in autopar computes rank coordinates or creates a process group.

Groups outlive the program that asked for them: a process that compiles many plans (a
benchmark, a user trying strategies, a recompile for a new shape) gets the group of the
same ranks (and the same timeout) it made before, from :func:`cached_group` and
:func:`cached_mesh`, instead of a new one each compile: torch keeps every group it made
until ``destroy_process_group``, and a gloo group holds its own threads (about nine per
compile on four ranks before the cache). The cache empties itself when the default
group changes (a new ``init_process_group``).
:class:`Grid3D` is AxoNN's grid (and Bian's cube's) as a rank grid.

Example (2 data × 2 tensor; members are global ranks)::

    >>> g = RankGrid({"data": 2, "tensor": 2})
    >>> g.coordinates(3)
    {'data': 1, 'tensor': 1}
    >>> g.groups(("tensor",))
    [[0, 1], [2, 3]]
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch

from autopar._torch_compat import new_group_in_order


class MeshAxis(enum.StrEnum):
    """The one vocabulary of mesh dimensions and process-group names (as torchtitan's
    ``MeshAxisName``): every dimension of a plan's rank grid and every group a rank
    program names is one of these (a pipeline's tied-weight groups ``tied:<positions>``
    aside). Members are ``str``: they equal, hash and format as their values, so
    dictionaries keyed by the plain names, the groups' registry and plan.json read the
    same; ``repr`` is the value's, so messages that show a name read as before. A
    family's declaration names the axes it owns (:attr:`autopar.planning.declared.Language.axes`).
    What a rank program's graph holds stays a plain ``str`` (``axis.value``): torch.fx
    would write an enum member into the generated code by its class."""

    PIPELINE = "pipeline"
    DATA = "data"
    CONTEXT = "context"
    TENSOR = "tensor"
    X = "x"
    Y = "y"
    Z = "z"
    REPLICA = "replica"                  # a 3D grid's ranks of one (x, y): z × data split the batch
    POSITION = "position"                # D&SP: the place inside a sub-grid
    SUBGRID = "subgrid"                  # D&SP: one sub-grid's ranks
    SEGMENT = "segment"                  # D&SP: one position of every sub-grid
    TENSOR_SEG = "tensor_seg"            # a mixed plan's sub-grids of the tensor group
    TENSOR_SUB = "tensor_sub"            # and the places inside one
    EXPERTS = "experts"                  # an expert group: consecutive data ranks
    EXPERT_REPLICA = "expert_replica"    # the ranks holding the same experts
    DATA_CONTEXT = "data_context"        # the gradients' average under context parallelism

    def __repr__(self) -> str:
        return repr(self.value)


def subgrid_dims(n: int, g: int, topology_aware: bool) -> dict[str, int]:
    """D&SP's layout of ``n`` ranks in ``g`` sub-grids (SUPER §V): topology-aware, the
    sub-grids interleave (rank ``p·g + s``: one node holds every sub-grid's position
    ``p``), else each sub-grid is contiguous (rank ``s·n/g + p``)."""
    if g < 1 or n % g:
        raise ValueError(f"{g} sub-grids do not divide {n} ranks; choose g dividing the number of ranks")
    position, subgrid = MeshAxis.POSITION, MeshAxis.SUBGRID
    return {position: n // g, subgrid: g} if topology_aware else {subgrid: g, position: n // g}


@dataclass(frozen=True)
class GroupSpec:
    """A named group of every rank: the ranks that differ only along ``dims`` (ordered
    with ``dims[0]`` outermost, so a group's rank ``i`` is the ``i``-th in that order);
    ``only``: ``(dim, coordinates)`` keeps those coordinates of one of ``dims`` (ranks off
    them are in no group of this name)."""

    dims: tuple[str, ...]
    only: Optional[tuple[str, tuple[int, ...]]] = None


def subgrid_group_specs(csub: bool) -> dict[str, GroupSpec]:
    """D&SP's groups on :func:`subgrid_dims`: ``segment`` (position ``p`` of
    every sub-grid, in sub-grid order), ``subgrid`` (one sub-grid, in position order) and
    ``data``, every rank in batch-chunk order ``p·g + s`` (under cSub the common layers
    run on sub-grid 0 only: the sub-grid)."""
    position, subgrid = MeshAxis.POSITION, MeshAxis.SUBGRID
    return {MeshAxis.DATA: GroupSpec((position,)) if csub else GroupSpec((position, subgrid)),
            MeshAxis.SEGMENT: GroupSpec((subgrid,)), subgrid: GroupSpec((position,))}


_CACHE: dict = {"world": None, "groups": {}}


def _cache() -> dict:
    """This process's groups by key, emptied when the default group is not the one
    they were made under (the group object is held, so its id cannot be reused)."""
    import torch.distributed as dist
    world = dist.group.WORLD
    if _CACHE["world"] is not world:
        _CACHE["world"], _CACHE["groups"] = world, {}
    return _CACHE["groups"]


def _default_timeout():
    from torch.distributed import distributed_c10d
    return distributed_c10d.default_pg_timeout, distributed_c10d.default_pg_nccl_timeout


def cached_group(members: Sequence[int]):
    """``dist.new_group(members, sort_ranks=False)`` (:func:`~autopar._torch_compat.new_group_in_order`),
    made once per process for these members (in this order) and the default timeout in force (``new_groups_timeout``).
    Every rank calls it for every group, in the same order, as ``new_group`` requires;
    every rank's cache holds the same keys, so they make or reuse together."""
    groups = _cache()
    key = ("group", tuple(members), _default_timeout())
    if key not in groups:
        groups[key] = new_group_in_order(list(members))
    return groups[key]


def cached_mesh(device: str, ranks: torch.Tensor, names: tuple[str, ...]):
    """A ``DeviceMesh`` over ``ranks`` (its shape the mesh's) named ``names``, made once
    per process for these ranks, names, device and default timeout (see :func:`cached_group`)."""
    from torch.distributed.device_mesh import DeviceMesh
    groups = _cache()
    key = ("mesh", device, tuple(ranks.shape), tuple(ranks.flatten().tolist()), names, _default_timeout())
    if key not in groups:
        groups[key] = DeviceMesh(device, ranks, mesh_dim_names=names)
    return groups[key]


class RankGrid:
    """``dims`` (name -> size, outermost first) over ``members`` (global ranks, row-major
    over the dims; default ``range(size)``)."""

    def __init__(self, dims: Mapping[str, int], members: Optional[Sequence[int]] = None):
        self.names = tuple(str(n) for n in dims)   # plain names (a MeshAxis is its value)
        self.shape = tuple(int(dims[n]) for n in self.names)
        if any(s < 1 for s in self.shape):
            raise ValueError(f"RankGrid: every dimension needs a size of at least 1, got {dict(dims)}")
        self.size = math.prod(self.shape)
        self.members = tuple(int(r) for r in members) if members is not None else tuple(range(self.size))
        if len(self.members) != self.size:
            raise ValueError(f"RankGrid: {dict(dims)} holds {self.size} ranks, {len(self.members)} members were given")
        self._tensor: Optional[torch.Tensor] = None

    @property
    def _ranks(self) -> torch.Tensor:
        """The members as one tensor of the grid's shape (made on first use)."""
        if self._tensor is None:
            self._tensor = torch.tensor(self.members, dtype=torch.long, device="cpu").view(self.shape)
        return self._tensor

    def __repr__(self) -> str:
        dims = " x ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))
        return f"RankGrid({dims})"

    def coordinates(self, index: int) -> dict[str, int]:
        """The coordinates of the grid's ``index``-th rank (the innermost varies fastest)."""
        if not 0 <= index < self.size:
            raise ValueError(f"rank {index} is outside a grid of {self.size} ranks ({self!r})")
        out = {}
        for name, size in zip(reversed(self.names), reversed(self.shape)):
            out[name] = index % size
            index //= size
        return {name: out[name] for name in self.names}

    def index(self, **coords: int) -> int:
        """The grid index at ``coords`` (a dimension left out is at 0)."""
        index = 0
        for name, size in zip(self.names, self.shape):
            index = index * size + coords.get(name, 0)
        return index

    def groups(self, dims: Sequence[str], only: Optional[tuple[str, Sequence[int]]] = None) -> list[list[int]]:
        """Every group of ranks differing only along ``dims`` (global ranks, ``dims[0]``
        outermost inside a group), the groups in row-major order of the other
        coordinates; ``only``: ``(dim, coordinates)`` keeps those coordinates of ``dim``."""
        dims = tuple(dims)
        unknown = [d for d in dims if d not in self.names]
        if unknown or len(set(dims)) != len(dims):
            raise ValueError(f"RankGrid.groups: {dims} are not distinct dimensions of {self!r}")
        ranks = self._ranks
        if only is not None:
            dim, keep = only
            ranks = ranks.index_select(self.names.index(dim), torch.tensor(list(keep), dtype=torch.long, device="cpu"))
        others = [i for i, n in enumerate(self.names) if n not in dims]
        order = others + [self.names.index(d) for d in dims]
        width = math.prod(ranks.shape[self.names.index(d)] for d in dims)
        return ranks.permute(order).reshape(-1, width).tolist()

    def process_groups(self, specs: Mapping[str, Optional[GroupSpec]], rank: int,
                       device_type: Optional[str] = None) -> dict[str, object]:
        """Create every group of every spec (every rank calls this with the same specs, in
        the same order) and return ``rank``'s: name -> ``ProcessGroup``; ``None`` for a
        group of one rank, for a spec of None, or where ``rank`` is in no group of that
        name. The grid's own dimensions come from one ``DeviceMesh`` over it
        (``device_type``: the mesh's; default ``cuda`` under NCCL, else ``cpu``); a spec
        seen before gets the same group, and so does one of the same ranks another
        compile in this process made (:func:`cached_group`)."""
        import torch.distributed as dist
        mine: dict[str, object] = {}
        made: dict[GroupSpec, object] = {}
        mesh = None
        for name, spec in specs.items():
            if spec is None or all(len(g) == 1 for g in self.groups(spec.dims, spec.only)):
                mine[name] = None
            elif spec in made:
                mine[name] = made[spec]
            elif spec.only is None and len(spec.dims) == 1:
                if mesh is None:
                    device = device_type or ("cuda" if dist.get_backend() == "nccl" else "cpu")
                    mesh = cached_mesh(device, self._ranks, self.names)
                mine[name] = made[spec] = mesh.get_group(spec.dims[0])
            else:
                mine[name] = None
                for members in self.groups(spec.dims, spec.only):  # every rank makes every group, in order
                    group = cached_group(members)
                    if rank in members:
                        mine[name] = group
                made[spec] = mine[name]
        return mine


GRID_AXES = (MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.DATA)
"""AxoNN's grid's axes, innermost first."""


@dataclass(frozen=True)
class Grid3D:
    """``Gx × Gy × Gz × Gdata`` (axonn §III); every size at least 1."""

    x: int
    y: int
    z: int
    data: int = 1

    def __post_init__(self):
        if min(self.x, self.y, self.z, self.data) >= 1:
            return
        for name in ("x", "y", "z", "data"):
            if getattr(self, name) < 1:
                raise ValueError(f"Grid3D: G{name} = {getattr(self, name)} must be at least 1")

    @property
    def size(self) -> int:
        return self.x * self.y * self.z * self.data

    def stride(self, axis: str) -> int:
        """Distance between consecutive ranks of an ``axis`` group (the x → y → z → data hierarchy)."""
        return {MeshAxis.X: 1, MeshAxis.Y: self.x, MeshAxis.Z: self.x * self.y,
                MeshAxis.DATA: self.x * self.y * self.z}[axis]

    def rank_grid(self) -> RankGrid:
        """The grid's ranks as ``data × z × y × x`` (:mod:`autopar.grid`)."""
        return RankGrid({MeshAxis.DATA: self.data, MeshAxis.Z: self.z, MeshAxis.Y: self.y, MeshAxis.X: self.x})

    def group_specs(self) -> dict[str, GroupSpec]:
        """The groups a 3D program names: one per axis, and ``replica`` (the ranks of one
        (x, y), which split the batch over z and data, ordered by batch chunk ``data·Gz + z``)."""
        return {**{axis: GroupSpec((axis,)) for axis in GRID_AXES},
                MeshAxis.REPLICA: GroupSpec((MeshAxis.DATA, MeshAxis.Z))}

    def coordinates(self, rank: int) -> dict[str, int]:
        coords = self.rank_grid().coordinates(rank)
        return {axis.value: coords[axis] for axis in GRID_AXES}

    def rank(self, x: int, y: int, z: int, data: int = 0) -> int:
        return self.rank_grid().index(x=x, y=y, z=z, data=data)

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ``axis`` as a list of ranks ordered by their coordinate on it; the
        groups ordered by their first rank."""
        return self.rank_grid().groups((axis,))  # row-major over the other axes: by first rank

    def swapped(self) -> "Grid3D":
        """The grid a "transposed" layer sees: x and y exchange roles (axonn end of §III-B)."""
        return Grid3D(self.y, self.x, self.z, self.data)
