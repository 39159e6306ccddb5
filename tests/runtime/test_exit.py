"""Orderly shutdown: a torchrun job that trains with autopar exits with code 0 on every
rank, whether the script destroys the process group, stops autopar first, or neither.
``health.stop()`` joins the failure board's heartbeat thread: a thread left running was
the cause of aborts at exit (inside a store call while the interpreter finalises,
docs/guide/launching_and_failures.md). 50 consecutive jobs: ``benchmarks/exit_soak.py``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(r'''
    import os, sys, threading
    sys.path.insert(0, {root!r})
    import torch
    import torch.distributed as dist
    import autopar
    from autopar.runtime import health
    from examples.factories import training_case

    ending = sys.argv[1]
    dist.init_process_group("gloo")
    factory, inputs, target, loss_fn = training_case("transformer")
    torch.manual_seed(0)
    pm = autopar.compile(factory(), None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy={{"tensor": 2}})
    optimizer = torch.optim.AdamW(pm.parameters())
    for _ in range(2):
        pm.step(*inputs, target=target)
        optimizer.step()
        optimizer.zero_grad()
    beats = [t for t in threading.enumerate() if t.name == "autopar-heartbeat"]
    assert len(beats) == 1, beats
    if ending == "stop":  # what launch does: stop() joins the thread, then the group goes
        health.stop()
        assert not beats[0].is_alive(), "health.stop() returned with the heartbeat thread alive"
        dist.destroy_process_group()
    elif ending == "destroy":  # what a user does; the thread is joined at exit
        dist.destroy_process_group()
    # "return": the user neither destroys nor stops; exit joins the thread all the same
    print(f"rank {{os.environ['RANK']}} done", flush=True)
''')


@pytest.mark.multiprocess
# "stop" is what launch does at the end of every shared launch of the suite: the extended suite
# "destroy" is a torchrun job of its own, about a minute: the extended suite too (every shared
# launch of the main suite ends its ranks and checks they exit with code 0)
@pytest.mark.parametrize("ending", [pytest.param("destroy", marks=pytest.mark.extended),
                                    pytest.param("stop", marks=pytest.mark.extended)])
def test_torchrun_job_exits_with_code_0_on_every_rank(tmp_path, ending):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=ROOT))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), ending],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert "terminate called" not in output, output
    assert proc.returncode == 0, output  # torchrun's code is 0 only when every rank's is
    assert "rank 0 done" in output and "rank 1 done" in output, output


GARBAGE_AT_EXIT = textwrap.dedent(r'''
    import gc, sys, threading, time
    sys.path.insert(0, {root!r})
    import torch
    import torch.distributed as dist
    from autopar.runtime import health

    dist.init_process_group("gloo")
    health.start()  # a rank's board, as compile makes it
    class Holder:
        pass
    held = Holder()
    held.cycle = held  # only the cyclic collector frees what it holds
    held.groups = [dist.new_group([0, 1]) for _ in range(8)]
    for group in held.groups:
        dist.all_reduce(torch.ones(4), group=group)
    def collect():  # a daemon thread running Python runs the collector too
        while True:
            gc.collect()
            time.sleep(0.0005)
    threading.Thread(target=collect, daemon=True).start()
    dist.destroy_process_group()
    del held, group
''')


@pytest.mark.extended  # a launch of its own: the extended suite
@pytest.mark.multiprocess
def test_a_daemon_thread_collecting_a_ranks_garbage_at_exit_does_not_abort_it(tmp_path):
    """Process groups in a reference cycle and a daemon thread that collects garbage: the
    groups' destructors release the GIL and take it back, and a daemon thread doing so
    after the interpreter began finalising was ended inside them (``terminate called
    without an active exception``, SIGABRT, on every rank of every run). The exit handler
    collects in the main thread first, with automatic collection off."""
    script = tmp_path / "garbage.py"
    script.write_text(GARBAGE_AT_EXIT.format(root=ROOT))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert "terminate called" not in output, output
    assert proc.returncode == 0, output
