"""The first plan a new user sees, priced and measured (docs/benchmarks.md §12 "Measured on first use").

    python benchmarks/bench_first_use.py [--steps 9] [--warmup 2] [--models tiny,bert,qwen2,titan] [--keep-profile]
                                         [--probe-each]

One launch of 4 gloo ranks with an empty profile cache (``AUTOPAR_CACHE_DIR`` a fresh
folder, unless ``--keep-profile``), so the first ``compile`` measures this machine
(:mod:`autopar.cost.first_use`) exactly as a new user's does. Then, per model, its
``"auto"`` plan and three forced ones (data 4, a 2-stage 1F1B pipeline × data 2,
data 2 × tensor 2) are compiled and timed in interleaved rounds (each plan one
training step per round, every rank starting together after a barrier), and each plan's
predicted step is set beside its measured median.

Models: ``tiny`` (a 4-block GPT-style model, h = 128, batch 8 × 64), ``bert``
(Hugging Face BERT masked LM, 4 layers, h = 128, batch 16 × 64, its own loss from
``labels``), ``qwen2`` (Hugging Face Qwen 2, 4 layers, h = 128, batch 16 × 64, ``labels``),
``titan`` (torchtitan 0.3's Llama 3 debug model, 6 layers, dim 256, batch 8 × 64; skipped
when torchtitan is not installed).

Goal (issue text of the cost model's fidelity): predicted / measured within 0.75-1.25 on
every plan, and ``"auto"``'s plan within 1.05 of the fastest measured.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from common import REPO_ROOT, timed_step

import torch

assert REPO_ROOT
WORLD = 4
PLANS = {
    "auto": "auto",
    "data 4": {"data": 4},
    "pipeline 2 x data 2": {"pipeline": 2, "data": 2, "microbatches": 4, "schedule": "1f1b"},
    "data 2 x tensor 2": {"data": 2, "tensor": 2},
}


def _labels(vocab: int, batch: int, seq: int, seed: int, masked: bool = False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if not masked:
        return {"input_ids": ids, "labels": ids.clone()}
    chosen = torch.rand(batch, seq, generator=g) < 0.15
    return {"input_ids": ids.masked_fill(chosen, 1), "labels": ids.masked_fill(~chosen, -100)}


def case(name: str):
    """``(factory, inputs, target, loss_fn, kwargs)``."""
    if name == "tiny":
        from examples.models import TinyTransformer, lm_loss
        g = torch.Generator().manual_seed(0)
        ids, target = torch.randint(0, 256, (8, 64), generator=g), torch.randint(0, 256, (8, 64), generator=g)
        return (lambda: TinyTransformer(vocab=256, width=128, heads=8, layers=4, block=64)), (ids,), target, lm_loss, {}
    if name == "bert":
        from transformers import BertConfig, BertForMaskedLM
        config = BertConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                            intermediate_size=512, max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        return (lambda: BertForMaskedLM(config)), (), None, None, _labels(1024, 16, 64, 1, masked=True)
    if name == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        config = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return (lambda: Qwen2ForCausalLM(config)), (), None, None, _labels(1024, 16, 64, 2)
    if name == "titan":
        from examples.models import lm_loss
        from examples.peers import torchtitan_llama
        g = torch.Generator().manual_seed(3)
        ids, target = torch.randint(0, 2048, (8, 64), generator=g), torch.randint(0, 2048, (8, 64), generator=g)
        return (lambda: torchtitan_llama.llama3(6, 64)), (ids,), target, lm_loss, {}
    raise ValueError(f"unknown model {name!r}: one of tiny, bert, qwen2, titan")


def available(name: str) -> bool:
    if name != "titan":
        return True
    from examples.peers import torchtitan_llama
    return torchtitan_llama.available() is None


def job(models: list[str], steps: int, warmup: int, each: bool = False) -> dict:
    """On every rank: per model, compile each plan (the first compile measures the
    machine), time interleaved rounds; rank 0's (form, predicted, measured median, odd, even)."""

    import autopar
    torch.set_num_threads(1)
    out: dict = {}
    root = os.environ.get("AUTOPAR_CACHE_DIR")
    for name in models:
        if each and root:  # an empty cache of its own: this model's first compile measures the machine again
            os.environ["AUTOPAR_CACHE_DIR"] = os.path.join(root, name)
        factory, inputs, target, loss_fn, kwargs = case(name)
        compiled = {}
        for label, strategy in PLANS.items():
            torch.manual_seed(0)
            started = time.perf_counter()
            compiled[label] = autopar.compile(factory(), None, example_inputs=inputs, loss_fn=loss_fn,
                                              example_target=target, example_kwargs=kwargs, strategy=strategy)
            if (each or name == models[0]) and label == "auto":
                out.setdefault("_first_compile_s", []).append(time.perf_counter() - started)
                out["_hardware"] = compiled[label].plan.hardware

        times: dict[str, list[float]] = {label: [] for label in compiled}
        for r in range(warmup + steps):
            for label, pm in compiled.items():
                t = timed_step(pm, inputs, target, kwargs)
                if r >= warmup:
                    times[label].append(t)
        out[name] = {label: (pm.plan.form, pm.plan.step_s, statistics.median(times[label]),
                             statistics.median(times[label][0::2]), statistics.median(times[label][1::2]))
                     for label, pm in compiled.items()}
        del compiled
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--models", default="tiny,bert,qwen2,titan")
    p.add_argument("--keep-profile", action="store_true", help="price with the cached profile (no first-use probe)")
    p.add_argument("--probe-each", action="store_true",
                   help="an empty cache per model: each model's first compile measures the machine again, so the "
                        "machine's drift between models (1.2-1.7x over minutes on the 2-core VM) stays out of the error")
    args = p.parse_args(argv)
    from autopar.runtime.launcher import launch
    models = [m for m in args.models.split(",") if available(m)]
    env = {"AUTOPAR_FIRST_USE_CALIBRATION": "1"}
    if not args.keep_profile:
        env["AUTOPAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="autopar-first-use-")
    os.environ.update(env)
    started = time.perf_counter()
    each = args.probe_each and not args.keep_profile
    result = launch(job, WORLD, (models, args.steps, args.warmup, each), backend="gloo", timeout_s=3600)[0]
    firsts = ", ".join(f"{t:.1f}" for t in result["_first_compile_s"])
    print(f"\n4 gloo ranks, {os.cpu_count()} cores; priced with {result['_hardware']}"
          f"{', measured again before each model' if each else ''}; first compile (probe included) {firsts} s; "
          f"whole run {time.perf_counter() - started:.0f} s")
    print("| model | plan | predicted | measured | predicted / measured | noise |")
    print("|---|---|---|---|---|---|")
    inside = total = 0
    for name in models:
        rows = result[name]
        fastest = min(r[2] for r in rows.values())
        for label, (form, predicted, measured, odd, even) in rows.items():
            ratio = predicted / measured
            total += 1
            inside += 0.75 <= ratio <= 1.25
            extra = f" ({form})" if label == "auto" else ""
            print(f"| {name} | {label}{extra} | {predicted * 1e3:.1f} ms | {measured * 1e3:.1f} ms | "
                  f"**{ratio:.2f}** | {abs(odd - even) / measured:.2f} |")
        print(f"| {name} | auto / fastest measured | | | {rows['auto'][2] / fastest:.2f} | |")
    print(f"\n{inside} of {total} predictions within 25 % of the measured step")
    if not args.keep_profile:
        where = "<model>/" if each else ""
        print(f"the measured profile: {env['AUTOPAR_CACHE_DIR']}/{where}profiles/gloo.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
