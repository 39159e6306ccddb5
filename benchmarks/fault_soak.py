"""Fault-injection soak (docs/guide/long_runs.md): training under ``torchrun --max-restarts``
with step checkpoints survives ranks killed with SIGKILL at random points, and ends with
the parameters of an uninterrupted run.

Each case trains Hugging Face GPT-2 (2 layers, dropout 0.1) for ``--steps`` steps on 4
gloo ranks under one plan, saving a step checkpoint every ``--every`` steps
(asynchronously on alternate cases), and resuming from the latest one at every start.
A killer thread in one chosen rank sends SIGKILL to its own process after a random delay
in a chosen restart, first noting what the training thread was doing (its innermost
autopar or torch frame: forward, backward, a collective, a checkpoint write) in the
fault log; ``checkpoint`` faults wait until an asynchronous write is in flight. torchrun
restarts the whole group, which resumes. The last case also restarts once on 2 ranks
(a second ``torchrun`` on fewer ranks resuming the same directory: the plan changes). At
the end rank 0 writes the full parameters; they are compared with an uninterrupted run
of the same plan (bit for bit; within float rounding across the change of world size).

    python benchmarks/fault_soak.py [--faults 20] [--steps 12] [--every 2]

Worker mode (run by torchrun): ``fault_soak.py --worker DIR STRATEGY STEPS EVERY ASYNC``.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PLANS = [{"data": 2, "tensor": 2}, {"pipeline": 2, "data": 2, "microbatches": 2}, {"data": 4, "zero": 3}]


def _batch(step: int):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g)


def _where(frame) -> str:
    """What the training thread was doing: the phase of the step (forward, backward, the
    optimizer) and the innermost frame that says more (a collective, a checkpoint)."""
    names = []
    while frame is not None:
        names.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    called = {name for _, name in names}
    phase = ("backward: " if called & {"backward", "_engine_run_backward", "_backward", "run"} and
             any(os.path.basename(p) in ("__init__.py", "graph.py", "executor.py", "backward.py") and
                 n in ("backward", "_engine_run_backward", "_backward") for p, n in names) else
             "optimizer: " if any("optim" in p for p, _ in names) else "")
    return phase + _innermost(names)


def _innermost(names: list) -> str:
    for path, name in names:
        base = os.path.basename(path)
        if "checkpoint" in base:
            return f"checkpoint ({name})"
        if base in ("distributed_c10d.py", "collectives.py", "grad_sync.py") or "all_reduce" in name:
            return f"collective ({name})"
        if name in ("backward", "_engine_run_backward", "run_backward") or base == "backward.py":
            return f"backward ({name})"
        if name == "forward" or base in ("executable.py", "runner.py"):
            return f"forward ({base}:{name})"
    return f"elsewhere ({names[0][1] if names else '?'})"


PROGRESS = {"step": 0}  # the training loop's step, which the killer waits for


def _killer(fault: dict, log: str) -> None:
    """Kill this process (SIGKILL) once training reaches the fault's step, after its
    delay; note where it hit first."""
    main = threading.main_thread().ident
    while PROGRESS["step"] < fault["step"]:
        time.sleep(0.001)
    time.sleep(fault["delay"])
    if fault["kind"] == "checkpoint":
        deadline = time.monotonic() + 60
        while not any(t.name.startswith("autopar-checkpoint-") for t in threading.enumerate()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        where = "checkpoint write in flight; training thread: " + _where(sys._current_frames().get(main))
    else:
        where = _where(sys._current_frames().get(main))
    with open(log, "a") as f:
        f.write(json.dumps({**fault, "where": where}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def worker(directory: str, strategy: dict, steps: int, every: int, async_: bool, dropout: float) -> None:
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    import autopar
    from examples.models import gpt2_loss
    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    faults = os.path.join(directory, "faults.json")
    if os.path.exists(faults):
        for fault in json.load(open(faults)):
            if fault["rank"] == rank and fault["restart"] == restart and fault["world"] == dist.get_world_size():
                threading.Thread(target=_killer, args=(fault, os.path.join(directory, "faults.log")),
                                 daemon=True).start()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, use_cache=False,
                                       resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout))
    ids, target = _batch(0)
    pm = autopar.compile(model, None, example_inputs=(ids,), loss_fn=gpt2_loss, example_target=target,
                         strategy=strategy)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    found = autopar.resume(pm, os.path.join(directory, "ckpt"), optimizer, scheduler=scheduler)
    start = 0 if found is None else found[0]
    for step in range(start + 1, steps + 1):
        PROGRESS["step"] = step
        ids, target = _batch(step)
        optimizer.zero_grad()
        pm.step(ids, target=target)
        optimizer.step()
        scheduler.step()
        if step % every == 0 and step < steps:
            autopar.save_checkpoint(pm, os.path.join(directory, "ckpt"), optimizer, step=step, scheduler=scheduler,
                                    keep=2, async_=async_)
    autopar.wait_checkpoints()
    state = pm.full_state_dict()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in state.items()}, os.path.join(directory, "final.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _torchrun(directory: str, world: int, strategy: dict, steps: int, every: int, async_: bool,
              restarts: int, dropout: float) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           f"--max-restarts={restarts}", os.path.abspath(__file__), "--worker", directory, json.dumps(strategy),
           str(steps), str(every), str(int(async_)), str(dropout)]
    # torchrun shares one rendezvous store across restarts, and a restarted rank that starts
    # late reads the previous attempt's gloo addresses from it: one store per attempt
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.stderr.write(out.stderr[-4000:])
    return out.returncode


def run_case(index: int, strategy: dict, faults: list[dict], steps: int, every: int, async_: bool,
             shrink: bool) -> dict:
    import torch
    with tempfile.TemporaryDirectory(prefix="autopar-soak-") as base:
        clean, faulty = os.path.join(base, "clean"), os.path.join(base, "faulty")
        os.makedirs(clean)
        os.makedirs(faulty)
        dropout = 0.0 if shrink else 0.1  # another world size draws other dropout masks
        assert _torchrun(clean, 4, strategy, steps, every, async_, 0, dropout) == 0, "the uninterrupted run failed"
        with open(os.path.join(faulty, "faults.json"), "w") as f:
            json.dump(faults, f)
        first = steps // 2 if shrink else steps
        code = _torchrun(faulty, 4, strategy, first, every, async_, len(faults), dropout)
        if shrink and code == 0:  # the rest on 2 ranks: the plan changes, the checkpoint is resharded
            os.remove(os.path.join(faulty, "final.pt"))
            code = _torchrun(faulty, 2, {"data": 2}, steps, every, async_, 0, dropout)
        hit = [json.loads(line) for line in open(os.path.join(faulty, "faults.log"))] \
            if os.path.exists(os.path.join(faulty, "faults.log")) else []
        a = torch.load(os.path.join(clean, "final.pt"))
        b = torch.load(os.path.join(faulty, "final.pt")) if code == 0 else {}
        worst = max((((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)).item() for k in a), default=1.0) \
            if b else float("nan")
        return {"case": index, "strategy": strategy, "async": async_, "shrink": shrink, "code": code,
                "identical": bool(b) and all(torch.equal(a[k], b[k]) for k in a), "worst": worst, "hits": hit}


def main(argv=None) -> list:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--per-case", type=int, default=4, help="faults per torchrun case")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    cases, made = [], 0
    while made < args.faults:
        index = len(cases)
        n = min(args.per_case, args.faults - made)
        shrink = made + n >= args.faults
        last = args.steps // 2 if shrink else args.steps
        # restart r resumes from the entry before its fault's step, so the faults move forward
        async_ = index % 2 == 1
        # on the asynchronous cases every other fault waits for a write in flight
        faults = [{"rank": rng.randrange(4), "restart": r, "world": 4,
                   "kind": "checkpoint" if async_ and r % 2 else "any",
                   "step": min(last, 1 + r * max(1, (last - 1) // n) + rng.randrange(max(1, (last - 1) // n))),
                   "delay": round(rng.uniform(0.0, 0.4), 3)} for r in range(n)]
        cases.append((index, PLANS[index % len(PLANS)], faults, async_, shrink))
        made += n
    results = []
    for index, strategy, faults, async_, shrink in cases:
        result = run_case(index, strategy, faults, args.steps, args.every, async_, shrink)
        results.append(result)
        print(json.dumps(result), flush=True)
    print("\n| case | plan | async | faults | where they hit | survived | final parameters |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        where = "; ".join(f"rank {h['rank']}: {h['where']}" for h in r["hits"]) or "-"
        final = "identical" if r["identical"] else f"max rel. diff {r['worst']:.1e}"
        print(f"| {r['case']} | {r['strategy']}{' then data 2 on 2 ranks' if r['shrink'] else ''} | "
              f"{r['async']} | {len(r['hits'])} | {where} | {'yes' if r['code'] == 0 else 'NO'} | {final} |")
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), bool(int(sys.argv[6])),
               float(sys.argv[7]))
    else:
        main()
