"""Benchmark: autopar's generated Triton kernels (the fusion pass) against eager PyTorch and
``torch.compile`` on one CUDA device, as a share of the device's copy bandwidth.

Chains (megatron §4.2 / §5.8), each in bf16 and fp32, each a small ``nn.Module``:

* ``bias_gelu`` / ``bias_gelu_tanh``: ``F.gelu(x + b)`` (exact / tanh), x [8192, 4·4096];
* ``bias_dropout_add_ln``: ``h = residual + dropout(y + b, 0.1)``, returns ``(h, layer_norm(h))``,
  y [16384, 4096]. autopar fuses its rank-aware ``rng.replicated_dropout`` (under
  ``rng.use_random_states(RandomStates(0, 0, 0))``, no process group needed); eager runs
  ``F.dropout`` (the unfused ``replicated_dropout`` is an int64 Philox reference, not a
  baseline), and so does ``torch.compile`` unless a probe finds that it compiles
  ``replicated_dropout`` into one graph without recompiling (today it recompiles on every
  new seed). The row's note says which ran;
* ``scale_mask_softmax``: ``softmax((s * scale).masked_fill(~causal, -inf), -1)``,
  s [8, 32, 1024, 1024], causal a bool [T, T] lower triangle;
* Llama's (7B widths): ``add_rms_norm``: ``h = x + residual``, returns ``(h, rms_norm(h) * w)``
  written as Hugging Face's LlamaRMSNorm (the fp32 round trip, ``pow(2).mean(-1,
  keepdim=True)``, ``rsqrt``), x [16384, 4096]; ``swiglu``: ``silu(gate) * up``, [8192,
  11008]; ``rotary``: ``q * cos + rotate_half(q) * sin`` with q [8, 32, 1024, 128] and cos,
  sin [8, 1024, 128] broadcast over the heads.

autopar's side is ``fusion_pass(capture(module, inputs))``; its outputs (and, for
fwd+bwd, the input and parameter gradients) are checked against eager before timing,
and the chain must be exactly one kernel (else the report is printed and the row fails).
Each pass (forward under ``no_grad``; forward + ``autograd.grad``) is timed with CUDA events,
the three sides alternating (A B C A B C), median of ``--steps`` after warm-up. Bytes moved
are the minimum traffic, the same for all three sides: forward reads every input once
(parameters and the mask included) and writes every output once; backward also reads the
inputs and the output gradients and writes the input gradients. The share is bytes / time
over the copy bandwidth measured here: median time of ``dst.copy_(src)`` on 1 GiB, read +
write. Goal: autopar ≥ 80 % of copy bandwidth and no slower than torch.compile.

    python benchmarks/bench_fusion.py [--steps 40] [--quick] [--json PATH] [--cases bias_gelu-bf16 ...]
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import math

# common first: it puts the repo root on sys.path
from common import Row, cases_of, compare, parser, quartiles, steps_of, write_json

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.trace.capture import capture
from autopar.passes.fusion.rewrite import FUSION, fusion_pass
from autopar.runtime import rng

BW_GOAL, SPEED_GOAL = 0.80, 1.0   # share of copy bandwidth; autopar / torch.compile time
CHAINS = ["bias_gelu", "bias_gelu_tanh", "bias_dropout_add_ln", "scale_mask_softmax", "add_rms_norm", "swiglu",
          "rotary"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CASES = [f"{c}-{d}" for c in CHAINS for d in DTYPES]
DEVICE = "cuda"
RTOL = {torch.bfloat16: 3e-2, torch.float32: 1e-3}   # relative to the largest magnitude
NEEDS_CUDA = ("bench_fusion: skipped, needs a CUDA device (it times autopar's fused Triton kernels, eager "
              "and torch.compile of bias+GeLU, bias+dropout+add+layer norm, scale+mask+softmax, Llama's "
              "add+RMS norm, SwiGLU and rotary embedding as a share of the measured copy bandwidth)")


class BiasGelu(nn.Module):
    def __init__(self, hidden: int, approximate: str = "none"):
        super().__init__()
        self.b = nn.Parameter(torch.randn(hidden) * 0.1)
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x + self.b, approximate=self.approximate)


class BiasDropoutAddNorm(nn.Module):
    def __init__(self, hidden: int, p: float = 0.1, rank_aware: bool = True):
        super().__init__()
        self.b = nn.Parameter(torch.randn(hidden) * 0.1)
        self.ln = nn.LayerNorm(hidden)
        self.p, self.rank_aware = p, rank_aware

    def forward(self, y, residual):
        z = y + self.b
        z = rng.replicated_dropout(z, self.p, True, "tensor") if self.rank_aware else F.dropout(z, self.p, True)
        h = residual + z
        return h, self.ln(h)


class ScaleMaskSoftmax(nn.Module):
    def __init__(self, t: int, scale: float):
        super().__init__()
        self.register_buffer("causal", torch.ones(t, t, dtype=torch.bool).tril(), persistent=False)
        self.scale = scale

    def forward(self, s):
        return torch.softmax((s * self.scale).masked_fill(~self.causal, float("-inf")), -1)


class AddRMSNorm(nn.Module):
    """The residual add and Hugging Face's LlamaRMSNorm itself."""

    def __init__(self, hidden: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        self.norm = LlamaRMSNorm(hidden)

    def forward(self, x, residual):
        h = x + residual
        return h, self.norm(h)


class SwiGLU(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


class Rotary(nn.Module):
    """Llama's apply_rotary_pos_emb on the queries: cos, sin [B, T, D] over the heads."""

    def __init__(self):
        super().__init__()
        from transformers.models.llama.modeling_llama import rotate_half
        self.rotate_half = rotate_half

    def forward(self, q, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + self.rotate_half(q) * sin


def build(chain: str, quick: bool) -> tuple[nn.Module, list[tuple]]:
    """(module in fp32 on the CPU, the input shapes) of a chain."""
    if chain.startswith("bias_gelu"):
        tokens, hidden = (1024, 4096) if quick else (8192, 4 * 4096)
        return BiasGelu(hidden, "tanh" if chain.endswith("tanh") else "none"), [(tokens, hidden)]
    if chain == "bias_dropout_add_ln":
        tokens, hidden = (1024, 1024) if quick else (16384, 4096)
        return BiasDropoutAddNorm(hidden), [(tokens, hidden)] * 2
    if chain == "scale_mask_softmax":
        b, h, t = (2, 8, 256) if quick else (8, 32, 1024)
        return ScaleMaskSoftmax(t, 1 / math.sqrt(128)), [(b, h, t, t)]
    if chain == "add_rms_norm":
        tokens, hidden = (1024, 1024) if quick else (16384, 4096)
        return AddRMSNorm(hidden), [(tokens, hidden)] * 2
    if chain == "swiglu":
        tokens, inner = (1024, 2816) if quick else (8192, 11008)
        return SwiGLU(), [(tokens, inner)] * 2
    if chain == "rotary":
        b, h, t, d = (2, 8, 256, 128) if quick else (8, 32, 1024, 128)
        return Rotary(), [(b, h, t, d), (b, t, d), (b, t, d)]
    raise KeyError(chain)


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def check_close(what: str, ours, theirs, rtol: float) -> None:
    for k, (a, b) in enumerate(zip(ours, theirs)):
        a, b = a.detach().float(), b.detach().float()
        err, scale = (a - b).abs().max().item(), b.abs().max().item()
        if not err <= rtol * scale + 1e-6:
            raise AssertionError(f"{what} [{k}]: autopar and eager disagree (max |diff| {err:.3g}, max |eager| "
                                 f"{scale:.3g}); the benchmark would compare different computations")


def compile_probe() -> str | None:
    """None when torch.compile makes one graph of ``replicated_dropout`` over 3 calls
    (no graph break, no recompile), else why not."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model, args = BiasDropoutAddNorm(16), (torch.randn(4, 16), torch.randn(4, 16))
    compiled = torch.compile(model, backend="eager")
    with rng.use_random_states(rng.RandomStates(0, 0, 0)):
        for _ in range(3):
            compiled(*args)
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    torch._dynamo.reset()
    if graphs == 1 and breaks == 0:
        return None
    why = " (a recompile per call: dynamo guards on the dropout call counter)" if graphs > 1 else ""
    return f"torch.compile of replicated_dropout: {graphs} graphs in 3 calls{why}, {breaks} graph breaks"


def timed(sides: dict, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each side, sides alternating (A B C A B C) as common.interleaved,
    but timed with CUDA events and no synchronisation between calls: the GPU time of
    each call, with the host running ahead (launch overhead hidden when the kernels are
    long enough, as in triton.testing.do_bench)."""
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    torch.cuda.synchronize()
    events: dict[str, list] = {name: [] for name in sides}
    for _ in range(steps):
        for name, fn in sides.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) / 1e3 for s, e in pairs] for name, pairs in events.items()}


def copy_bandwidth(steps: int, warmup: int, quick: bool) -> float:
    """Bytes per second of ``dst.copy_(src)`` (read + write), median over ``steps``."""
    size = (256 if quick else 1024) * 2**20
    src, dst = torch.empty(size, dtype=torch.uint8, device=DEVICE), torch.empty(size, dtype=torch.uint8, device=DEVICE)
    seconds = quartiles(timed({"copy": lambda: dst.copy_(src)}, steps, warmup)["copy"])[1]
    return 2 * size / seconds


@dataclasses.dataclass
class FusionRow(Row):
    """A common.Row (autopar against torch.compile) with eager and the bandwidth shares."""
    eager_median_ms: float = 0.0
    bytes_moved: int = 0
    copy_gbps: float = 0.0
    autopar_share: float = 0.0
    eager_share: float = 0.0
    compile_share: float = 0.0
    one_kernel: bool = True

    @property
    def met(self) -> bool:
        return self.one_kernel and self.autopar_share >= BW_GOAL and self.ratio <= self.goal


def run_case(case: str, steps: int, warmup: int, quick: bool, copy_bps: float, probe: str | None) -> list:
    chain, dname = case.rsplit("-", 1)
    dtype, device = DTYPES[dname], torch.device(DEVICE)
    torch.manual_seed(0)
    torch._dynamo.reset()   # a fresh cache per case: no recompile limit, no automatic dynamic shapes
    model, shapes = build(chain, quick)
    model = model.to(device=device, dtype=dtype)
    xs = [torch.randn(s, device=device, dtype=dtype, requires_grad=True) for s in shapes]
    dropout = isinstance(model, BiasDropoutAddNorm)
    plain = copy.deepcopy(model)
    if dropout:
        plain.rank_aware = False
    compiled = torch.compile(model if dropout and probe is None else plain)
    notes = []
    with rng.use_random_states(rng.RandomStates(0, 0, 0)):   # capture runs the chain once
        gm = fusion_pass(capture(copy.deepcopy(model), xs))
    report = gm.meta[FUSION]
    one_kernel = len(report.uses) == 1
    if not one_kernel:
        print(f"{case}: expected the whole chain in one kernel\n{report.summary()}")
        notes.append(f"NOT ONE KERNEL ({len(report.uses)} fused chain(s), {len(report.skipped)} unfused)")

    # correctness: fused against eager of the same chain (the same dropout masks), forward and backward
    leaves = {"autopar": xs + [gm.get_parameter("model." + n) for n, _ in model.named_parameters()], "eager": xs + list(plain.parameters()),
              "torch.compile": xs + list(compiled.parameters())}
    with rng.use_random_states(rng.RandomStates(0, 0, 0)):
        want = as_tuple(model(*xs))
        gouts = [torch.randn_like(o) for o in want]
        want_grads = torch.autograd.grad(want, xs + list(model.parameters()), gouts)
    with rng.use_random_states(rng.RandomStates(0, 0, 0)):
        got = as_tuple(gm(*xs))
        got_grads = torch.autograd.grad(got, leaves["autopar"], gouts)
    check_close(f"{case} forward", got, want, RTOL[dtype])
    check_close(f"{case} gradients", got_grads, want_grads, RTOL[dtype])
    if not dropout:
        check_close(f"{case} torch.compile forward", as_tuple(compiled(*xs)), want, RTOL[dtype])
    if dropout:
        notes.append("autopar: replicated_dropout (masks checked equal to eager's); eager: F.dropout; torch.compile: "
                     + ("replicated_dropout" if probe is None else f"F.dropout ({probe})"))
    reads = xs + list(plain.parameters()) + list(plain.buffers())
    fwd_bytes = nbytes(reads) + nbytes(want)
    bwd_bytes = nbytes(reads) + nbytes(gouts) + nbytes(leaves["eager"])
    del got, got_grads, want, want_grads
    fns = {"autopar": gm, "eager": plain, "torch.compile": compiled}

    def forward(fn):
        def step():
            with torch.no_grad():
                fn(*xs)
        return step

    def forward_backward(name):
        fn, params = fns[name], leaves[name]
        return lambda: torch.autograd.grad(as_tuple(fn(*xs)), params, gouts)

    rows = []
    with rng.use_random_states(rng.RandomStates(0, 0, 0)):
        for pass_, sides, moved in [("fwd", {n: forward(f) for n, f in fns.items()}, fwd_bytes),
                                    ("fwd+bwd", {n: forward_backward(n) for n in fns}, fwd_bytes + bwd_bytes)]:
            times = timed(sides, steps, warmup)
            share = {n: moved / quartiles(t)[1] / copy_bps for n, t in times.items()}
            row = compare("fusion", f"{case}/{pass_}", times, ours="autopar", baseline="torch.compile",
                          goal=SPEED_GOAL, note="; ".join(notes))
            rows.append(FusionRow(**dataclasses.asdict(row), eager_median_ms=quartiles(times["eager"])[1] * 1e3,
                                  bytes_moved=moved, copy_gbps=copy_bps / 1e9, autopar_share=share["autopar"],
                                  eager_share=share["eager"], compile_share=share["torch.compile"],
                                  one_kernel=one_kernel))
    return rows


def format_table(rows: list[FusionRow]) -> str:
    header = ["case", "MB moved", "autopar ms", "eager ms", "compile ms", "autopar %copy", "eager %copy",
              "compile %copy", "autopar/compile", "met"]
    lines = [[r.case, f"{r.bytes_moved / 1e6:.0f}", f"{r.ours_median_ms:.3f}", f"{r.eager_median_ms:.3f}",
              f"{r.baseline_median_ms:.3f}", f"{100 * r.autopar_share:.0f}%", f"{100 * r.eager_share:.0f}%",
              f"{100 * r.compile_share:.0f}%", f"{r.ratio:.3f}x", "yes" if r.met else "NO"] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(out + ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines])


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None) -> list:
    """The rows of every case; none (after one line saying why) without CUDA."""
    if not torch.cuda.is_available():
        print(NEEDS_CUDA)
        return []
    cases = cases or CASES
    copy_bps = copy_bandwidth(steps, warmup, quick)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bps / 1e9:.0f} GB/s "
          f"(median dst.copy_(src) of {256 if quick else 1024} MiB, read + write)")
    probe = compile_probe() if any(c.startswith("bias_dropout") for c in cases) else None
    rows = []
    for case in cases:
        rows += run_case(case, steps, warmup, quick, copy_bps, probe)
        gc.collect()   # the case's tensors and compiled graphs, before the next case allocates
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> list:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print(NEEDS_CUDA)
        write_json(args.json, [])
        return []
    steps, warmup = steps_of(args)
    rows = run(steps, warmup, args.quick, cases_of(args.cases, args.quick, CASES, CASES))
    print(f"\n== fusion: autopar fused kernel vs eager vs torch.compile ({steps} steps, {warmup} warm-up; goal: "
          f"autopar >= {BW_GOAL:.0%} of copy bandwidth and <= {SPEED_GOAL:.2f}x torch.compile) ==")
    print(format_table(rows))
    for case, note in dict.fromkeys((r.case.rsplit("/", 1)[0], r.note) for r in rows if r.note):
        print(f"  {case}: {note}")
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
