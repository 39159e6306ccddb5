"""The private torch APIs autopar relies on, in one place so a torch upgrade touches one file.

* ATen operator overloads (``torch.ops.aten.addmm.default``) are ``torch._ops.OpOverload``
  objects; their ``_schema`` names arguments and says which returns alias inputs.
* The local launcher hosts the rendezvous store in the parent process and tells the
  ranks so with torchrun's ``TORCHELASTIC_USE_AGENT_STORE`` contract.
* The failure board (``autopar.runtime.health``) reads the default group's store and the
  groups' collective timeouts; groups made without a timeout get torch's module-level
  default, not the default group's, unless :class:`new_groups_timeout` swaps it.
* Graphs from ``torch.export`` nest their flat outputs again through the code generator's
  pytree spec, and the unlifted module carries its input and output specs as
  ``_in_spec``/``_out_spec``; rank programs built on another root copy them
  (:func:`export_out_spec`, :func:`copy_export_specs`; ``tree_unflatten`` nests outputs).
* A module's own parameters (not its children's) are ``module._parameters``; its forward
  hooks ``_forward_pre_hooks``/``_forward_hooks`` (:func:`own_parameters`, :func:`forward_hooks`).
* Stamping repeated layers (``autopar.trace.stamping``) exports a model with its stack
  of layers cut short by swapping the stack's ``_modules``, builds a graph with the
  exported one's code generator (``graph._codegen``: its pytree nesting), and registers
  the stamped layers' buffers as persistent or not as the exported module does
  (``_non_persistent_buffers_set``). ``torch.fx.config.do_not_emit_stack_traces`` spares
  export the stack trace of every node, which autopar never reads (:func:`no_stack_traces`).
* A process group whose ranks are numbered in the order given, not sorted
  (:func:`new_group_in_order`): ``new_group(sort_ranks=False)`` from torch 2.13; before it
  ``new_group`` always sorted, through the module-level name ``sorted``.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: F401 - re-exported (runtime.pipeline, data)

OpOverload = torch._ops.OpOverload

AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
"""Environment telling ``init_process_group`` that the store at MASTER_ADDR:PORT is hosted
by the launching process (as torchrun's agent does), so ranks connect as clients."""


def is_aten_op(target) -> bool:
    return isinstance(target, OpOverload)


def schema_of(target):
    """The operator schema of an ATen overload, or None for anything else."""
    return target._schema if isinstance(target, OpOverload) else None


def argument_names(target) -> list[str]:
    schema = schema_of(target)
    return [a.name for a in schema.arguments] if schema is not None else []


def aten_name(target) -> str:
    """``aten.addmm`` for ``torch.ops.aten.addmm.default``."""
    return f"aten.{target._schema.name.split('::')[-1]}"


def _flat_collectives():
    """``(all_gather, reduce_scatter)`` of flat tensors into/out of one buffer:
    ``all_gather_single``/``reduce_scatter_single`` where torch has them (2.13 deprecates
    the ``*_tensor`` names), else the older names."""
    import torch.distributed as dist
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)


all_gather_flat, reduce_scatter_flat = _flat_collectives()


# ---------------------------------------------------------------- process groups' stores and timeouts
# (autopar.runtime.health: the failure board lives in the default group's store, and the
# groups autopar creates get the default group's collective timeout)

def default_store():
    """The store the default process group was initialised with (torchrun's or launch's
    rendezvous store, under the default group's prefix)."""
    from torch.distributed import distributed_c10d
    return distributed_c10d._get_default_store()


def group_timeout(group):
    """The collective timeout (a ``timedelta``) of ``group``'s backend, or None if unknown."""
    for device in group._device_types:
        options = getattr(group._get_backend(device), "options", None)
        timeout = getattr(options, "_timeout", None)
        if timeout is not None:
            return timeout
    return None


def set_group_timeout(group, timeout) -> None:
    """Make ``group``'s future collectives time out after ``timeout`` (a ``timedelta``)."""
    from torch.distributed import distributed_c10d
    distributed_c10d._set_pg_timeout(timeout, group)


class new_groups_timeout:
    """Inside the block, process groups created without an explicit timeout (``new_group``,
    ``split_group``, ``DeviceMesh``) get ``timeout`` instead of torch's default (30
    minutes for gloo, 10 for NCCL): torch reads these module globals when a group is made."""

    _NAMES = ("default_pg_timeout", "default_pg_nccl_timeout")

    def __init__(self, timeout):
        self.timeout = timeout

    def __enter__(self):
        from torch.distributed import distributed_c10d
        self.saved = {name: getattr(distributed_c10d, name) for name in self._NAMES}
        if self.timeout is not None:
            for name in self._NAMES:
                setattr(distributed_c10d, name, self.timeout)
        return self

    def __exit__(self, *exc):
        from torch.distributed import distributed_c10d
        for name, value in self.saved.items():
            setattr(distributed_c10d, name, value)


_sorted_lock = __import__("threading").Lock()


def new_group_in_order(members: list[int]):
    """``dist.new_group(members)`` whose group rank ``i`` is ``members[i]``. torch 2.13 has
    ``sort_ranks=False``; older releases sort ``members`` unconditionally, with the builtin
    ``sorted`` looked up in ``distributed_c10d``'s globals, which this shadows by the
    identity while the group is made (every rank makes its groups in the same order)."""
    import inspect
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    if "sort_ranks" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(list(members), sort_ranks=False)
    if list(members) == sorted(members):
        return dist.new_group(list(members))
    with _sorted_lock:
        distributed_c10d.sorted = list
        try:
            return dist.new_group(list(members))
        finally:
            del distributed_c10d.sorted


def export_out_spec(gm):
    """The pytree spec that nests an exported graph's flat outputs (None for other graphs)."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    return info.out_spec if info is not None else None


def copy_export_specs(src, dst) -> None:
    """Give ``dst`` (a GraphModule over ``src``'s graph) the input/output specs of the
    module ``torch.export`` unlifted, which its calls check and nest by."""
    for attr in ("_in_spec", "_out_spec"):
        if hasattr(src, attr):
            setattr(dst, attr, getattr(src, attr))


def own_parameters(module: torch.nn.Module):
    """``(attribute, parameter)`` for the parameters registered on ``module`` itself."""
    return module._parameters.items()


def forward_hooks(module: torch.nn.Module) -> tuple:
    """The ids of ``module``'s forward pre-hooks and forward hooks."""
    return tuple(module._forward_pre_hooks), tuple(module._forward_hooks)


def children_of(module: torch.nn.Module) -> dict:
    """``module``'s registered children (its ``_modules``, by name)."""
    return module._modules


def set_children(module: torch.nn.Module, children: dict) -> None:
    """Make ``children`` the registered children of ``module`` (a ``ModuleList`` cut short)."""
    module._modules = children


def graph_codegen(graph: torch.fx.Graph):
    """The code generator of ``graph`` (an export's nests the flat outputs again)."""
    return graph._codegen


def non_persistent_buffers(module: torch.nn.Module) -> set:
    """The names of ``module``'s own buffers that ``state_dict`` leaves out."""
    return module._non_persistent_buffers_set


class no_stack_traces:
    """While tracing, record no ``node.meta["stack_trace"]`` (a traceback per node, a fifth
    of what ``torch.export`` costs on a large model)."""

    def __enter__(self):
        import torch.fx.config as fx_config
        self._config, self._before = fx_config, getattr(fx_config, "do_not_emit_stack_traces", False)
        fx_config.do_not_emit_stack_traces = True

    def __exit__(self, *exc):
        self._config.do_not_emit_stack_traces = self._before


def enclosing_saved_tensors_hooks():
    """The ``(pack, unpack)`` pair of the innermost ``saved_tensors_hooks`` context active
    now (None: none). Only the innermost pair runs, so a context that keeps some saved
    tensors its own way hands the others to this pair (sequence parallelism's inside
    ZeRO-3's, :func:`autopar.strategies.megatron.collectives.keep_split_inputs`)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)
