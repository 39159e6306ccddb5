"""Analysis pass: routed mixture-of-experts layers.

A routed expert layer sends each token to ``k`` of ``E`` experts its router picks. The
experts themselves are a ``linear_chain`` region with ``details["experts"] = E`` (3-D
weights applied by a grouped matmul, :mod:`autopar.passes.analysis.linear_chains`); this pass
reads around them, in the captured graph, what expert parallelism needs (docs/experts.md):

* the **router**: the linear of ``E`` outputs (a bias or not) whose scores (``softmax``
  or ``sigmoid``, after casts and views), or logits, a ``topk(k)`` reads; its values,
  renormalised over the ``k`` slots (divided by their sum, or their softmax: GPT-OSS) or
  not, are the routing weights, its indices the experts;
* the **dispatch**: what takes the indices to the grouped matmul's offsets and the
  tokens to its rows (Hugging Face: ``sort`` of the expert ids, ``histc``, ``cumsum``,
  an index by ``perm // k``);
* the **combine**: from the down projection to the sum over the ``k`` slots
  (``(out * w)[inverse].view(T, k, H).sum(1)``);
* **shared experts** (Qwen2-MoE, DeepSeek): MLPs (``linear_chain`` regions without
  experts) that read the router's input and whose output, gated or not, is added to the
  combine's: a parallel branch beside the routed experts;
* the **experts** themselves: their biases (``out + bias[expert_ids]`` after a grouped
  matmul, Hugging Face GPT-OSS) and the activation between their projections, read and
  then checked by running the captured ops against what the expert-parallel call
  computes (:func:`expert_activation`, :func:`gated`: SiLU, exact or tanh GeLU, ReLU, or
  GPT-OSS's clamped SwiGLU; gate and up as halves or alternating columns).

It records one ``experts`` region per layer, its nodes the router's, the dispatch's, the
experts' and the combine's, ``details``: ``experts``, ``top_k``, ``router`` (the linear's
node), ``router_weight`` (its parameter), ``scores`` (``"softmax"``/``"sigmoid"``),
``normalized`` (the top-k values divided by their sum, or their softmax over the slots),
``chain`` (the experts' ``linear_chain`` id), ``input`` (the tokens the
router reads), ``index`` and ``weights`` (the top-k experts and their weights, ``[tokens,
k]``), ``combine`` (the node whose value is the layer's routed output), ``shared`` (the
shared experts' ``linear_chain`` ids), ``router_bias``, ``gate_up_bias`` and ``down_bias``
(parameter names, or None), ``activation`` (``{"name": ...}``, with ``alpha`` and ``limit``
for the clamped SwiGLU), ``interleaved`` (gate and up columns alternate) and ``unread``
(why the expert-parallel call cannot compute these experts; None when it can). An
expert chain whose router it cannot read (no ``topk`` before its offsets, a router of
another width) gets no region, with a warning that names the chain and says the layer
stays in its data or tensor plan.

Experts written as separate modules (a ``ModuleList``) and a loop over them
(``token, slot = where(index == e)``; the expert on ``x[token]``; its output weighted
and ``index_add``-ed into the layer's output) give a region too, ``details["form"] =
"module_list"``, with every expert's chain (``chains``) and module path (``modules``) in
expert order.

:func:`router_statistics` finds what a load-balancing loss reduces over the tokens
(the data family makes those the whole batch's). The expert family
(:mod:`autopar.strategies.experts.planner`) prices and rewrites the regions.

The package: :mod:`.reading` (small readers of the graph the others share), :mod:`.router`
(the router, the routing weights, the combine and the shared experts around a layer's
experts), :mod:`.activation` (the experts' parameters and activation), :mod:`.layers`
(the pass, for grouped and for separate experts) and :mod:`.statistics` (the routers'
load-balancing statistics).
"""
from autopar.passes.analysis.experts.activation import activation_argument, expert_activation, gated
from autopar.passes.analysis.experts.layers import find_routed_experts_pass
from autopar.passes.analysis.experts.statistics import router_statistics

__all__ = ["activation_argument", "expert_activation", "find_routed_experts_pass", "gated", "router_statistics"]
