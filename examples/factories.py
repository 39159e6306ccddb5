"""Factories for ``autopar plan FILE:FACTORY``: each returns (model, inputs, loss, target)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.models import MLP, TinyTransformer, gpt2 as _gpt2, gpt2_loss, lm_loss  # noqa: E402


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
    from examples.models import Inception
    torch.manual_seed(0)
    return Inception(), (torch.randn(8, 3, 8, 8),), F.cross_entropy, torch.randint(0, 5, (8,))
