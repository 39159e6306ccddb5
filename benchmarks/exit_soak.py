"""Consecutive multi-rank jobs that train with autopar and exit: none may abort.

Each job is what a user runs: ``torchrun --nproc-per-node N`` on a script that
initialises the default group from torchrun's environment, compiles a model, trains a
few steps, calls ``dist.destroy_process_group()`` and returns. A job passes when torchrun
and every rank exit with code 0 and nothing printed ``terminate called`` (the C++ abort
of a rank whose failure board heartbeat thread is inside a store call while the
interpreter finalises, docs/guide/launching_and_failures.md).

The jobs cycle through families and sizes (data, Megatron tensor, "auto", a 2-stage
pipeline, D&SP on a fork/join model, on 2 and 4 ranks), then through Hugging Face
encoder-decoders (Whisper, with its conv stem, and T5) under tensor, pipeline and "auto",
some launched the other common way: ``torch.multiprocessing.spawn`` from the script,
rank 0 hosting the store (``--models`` picks a list)::

    python benchmarks/exit_soak.py --jobs 50                        # the figures in docs/benchmarks.md
    python benchmarks/exit_soak.py --jobs 50 --models encdec        # the encoder-decoder jobs only
    python benchmarks/exit_soak.py --jobs 3 --quiet                 # a quick look

Every rank runs with ``PYTHONFAULTHANDLER=1`` (an abort prints every thread's Python
stack); ``--cores`` lets the ranks write core files into the job's folder, kept with its
output under ``--keep`` when it fails. It prints one line per job and a summary, and
exits 1 if any job failed.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
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

# Hugging Face encoder-decoders (examples/zoo.py), keyword inputs; "spawn": launched with
# torch.multiprocessing.spawn (rank 0 hosts the store) instead of torchrun
ENCDEC_JOBS = [
    ("whisper", "tensor=2", 2),
    ("t5", "tensor=2", 2),
    ("whisper", "pipeline=2", 2),
    ("t5", "pipeline=2", 2),
    ("whisper", "auto", 2),
    ("t5", "auto", 2),
    ("whisper", "tensor=2", "spawn2"),
    ("t5", "tensor=2", "spawn2"),
]

MODELS = {"mixed": JOBS, "encdec": ENCDEC_JOBS, "all": JOBS + ENCDEC_JOBS}

USER_SCRIPT = r'''
import os, sys
sys.path.insert(0, {root!r})
import torch
import torch.distributed as dist
import autopar


def case(model_name, pipeline):
    # (factory, positional inputs, keyword inputs, target, loss)
    if model_name in ("whisper", "t5"):
        from examples import zoo
        c = getattr(zoo, model_name)()
        factory = c.factory
        if model_name == "t5" and pipeline:  # T5's block 0 differs (relative bias): 4 blocks to cut between
            from transformers import T5ForConditionalGeneration
            config = zoo._t5_config()
            config.num_layers = config.num_decoder_layers = 4
            factory = lambda: T5ForConditionalGeneration(config)  # noqa: E731
        return factory, c.inputs, c.kwargs, c.target, c.loss_fn
    from examples.factories import training_case
    factory, inputs, target, loss_fn = training_case(model_name, layers=4 if pipeline else None)
    return factory, inputs, {{}}, target, loss_fn


def train(model_name, strategy):
    pipeline = "pipeline" in strategy
    if strategy == "dsp":
        strategy = {{"data": dist.get_world_size(), "subgrids": 2}}
    elif strategy != "auto":
        strategy = {{k: int(v) for k, v in (part.split("=") for part in strategy.split(","))}}
    torch.manual_seed(0)
    factory, inputs, kwargs, target, loss_fn = case(model_name, pipeline)
    pm = autopar.compile(factory(), None, example_inputs=inputs, example_kwargs=kwargs or None, loss_fn=loss_fn,
                         example_target=target, strategy=strategy)
    optimizer = torch.optim.AdamW(pm.parameters())
    for _ in range(3):
        pm.step(*inputs, target=target, **kwargs)
        optimizer.step()
        optimizer.zero_grad()


def spawned(rank, world, port, model_name, strategy):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train(model_name, strategy)
    dist.destroy_process_group()


if __name__ == "__main__":
    model_name, strategy = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:  # spawn WORLD: the script starts its ranks itself
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(int(sys.argv[3]), port, model_name, strategy), nprocs=int(sys.argv[3]))
    else:
        dist.init_process_group("gloo")
        train(model_name, strategy)
        dist.destroy_process_group()
'''


def run_job(job, script: str, timeout_s: float, workdir: str, cores: bool = False) -> tuple[bool, str, float]:
    model, strategy, ranks = job
    start = time.perf_counter()
    if isinstance(ranks, str):  # "spawn2": the script spawns 2 ranks itself
        ranks = int(ranks.removeprefix("spawn"))
        cmd, how = [sys.executable, script, model, strategy, str(ranks)], " (mp.spawn)"
    else:
        cmd, how = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                    script, model, strategy], ""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    limits = (lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2)) if cores else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
                            preexec_fn=limits)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun passes SIGTERM on to its ranks (SIGKILL would orphan them)
        output, _ = proc.communicate()
        return False, f"{model} {strategy} on {ranks}{how}: timed out after {timeout_s:g} s\n{output[-3000:]}", \
            time.perf_counter() - start
    aborted = "terminate called" in output or "SIGABRT" in output or "exitcode  : -6" in output \
        or "Fatal Python error" in output
    ok = proc.returncode == 0 and not aborted
    what = f"{model} {strategy} on {ranks} ranks{how}: exit {proc.returncode}" + (", ABORT" if aborted else "")
    if not ok:
        with open(os.path.join(workdir, "output.txt"), "w") as f:
            f.write(output)
        what += "\n" + "\n".join(line for line in output.splitlines()[-60:])
    return ok, what, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--models", choices=sorted(MODELS), default="all",
                        help="the jobs to cycle through: the mixed families, the encoder-decoders, or both")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    parser.add_argument("--cores", action="store_true", help="let the ranks write core files (kept with --keep)")
    parser.add_argument("--keep", help="a folder: each failed job's output (and core files) kept in job-N/ there")
    args = parser.parse_args(argv)
    jobs = MODELS[args.models]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train_and_exit.py")
        with open(script, "w") as f:
            f.write(USER_SCRIPT.format(root=ROOT))
        failed, seconds = 0, []
        for index in range(args.jobs):
            workdir = os.path.join(tmp, f"job-{index + 1}")
            os.mkdir(workdir)
            ok, what, took = run_job(jobs[index % len(jobs)], script, args.timeout, workdir, args.cores)
            seconds.append(took)
            failed += not ok
            if not ok and args.keep:
                shutil.copytree(workdir, os.path.join(args.keep, f"job-{index + 1}"), dirs_exist_ok=True)
            shutil.rmtree(workdir, ignore_errors=True)
            if not ok or not args.quiet:
                print(f"job {index + 1:>3}/{args.jobs}: {'ok  ' if ok else 'FAIL'} {what} ({took:.1f} s)", flush=True)
    seconds.sort()
    print(f"{args.jobs - failed} of {args.jobs} jobs exited cleanly, {failed} failed "
          f"(median {seconds[len(seconds) // 2]:.1f} s a job)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
