"""Benchmark (docs/benchmarks.md §19): training with step checkpoints every 10 steps,
asynchronous against synchronous against none (autopar.save_checkpoint(step=, async_=)).

Hugging Face GPT-2 (4 layers, width 256, 64 tokens) on 2 gloo ranks, ``data 2``, AdamW.
One repetition of a side is a block of 10 training steps (``zero_grad``, ``step``,
``optimizer.step``): without checkpoints; with a synchronous save at the start of the
block; with an asynchronous save at the start whose write runs during the block's steps
and is waited for at its end (``wait_checkpoints``: what the next save would wait for).
The three sides alternate block by block (medians, IQRs, paired ratios against the block
without checkpoints). Each save writes the whole model and optimizer state of the step
into a fresh entry (``keep=2``), on this machine's disk.

    python benchmarks/bench_checkpoint.py [--steps 8] [--quick]
"""
from __future__ import annotations

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import compare, interleaved, parser, print_rows, write_json

import os
import shutil
import tempfile

import torch
import torch.distributed as dist

import autopar
from autopar.runtime.launcher import launch

BLOCK = 10


def make_case(quick: bool):
    from transformers import GPT2Config, GPT2LMHeadModel
    from examples.models import gpt2_loss
    torch.manual_seed(0)
    width = 128 if quick else 256
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=width, n_head=4, vocab_size=512, n_positions=64,
                                       use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 512, (8, 64))
    return model, (ids,), torch.randint(0, 512, (8, 64)), gpt2_loss


def rank_job(reps: int, warmup: int, quick: bool, root: str, world: int) -> dict:
    torch.set_num_threads(1)
    model, inputs, target, loss_fn = make_case(quick)
    pm = autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy={"data": world} if world > 1 else None)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-4)
    counter = [0]

    def steps():
        for _ in range(BLOCK):
            optimizer.zero_grad(set_to_none=True)
            pm.step(*inputs, target=target)
            optimizer.step()
        counter[0] += BLOCK

    def none():
        steps()

    def synchronous():
        autopar.save_checkpoint(pm, os.path.join(root, "sync"), optimizer, step=counter[0], keep=2)
        steps()

    def asynchronous():
        autopar.save_checkpoint(pm, os.path.join(root, "async"), optimizer, step=counter[0], keep=2, async_=True)
        steps()
        autopar.wait_checkpoints()

    times = interleaved({"none": none, "sync": synchronous, "async": asynchronous}, reps, warmup, sync=dist.barrier)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, "sync")) for f in fs)
    if dist.get_rank() != 0:
        return {}
    entries = max(1, len(os.listdir(os.path.join(root, "sync"))))
    note = f"{BLOCK} steps per block, one save per block, {size / entries / 2**20:.1f} MiB per entry"
    return {"rows": [compare("checkpoint", f"{side} every {BLOCK} steps", times, ours=side, baseline="none",
                             goal=1.05 if side == "async" else float("inf"), note=note)
                     for side in ("sync", "async")]}


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0], default_steps=8)
    p.add_argument("--world", type=int, default=2, help="gloo ranks, data parallel over all of them")
    args = p.parse_args(argv)
    reps, warmup = (max(3, args.steps // 2), 1) if args.quick else (args.steps, 1)
    root = tempfile.mkdtemp(prefix="autopar-bench-checkpoint-")
    try:
        rows = launch(rank_job, args.world, (reps, warmup, args.quick, root, args.world), timeout_s=3000)[0]["rows"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_rows(f"step checkpoints every {BLOCK} steps on 2 gloo ranks, data 2 ({reps} blocks per side, "
               f"{warmup} warm-up)", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
