"""Train a small Llama-style language model with autopar: a script to copy.

    python examples/train_lm.py --world 4                      # 4 local CPU ranks (gloo)
    python examples/train_lm.py --world 4 --strategy tensor=2,data=2
    torchrun --nproc-per-node 8 examples/train_lm.py --steps 2000   # GPUs: NCCL, bf16 autocast

What it does, as a training script would:

* **model**: a Hugging Face ``LlamaConfig`` (``--config`` a ``config.json``, or the sizes
  below, ~10 M parameters) built on the meta device; ``pm.init_weights(seed)`` gives
  each rank only the parts it holds, the same model whatever the plan;
* **data**: the Python standard library's own source files, read as bytes (no download;
  a held-out set of files for evaluation); the tokenizer is the bytes themselves
  (vocabulary 256); each rank reads only its share of each batch
  (``compile(batch="local")`` with :func:`autopar.data.sampler`), counted in the log;
* **training**: AdamW, linear warm-up then cosine decay, gradient clipping
  (``pm.clip_grad_norm_``), bf16 autocast where the device supports it (a CUDA GPU
  with bf16), an evaluation on held-out text every ``--eval-every`` steps, step
  checkpoints every ``--ckpt-every`` steps, resumed from where a restarted job finds
  them (``autopar.save_checkpoint`` / ``autopar.resume``);
* **progress** on rank 0 every ``--log-every`` steps: loss, tokens/s, achieved FLOP/s and
  MFU against the hardware the plan was priced for, the measured step beside the
  predicted one;
* **outputs** under ``--out``: ``log.json`` (every logged step, the evaluations, the rows
  each rank read, the plan), ``loss.png`` (when matplotlib is installed) and the plan
  (``report.html``, with the measured step).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.runtime.launcher import init_from_env, launch  # noqa: E402

SIZES = dict(vocab_size=256, hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
             num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False)


# ---------------------------------------------------------------------------- data
def corpus(limit_bytes: int, held_out_every: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, held-out bytes): the standard library's ``.py`` files in sorted
    order, every ``held_out_every``-th file held out, up to ``limit_bytes`` in all."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    train, held, size = [], [], 0
    for i, path in enumerate(files):
        with open(path, "rb") as f:
            data = f.read()
        (held if i % held_out_every == held_out_every - 1 else train).append(data)
        size += len(data)
        if size >= limit_bytes:
            break
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8).long()  # noqa: E731
    return as_tensor(train), as_tensor(held)


def unigram_entropy(data: torch.Tensor) -> float:
    """The bytes' entropy in nats: the loss of the best model that ignores context."""
    p = torch.bincount(data, minlength=256).double() / len(data)
    p = p[p > 0]
    return float(-(p * p.log()).sum())


class Windows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``length`` bytes (the model shifts its labels itself)."""

    def __init__(self, data: torch.Tensor, length: int):
        self.data, self.length = data, length

    def __len__(self) -> int:
        return len(self.data) // self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i * self.length:(i + 1) * self.length]


# ---------------------------------------------------------------------------- model
def build_config(path: str | None, seq: int):
    from transformers import LlamaConfig
    if path:
        from autopar.hf_config import load_config
        return load_config(path)
    return LlamaConfig(**SIZES, max_position_embeddings=seq, use_cache=False)


def schedule(warmup: int, total: int):
    """Linear warm-up to the peak rate, then cosine decay to a tenth of it."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def parse_strategy(text: str):
    if text in ("auto", "data", "tensor"):
        return text
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


# ---------------------------------------------------------------------------- training
def train(args) -> dict:
    import torch.distributed as dist
    from transformers import LlamaForCausalLM
    from autopar.cost import profiles
    rank = dist.get_rank() if dist.is_initialized() else 0
    # NCCL ranks (torchrun on GPUs) each on its GPU; gloo ranks (--world N, or torchrun on CPUs) on the CPU
    on_gpu = torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("cpu")
    train_bytes, held_bytes = corpus(args.corpus_mb * 2**20)
    config = build_config(args.config, args.seq)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    ids = torch.zeros(args.batch, args.seq, dtype=torch.long, device="meta")  # the global batch's shape
    # priced for (and MFU measured against) --hardware: a preset (h100, a100-selene, ...), a
    # profile file, or this machine's calibrated profile (autopar calibrate), else cpu-gloo
    pm = autopar.compile(model, None, example_kwargs={"input_ids": ids, "labels": ids},
                         strategy=parse_strategy(args.strategy), hardware=args.hardware, batch=args.batch_form,
                         device=device)
    hardware, _ = profiles.resolve(args.hardware)
    pm.init_weights(seed=args.seed)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(args.warmup, args.steps))
    local = args.batch_form == "local"
    dataset = Windows(train_bytes, args.seq)
    # each share's rows: autopar.data.sampler on this rank's share; the global form reads
    # every share's (the same rows in the same order, stacked: equal steps, more reading)
    samplers = [autopar.data.sampler(pm, dataset, seed=args.seed)] if local else [
        torch.utils.data.DistributedSampler(dataset, num_replicas=pm.data_parallel_size, rank=share, seed=args.seed,
                                            drop_last=True) for share in range(pm.data_parallel_size)]
    loaders = [torch.utils.data.DataLoader(dataset, batch_size=args.batch // pm.data_parallel_size, sampler=s,
                                           drop_last=True) for s in samplers]
    held = [held_bytes[i * args.seq:(i + 1) * args.seq] for i in range(len(held_bytes) // args.seq)]
    eval_batches = min(args.eval_batches, len(held) // args.batch)
    if eval_batches < 1 or len(loaders[0]) < 1:
        raise SystemExit(f"train_lm: the corpus ({len(train_bytes)} training, {len(held_bytes)} held-out bytes) holds "
                         f"less than one batch of {args.batch} x {args.seq}; raise --corpus-mb or lower --batch / --seq")
    held = torch.stack(held[:eval_batches * args.batch]).view(eval_batches, args.batch, args.seq)
    start, log = 0, {"steps": [], "evals": [], "rows_read": 0}
    if args.ckpt_dir:
        found = autopar.resume(pm, args.ckpt_dir, optimizer, scheduler=scheduler)
        if found is not None:
            start, log = found[0], found[1]
            if rank == 0:
                print(f"resumed from the checkpoint of step {start} under {args.ckpt_dir}", flush=True)
    autocast = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" and torch.cuda.is_bf16_supported() \
        else torch.autocast("cpu", enabled=False)
    peak = hardware.peak_flops * dist.get_world_size() if dist.is_initialized() else hardware.peak_flops
    entropy = unigram_entropy(train_bytes)
    if rank == 0:
        print("\n".join(pm.plan.explain().splitlines()[:3]), flush=True)
        print(f"corpus: {len(train_bytes) / 2**20:.1f} MiB of the standard library's sources "
              f"(unigram entropy {entropy:.3f} nats/byte), held out {len(held_bytes) / 2**20:.1f} MiB; "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters; batch {args.batch} x "
              f"{args.seq} bytes, {'each rank its share' if local else 'the global batch on every rank'}",
              flush=True)
    per_epoch = len(loaders[0])
    tokens_per_step, last = args.batch * args.seq, time.perf_counter()
    for step in range(start, args.steps):
        if step == start or step % per_epoch == 0:  # a new epoch (or a resumed one): each share's rows reshuffled
            for sampler in samplers:
                sampler.set_epoch(step // per_epoch)
            batches = [iter(loader) for loader in loaders]
            for _ in range(step % per_epoch):  # a resumed run skips the batches its epoch trained on
                [next(b) for b in batches]
        batch = torch.cat([next(b) for b in batches])
        log["rows_read"] += len(batch)
        batch = batch.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = pm.step(input_ids=batch, labels=batch)
        norm = pm.clip_grad_norm_(args.clip)
        optimizer.step()
        scheduler.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            now = time.perf_counter()
            seconds = (now - last) / args.log_every
            last = now
            measured = pm.measured_step_s or seconds
            entry = {"step": step + 1, "loss": float(loss), "grad_norm": float(norm),
                     "lr": scheduler.get_last_lr()[0], "step_s": measured, "tokens_per_s": tokens_per_step / measured,
                     "flops_per_s": pm.plan.flops_per_step / measured,
                     "mfu": pm.plan.flops_per_step / measured / peak, "predicted_step_s": pm.plan.step_s}
            log["steps"].append(entry)
            if rank == 0:
                print(f"step {step + 1:>5}/{args.steps}  loss {entry['loss']:.3f}  lr {entry['lr']:.2e}  "
                      f"{entry['tokens_per_s']:,.0f} tok/s  {entry['flops_per_s'] / 1e9:.2f} GFLOP/s "
                      f"(MFU {entry['mfu']:.1%} of {hardware.name})  step {measured * 1e3:.0f} ms "
                      f"(predicted {pm.plan.step_s * 1e3:.0f} ms)", flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            log["evals"].append({"step": step + 1, "loss": evaluate(pm, held, device, autocast, local)})
            if rank == 0:
                print(f"step {step + 1:>5}  held-out loss {log['evals'][-1]['loss']:.3f} nats/byte "
                      f"(unigram entropy {entropy:.3f})", flush=True)
        if args.ckpt_dir and (step + 1) % args.ckpt_every == 0:
            autopar.save_checkpoint(pm, args.ckpt_dir, optimizer, step=step + 1, extra=log, scheduler=scheduler,
                                    keep=2, async_=True)
    autopar.wait_checkpoints()
    rows = torch.tensor([log["rows_read"]], device=device)  # NCCL gathers device tensors
    every = [torch.zeros_like(rows) for _ in range(dist.get_world_size())] if dist.is_initialized() else [rows]
    if dist.is_initialized():
        dist.all_gather(every, rows)
    log.update(rows_read_per_rank=[int(r.item()) for r in every], shares=pm.data_parallel_size,
               share_of_rank=pm.data_parallel_rank, unigram_entropy=entropy,
               plan=" x ".join(f"{k} {v}" for k, v in pm.plan.mesh.items() if v > 1) + (
                   f", {pm.plan.pipeline['schedule']}" if pm.plan.pipeline else ""),
               parameters=sum(p.numel() for p in model.parameters()), batch_form=args.batch_form)
    if rank == 0 and args.out:
        write_outputs(pm, log, args.out)
    return log if rank == 0 else {}


@torch.no_grad()
def evaluate(pm, held: torch.Tensor, device, autocast, local: bool) -> float:
    """The mean loss over the held-out batches (each the global batch; with
    ``batch="local"`` each rank passes its share)."""
    was = pm.training
    pm.eval()
    losses = []
    for batch in held:
        batch = batch.to(device)
        if local:
            batch = autopar.data.local_rows(pm, batch)
        with autocast:
            out = pm(input_ids=batch, labels=batch)
        losses.append(float(out.loss if hasattr(out, "loss") else out["loss"]))
    pm.train(was)
    return sum(losses) / len(losses)


def write_outputs(pm, log: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    pm.save_plan(os.path.join(out, "plan"), max_ranks=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss.png (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s["step"] for s in log["steps"]], [s["loss"] for s in log["steps"]], label="training loss")
    ax.plot([e["step"] for e in log["evals"]], [e["loss"] for e in log["evals"]], "o-", label="held-out loss")
    ax.axhline(log["unigram_entropy"], color="grey", linestyle="--", label="unigram entropy of the bytes")
    ax.set_xlabel("step")
    ax.set_ylabel("nats per byte")
    ax.set_title(f"Llama-style, {log['parameters'] / 1e6:.1f} M parameters, {log['plan']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4, help="local CPU ranks to launch (ignored under torchrun)")
    p.add_argument("--strategy", default="auto", help="auto, data, tensor, or e.g. tensor=2,data=2 or pipeline=2,data=2")
    p.add_argument("--config", default=None, help="a Hugging Face config.json (default: the ~10 M sizes above)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16, help="global batch, in sequences")
    p.add_argument("--seq", type=int, default=128, help="bytes per sequence")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--batch-form", choices=["local", "global"], default="local",
                   help="local: each rank reads its share; global: every rank reads the whole batch")
    p.add_argument("--corpus-mb", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default=None, help="step checkpoints here (resumed from when present)")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--hardware", default=None, help="what the plan is priced for and MFU measured against "
                                                    "(default: this machine's calibrated profile, else cpu-gloo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="train_lm_out", help="log.json, loss.png and the plan go here")
    args = p.parse_args(argv)
    if "RANK" in os.environ:  # torchrun
        init_from_env()
        train(args)
        autopar.wait_checkpoints()
        import torch.distributed as dist
        dist.destroy_process_group()
        return 0
    # the launcher's timeout bounds the whole job (and a hung collective): a generous one
    launch(train, args.world, (args,), timeout_s=max(600.0, 30.0 * args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
