"""The memory model against measured peak memory per rank (docs/benchmarks.md §8).

For each plan of a small transformer, GPT-2 and Llama on 4 gloo ranks (data, Megatron tensor
with and without sequence parallelism, context parallelism, an AxoNN grid, D&SP over the attention heads, a
pipeline; and the memory levers: accumulation, ZeRO-1/2/3, recomputation), one training step and one AdamW step are run
and the bytes a rank holds are *measured*:

* parameters: this rank's ``pm.parameters()`` (under ZeRO its shards, plus ZeRO-1/2's
  full copies the program reads);
* gradients: the most bytes of ``.grad`` held at once during backward or after it (ZeRO-1/2
  drop the full gradients once their buckets are reduced);
* optimizer state: AdamW's tensors after its step;
* activations: the most bytes autograd holds saved for backward at once during the step
  (parameters excluded): every saved tensor's storage counted once while alive
  (``torch.autograd.graph.saved_tensors_hooks`` with a finaliser on each).

On the CPU there is no allocator statistic comparable to ``torch.cuda.max_memory_allocated``,
so this is the saved-tensor accounting the issue allows; it leaves out what the model
leaves out (the temporaries of one kernel, collective buffers, fragmentation).

The *predicted* figure is the plan's memory per rank (``plan.total.memory_bytes``: 16
bytes per parameter element for fp32 weights, gradients and AdamW's two moments, less
under ZeRO, plus the kernel outputs saved for backward; a pipeline's the most loaded
rank's). The table gives both and their ratio; the goal is within 20 %.

    python benchmarks/bench_memory.py [--json out.json] [--cases llama gpt2:"context 4" ...]
"""
from __future__ import annotations

from common import parser

import weakref

import json

import torch

import autopar
from autopar.runtime.launcher import launch
from autopar.strategies.megatron import collectives as sequence_collectives

MODELS = {
    "transformer": dict(vocab=256, width=128, heads=4, layers=4, block=64),
}
CASES = [
    ("transformer", "data 4", {"data": 4}),
    ("transformer", "data 2 x tensor 2", {"data": 2, "tensor": 2, "sequence_parallel": False}),
    ("transformer", "data 2 x tensor 2, SP", {"data": 2, "tensor": 2, "sequence_parallel": True}),
    ("transformer", "tensor 4", {"tensor": 4, "sequence_parallel": False}),
    ("transformer", "tensor 4, SP", {"tensor": 4, "sequence_parallel": True}),
    ("transformer", "3D 2x2x1", {"x": 2, "y": 2, "z": 1, "data": 1}),
    ("transformer", "D&SP 2 sub-grids", {"data": 4, "subgrids": 2}),
    ("transformer", "pipeline 2 x data 2, m=2", {"pipeline": 2, "data": 2, "microbatches": 2}),
    ("transformer", "data 4, m=4", {"data": 4, "microbatches": 4}),
    ("transformer", "data 4, ZeRO-1", {"data": 4, "zero": 1}),
    ("transformer", "data 4, ZeRO-2", {"data": 4, "zero": 2}),
    ("transformer", "data 4, ZeRO-3", {"data": 4, "zero": 3}),
    ("transformer", "data 4, full recompute", {"data": 4, "recompute": "full"}),
    ("transformer", "data 4, selective recompute", {"data": 4, "recompute": "selective"}),
    ("gpt2", "data 4", {"data": 4}),
    ("gpt2", "data 2 x tensor 2", {"data": 2, "tensor": 2, "sequence_parallel": False}),
    ("gpt2", "data 2 x tensor 2, SP", {"data": 2, "tensor": 2, "sequence_parallel": True}),
    ("gpt2", "pipeline 2 x data 2, m=2", {"pipeline": 2, "data": 2, "microbatches": 2}),
    ("gpt2", "context 4", {"context": 4}),
    ("gpt2", "context 2 x data 2", {"context": 2, "data": 2}),
    ("llama", "data 4", {"data": 4}),
    ("llama", "tensor 4", {"tensor": 4, "sequence_parallel": False}),
    ("llama", "tensor 4, SP", {"tensor": 4, "sequence_parallel": True}),
    ("llama", "context 4", {"context": 4}),
    ("llama", "context 2 x tensor 2", {"context": 2, "tensor": 2}),
]


def _case(name: str, batch: int = 16):
    from examples.factories import _gpt2, gpt2_loss, lm_loss
    from examples.models import TinyTransformer
    g = torch.Generator().manual_seed(1)
    if name == "llama":   # Hugging Face Llama (SDPA, GQA, rotary): context parallelism rings its attention
        import transformers
        from examples.zoo import logits_loss
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
        ids = torch.randint(0, 256, (batch, 64), generator=g)
        return (lambda: transformers.LlamaForCausalLM(config)), ids, torch.randint(0, 256, (batch, 64), generator=g), \
            logits_loss
    if name == "gpt2":
        factory = lambda: _gpt2(layers=4)  # noqa: E731
        vocab, block = 64, 16
    else:
        factory = lambda: TinyTransformer(**MODELS[name])  # noqa: E731
        vocab, block = MODELS[name]["vocab"], MODELS[name]["block"]
    ids = torch.randint(0, vocab, (batch, block), generator=g)
    target = torch.randint(0, vocab, (batch, block), generator=g)
    loss = gpt2_loss if name == "gpt2" else lm_loss
    return factory, ids, target, loss


class SavedBytes:
    """The most bytes autograd holds saved at once while active: each saved tensor's
    storage counted once while any saved tensor keeps it (parameters excluded)."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params if p.numel()}
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.live = self.peak = 0

    def _release(self, ptr: int) -> None:
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            self.live -= self.sizes.pop(ptr)

    def pack(self, t: torch.Tensor):
        if not isinstance(t, torch.Tensor) or not t.numel():
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.params:
            return t
        if ptr not in self.refs:
            self.refs[ptr] = 0
            self.sizes[ptr] = t.untyped_storage().nbytes()
            self.live += self.sizes[ptr]
            self.peak = max(self.peak, self.live)
        self.refs[ptr] += 1
        box = t.view_as(t)  # its own object, so the finaliser runs when autograd drops it
        weakref.finalize(box, self._release, ptr)
        return box

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def job(cases):
    rows = []
    for model_name, label, strategy in cases:
        factory, ids, target, loss = _case(model_name)
        torch.manual_seed(0)
        pm = autopar.compile(factory(), None, example_inputs=(ids,), loss_fn=loss, example_target=target,
                             strategy=strategy)
        optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        pm.step(ids, target=target)  # the programs built, then the measured step
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        zero = pm.family_runtime("data").state  # ZeRO's state (None without ZeRO)
        tracked = list(pm.parameters()) + (list(zero.full.values()) if zero is not None else [])
        saved = SavedBytes(tracked)
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        if zero is not None:  # ZeRO-3's notes for backward are the innermost hooks: observe through them
            own = zero._pack
            zero._pack = lambda t: (lambda r: saved.pack(r) if r is t else r)(own(t))  # noqa: E731
        # sequence parallelism keeps a column linear's gathered input as this rank's chunk
        # (its hooks are the innermost; what they do not keep reaches these): the chunk is held
        own_match = sequence_collectives._match
        sequence_collectives._match = lambda t: (lambda r: r if r is None else  # noqa: E731
                                                 setattr(r, "note", saved.pack(r.held.local)) or r)(own_match(t))
        # the gradients' peak during backward (ZeRO-1/2 drop the full ones at the buckets' end)
        peak_grads = [0]
        live = lambda: nbytes(q.grad for q in tracked if q.grad is not None)  # noqa: E731
        handles = [q.register_post_accumulate_grad_hook(lambda _: peak_grads.__setitem__(0, max(peak_grads[0], live())))
                   for q in tracked if q.requires_grad]
        with saved.hooks():
            pm.step(ids, target=target)
        sequence_collectives._match = own_match
        for h in handles:
            h.remove()
        optimizer.step()
        params = nbytes(tracked)
        grads = max(peak_grads[0], live())
        state = nbytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
        measured = params + grads + state + saved.peak
        rows.append({"model": model_name, "plan": label, "mesh": dict(pm.plan.mesh), "params": params,
                     "grads": grads, "optimizer": state, "activations": saved.peak, "measured": measured,
                     "predicted": pm.plan.total.memory_bytes,
                     # the prediction's activations: the rest once 16 bytes per parameter
                     # element held are taken off (plans without ZeRO)
                     "predicted_activations": None if pm.plan.zero else
                     pm.plan.total.memory_bytes - 16 * sum(p.numel() for p in pm.parameters())})
    return rows


def main(argv=None) -> int:
    p = parser(__doc__)
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.cases or c[0] in args.cases or f"{c[0]}:{c[1]}" in args.cases]
    reports = launch(job, 4, (cases,), timeout_s=1800)
    rows = []
    for i, first in enumerate(reports[0]):
        worst = max((r[i] for r in reports), key=lambda r: r["measured"])  # the most loaded rank
        worst["ratio"] = worst["predicted"] / worst["measured"]
        rows.append(worst)
    print(f"{'model':12s} {'plan':28s} {'params':>9s} {'grads':>9s} {'optim':>9s} {'activ':>9s} "
          f"{'pred act':>9s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}")
    kib = lambda b: f"{b / 1024:8.0f}K"  # noqa: E731
    for r in rows:
        act = kib(r["predicted_activations"]) if r["predicted_activations"] is not None else f"{'-':>9s}"
        print(f"{r['model']:12s} {r['plan']:28s} {kib(r['params'])} {kib(r['grads'])} {kib(r['optimizer'])} "
              f"{kib(r['activations'])} {act} {kib(r['measured'])} {kib(r['predicted'])} {r['ratio']:6.3f}")
    within = sum(0.8 <= r["ratio"] <= 1.2 for r in rows)
    print(f"within 20 %: {within} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
