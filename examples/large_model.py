"""Train a model no rank holds whole (docs/guide/large_models.md).

A Hugging Face Llama is built on the meta device on each of 4 local CPU ranks (shapes
only), compiled under ``strategy`` (default: tensor 2 x pipeline 2), given the weights of
a pretrained checkpoint (each rank reads only the slices it holds), trained 3 steps, and
saved as a Hugging Face checkpoint that ``from_pretrained`` loads on one device::

    python examples/large_model.py
    python examples/large_model.py --strategy '{"x": 2, "y": 1, "z": 2}'

The "pretrained" checkpoint is written first by a single-device model, as any
``save_pretrained`` directory would be.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.runtime.launcher import launch  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (8, 32), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def train(strategy, pretrained: str, out: str):
    import torch.distributed as dist
    import transformers
    with torch.device("meta"):                      # shapes only: nothing allocated, nothing initialised
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    kwargs = batch()
    pm = autopar.compile(model, None, example_kwargs=kwargs, strategy=strategy)
    pm.load_pretrained(pretrained)                  # each rank reads the slices it holds
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        losses.append(round(pm.step(**kwargs).item(), 4))
        optimizer.step()
        optimizer.zero_grad()
    pm.save_pretrained(out)                         # rank 0 writes, a tensor at a time
    if dist.get_rank() == 0:
        print(pm.plan.explain().splitlines()[1])
        print("rank 0 holds", sum(p.numel() for p in pm.parameters()), "of",
              sum(p.numel() for p in model.parameters()), "parameter elements")
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default='{"tensor": 2, "pipeline": 2, "microbatches": 2}')
    args = p.parse_args(argv)
    import transformers
    with tempfile.TemporaryDirectory() as pretrained, tempfile.TemporaryDirectory() as out:
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(pretrained)
        losses = launch(train, 4, (json.loads(args.strategy), pretrained, out), timeout_s=600)[0]
        print("losses of the 3 steps:", losses)
        trained = transformers.LlamaForCausalLM.from_pretrained(out)   # one device, the trained weights
        print("from_pretrained of the saved model: loss", round(trained(**batch()).loss.item(), 4))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
