"""Pricing the memory levers of a ``data × tensor`` configuration (docs/memory.md):
gradient accumulation over ``m`` microbatches and ZeRO's stage ``s`` over the data ranks.

For a configuration the Megatron family priced at the whole batch of each data rank
(:func:`autopar.strategies.megatron.planner.price_mesh`), each lever setting is priced
from the same formulas at one microbatch's rows:

* **accumulation** (Megatron eq. 1: ``m = B / (d·b)`` microbatches of ``b`` rows): the
  compute and the tensor group's all-reduces are ``m`` times one microbatch's (kernels
  on fewer rows run less efficiently: ``matmul_time``'s efficiency curve and each
  launch's fixed cost are counted once per microbatch); the activations kept are one
  microbatch's; the data all-reduce runs once, overlapping only the last microbatch's
  backward;
* **ZeRO** (Rajbhandari et al. §5, with this runtime's schedule,
  :mod:`autopar.strategies.data.zero`): with ``P`` parameter elements on the rank (its
  tensor part), fp32 parameters, gradients and AdamW's two moments take ``4P + 4P +
  8P`` bytes; ZeRO-1 divides the moments by ``d``, ZeRO-2 the gradients too (with
  accumulation the full gradients stay: they accumulate over the microbatches before
  the reduce-scatter), ZeRO-3 the parameters too, keeping the two largest gathered
  parameters (the one in use and the prefetched one). Time: ZeRO-1 all-reduces as
  plain data parallelism; ZeRO-2 reduce-scatters instead (half the volume, overlapped
  alike); both all-gather the updated shards before the next step (exposed). ZeRO-3
  all-gathers every parameter in forward (prefetched: only what exceeds the forward
  compute is exposed), and again in backward and reduce-scatters its gradient (both
  synchronous in this runtime: exposed), per microbatch.

:func:`best_levers` weighs every setting (or the forced ones) and keeps the fastest that
fits in memory, or when none fits the one needing the least.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.cost import model as cm
from autopar.cost.hardware import Hardware
from autopar.ir import regions, tensor_spec
from autopar.planning.model import GRADIENT_BUCKET_BYTES, exposed_data_comm

PARAM_BYTES, GRAD_BYTES, STATE_BYTES = 4, 4, 8


@dataclass(frozen=True)
class LeverFigures:
    """One lever setting priced: ``m`` microbatches, ZeRO stage ``zero``, recomputation
    ``recompute`` ("none", "selective", "full"); compute and communication by group
    (seconds per step), bytes per rank."""

    m: int
    zero: int
    compute_s: float
    comm_s: dict
    memory_bytes: float
    activation_bytes: float
    recompute: str = "none"

    @property
    def step_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values())


def recompute_figures(model, hw: Hardware, rows: float, tensor: int, activations: float, compute: float
                      ) -> dict[str, tuple[float, float]]:
    """``mode -> (activation bytes, compute seconds)`` of one microbatch of ``rows`` per
    data rank whose activations without recomputation are ``activations`` and compute
    ``compute``: ``"full"`` keeps each block's input and, while one block recomputes,
    its activations, and runs the blocks' forward again (megatron §3.5); ``"selective"``
    drops the attention cores' activations and runs their forward again (Korthikanti et
    al.). Both scale the model's unsplit figures by the share of the blocks (cores) in
    them, so a tensor split's own division carries over."""
    nodes = [n.name for n in model.gm.graph.nodes]
    scale = 1.0 / (model.batch / rows) if model.batch else 1.0
    whole = model.activation_bytes(nodes, scale) or 1.0
    out = {"none": (activations, compute)}
    blocks = regions(model.gm, "block")
    if blocks:
        in_blocks = sum(model.activation_bytes(b.nodes, scale) for b in blocks)
        inputs = 0.0
        for b in blocks:
            inside = set(b.nodes)
            first = next((model.table[n] for n in b.nodes if model.table[n].op in
                          ("call_function", "call_method", "call_module")), None)
            args = [a for a in (first.all_input_nodes if first is not None else ())
                    if a.name not in inside and a.op not in ("get_attr", "placeholder")]
            inputs += sum(float(s.nbytes) * scale for a in args if (s := tensor_spec(a)) is not None)
        share = in_blocks / whole
        again = sum(model.seconds(b.nodes, hw, scale / tensor) for b in blocks) / 3
        out["full"] = (activations * (1 - share) + inputs + activations * share / len(blocks), compute + again)
    cores = [n for r in regions(model.gm, "attention") for n in r.details.get("core", ())]
    if cores:
        share = model.activation_bytes(cores, scale) / whole
        again = model.seconds(cores, hw, scale / tensor) / 3
        out["selective"] = (activations * (1 - share), compute + again)
    return out



def state_bytes(params: float, data: int, zero: int, m: int, largest: float = 0.0) -> float:
    """Parameters, gradients and optimizer state per rank under ZeRO stage ``zero`` over
    ``data`` ranks (module docstring); ``largest``: the two largest parameters' elements
    (ZeRO-3 holds them gathered)."""
    d = data if data > 1 else 1
    p = params * PARAM_BYTES / (d if zero >= 3 else 1) + (largest * PARAM_BYTES if zero >= 3 else 0.0)
    g = params * GRAD_BYTES / (d if zero >= 2 and (m == 1 or zero >= 3) else 1)
    s = params * STATE_BYTES / (d if zero >= 1 else 1)
    return p + g + s


def zero_comm(params: float, data: int, tensor: int, zero: int, m: int, compute_one: float,
              hw: Hardware) -> float:
    """The data group's exposed seconds per step under ZeRO (module docstring);
    ``compute_one``: one microbatch's compute seconds (forward + backward)."""
    grad_bytes = params * GRAD_BYTES
    if zero == 0:
        return exposed_data_comm(data, tensor, grad_bytes, compute_one, hw)
    gather = cm.all_gather_time(data, grad_bytes / data, hw, stride=tensor)
    if zero <= 2:
        reduce = (exposed_data_comm(data, tensor, grad_bytes, compute_one, hw) if zero == 1 else
                  max(cm.reduce_scatter_time(data, grad_bytes, hw, stride=tensor) - compute_one * 2 / 3,
                      cm.reduce_scatter_time(data, min(grad_bytes, GRADIENT_BUCKET_BYTES), hw, stride=tensor)))
        return reduce + gather
    forward = max(gather - compute_one / 3, 0.0)
    backward = gather + cm.reduce_scatter_time(data, grad_bytes, hw, stride=tensor)
    return m * (forward + backward)


def best_levers(options: list[LeverFigures], memory_limit: float) -> LeverFigures:
    """The fastest setting that fits in ``memory_limit`` (ties to the earlier: fewer
    microbatches, lower stage), else the one needing the least memory."""
    fitting = [o for o in options if o.memory_bytes <= memory_limit]
    if fitting:
        return min(fitting, key=lambda o: o.step_s)
    return min(options, key=lambda o: o.memory_bytes)
