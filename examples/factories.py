"""Example cases: factories for ``autopar plan FILE:FACTORY`` (each returns model, inputs,
loss, target) and :func:`training_case` for the equivalence checks on ranks."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.models import MLP, Inception, TinyTransformer, Towers, gpt2 as _gpt2, gpt2_loss, lm_loss  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return MLP(), (torch.randn(8, 32),), F.cross_entropy, torch.randint(0, 8, (8,))


def transformer():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return TinyTransformer(), (ids,), lm_loss, torch.randint(0, 64, (4, 16))


def gpt2():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return _gpt2(), (ids,), gpt2_loss, torch.randint(0, 64, (4, 16))


def inception():
    torch.manual_seed(0)
    return Inception(), (torch.randn(8, 3, 8, 8),), F.cross_entropy, torch.randint(0, 5, (8,))


def training_case(model_name: str, batch: int | None = None, layers: int | None = None):
    """``(model factory, inputs, target, loss)`` of a named example, for training on ranks
    against a single-device copy (``autopar.testing``, ``examples/train.py``): the factory,
    not a model, so every rank builds its own from the same seed. ``batch``: the language
    models' batch (4 by default; Bian's cube on 8 ranks needs 8: z, then x and y, split it);
    ``layers``: their number of blocks (2 by default; a pipeline of 4 stages needs 4)."""
    generator = torch.Generator().manual_seed(1)
    if model_name == "inception":
        return Inception, (torch.randn(8, 3, 8, 8, generator=generator),), \
            torch.randint(0, 5, (8,), generator=generator), F.cross_entropy
    if model_name in ("towers", "towers4"):
        factory = Towers if model_name == "towers" else (lambda: Towers(towers=4))
        return factory, (torch.randn(8, 16, generator=generator),), \
            torch.randint(0, 4, (8,), generator=generator), F.cross_entropy
    if model_name == "mlp":
        x = torch.randn(8, 32, generator=generator)
        y = torch.randint(0, 8, (8,), generator=generator)
        return MLP, (x,), y, F.cross_entropy
    ids = torch.randint(0, 64, (batch or 4, 16), generator=generator)
    target = torch.randint(0, 64, (batch or 4, 16), generator=generator)
    if model_name == "transformer":
        return (lambda: TinyTransformer(layers=layers or 2)), (ids,), target, lm_loss
    if model_name == "gpt2":
        return (lambda: _gpt2(layers=layers or 2)), (ids,), target, gpt2_loss
    raise ValueError(f"unknown example model {model_name!r}")
