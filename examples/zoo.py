"""The model-coverage suite's models: Hugging Face ``transformers`` models built from
small configs with random weights (nothing is downloaded), and the project's own
examples. Each entry is a :class:`ZooCase`: a factory (every rank builds its own copy
from the same seed), one global example batch, its target and the loss.

Used by :func:`coverage_job` (``tests/test_coverage.py``, ``python -m examples.coverage``)
and by anyone who wants a realistic model to try a strategy on::

    >>> case = ZOO["llama"]()
    >>> model = case.factory(); out = model(*case.inputs, **case.kwargs)

Models are called as their users call them: T5 with keywords (``input_ids=``,
``decoder_input_ids=``). :data:`OWN_LOSS` holds Hugging Face models called with
``input_ids``, a padded ``attention_mask`` and ``labels`` (-100 where no token counts),
which compute their own loss: no target, no ``loss_fn``
(``tests/trace/test_keyword_inputs.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# no dropout anywhere: single-device and parallel training must see the same function
# (autopar's rank-aware dropout is checked separately, tests/passes/test_random_draws.py)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@dataclasses.dataclass
class ZooCase:
    """``factory()(*inputs, **kwargs)`` is one global batch; ``loss_fn(output, target)``
    its loss, or, with both None, the loss the model computes itself (``labels``)."""
    name: str
    factory: Callable[[], nn.Module]
    inputs: tuple
    target: torch.Tensor | None
    loss_fn: Callable | None
    note: str = ""
    kwargs: dict = dataclasses.field(default_factory=dict)


def logits_loss(output, target):
    """Cross-entropy of a Hugging Face output's ``logits`` ([B, C] or [B, T, V])."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits.flatten(0, -2), target.flatten())


def _tokens(generator, *shape, vocab=64):
    return torch.randint(0, vocab, shape, generator=generator)


def gpt2() -> ZooCase:
    from examples.models import gpt2 as build
    g = torch.Generator().manual_seed(1)
    return ZooCase("gpt2", lambda: build(layers=2), (_tokens(g, 4, 16),), _tokens(g, 4, 16), logits_loss)


def bert() -> ZooCase:
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3, **_NO_DROPOUT)
    g = torch.Generator().manual_seed(1)
    return ZooCase("bert", lambda: BertForSequenceClassification(config), (_tokens(g, 4, 16),),
                   torch.randint(0, 3, (4,), generator=g), logits_loss, "sequence classification")


def llama() -> ZooCase:
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=64, max_position_embeddings=16, use_cache=False)
    g = torch.Generator().manual_seed(1)
    return ZooCase("llama", lambda: LlamaForCausalLM(config), (_tokens(g, 4, 16),), _tokens(g, 4, 16), logits_loss)


def _t5_config():
    from transformers import T5Config
    return T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                    use_cache=False, decoder_start_token_id=0, pad_token_id=0)


def t5() -> ZooCase:
    from transformers import T5ForConditionalGeneration
    config = _t5_config()
    g = torch.Generator().manual_seed(1)
    ids, decoder_ids = _tokens(g, 4, 16), _tokens(g, 4, 8)
    return ZooCase("t5", lambda: T5ForConditionalGeneration(config), (), _tokens(g, 4, 8), logits_loss,
                   "encoder-decoder, keyword inputs", kwargs={"input_ids": ids, "decoder_input_ids": decoder_ids})


def whisper() -> ZooCase:
    """Whisper (encoder-decoder with a conv stem over log-mel features), 2 + 2 layers;
    not in :data:`ZOO` (``benchmarks/exit_soak.py`` trains it under tensor, pipeline and
    "auto")."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    config = WhisperConfig(vocab_size=64, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, use_cache=False,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    g = torch.Generator().manual_seed(1)
    features, decoder_ids = torch.randn(4, 8, 32, generator=g), _tokens(g, 4, 8)
    return ZooCase("whisper", lambda: WhisperForConditionalGeneration(config), (), _tokens(g, 4, 8), logits_loss,
                   "encoder-decoder, conv stem, keyword inputs",
                   kwargs={"input_features": features, "decoder_input_ids": decoder_ids})


def vit() -> ZooCase:
    from transformers import ViTConfig, ViTForImageClassification
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=5, **_NO_DROPOUT)
    g = torch.Generator().manual_seed(1)
    return ZooCase("vit", lambda: ViTForImageClassification(config), (torch.randn(4, 3, 16, 16, generator=g),),
                   torch.randint(0, 5, (4,), generator=g), logits_loss)


def resnet() -> ZooCase:
    from transformers import ResNetConfig, ResNetForImageClassification
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    g = torch.Generator().manual_seed(1)
    return ZooCase("resnet", lambda: ResNetForImageClassification(config), (torch.randn(4, 3, 16, 16, generator=g),),
                   torch.randint(0, 5, (4,), generator=g), logits_loss, "batch norm in training mode")


def _own(name: str) -> Callable[[], ZooCase]:
    def case() -> ZooCase:
        from examples.factories import training_case
        factory, inputs, target, loss = training_case(name)
        return ZooCase(name, factory, inputs, target, loss, "autopar example")
    return case


# ------------------------------------------------ models that compute their own loss

_LENGTHS = (16, 3, 12, 7, 16, 9, 5, 14)  # tokens per row: every data rank and microbatch counts its own number


def _padded(g, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and an attention mask with right padding (rows of :data:`_LENGTHS`)."""
    ids = _tokens(g, batch, seq)
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for row in range(batch):
        mask[row, :max(1, _LENGTHS[row % len(_LENGTHS)] * seq // 16)] = 1
    return ids.masked_fill(mask == 0, 0), mask


def gpt2_labels() -> ZooCase:
    """GPT-2 as a causal LM: ``labels`` are the ids, -100 on padding."""
    from examples.models import gpt2 as build
    g = torch.Generator().manual_seed(2)
    ids, mask = _padded(g, 8, 16)
    return ZooCase("gpt2_labels", lambda: build(layers=2), (), None, None, "own loss, padded",
                   kwargs={"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})


def bert_mlm() -> ZooCase:
    """BERT masked LM: ``labels`` count only the masked tokens (-100 elsewhere)."""
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16, **_NO_DROPOUT)
    g = torch.Generator().manual_seed(3)
    ids, mask = _padded(g, 8, 16)
    chosen = (torch.rand(8, 16, generator=g) < 0.3) & (mask == 1)
    return ZooCase("bert_mlm", lambda: BertForMaskedLM(config), (), None, None, "own loss, padded",
                   kwargs={"input_ids": ids.masked_fill(chosen, 1), "attention_mask": mask,
                           "labels": ids.masked_fill(~chosen, -100)})


def t5_labels() -> ZooCase:
    """T5 with ``labels`` (the decoder's inputs are the labels shifted right), padded."""
    from transformers import T5ForConditionalGeneration
    config = _t5_config()
    g = torch.Generator().manual_seed(4)
    ids, mask = _padded(g, 8, 16)
    answers, answer_mask = _padded(g, 8, 8)
    return ZooCase("t5_labels", lambda: T5ForConditionalGeneration(config), (), None, None, "own loss, padded",
                   kwargs={"input_ids": ids, "attention_mask": mask,
                           "labels": answers.masked_fill(answer_mask == 0, -100)})


OWN_LOSS: dict[str, Callable[[], ZooCase]] = {"gpt2_labels": gpt2_labels, "bert_mlm": bert_mlm,
                                               "t5_labels": t5_labels}
"""Hugging Face models called with keywords that compute their own loss from ``labels``."""


ZOO: dict[str, Callable[[], ZooCase]] = {
    "gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "vit": vit, "resnet": resnet,
    "mlp": _own("mlp"), "transformer": _own("transformer"), "inception": _own("inception"), "towers": _own("towers"),
}
"""Every model of the suite by name, Hugging Face first."""
