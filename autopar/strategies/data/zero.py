"""Sharded data parallelism: ZeRO stages 1, 2 and 3 (FSDP) over the data group.

Rajbhandari et al.'s ZeRO (and PyTorch's FSDP, which is ZeRO-3) partition what plain
data parallelism replicates on every data rank. With ``strategy={..., "zero": s}``:

* **ZeRO-1**: each data rank steps only its shard of every parameter, so the optimizer's
  state (AdamW: two tensors per parameter) is ``1/d`` of it. A rank needs only its
  shard's summed gradient, so the gradient buckets are reduce-scattered (half the bytes
  of the all-reduce plain data parallelism runs, AxoNN eqs 2-3), and after the optimizer
  step the shards are all-gathered into the full parameters the program reads.
* **ZeRO-2**: as ZeRO-1; the planner prices its gradients sharded too (a rank never
  holds the averaged full gradient: each bucket's full gradients are freed once copied
  into the bucket, which ZeRO-1's runtime does alike).
* **ZeRO-3** (FSDP): the full parameters are not kept at all. The rank program reads
  each one where it is used; the first read of a *unit* (a layer, or a module outside
  the stacks: :func:`autopar.runtime.layout.zero_unit`, as torchtitan wraps each layer with
  FSDP2) all-gathers the whole unit in one collective, prefetches the next unit while
  this one computes, and frees the unit before it; a tensor autograd would keep for
  backward is kept as a note instead and its unit all-gathered again when backward
  needs it (the unit before it prefetched); backward reduce-scatters a unit's gradients
  in one collective once every use has given one, at most two in flight
  (:mod:`autopar.strategies.data.zero_runtime`).

**The shard.** A parameter is cut along its first dimension into ``d`` row blocks of
sizes differing by at most one (``RowShard``): data rank ``i`` holds block ``i`` of its
tensor-parallel part (the cut of the other families comes first). ``pm.parameters()``
are these shards: any ``torch.optim`` optimizer steps them, ``grad_norm`` sums their
norms over the data group too, ``full_state_dict``, ``full_gradients`` and checkpoints
gather or cut them through the parameter layout (:mod:`autopar.runtime.layout`, the placement's
``zero``). A parameter with fewer rows than data ranks (a scalar, a short bias) stays
whole on every rank and is all-reduced as without ZeRO, as DeepSpeed keeps small
parameters persistent: all-gathering a few elements costs a collective's latency for
nothing saved. ``pm.layout`` lists which parameters are sharded.

Which parameters: those whose gradient the plan averages over the data group (the
layout's ``data`` buckets), so ZeRO composes with Megatron's and the mixed plans' tensor
splits and with a pipeline (sharded within each stage's data group). AxoNN's grid
weights in a mixed plan, whose gradients the 3D runtime writes after backward, are kept
persistent under ZeRO-3 (ZeRO-2 for them); the optimizer state is sharded all the same.

**Why our own and not FSDP2.** ``fully_shard`` wraps ``nn.Module`` s, turns their
parameters into DTensors and all-gathers in module forward hooks. A rank program here
is a rewritten fx graph that reads parameters (``get_attr``) far from the module that
owns them (Megatron's row linears, the 3D layers, export's ATen graphs read every
parameter at the top) and already carries its own tensor-parallel cuts and collectives;
FSDP's hooks would gather at the wrong place or not at all, and DTensor parameters would
change what the rewritten ops receive. The graph pass :func:`zero_pass` instead puts
each gather right before its use in the rank program, where the dump shows it::

    fc1_weight = zero_param('model.fc1.weight', 'model.fc2.weight')   # gathers; prefetches fc2
    linear = torch._C._nn.linear(x, fc1_weight, fc1_bias)

and the runtime (:class:`~autopar.strategies.data.zero_runtime.ZeroState`) holds the
shards, the full parameters of ZeRO-1/2, ZeRO-3's units, the prefetches, the notes kept
for backward and the reduce-scatters in flight.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx

from autopar._torch_compat import all_gather_flat
from autopar.grid import MeshAxis
from autopar.runtime.layout import cut_shape
from autopar.runtime.groups import get_group
from autopar.trace.capture import MODEL_PREFIX

log = logging.getLogger("autopar.zero")

STAGES = (1, 2, 3)


# ---------------------------------------------------------------------------- the cut
@dataclass(frozen=True)
class RowShard:
    """Rows ``[start, stop)`` of a parameter's first dimension (``rows`` of them) on data
    rank ``index`` of ``size`` over ``group``: blocks of sizes differing by at most one,
    the larger first. ``stage``: ZeRO's; ``persistent``: the full parameter is kept
    between uses (ZeRO-1/2, or a grid weight under ZeRO-3); ``divisor``: what the summed
    gradient is divided by (the data bucket's)."""

    group: str
    size: int
    index: int
    rows: int
    stage: int
    persistent: bool = True
    divisor: int | None = None

    @staticmethod
    def block(rows: int, size: int, index: int) -> tuple[int, int]:
        base, extra = divmod(rows, size)
        start = index * base + min(index, extra)
        return start, start + base + (1 if index < extra else 0)

    @property
    def span(self) -> tuple[int, int]:
        return self.block(self.rows, self.size, self.index)

    @property
    def chunk(self) -> int:
        """The padded block every rank sends in an all-gather or reduce-scatter."""
        return -(-self.rows // self.size)

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``full`` (the tensor-parallel part), a view."""
        start, stop = self.span
        return full[start:stop]

    def padded_blocks(self, full: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's block of ``full``, padded and flat, in rank order (laid end to end,
        what a reduce-scatter over the group takes)."""
        return [self.pad(full[start:stop]) for start, stop in
                (self.block(self.rows, self.size, k) for k in range(self.size))]

    def pad(self, block: torch.Tensor) -> torch.Tensor:
        """``block`` padded with zero rows to :attr:`chunk` rows, flat."""
        missing = self.chunk - block.shape[0]
        if missing:
            block = torch.cat([block, block.new_zeros((missing, *block.shape[1:]))])
        return block.reshape(-1)

    def unpad(self, flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The full ``shape`` tensor from the ``size`` padded blocks laid end to end in ``flat``
        (or one block a row of a ``[size, n]`` view: a ZeRO-3 unit's gather)."""
        blocks = flat.reshape(self.size, self.chunk, *shape[1:])
        return torch.cat([blocks[i, :stop - start] for i, (start, stop) in
                          enumerate(self.block(self.rows, self.size, k) for k in range(self.size))])

    def gather(self, shard: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The full ``shape`` tensor from every rank's shard (an all-gather over the group)."""
        out = shard.new_empty(self.size * self.chunk * _row_numel(shape))
        all_gather_flat(out, self.pad(shard.detach()).contiguous(), group=get_group(self.group))
        return self.unpad(out, shape)

    def __str__(self) -> str:
        start, stop = self.span
        return f"zero-{self.stage} rows {start}:{stop} of {self.rows} over {self.group}"


def _row_numel(shape) -> int:
    n = 1
    for s in shape[1:]:
        n *= s
    return n


def shardable(shape: tuple[int, ...], size: int) -> bool:
    """Whether a parameter of ``shape`` is sharded over ``size`` data ranks: it has at
    least one row per rank (a scalar or a shorter tensor stays whole, module docstring)."""
    return len(shape) > 0 and shape[0] >= size


# ---------------------------------------------------------------------------- the layout
def place(builder, stage: int, group: str = MeshAxis.DATA) -> None:
    """Shard every held parameter the plan averages over the data group (its bucket's
    group is ``group``: ``data``, or ``data_context`` under context parallelism, whose
    ranks average the gradients too) with at least one row per rank of it: the placement's ``zero``
    cut, its bucket marked with the stage (ZeRO-3's gathered parameters have none: their
    gradients are reduce-scattered in backward), its norm summed over data too. Runs
    after every family placed its parameters (:func:`autopar.strategies.placement.build_layout`)."""
    size = builder.seat.size(group)
    index = builder.seat.coords.get(group, 0)
    for name in builder.names():
        p = builder.placement(name)
        if not p.held or p.bucket is None or p.bucket.group != group:
            continue
        local_shape = cut_shape(p, builder.seat)
        if not shardable(local_shape, size):
            continue
        persistent = stage < 3 or getattr(p.cut, "grid_weight", False)
        divisor = p.bucket.divisor if p.bucket.divisor is not None else size
        cut = RowShard(group, size, index, local_shape[0], stage, persistent, divisor)
        bucket = dataclasses.replace(p.bucket, zero=stage) if persistent else None
        builder.update(name, zero=cut, bucket=bucket, norm_groups=tuple(sorted({*p.norm_groups, group})))


# ---------------------------------------------------------------------------- the graph pass
def zero_param(name: str, prefetch: Optional[str] = None) -> torch.Tensor:
    """The full (tensor-parallel) parameter ``name`` of the rank program, from the
    current :class:`ZeroState`; ``prefetch``: the next one the program reads, whose
    all-gather starts now (ZeRO-3)."""
    return _current().param(name, prefetch)


def zero_module(path: str, names: tuple, prefetch: Optional[str], *args, **kwargs):
    """Call the module at ``path`` with its sharded parameters ``names`` (``(attribute,
    parameter name)``) as :func:`zero_param` gives them (``torch.func.functional_call``)."""
    state = _current()
    module = state.root.get_submodule(path)
    params = {attr: state.param(name, prefetch if k == len(names) - 1 else None)
              for k, (attr, name) in enumerate(names)}
    return torch.func.functional_call(module, params, args, kwargs)


def zero_pass(gm: fx.GraphModule, *, params: dict[str, str]) -> fx.GraphModule:
    """Read each sharded parameter through :func:`zero_param` right before each node
    that uses it (the read moves from the graph's top, where export puts it, to its use,
    so that ZeRO-3 holds one layer's full parameters at a time), and call a module
    holding sharded parameters through :func:`zero_module`. ``params``: the wrapper's
    name of every sharded parameter (all its names, tied ones too) → its layout name.
    Each read names the next one in graph order, to prefetch."""
    graph = gm.graph
    reads: list[fx.Node] = []
    for node in list(graph.nodes):
        if node.op == "get_attr" and node.target in params:
            for user in list(node.users):
                with graph.inserting_before(user):
                    read = graph.call_function(zero_param, (params[node.target], None))
                read.meta.update(node.meta)
                user.replace_input_with(node, read)
                reads.append(read)
            graph.erase_node(node)
        elif node.op == "call_module":
            module = gm.get_submodule(node.target)
            names = tuple((attr, params[f"{node.target}.{attr}"]) for attr, _ in module.named_parameters()
                          if f"{node.target}.{attr}" in params)
            if not names:
                continue
            with graph.inserting_before(node):
                call = graph.call_function(zero_module, (node.target, names, None, *node.args), dict(node.kwargs))
            call.meta.update(node.meta)
            node.replace_all_uses_with(call)
            graph.erase_node(node)
            reads.append(call)
    order = {n: k for k, n in enumerate(graph.nodes)}
    reads.sort(key=order.__getitem__)
    for read, following in zip(reads, reads[1:]):
        nxt = following.args[0] if following.target is zero_param else following.args[1][0][1]
        index = 1 if read.target is zero_param else 2
        read.args = read.args[:index] + (nxt,) + read.args[index + 1:]
    graph.lint()
    gm.recompile()
    return gm


def sharded_names(layout) -> dict[str, str]:
    """The wrapper's name (``model.<name>``) of every parameter ``layout`` shards → its
    layout name (the first of its names): what :func:`zero_pass` rewrites."""
    out = {}
    for p in layout.unique():
        if p.zero is not None:
            out.update((MODEL_PREFIX + n, p.names[0]) for n in p.names)
    return out


# ---------------------------------------------------------------------------- the runtime
_STATE = None  # the ZeroState the running rank program reads (zero_runtime.use_zero sets it)


def _current():
    if _STATE is None:
        raise RuntimeError("zero_param: no ZeRO state is current; the ParallelModule that runs this program sets it")
    return _STATE
