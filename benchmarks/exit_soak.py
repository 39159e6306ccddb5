"""Consecutive multi-rank jobs that train with autopar and exit: none may abort.

Each job is what a user runs: ``torchrun --nproc-per-node N`` on a script that
initialises the default group from torchrun's environment, compiles a model, trains a
few steps, calls ``dist.destroy_process_group()`` and returns. A job passes when torchrun
and every rank exit with code 0 and nothing printed ``terminate called`` (the C++ abort
seen before issue 18, in about one job of three: the failure board's heartbeat thread
inside a store call while the interpreter finalised).

The jobs cycle through families and sizes (data, Megatron tensor, "auto", a 2-stage
pipeline, D&SP on a fork/join model, on 2 and 4 ranks)::

    python benchmarks/exit_soak.py --jobs 50          # the figure in docs/benchmarks.md
    python benchmarks/exit_soak.py --jobs 3 --quiet   # what tests/test_exit.py runs

It prints one line per job and a summary, and exits 1 if any job failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (model, strategy, ranks): families and world sizes the jobs cycle through
JOBS = [
    ("transformer", "tensor=2", 2),
    ("transformer", "auto", 4),
    ("gpt2", "pipeline=2", 2),
    ("towers4", "dsp", 4),
    ("mlp", "data=4", 4),
    ("transformer", "data=2,tensor=2", 4),
    ("gpt2", "auto", 2),
    ("transformer", "pipeline=2,data=2", 4),
]

USER_SCRIPT = r'''
import os, sys
sys.path.insert(0, {root!r})
import torch
import torch.distributed as dist
import autopar
from examples.factories import training_case

model_name, strategy = sys.argv[1], sys.argv[2]
if strategy == "dsp":
    strategy = {{"data": int(os.environ["WORLD_SIZE"]), "subgrids": 2}}
elif strategy != "auto":
    strategy = {{k: int(v) for k, v in (part.split("=") for part in strategy.split(","))}}
dist.init_process_group("gloo")
torch.manual_seed(0)
factory, inputs, target, loss_fn = training_case(model_name, layers=4 if "pipeline" in sys.argv[2] else None)
pm = autopar.compile(factory(), None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                     strategy=strategy)
optimizer = torch.optim.AdamW(pm.parameters())
for _ in range(3):
    pm.step(*inputs, target=target)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
'''


def run_job(index: int, script: str, timeout_s: float) -> tuple[bool, str, float]:
    model, strategy, ranks = JOBS[index % len(JOBS)]
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           script, model, strategy]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun passes SIGTERM on to its ranks (SIGKILL would orphan them)
        output, _ = proc.communicate()
        return False, f"{model} {strategy} on {ranks}: timed out after {timeout_s:g} s\n{output[-3000:]}", \
            time.perf_counter() - start
    aborted = "terminate called" in output or "SIGABRT" in output or "exitcode  : -6" in output
    ok = proc.returncode == 0 and not aborted
    what = f"{model} {strategy} on {ranks} ranks: exit {proc.returncode}" + (", ABORT" if aborted else "")
    if not ok:
        what += "\n" + "\n".join(line for line in output.splitlines()[-25:])
    return ok, what, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train_and_exit.py")
        with open(script, "w") as f:
            f.write(USER_SCRIPT.format(root=ROOT))
        failed, seconds = 0, []
        for index in range(args.jobs):
            ok, what, took = run_job(index, script, args.timeout)
            seconds.append(took)
            failed += not ok
            if not ok or not args.quiet:
                print(f"job {index + 1:>3}/{args.jobs}: {'ok  ' if ok else 'FAIL'} {what} ({took:.1f} s)", flush=True)
    seconds.sort()
    print(f"{args.jobs - failed} of {args.jobs} jobs exited cleanly, {failed} failed "
          f"(median {seconds[len(seconds) // 2]:.1f} s a job)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
