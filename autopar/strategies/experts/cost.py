"""What expert parallelism costs one routed mixture-of-experts layer, per rank and step,
beside data parallelism (``degree`` 1), in the cost model's terms (:mod:`autopar.cost.model`).

A layer of ``E`` experts, each a (gated) MLP ``hidden → inner → hidden``, routes each of a
data rank's ``T`` tokens to ``k`` experts. **Planning assumption: uniform routing** (every
expert receives ``T·k/E`` of each rank's rows; the measured load, ``Routing.rows``, is
reported at run time). Over an expert group of ``P`` ranks (``P`` divides ``E`` and the
data degree ``d``):

* **compute**: a rank's experts process ``T·k`` rows whatever ``P`` (its ``E/P`` experts
  receive ``T·k/E`` rows from each of ``P`` ranks): the up (gate and up: ``g = 2`` when
  gated) and down projections, ``2·T·k·(g+1)·H·I`` FLOPs forward, twice that backward
  (Megatron PTD-P appendix), priced as matmuls;
* **all-to-all**: the dispatch and the combine, forward and backward: 4 all-to-alls of a
  ``T·k·H·b``-byte buffer per rank over the ``P`` ranks (``(P−1)/P`` of it leaves the rank;
  :data:`autopar.cost.model.ALL_TO_ALL`); none at ``P = 1``;
* **gradients**: the ``E/P`` experts' weights are replicated over ``d/P`` ranks (the ranks
  holding the same experts) and all-reduced there: ``(E/P)·(g+1)·H·I`` elements (AxoNN eq 3);
  at ``P = d`` nothing; data parallelism all-reduces all ``E`` experts over ``d``;
* **memory**: the ``E/P`` experts' parameters, gradients and AdamW state
  (:func:`autopar.cost.model.training_memory`), and the rows the experts save for
  backward.

What expert parallelism trades, then: its all-to-alls against a ``P``-fold smaller
gradient all-reduce over a ``P``-fold smaller group, and ``P``-fold less expert memory.

:func:`expert_layer_numbers` prices a layer given by its sizes (:class:`MoELayer`); the
planner prices a MoE region of the model with :func:`layer_figures`, beside what the
base plan's rows of its experts' chain cost, and the data group's exposed gradient
communication with expert-parallel layers with :func:`experts_data_comm`.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.ir import tensor_spec
from autopar.planning.model import ModelFacts, exposed_data_comm
from autopar.planning.plan import RegionChoice


@dataclass(frozen=True)
class MoELayer:
    """A routed layer's sizes: ``tokens`` per data rank and step, ``hidden``, ``inner``
    (each expert's intermediate width), ``experts``, ``top_k``, gated experts (SwiGLU:
    gate and up projections), ``bytes`` per element."""
    tokens: int
    hidden: int
    inner: int
    experts: int
    top_k: int
    gated: bool = True
    bytes: int = 4

    @property
    def expert_params(self) -> int:
        """Elements of one expert's weights: (gate and) up ``[inner, hidden]``, down ``[hidden, inner]``."""
        return ((2 if self.gated else 1) + 1) * self.hidden * self.inner


@dataclass(frozen=True)
class ExpertNumbers:
    """One layer's predicted seconds per step on one rank under expert degree ``degree``
    (1: data parallelism) and data degree ``data``, and its memory."""
    degree: int
    data: int
    rows: float                 # rows the rank's experts process per step (uniform routing)
    compute_s: float
    all_to_all_bytes: float     # the buffer each rank holds for one all-to-all
    all_to_all_s: float         # the 4 all-to-alls (dispatch, combine; forward and backward)
    gradient_s: float           # the experts' gradient all-reduce over the ranks holding the same experts
    params_per_rank: int
    memory_bytes: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.all_to_all_s + self.gradient_s


def dispatch_combine_time(degree: int, buffer_bytes: float, hw: Hardware) -> float:
    """A layer's 4 all-to-alls per step (dispatch and combine, forward and backward) of a
    ``buffer_bytes`` buffer per rank over an expert group of ``degree``; 0 at degree 1."""
    return 4 * cost_model.all_to_all_time(degree, buffer_bytes, hw) if degree > 1 else 0.0


def expert_layer_numbers(layer: MoELayer, degree: int, data: int, hw: Hardware) -> ExpertNumbers:
    """The predicted figures of ``layer`` over expert groups of ``degree`` ranks inside a
    data group of ``data`` (see the module docstring); ``degree`` 1 is data parallelism."""
    if degree < 1 or layer.experts % degree or data % degree:
        raise ValueError(f"expert degree {degree}: it must divide the {layer.experts} experts and the data degree "
                         f"{data}")
    rows = float(layer.tokens * layer.top_k)
    up = (2 if layer.gated else 1) * layer.hidden * layer.inner
    down = layer.hidden * layer.inner
    forward = cost_model.matmul_time(2 * rows * up, hw) + cost_model.matmul_time(2 * rows * down, hw)
    backward = 2 * (cost_model.matmul_time(2 * rows * up, hw) + cost_model.matmul_time(2 * rows * down, hw))
    buffer = rows * layer.hidden * layer.bytes
    all_to_all = dispatch_combine_time(degree, buffer, hw)
    local = layer.experts // degree
    replicas = data // degree
    gradient = cost_model.all_reduce_time(replicas, local * layer.expert_params * layer.bytes, hw, stride=degree)
    saved = rows * (layer.hidden + (2 if layer.gated else 1) * layer.inner + layer.inner) * layer.bytes
    params = local * layer.expert_params
    return ExpertNumbers(degree, data, rows, forward + backward, buffer, all_to_all, gradient, params,
                         cost_model.training_memory(params, saved))



@dataclass(frozen=True)
class LayerFigures:
    """One MoE region's predicted figures per rank and step under expert degree ``degree``."""
    region: str
    chains: tuple[str, ...]   # the experts' chain (a ModuleList: one per expert)
    degree: int
    experts: int
    top_k: int
    rows: float               # the rows the rank's experts process per step (uniform routing)
    all_to_all_bytes: float   # the buffer of one all-to-all, per rank
    all_to_all_s: float       # the 4 all-to-alls (dispatch and combine, forward and backward)
    tensor_s: float           # Megatron's f and g around the experts when tensor-split
    compute_s: float          # the experts' chain
    gradient_s: float         # the experts' weights all-reduced over their replicas
    params_before: float      # the chain's parameter elements on the rank in the base plan
    params_after: float       # with expert parallelism
    base_s: float             # the base plan's chain (compute, communication, its data all-reduce)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.all_to_all_s + self.tensor_s + self.gradient_s


def layer_figures(model: ModelFacts, hw, region, chain_choice: list[RegionChoice], degree: int, data: int,
                  tensor: int, microbatches: int = 1) -> LayerFigures:
    """``region`` under ``degree`` beside what the base plan's rows of its experts'
    chains (``chain_choice``) cost; with ``microbatches``, one microbatch's compute and
    communication (the gradient all-reduce and the memory stay the step's)."""
    d = region.details
    spec = tensor_spec(model.table[d["input"]])
    tokens, hidden = spec.shape[0] / (data * microbatches), spec.shape[-1]
    itemsize = getattr(spec.dtype, "itemsize", 4)
    rows = tokens * d["top_k"]
    buffer = rows * hidden * itemsize
    ids = d.get("chains", [d["chain"]])
    chains = [r for r in model.regions if r.id in ids]
    nodes = [n for c in chains for n in c.nodes]
    params = sum(model.region_param_elems(c.id) for c in chains)
    before = sum(model.region_param_elems(c.region) / (tensor if c.strategy == "megatron" else 1)
                 for c in chain_choice)
    inside = tensor if d.get("form") != "module_list" else 1   # separate modules run whole on each tensor rank
    after = params / (degree * inside)
    compute = model.seconds(nodes, hw, 1 / (data * microbatches * inside))
    a2a = dispatch_combine_time(degree, buffer, hw)
    tensor_s = 2 * cost_model.all_reduce_time(tensor, tokens * hidden * itemsize, hw) if inside > 1 else 0.0
    gradient = cost_model.all_reduce_time(data // degree, after * 4, hw, stride=degree * tensor)
    base = (sum(c.cost.compute_s + c.cost.total_comm_s for c in chain_choice)
            + cost_model.all_reduce_time(data, before * 4, hw, stride=tensor))
    return LayerFigures(region.id, tuple(ids), degree, d["experts"], d["top_k"], rows, buffer, a2a, tensor_s, compute,
                        gradient, before, after, base)


def experts_data_comm(params: float, layers: list[LayerFigures], data: int, tensor: int, compute: float,
                      hw) -> float:
    """The data group's exposed seconds per step with the MoE regions ``layers``
    expert-parallel, ``params`` parameter elements on the rank: every gradient but the
    experts' all-reduced over the data ranks, overlapped with backward
    (:func:`autopar.planning.model.exposed_data_comm`), then the experts' over their
    replicas in what of backward that leaves; ``compute``: one microbatch's seconds."""
    rest = (params - sum(f.params_after for f in layers)) * 4
    comm = exposed_data_comm(data, tensor, rest, compute, hw)
    slack = max(0.0, compute * 2 / 3 - cost_model.all_reduce_time(data, rest, hw, stride=tensor))
    return comm + max(0.0, sum(f.gradient_s for f in layers) - slack)


__all__ = ["ExpertNumbers", "LayerFigures", "MoELayer", "dispatch_combine_time", "expert_layer_numbers",
           "experts_data_comm", "layer_figures"]
