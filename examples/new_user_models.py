"""Model definitions as a new user brings them: five transformers written the way
well-known repositories write theirs (from their structure, not copied, and not changed
for autopar; ``examples/new_user/``), and the job that trains each against the single
device (``tests/test_new_user_models.py``).

* ``nanogpt``: Karpathy's nanoGPT: one ``c_attn`` projection cut by ``split(n_embd, dim=2)``,
  each part ``view(B, T, nh, hs).transpose(1, 2)``, ``scaled_dot_product_attention`` with
  ``is_causal=True``, a GELU MLP, the embedding tied to the head
  (``transformer.wte.weight = lm_head.weight``), and ``forward(idx, targets=None)``
  returning ``(logits, loss)``, the loss a ``cross_entropy`` with ``ignore_index=-1``;
  called ``pm(idx=ids, targets=ids)``;
* ``nanogpt_manual``: the same with nanoGPT's attention written out (its path without
  flash attention): a ``bias`` buffer ``tril(ones(T, T)).view(1, 1, T, T)``, ``masked_fill``
  with ``-inf``, softmax, dropout, ``att @ v``;
* ``llama``: Meta's reference Llama (``llama/model.py``) as fine-tuning code trains it:
  ``RMSNorm`` in float32, ``precompute_freqs_cis`` with ``torch.polar`` kept as a plain
  attribute, ``apply_rotary_emb`` with ``view_as_complex``/``view_as_real``, separate
  ``wq, wk, wv, wo``, grouped-query attention (4 heads, 2 key/value heads) by ``repeat_kv``
  (expand, then reshape), an additive ``triu`` mask, a SwiGLU ``FeedForward(w1, w2, w3)``;
  ``forward(tokens)`` gives the logits, the loss is the user's ``cross_entropy``;
* ``vit``: a vision transformer as timm writes it: ``PatchEmbed`` (a ``Conv2d`` with
  stride the patch, ``flatten(2).transpose(1, 2)``), a class token ``expand``-ed and
  concatenated, a learned position embedding, a fused ``qkv`` reshaped
  ``(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4)`` and ``unbind(0)``, pre-norm blocks, the
  head on the class token; a classification loss;
* ``t5``: a T5 encoder: ``T5LayerNorm`` (no mean, no bias), unscaled scores, a relative
  position bias (an ``nn.Embedding`` of log-spaced buckets, ``[T, T, heads]`` permuted to
  ``[1, heads, T, T]``) computed by the first layer and passed to the others, a padding
  mask from the ``attention_mask`` keyword, a ReLU feed-forward; a token-level head.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from examples.new_user import llama, nanogpt, t5, vit

VOCAB, SEQ, BATCH, CLASSES = 64, 8, 4, 10
MODELS = ("nanogpt", "nanogpt_manual", "llama", "vit", "t5")


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The user's loss of a model that returns logits ``[B, T, V]``."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1))


def case(name: str) -> tuple[Callable[[], torch.nn.Module], tuple, dict[str, Any], Any, Callable | None]:
    """``(factory, inputs, keyword inputs, target, loss_fn)`` of one model, as its user
    calls it (``loss_fn=None``: the model computes its own loss)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    if name in ("nanogpt", "nanogpt_manual"):
        config = nanogpt.GPTConfig(flash=name == "nanogpt")
        return lambda: nanogpt.GPT(config), (), {"idx": ids, "targets": target}, None, None
    if name == "llama":
        return lambda: llama.Transformer(llama.ModelArgs()), (ids,), {}, target, token_loss
    if name == "vit":
        images = torch.randn(BATCH, 3, 16, 16, generator=generator)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        return lambda: vit.VisionTransformer(num_classes=CLASSES), (images,), {}, labels, F.cross_entropy
    if name == "t5":
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, -3:] = 0  # one padded sequence
        return (lambda: t5.T5Encoder(), (), {"input_ids": ids, "attention_mask": mask}, target, token_loss)
    raise ValueError(f"unknown model {name!r}: one of {MODELS}")


def region_strategies(report: dict, kind: str) -> list[str]:
    """The strategy of each region of ``kind`` (``attention``, ``chain``) in plan order."""
    return [strategy for region, strategy in report["regions"].items() if region.startswith(kind + ":")]


def new_user_job(cases: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """On every rank: each ``(model, strategy)`` in float64 against one process
    (:func:`autopar.testing.compare_with_single_device`), with the strategy of every
    region; an error is reported in the row, unless it leaves the group unusable."""
    from autopar.testing import compare_with_single_device, reported_in
    rows = []
    for name, strategy in cases:
        row: dict[str, Any] = {"model": name, "strategy": strategy}
        with reported_in(row, f"{name} under {strategy}"):
            factory, inputs, kwargs, target, loss_fn = case(name)
            report = compare_with_single_device(factory, inputs, target, loss_fn, strategy, kwargs=kwargs,
                                                dtype=torch.float64)
            row.update({k: report[k] for k in ("mesh", "strategies", "regions", "output", "loss", "grad", "param")})
            row["attention"] = region_strategies(report, "attention")
        rows.append(row)
    return rows
