"""Peak memory of a model larger than one rank's share, compiled from the meta device (docs/benchmarks.md §15).

A Llama-architecture model (Hugging Face ``LlamaForCausalLM``: hidden 1024, 8 layers, 16
heads, 4 key/value heads, SwiGLU 2816, vocabulary 128000; 352M parameters, 1.41 GB in
fp32) is built under ``torch.device("meta")`` on each of 4 gloo ranks, compiled under a
plan, given its weights (``pm.init_weights(seed=0)``, or ``pm.load_pretrained`` of a
safetensors checkpoint written beforehand by the single-device model with ``--load``), and
trained 3 steps (``pm.step`` + an SGD step without momentum, which keeps no optimizer
state). Each rank then reports its peak resident memory (``VmHWM`` of
``/proc/self/status``), and, read at the start of the job, the fixed cost of the process
(Python, torch, transformers and autopar imported, the gloo group made).

The plan's prediction (``plan.total.memory_bytes``) counts AdamW's two moments (8 bytes
per parameter element held); the run keeps no optimizer state, so the table gives the
prediction less those bytes beside it. Goal: every rank's peak below the full model's
size, and its growth over the fixed cost within 1.3x the prediction without optimizer
state.

    python benchmarks/bench_large_model.py [--load] [--plans tensor pipeline tensor3d zero3] [--json out.json]
"""
from __future__ import annotations

from common import parser, vm

import json
import os
import tempfile
import time

import torch

from autopar.runtime.launcher import launch

CONFIG = dict(vocab_size=128000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
              tie_word_embeddings=False)
BATCH, SEQ = 4, 32
PLANS = {
    "tensor": {"tensor": 4},
    "pipeline": {"pipeline": 4, "microbatches": 4},
    "tensor3d": {"x": 2, "y": 1, "z": 2},
    "zero3": {"data": 4, "zero": 3},
}


def model_on_meta():
    import transformers
    config = transformers.LlamaConfig(**CONFIG)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def job(strategy, checkpoint):
    import autopar  # noqa: F401 - imported before the fixed cost is read
    fixed = vm("VmHWM")
    model = model_on_meta()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kwargs = batch()
    times = {}
    start = time.perf_counter()
    pm = autopar.compile(model, None, example_kwargs=kwargs, strategy=strategy)
    times["compile"] = time.perf_counter() - start
    start = time.perf_counter()
    if checkpoint:
        pm.load_pretrained(checkpoint)
    else:
        pm.init_weights(seed=0)
    times["weights"] = time.perf_counter() - start
    after_weights = vm("VmHWM")
    optimizer = torch.optim.SGD(pm.parameters(), lr=1e-3)
    start = time.perf_counter()
    for _ in range(3):
        pm.step(**kwargs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times["3 steps"] = time.perf_counter() - start
    held = sum(p.numel() for p in pm.parameters())
    predicted = pm.plan.total.memory_bytes
    return {"fixed": fixed, "after_weights": after_weights, "peak": vm("VmHWM"), "full": full_bytes,
            "held_bytes": held * 4, "predicted": predicted, "predicted_no_optimizer": predicted - 8 * held,
            "times": times, "mesh": dict(pm.plan.mesh)}


def write_checkpoint(folder: str) -> str:
    """The single-device model, built for real, saved as Hugging Face does."""
    import transformers
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--load", action="store_true", help="load_pretrained a safetensors checkpoint instead of init")
    p.add_argument("--plans", nargs="*", default=list(PLANS))
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = write_checkpoint(folder) if args.load else None
        for name in args.plans:
            reports = launch(job, 4, (PLANS[name], checkpoint), timeout_s=1800)
            for rank, r in enumerate(reports):
                rows.append({"plan": name, "rank": rank, **r})
    gib = lambda b: f"{b / 2**30:6.2f}"  # noqa: E731
    print(f"{'plan':9s} {'rank':>4s} {'full':>6s} {'fixed':>6s} {'peak':>6s} {'growth':>6s} {'pred':>6s} "
          f"{'pred-opt':>8s} {'ratio':>6s} {'below':>5s}  compile/weights/3 steps (s)")
    for r in rows:
        growth = r["peak"] - r["fixed"]
        ratio = growth / r["predicted_no_optimizer"]
        t = r["times"]
        print(f"{r['plan']:9s} {r['rank']:4d} {gib(r['full'])} {gib(r['fixed'])} {gib(r['peak'])} {gib(growth)} "
              f"{gib(r['predicted'])} {gib(r['predicted_no_optimizer']):>8s} {ratio:6.2f} "
              f"{'yes' if r['peak'] < r['full'] else 'NO':>5s}  {t['compile']:.1f}/{t['weights']:.1f}/{t['3 steps']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
