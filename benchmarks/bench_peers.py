"""Benchmark (docs/benchmarks.md §22): autopar against a peer library's own parallelisation of the same
model, in one launch per world size.

Each *entry* is one configuration: a model from ``examples/peers/``, an autopar strategy,
and the peer's own way of parallelising that model to the same degrees. Both sides start
from the same weights (one seed) and see the same global batch; a step is ``zero_grad`` +
forward + loss + backward (the gradient synchronisation included), no optimizer step.

``llama3-fsdp4``: the same model, autopar's ``{"data": 4, "zero": 3}`` against torchtitan's
FSDP2 over 4 (``fully_shard`` per layer and at the root, resharding after forward).

``llama3-pp2-dp2-1f1b``: the same model, autopar's ``{"pipeline": 2, "data": 2, "schedule":
"1f1b", "microbatches": 4}`` against torch.pipelining's ``Schedule1F1B`` over the same two
stages of three layers (:func:`pipelining_side`), each stage's gradients averaged over its
data group after the schedule.

``llama3-dp2-tp2-sp``: torchtitan's Llama 3 (release 0.3.0, its debug model: dim 256,
16 heads, vocabulary 2048, :data:`LAYERS` layers, SDPA inner attention), float32, batch
8 × 64 tokens, 4 gloo ranks:

* autopar: ``pm.step(x, target=y)`` with ``{"data": 2, "tensor": 2, "sequence_parallel": True}``
  (each rank passes the global batch and the program takes its part);
* torchtitan: its own composition (``llama3_torchtitan_parallel``): the tensor-parallel
  plan with sequence parallelism of ``set_llama3_sharding_config`` (the head split over
  the vocabulary, the loss vocabulary-parallel) applied by ``parallelize_llama`` on its
  ``fsdp`` × ``tp`` = 2 × 2 mesh, with ``fully_shard`` per layer and at the root (FSDP2);
  each rank runs its data group's half of the batch, loss = torchtitan's summed
  cross-entropy over the global token count.

Before timing, each side's first step is checked against one process (the unsplit model,
float32, the whole batch): the loss and the gradient 2-norm (``pm.grad_norm()``; the
torchtitan side's gradients gathered with ``full_tensor``). What autopar split is printed
per region; every attention region of a tensor-parallel entry is expected to be
``megatron``, and an entry whose attention is not split says so in its row.

Timing: the sides alternate every repetition, each between two barriers, timed on rank
0 (:func:`common.interleaved`). Memory, per rank: a side's *state* (the resident-set
growth of building it and running its first step, the full model dropped: parameters,
gradients, buffers and programs) plus its step's *transient* (``VmHWM`` over the
resident set during one step, the peak reset by ``/proc/self/clear_refs`` and freed
heap returned by ``malloc_trim`` first); the largest over ranks is reported. Each side is
built and stepped once before (and dropped), so that a library's one-time costs (its
imports, caches and compiled code) are in neither figure. No goal: the rows are
measured only.

``llama3-ddp4``: autopar ``{"data": 4}`` against torch's ``DistributedDataParallel`` over
4 (:func:`ddp_side`). ``llama3-auto``: autopar's ``"auto"`` against torchtitan's FSDP2
over 4 (each side its own plan: different work, said in its row). ``hf-llama-fsdp4``:
Hugging Face's ``LlamaForCausalLM`` (:class:`HFLlama`, a model of no peer library),
autopar ``{"data": 4, "zero": 3}`` against torch's FSDP2 composed as its documentation
does (:func:`fsdp2_side`).

``-compiled`` entries: both sides under ``torch.compile`` (Inductor): autopar's
``compile(..., torch_compile=True)`` against torchtitan's own compile of each layer
(``CompileConfig(enable=True, components=["model"])``, before FSDP as its trainer applies
it) or, under torch.pipelining, each stage's layers compiled the same way. They are left
out of ``--quick``.

    python benchmarks/bench_peers.py [--steps 30] [--warmup 5] [--quick] [--cases CASE ...]
"""
from __future__ import annotations

import ctypes
import dataclasses
import gc
import logging
import os
from typing import Callable

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import (cases_of, check_close, compare, interleaved, parser, print_rows, steps_of, vm, write_json,
                    zero_grad)

import torch
import torch.distributed as dist

import autopar
from autopar.runtime.launcher import launch
from examples.models import lm_loss
from examples.peers import torchtitan_llama

LAYERS, BATCH, SEQ = 6, 8, 64   # torchtitan's "debugmodel" has 6 layers
DEVICE = ["cpu"]                 # where the ranks run: "cpu" (gloo) or "cuda" (NCCL, a GPU per rank)
RTOL = 1e-5                      # float32: each side's loss and gradient norm against one process


@dataclasses.dataclass(frozen=True)
class Entry:
    """One configuration: a model, autopar's strategy and the peer's own parallelisation
    (``peer_side(entry, x, y)`` builds it on every rank and returns a :class:`Side`)."""

    case: str
    world: int
    model: Callable[[], torch.nn.Module]   # the single-device model, seeded
    strategy: dict
    peer: str
    peer_side: Callable[["Entry", torch.Tensor, torch.Tensor], "Side"]
    options: dict = dataclasses.field(default_factory=dict)
    missing: Callable[[], str | None] = lambda: None   # why the peer cannot run here, or None
    prepare: Callable[[], object] = lambda: None       # the peer's imports, done before memory is measured
    compiled: bool = False   # both sides under torch.compile: autopar's torch_compile=True, the peer's own


@dataclasses.dataclass
class Side:
    """A side of a comparison on this rank: its timed ``step`` and its ``first``
    step, which returns the global loss and gradient 2-norm."""

    step: Callable[[], object]
    first: Callable[[], tuple[float, float]]


# -- torchtitan ----------------------------------------------------------------------------------

def torchtitan_side(entry: Entry, x: torch.Tensor, y: torch.Tensor) -> Side:
    """torchtitan's FSDP2 × TP (with or without SP) of its Llama 3, the rank's data part."""
    model, dims = torchtitan_llama.llama3_torchtitan_parallel(LAYERS, SEQ, device=DEVICE[0], **entry.options)
    dp = dims.get_mesh("fsdp")
    x_local, y_local = x.chunk(dp.size())[dp.get_local_rank()], y.chunk(dp.size())[dp.get_local_rank()]
    params, tokens = list(model.parameters()), y.numel()

    def step():
        zero_grad(params)
        torchtitan_llama.torchtitan_loss(model(x_local), y_local, tokens).backward()

    def first():
        zero_grad(params)
        loss = torchtitan_llama.torchtitan_loss(model(x_local), y_local, tokens)
        loss.backward()
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=dp.get_group())
        quiet = logging.getLogger("torch.distributed.tensor._redistribute")
        level = quiet.level
        quiet.setLevel(logging.ERROR)   # its note that a gradient is gathered in two all-gathers
        try:
            return loss.item(), norm_of(p.grad.full_tensor() for p in params)
        finally:
            quiet.setLevel(level)

    return Side(step, first)


# -- torch.pipelining ----------------------------------------------------------------------------

def pipelining_side(entry: Entry, x: torch.Tensor, y: torch.Tensor) -> Side:
    """torch.pipelining's schedule of the same model over ``pipeline`` stages of equal
    layer counts (torchtitan's model skips the modules a stage sets to None), each stage's
    gradients averaged over its data group after the schedule (as autopar's pipeline
    does); ranks ``s·d .. s·d + d − 1`` run stage ``s``."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleZBVZeroBubble
    p, m = entry.options["pipeline"], entry.options["microbatches"]
    v = 2 if entry.options["schedule"] == "zbv" else 1   # ZB-V: stages r and 2p - 1 - r on pipeline rank r
    world, rank = dist.get_world_size(), dist.get_rank()
    d = world // p
    stage_index, data_index = rank // d, rank % d
    pipes = [dist.new_group([s * d + i for s in range(p)]) for i in range(d)]   # every rank makes every group
    datas = [dist.new_group([s * d + i for i in range(d)]) for s in range(p)]
    pipe, data = pipes[data_index], datas[stage_index]
    rank_in_pipe = stage_index
    mine = [rank_in_pipe] if v == 1 else [rank_in_pipe, 2 * p - 1 - rank_in_pipe]
    stages, params = [], []
    for index in mine:
        model = entry.model().to(DEVICE[0])
        names = list(model.layers.keys())
        per = len(names) // (p * v)
        for k in names[:index * per] + names[(index + 1) * per:]:
            del model.layers[k]
        if index > 0:
            model.tok_embeddings = None
        if index < p * v - 1:
            model.norm, model.lm_head = None, None
        if entry.compiled:   # as torchtitan's apply_compile: each block on its own, whole graphs
            for block in model.layers.values():
                block.compile(fullgraph=True)
        stages.append(PipelineStage(model, index, p * v, torch.device(DEVICE[0], torch.cuda.current_device())
                                    if DEVICE[0] == "cuda" else torch.device("cpu"), group=pipe))
        params += list(model.parameters())
    if v == 1:
        kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[entry.options["schedule"]]
        schedule = kind(stages[0], n_microbatches=m, loss_fn=lm_loss)
    else:
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=m, loss_fn=lm_loss)
    x_local, y_local = x.chunk(d)[data_index], y.chunk(d)[data_index]
    first_stage = 0 in mine
    last = p * v - 1 in mine

    def run() -> list:
        zero_grad(params)
        losses: list = []
        if first_stage:
            schedule.step(x_local, target=y_local if last else None, losses=losses if last else None)
        else:
            schedule.step(target=y_local if last else None, losses=losses if last else None)
        for q in params:   # the data group's average, after the schedule
            dist.all_reduce(q.grad, group=data)
            q.grad.div_(d)
        return losses

    def first():
        losses = run()
        loss = torch.stack(losses).mean() if last else torch.zeros((), device=DEVICE[0])
        dist.all_reduce(loss, group=data)
        dist.all_reduce(loss, group=pipe)   # the last stage's, on every rank
        squares = sum(q.grad.double().pow(2).sum() for q in params)
        dist.all_reduce(squares, group=pipe)
        return loss.item() / d, squares.sqrt().item()

    return Side(run, first)


# -- torch's own: DDP, FSDP2 -------------------------------------------------------------------

def ddp_side(entry: Entry, x: torch.Tensor, y: torch.Tensor) -> Side:
    """torch's ``DistributedDataParallel`` over every rank (its defaults: 25 MiB buckets
    overlapped with backward), each rank its share of the batch."""
    from torch.nn.parallel import DistributedDataParallel
    world, rank = dist.get_world_size(), dist.get_rank()
    model = DistributedDataParallel(entry.model().to(DEVICE[0]))
    x_local, y_local = x.chunk(world)[rank], y.chunk(world)[rank]
    params = list(model.parameters())

    def step():
        zero_grad(params)
        lm_loss(model(x_local), y_local).backward()

    def first():
        zero_grad(params)
        loss = lm_loss(model(x_local), y_local)
        loss.backward()
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        return loss.item() / world, norm_of(p.grad for p in params)

    return Side(step, first)


def fsdp2_side(entry: Entry, x: torch.Tensor, y: torch.Tensor) -> Side:
    """torch's FSDP2 as its documentation composes it: ``fully_shard`` on each decoder layer
    and at the root over every rank (resharding after forward; with ``compiled``, each
    layer compiled first, as torchtitan does), each rank its share of the batch; its
    reductions are plain sums followed by FSDP2's division by the world size (gloo
    refuses the pre-multiplied average)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(DEVICE[0], (world,))
    model = entry.model().to(DEVICE[0])
    for layer in model.layers():
        if entry.compiled:
            layer.compile()
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    x_local, y_local = x.chunk(world)[rank], y.chunk(world)[rank]
    params = list(model.parameters())

    def step():
        zero_grad(params)
        lm_loss(model(x_local), y_local).backward()

    def first():
        zero_grad(params)
        loss = lm_loss(model(x_local), y_local)
        loss.backward()
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        return loss.item() / world, norm_of(p.grad.full_tensor() for p in params)

    return Side(step, first)


class HFLlama(torch.nn.Module):
    """Hugging Face's ``LlamaForCausalLM`` (random weights from a configuration: dim 256,
    8 heads, 2 key/value heads, 6 layers, vocabulary 2048, SwiGLU 688, real rotary),
    returning its logits; :meth:`layers` the decoder layers FSDP2 wraps."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=torchtitan_llama.VOCAB, hidden_size=256, intermediate_size=688,
                             num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=2,
                             max_position_embeddings=SEQ, use_cache=False, attn_implementation="sdpa")
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits

    def layers(self) -> list:
        return list(self.model.model.layers)


def transformers_missing() -> str | None:
    import importlib.util
    return None if importlib.util.find_spec("transformers") else "transformers is not installed"


def import_torchtitan() -> None:
    import torchtitan.components.loss  # noqa: F401
    import torchtitan.models.llama3.parallelize  # noqa: F401


def llama3() -> torch.nn.Module:
    return torchtitan_llama.llama3(LAYERS, SEQ)


ENTRIES = {e.case: e for e in [
    Entry("llama3-dp2-tp2-sp", 4, llama3, {"data": 2, "tensor": 2, "sequence_parallel": True},
          "torchtitan", torchtitan_side, {"dp_shard": 2, "tp": 2, "sequence_parallel": True},
          torchtitan_llama.available, import_torchtitan),
    Entry("llama3-fsdp4", 4, llama3, {"data": 4, "zero": 3},
          "torchtitan", torchtitan_side, {"dp_shard": 4, "tp": 1, "sequence_parallel": False},
          torchtitan_llama.available, import_torchtitan),
    Entry("llama3-pp2-dp2-1f1b", 4, llama3, {"pipeline": 2, "data": 2, "schedule": "1f1b", "microbatches": 4},
          "torch.pipelining", pipelining_side, {"pipeline": 2, "schedule": "1f1b", "microbatches": 4},
          torchtitan_llama.available, import_torchtitan),
    Entry("llama3-8l-pp2-dp2-zbv", 4, lambda: torchtitan_llama.llama3(8, SEQ),
          {"pipeline": 2, "data": 2, "schedule": "zbv", "chunks": 2, "microbatches": 4},
          "torch.pipelining", pipelining_side, {"pipeline": 2, "schedule": "zbv", "microbatches": 4},
          torchtitan_llama.available, import_torchtitan),
    Entry("llama3-1-compiled", 1, llama3, {"data": 1},
          "torchtitan", torchtitan_side, {"dp_shard": 1, "tp": 1, "sequence_parallel": False, "compile": True},
          torchtitan_llama.available, import_torchtitan, compiled=True),
    Entry("llama3-fsdp4-compiled", 4, llama3, {"data": 4, "zero": 3},
          "torchtitan", torchtitan_side, {"dp_shard": 4, "tp": 1, "sequence_parallel": False, "compile": True},
          torchtitan_llama.available, import_torchtitan, compiled=True),
    Entry("llama3-dp2-tp2-sp-compiled", 4, llama3, {"data": 2, "tensor": 2, "sequence_parallel": True},
          "torchtitan", torchtitan_side, {"dp_shard": 2, "tp": 2, "sequence_parallel": True, "compile": True},
          torchtitan_llama.available, import_torchtitan, compiled=True),
    Entry("llama3-pp2-dp2-1f1b-compiled", 4, llama3,
          {"pipeline": 2, "data": 2, "schedule": "1f1b", "microbatches": 4},
          "torch.pipelining", pipelining_side, {"pipeline": 2, "schedule": "1f1b", "microbatches": 4},
          torchtitan_llama.available, import_torchtitan, compiled=True),
]}
ENTRIES.update({e.case: e for e in [
    Entry("llama3-ddp4", 4, llama3, {"data": 4}, "DDP", ddp_side, {}, torchtitan_llama.available, import_torchtitan),
    Entry("llama3-auto", 4, llama3, "auto", "torchtitan", torchtitan_side,
          {"dp_shard": 4, "tp": 1, "sequence_parallel": False}, torchtitan_llama.available, import_torchtitan),
    Entry("hf-llama-fsdp4", 4, HFLlama, {"data": 4, "zero": 3}, "FSDP2", fsdp2_side, {}, transformers_missing),
    Entry("hf-llama-fsdp4-compiled", 4, HFLlama, {"data": 4, "zero": 3}, "FSDP2", fsdp2_side, {},
          transformers_missing, compiled=True),
]})
CASES = list(ENTRIES)
QUICK_CASES = [c for c in CASES if not ENTRIES[c].compiled]


# -- memory --------------------------------------------------------------------------------------

def settle() -> int:
    """Free what is garbage, give the heap's free pages back, reset the peak; the bytes in
    use (the resident set on the CPU, the allocator's bytes on a GPU)."""
    gc.collect()
    if DEVICE[0] == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # resets VmHWM to the current resident set
    return vm("VmRSS")


def transient(step: Callable[[], object]) -> int:
    """Bytes one step holds above what is in use when it starts, at its peak."""
    before = settle()
    step()
    if DEVICE[0] == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    return vm("VmHWM") - before


# -- the job -------------------------------------------------------------------------------------

def autopar_side(entry: Entry, x: torch.Tensor, y: torch.Tensor):
    model = entry.model().to(DEVICE[0])
    pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=lm_loss, example_target=y,
                         strategy=entry.strategy, torch_compile=entry.compiled)
    del model
    params = list(pm.parameters())

    def step():
        zero_grad(params)
        pm.step(x, target=y)

    def first():
        zero_grad(params)
        loss = pm.step(x, target=y)
        return float(loss), pm.grad_norm().item()

    return Side(step, first), pm


def reference(entry: Entry, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The single device: loss and gradient 2-norm of the whole batch."""
    model = entry.model().to(DEVICE[0])
    loss = lm_loss(model(x), y)
    loss.backward()
    return loss.item(), norm_of(p.grad for p in model.parameters())


def norm_of(grads) -> float:
    """The 2-norm of all gradients, summed in float64 (``torch``'s float32 norm of one
    2048 × 256 gradient is off by ~6e-5 on the CPU, more than the sides differ by)."""
    return sum(g.double().pow(2).sum() for g in grads).sqrt().item()


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def run_entry(entry: Entry, steps: int, warmup: int) -> tuple:
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, torchtitan_llama.VOCAB, (BATCH, SEQ), generator=generator).to(DEVICE[0])
    y = torch.randint(0, torchtitan_llama.VOCAB, (BATCH, SEQ), generator=generator).to(DEVICE[0])
    entry.prepare()
    ref_loss, ref_norm = reference(entry, x, y)   # also the first forward's one-time costs, on neither side
    for build in (lambda: autopar_side(entry, x, y)[0], lambda: entry.peer_side(entry, x, y)):
        build().first()   # each library's one-time costs (imports, caches, compiled code) outside the figures
    gc.collect()
    info: dict = {"case": entry.case, "strategy": entry.strategy, "peer": entry.peer}
    state, first = {}, {}

    def measured(name: str, build: Callable[[], Side]) -> Side:
        """``build()``'s side, its first step run; its state's bytes kept under ``name``."""
        start = settle()
        side = build()
        first[name] = side.first()   # its gradients and step buffers exist from here on
        state[name] = settle() - start
        return side

    built: dict = {}
    ours = measured("autopar", lambda: built.setdefault("autopar", autopar_side(entry, x, y))[0])
    theirs = measured(entry.peer, lambda: entry.peer_side(entry, x, y))
    pm = built["autopar"][1]
    info["mesh"] = dict(pm.plan.mesh)
    info["sequence_parallel"] = getattr(pm.plan, "sequence_parallel", None)
    info["regions"] = {r.region: r.strategy for r in pm.plan.regions}
    info["attention"] = [s for r, s in info["regions"].items() if r.startswith("attention:")]
    info["stages"] = dict(pm.plan.pipeline).get("assignment")   # each block's stage, under a pipeline
    info["numerics"] = {}
    for name in ("autopar", entry.peer):
        loss, norm = first[name]
        info["numerics"][name] = {"loss": loss, "grad_norm": norm, "loss_rel": relative(loss, ref_loss),
                                  "grad_norm_rel": relative(norm, ref_norm)}
    info["numerics"]["one process"] = {"loss": ref_loss, "grad_norm": ref_norm}
    for name in ("autopar", entry.peer):   # both sides compute what one process does, or no timing
        for kind in ("loss", "grad_norm"):
            check_close(f"{entry.case}: {name}'s {kind} against one process", info["numerics"][name][kind],
                        info["numerics"]["one process"][kind], rtol=RTOL, atol=0.0)
    times = interleaved({"autopar": ours.step, entry.peer: theirs.step}, steps=steps, warmup=warmup,
                        sync=sync)
    info["state"] = state
    info["transient"] = {name: transient(side.step) for name, side in (("autopar", ours), (entry.peer, theirs))}
    info["memory"] = {name: state[name] + info["transient"][name] for name in state}
    return times, info


def sync() -> None:
    """Every rank's work done: the device's queued kernels, then a barrier."""
    if DEVICE[0] == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def rank_job(cases: list[str], steps: int, warmup: int, device: str = "cpu") -> list[tuple]:
    """Runs on every rank; returns (times, info) per case (rank 0's times are reported)."""
    DEVICE[0] = device
    return [run_entry(ENTRIES[case], steps, warmup) for case in cases]


def summarise(case: str, peer: str, rank_results: list[tuple]) -> tuple:
    times, info = rank_results[0]
    peaks = {name: max(r[1]["memory"][name] for r in rank_results) for name in ("autopar", peer)}
    info["peak_mib"] = {name: value / 2 ** 20 for name, value in peaks.items()}
    info["state_mib"] = {name: max(r[1]["state"][name] for r in rank_results) / 2 ** 20 for name in peaks}
    info["transient_mib"] = {name: max(r[1]["transient"][name] for r in rank_results) / 2 ** 20 for name in peaks}
    info["memory_ratio"] = peaks["autopar"] / peaks[peer]
    errors = ", ".join(f"{name} {n['loss_rel']:.1e}/{n['grad_norm_rel']:.1e}"
                       for name, n in info["numerics"].items() if "loss_rel" in n)
    split = ("no tensor split" if info["mesh"].get("tensor", 1) == 1 else "attention split"
             if set(info["attention"]) == {"megatron"} else f"ATTENTION NOT ALL MEGATRON: {info['attention']}")
    if info["strategy"] == "auto":
        split += f"; autopar's own plan {info['mesh']}, not the peer's: different work"
    note = (f"peak memory per rank autopar {info['peak_mib']['autopar']:.1f} MiB, {peer} "
            f"{info['peak_mib'][peer]:.1f} MiB (ratio {info['memory_ratio']:.2f}); loss/grad-norm rel. error "
            f"vs one process: {errors}; {split}")
    row = compare("peers", case, times, ours="autopar", baseline=peer, goal=float("inf"), note=note)
    return row, info


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None,
        details: list | None = None, device: str = "cpu") -> list:
    """Every case, one launch per world size; ``details`` collects each case's plan,
    numerics and memory. ``device="cuda"``: NCCL, one GPU per rank; a case needing more
    ranks than the machine has GPUs is skipped, saying so."""
    cases = cases or (QUICK_CASES if quick else CASES)
    gpus = torch.cuda.device_count() if device == "cuda" else None

    def missing(case: str) -> str | None:
        entry = ENTRIES[case]
        if gpus is not None and entry.world > gpus:
            return f"needs {entry.world} GPUs (NCCL runs one rank per GPU); this machine has {gpus}"
        return entry.missing()

    rows = []
    for case in cases:
        reason = missing(case)
        if reason:
            print(f"peers/{case}: skipped: {reason}")
    runnable = [c for c in cases if not missing(c)]
    for world in sorted({ENTRIES[c].world for c in runnable}):
        group = [c for c in runnable if ENTRIES[c].world == world]
        backend = "nccl" if device == "cuda" else "gloo"
        results = launch(rank_job, world, (group, steps, warmup, device), backend=backend, timeout_s=600,
                         deadline_s=3600)
        for i, case in enumerate(group):
            row, info = summarise(case, ENTRIES[case].peer, [r[i] for r in results])
            rows.append(row)
            if details is not None:
                details.append(info)
    return rows


def print_details(details: list) -> None:
    for info in details:
        print(f"\n{info['case']}: autopar {info['strategy']} → mesh {info['mesh']}, sequence parallel "
              f"{info['sequence_parallel']}" + (f", each block's stage {info['stages']}" if info["stages"] else "")
              + "; regions:")
        for region, strategy in info["regions"].items():
            print(f"  {region}: {strategy}")
        for name, n in info["numerics"].items():
            extra = (f" (rel. {n['loss_rel']:.2e}, {n['grad_norm_rel']:.2e})" if "loss_rel" in n else "")
            print(f"  {name}: loss {n['loss']:.8f}, grad norm {n['grad_norm']:.8f}{extra}")
        print("  memory per rank (MiB, largest rank): " + ", ".join(
            f"{k} {v:.1f} (state {info['state_mib'][k]:.1f} + step {info['transient_mib'][k]:.1f})"
            for k, v in info["peak_mib"].items()))


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0], default_steps=30)
    p.add_argument("--markdown", action="store_true", help="also print the rows as a markdown table")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: gloo ranks (default); cuda: NCCL, a GPU per rank (entries needing more are skipped)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_peers: --device cuda needs a CUDA device; none here")
    steps, warmup = steps_of(args)
    details: list = []
    print("before: load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    rows = run(steps, warmup, args.quick, cases_of(args.cases, args.quick, CASES, QUICK_CASES), details, args.device)
    print("after: load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print_details(details)
    print_rows(f"peers: autopar vs the peer's own parallelisation ({steps} steps, {warmup} warm-up)", rows)
    if args.markdown:
        from common import format_rows
        print(format_rows(rows, markdown=True))
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
