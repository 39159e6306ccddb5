"""Benchmark (docs/benchmarks.md §11): a program compiled for one rank against the eager model it came from.

Both sides run the same model (autopar deep-copies it, so the weights are equal) on the
same input; a step is ``zero_grad`` + forward + backward, no optimizer step:

* autopar: ``pm.zero_grad(); pm.step(x, target=y)`` with ``pm = autopar.compile(model, None, ...)``
  in a process with no process group (world 1);
* eager:   ``model.zero_grad(); loss_fn(model(x), y).backward()``.

Goal: autopar ≤ 1.03 × eager. The small cases are there to make the per-step Python
overhead visible; the large ones are what the goal is about.

On a GPU (docs/benchmarks.md §13): ``--device cuda --dtype bf16 --fusion --cases gpt2-124m llama-1b``
runs Hugging Face GPT-2 small (124M) and a Llama-style model of ~1B parameters (16
layers, hidden 2048, 32 heads, 8 key/value heads, SwiGLU 8192, vocabulary 32000) with
model and batch on the GPU, every step ending in ``torch.cuda.synchronize()``; ``--fusion``
adds a third side, autopar with its generated kernels (goal: faster than eager).

    python benchmarks/bench_compile_overhead.py [--steps 40] [--quick] [--cases CASE ...]
    python benchmarks/bench_compile_overhead.py --device cuda --dtype bf16 --fusion --cases gpt2-124m llama-1b
    python benchmarks/bench_compile_overhead.py --breakdown mlp-small   # where pm.step's overhead goes
    python benchmarks/bench_compile_overhead.py --profile mlp-small     # cProfile of the autopar side
"""
from __future__ import annotations

import cProfile
import io
import pstats

# common first: it puts the repo root on sys.path (examples/ is not an installed package)
from common import (cases_of, check_close, compare, interleaved, make_case, parser, print_rows, quartiles,
                    steps_for, steps_of, write_json, zero_grad)

import torch  # noqa: E402

import autopar  # noqa: E402

GOAL = 1.03
CASES = ["mlp-small", "transformer-small", "mlp-1024", "transformer-256x4"]
QUICK_CASES = ["mlp-small", "transformer-small"]


GPU_CASES = ["gpt2-124m", "llama-1b"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gpu_case(name: str):
    """(model, input, target, loss_fn) of the one-GPU cases, from seed 0: batch 8 × 512 tokens."""
    from examples.zoo import logits_loss
    torch.manual_seed(0)
    if name == "gpt2-124m":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        vocab = model.config.vocab_size
    elif name == "llama-1b":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                                             num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                             max_position_embeddings=1024, use_cache=False))
        vocab = 32000
    else:
        raise KeyError(f"unknown case {name!r}")
    ids = torch.randint(0, vocab, (8, 512))
    return model, ids, torch.randint(0, vocab, (8, 512)), logits_loss


def placed_case(name: str, device: str, dtype: torch.dtype):
    """``(model, x, y, loss_fn, sync)`` of a case on ``device`` in ``dtype``; ``sync`` waits
    for the GPU's work (nothing on the CPU)."""
    if name in GPU_CASES:  # built where it runs: a 1B model's initialisation on the host alone takes seconds
        with torch.device(device):
            model, x, y, loss_fn = gpu_case(name)
    else:
        model, x, y, loss_fn = make_case(name)
    model = model.to(device=device, dtype=dtype)
    x, y = x.to(device), y.to(device)
    if x.is_floating_point():
        x, y = x.to(dtype), y.to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    return model, x, y, loss_fn, sync


def _compiled(model, x, y, loss_fn, fusion: bool):
    """The model compiled on one rank, without or with its generated kernels."""
    return autopar.compile(model, None, example_inputs=(x,), loss_fn=loss_fn, example_target=y,
                           strategy={"data": 1, "tensor": 1}, fusion=fusion)


def sides(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32, fusion: bool = False):
    model, x, y, loss_fn, sync = placed_case(name, device, dtype)
    compiled = {label: _compiled(model, x, y, loss_fn, fused)
                for label, fused in (("autopar", False), ("autopar fused", True)) if fused <= fusion}
    model_params = list(model.parameters())
    loose = dtype != torch.float32
    for label, pm in compiled.items():
        check_close(f"{name} ({label})", pm.step(x, target=y), loss_fn(model(x), y), rtol=2e-2 if loose else 1e-4)

    def step_of(pm):
        params = list(pm.parameters())

        def step():
            zero_grad(params)
            pm.step(x, target=y)
            sync()   # the GPU's work inside the timed step
        return step

    def step_eager():
        zero_grad(model_params)
        loss_fn(model(x), y).backward()
        sync()

    return {**{label: step_of(pm) for label, pm in compiled.items()}, "eager": step_eager}


def run(steps: int, warmup: int, quick: bool = False, cases: list[str] | None = None, threads: int = 1,
        device: str = "cpu", dtype: torch.dtype = torch.float32, fusion: bool = False) -> list:
    torch.set_num_threads(threads)
    rows = []
    for name in cases or (QUICK_CASES if quick else CASES):
        times = interleaved(sides(name, device, dtype, fusion), *steps_for(name, steps, warmup, quick))
        rows.append(compare("compile_overhead", name, times, ours="autopar", baseline="eager", goal=GOAL))
        if fusion:
            rows.append(compare("compile_overhead", f"{name} fused", times, ours="autopar fused",
                                baseline="eager", goal=1.0))
    return rows


def breakdown(name: str, steps: int, warmup: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> str:
    """Where the per-step overhead goes: a ladder from eager to ``pm.step``, each rung
    calling one more layer of what ``pm.step`` runs, timed interleaved (backward
    included everywhere, no zero_grad).

    * ``eager``: ``loss_fn(model(x), y).backward()``
    * ``graph``: the rank program (an ``fx.GraphModule``) called directly
    * ``runner``: ``pm.runner.step``: the program's lookup by input signature, the target
      count, the run-time context (groups, device, dropout streams, family state), the
      gradient buckets' finish
    * ``module``: ``ParallelModule.step`` without ``health.guarded`` (the call's
      flattening and checks)
    * ``pm.step``: the real thing (``health.guarded`` around it)

    Each rung calls the real layer, so the ladder follows the code. A rung's cost is what
    that layer costs *in situ*, after a backward: a few times what the same Python costs
    in a tight loop (``timeit``), whose caches stay warm.
    """
    model, x, y, loss_fn, sync = placed_case(name, device, dtype)
    pm = _compiled(model, x, y, loss_fn, fusion=False)   # the unfused program, as sides()' "autopar"
    pm.step(x, target=y)
    program = next(iter(pm.runner.programs.values()))
    unguarded = type(pm).step.__wrapped__   # health.guarded keeps the method it wraps

    ladder = {
        "eager": lambda: loss_fn(model(x), y).backward(),
        "graph": lambda: program.forward(x, y).backward(),   # as the runner calls it
        "runner": lambda: pm.runner.step((x,), y, pm.training),
        "module": lambda: unguarded(pm, x, target=y),
        "pm.step": lambda: pm.step(x, target=y),
    }
    ladder = {rung: (lambda fn=fn: (fn(), sync())) for rung, fn in ladder.items()}   # the device's work included
    times = interleaved(ladder, steps, warmup)
    eager = quartiles(times["eager"])[1]
    lines = [f"{name}: per-step cost of each piece of pm.step (median of {steps}, microseconds)"]
    previous = eager
    for rung, values in times.items():
        median = quartiles(values)[1]
        lines.append(f"  {rung:9s} {median * 1e6:9.1f} us   +{(median - previous) * 1e6:6.1f} us on the rung above"
                     f"   ({median / eager:.3f}x eager)")
        previous = median
    return "\n".join(lines)


def profile(name: str, steps: int = 20) -> str:
    """cProfile of ``steps`` autopar steps of a case (after two warm-up steps)."""
    step = sides(name)["autopar"]
    for _ in range(2):
        step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main(argv=None) -> list:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as on the ranks)")
    p.add_argument("--profile", metavar="CASE", help="print a cProfile of the autopar side of CASE and exit")
    p.add_argument("--breakdown", metavar="CASE", help="print where pm.step's overhead goes for CASE and exit")
    p.add_argument("--breakdown-steps", type=int, default=200, metavar="N",
                   help="timed steps per rung of --breakdown (default 200; 20 warm-up)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: model and batch on that device")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="the model's dtype (default fp32)")
    p.add_argument("--fusion", action="store_true", help="add a side: autopar with its generated Triton kernels")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_compile_overhead: --device cuda needs a CUDA device; none here")
        return []
    if args.breakdown:
        torch.set_num_threads(args.threads)
        print(breakdown(args.breakdown, args.breakdown_steps, min(20, max(2, args.breakdown_steps // 10)), args.device,
                        DTYPES[args.dtype]))
        return []
    if args.profile:
        torch.set_num_threads(args.threads)
        print(profile(args.profile))
        return []
    steps, warmup = steps_of(args)
    selected = cases_of(args.cases, args.quick, CASES + GPU_CASES, QUICK_CASES)
    if not args.quick and not args.cases:  # the GPU cases (1.1B parameters) only on a GPU, or by name
        selected = list(GPU_CASES) if args.device == "cuda" else list(CASES)
    rows = run(steps, warmup, args.quick, selected, args.threads, args.device, DTYPES[args.dtype], args.fusion)
    print_rows(f"compile overhead: autopar on 1 rank vs eager ({steps} steps, {warmup} warm-up, "
               f"{args.threads} thread(s), {args.device}, {args.dtype})", rows)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
