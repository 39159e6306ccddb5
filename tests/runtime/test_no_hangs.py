"""No hangs: when one rank dies or raises, every other rank stops with a RankFailureError
naming it, within the process group's timeout (docs/guide/launching_and_failures.md).

Each test launches 4 gloo ranks with ``return_exceptions=True``, so the parent leaves the
survivors alone: they must stop by themselves. A survivor that reports a RankFailureError
stopped by itself, through the failure board or a collective's timeout, each counted from
the event (one that did not would be reported as killed at launch's deadline). That
deadline is the whole job's, counted from its start, and generous (:data:`DEADLINE_S`): a
slow or loaded machine takes long to spawn and compile, which no failure's detection
depends on. No test reads a clock.
"""
import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import autopar
from autopar._torch_compat import group_timeout
from autopar.runtime.health import RankFailureError, _board, explain, is_collective_failure
from autopar.runtime.launcher import RankFailure, launch
from examples.factories import training_case
from examples.models import MLP

# the process group's collective timeout (each collective's, from its start)
TIMEOUT_S = 60.0
# launch's deadline for the whole job, from its start: spawning 4 ranks and compiling take
# 5-45 s on a busy 2-core machine, minutes on a slow loaded one
DEADLINE_S = 20 * TIMEOUT_S
MESH = {"data": 2, "tensor": 2}  # rank = data * 2 + tensor: rank 2 shares data with 0, tensor with 3


def _compile(model=None, mesh=None):
    """The example MLP (or ``model``) compiled for MESH (or a 2-D ``mesh`` of the same
    degrees); every group it communicates over has the default group's timeout."""
    factory, inputs, target, loss_fn = training_case("mlp")
    torch.manual_seed(0)
    pm = autopar.compile(model or factory(), mesh, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy=MESH)
    for name, group in pm.process_groups.items():
        if group is not None:
            assert group_timeout(group) == datetime.timedelta(seconds=TIMEOUT_S), (name, group_timeout(group))
    return pm, inputs, target


def _rank_2_killed_in_second_backward():
    # the user's mesh: init_device_mesh gives its groups torch's 30 minutes; compile lowers them
    pm, inputs, target = _compile(mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "tensor")))
    step = [0]
    if dist.get_rank() == 2:
        def die(grad):
            if step[0] == 2:
                # mid-step, once the heartbeat has said so (the board is what survivors read)
                while _board().read().beats[2]["doing"] != "step() #2":
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)
            return grad
        pm.root.model.head.weight.register_hook(die)
    for step[0] in (1, 2, 3):
        pm.step(*inputs, target=target)
    return "finished"


def _rank_1_given_a_bad_target():
    pm, inputs, target = _compile()
    pm.step(*inputs, target=target)
    if dist.get_rank() == 1:
        target = torch.zeros(8, 3, dtype=torch.long)  # cross-entropy wants one class per row
    pm.step(*inputs, target=target)
    return "finished"


def _rank_3_given_another_model():
    _compile(MLP(width=16) if dist.get_rank() == 3 else None)  # its first layer does not take the inputs
    return "compiled"


def _survivors(results, culprit: int) -> list[RankFailure]:
    out = []
    for rank, result in enumerate(results):
        if rank == culprit:
            continue
        assert isinstance(result, RankFailure), f"rank {rank} did not stop: {result!r}"
        out.append(result)
    return out


@pytest.mark.multiprocess
@pytest.mark.extended  # a launch of its own, about a minute: the extended suite (the error case below runs in both)
def test_a_killed_rank_is_named_by_every_other_rank_within_the_timeout():
    results = launch(_rank_2_killed_in_second_backward, 4, timeout_s=TIMEOUT_S, deadline_s=DEADLINE_S,
                     return_exceptions=True)
    dead = results[2]
    assert isinstance(dead, RankFailure) and dead.exitcode == -signal.SIGKILL, dead
    for failure in _survivors(results, 2):
        assert failure.error.startswith("RankFailureError: rank 2 died (its process "), failure
        assert "is gone; last seen in step() #2); this rank" in failure.error, failure
        assert "stopped in step() #2" in failure.error, failure


@pytest.mark.multiprocess
def test_an_error_raised_on_one_rank_reaches_every_rank():
    results = launch(_rank_1_given_a_bad_target, 4, timeout_s=TIMEOUT_S, deadline_s=DEADLINE_S,
                     return_exceptions=True)
    raised = results[1]
    assert isinstance(raised, RankFailure) and "Error" in raised.error, raised
    first_line = raised.error.splitlines()[0]
    for failure in _survivors(results, 1):
        assert failure.error.startswith(f"RankFailureError: rank 1 raised in step() #2: {first_line}; this rank"), \
            failure
        assert raised.error.strip() in failure.error.replace("\n    ", "\n"), failure  # rank 1's error in full


@pytest.mark.extended  # a launch of its own: the extended suite
@pytest.mark.multiprocess
def test_a_rank_failing_in_compile_fails_compile_on_every_rank():
    results = launch(_rank_3_given_another_model, 4, timeout_s=TIMEOUT_S, deadline_s=DEADLINE_S,
                     return_exceptions=True)
    raised = results[3]
    assert isinstance(raised, RankFailure), raised
    assert raised.error.startswith("CaptureError: autopar could not capture model MLP"), raised
    for failure in _survivors(results, 3):
        assert failure.error.startswith("RankFailureError: rank 3 raised in compile() #1: CaptureError: autopar "
                                        "could not capture model MLP."), failure
        # read off the board, not a timeout ("not every rank arrived within the timeout")
        assert "stopped waiting for the others in compile() #1" in failure.error, failure
        assert "within the timeout" not in failure.error, failure


def test_collective_failures_are_told_from_local_errors():
    assert is_collective_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    assert is_collective_failure(dist.DistStoreError("wait timeout after 1000ms"))
    assert not is_collective_failure(ValueError("Expected input batch_size (4) to match target batch_size (8)"))
    assert not is_collective_failure(RankFailureError("rank 1 raised ..."))


def test_without_a_process_group_there_is_nothing_to_ask():
    error = explain(RuntimeError("Connection closed by peer"), "step() #1")
    assert isinstance(error, RankFailureError) and "no failure board" in str(error)


def _snapshot(beats, records):
    """A board as rank 0 reads it, from ``beats`` (rank -> (pid, doing) or None) and failure records."""
    import json
    from types import SimpleNamespace

    from autopar.runtime.failure_board import Snapshot, this_machine
    board = SimpleNamespace(rank=0, machine=this_machine())
    now = time.time()
    snapshot = Snapshot(board, [None if b is None else {"t": now, "pid": b[0], "machine": board.machine,
                                                         "state": "alive", "doing": b[1], "since": now}
                                for b in beats])
    snapshot.read_failures("".join(json.dumps(r) + "\n" for r in records))
    return snapshot


def test_the_board_names_who_raised_who_died_and_whom_others_blamed():
    gone = 2 ** 22 + 12345  # above the default pid_max: no such process
    alive = os.getpid()
    snapshot = _snapshot([(alive, ""), (alive, "step() #2"), (gone, "step() #2"), (gone, "step() #2")], [
        {"rank": 1, "kind": "raised", "error": "ValueError: bad target\n  more", "during": "step() #2"},
        {"rank": 3, "kind": "stopped", "error": "RankFailureError: ...", "during": "step() #2",
         "culprits": {"2": "rank 2 died (seen by rank 3)"}},
    ])
    culprits = snapshot.culprits()
    # rank 3 reported before it exited: it is not taken for dead; rank 1 lives but raised
    assert culprits == {1: ("rank 1 raised in step() #2: ValueError: bad target", "ValueError: bad target\n  more"),
                        2: (f"rank 2 died (its process {gone} is gone; last seen in step() #2)", "")}
    error = RankFailureError.naming(culprits, "this rank (0) stopped in step() #2: RuntimeError: closed", "step() #2")
    assert str(error).splitlines() == [
        "rank 1 raised in step() #2: ValueError: bad target; rank 2 died (its process "
        f"{gone} is gone; last seen in step() #2); this rank (0) stopped in step() #2: RuntimeError: closed",
        "rank 1's error:", "    ValueError: bad target", "      more"]
    assert error.failed == {1: culprits[1][0], 2: culprits[2][0]}


def test_a_rank_that_went_on_after_its_error_is_not_blamed_and_others_blame_the_same_rank():
    alive = os.getpid()
    snapshot = _snapshot([(alive, ""), (alive, ""), (alive, ""), (alive, "")], [
        {"rank": 1, "kind": "raised", "error": "ValueError: bad", "during": "step() #2"},
        {"rank": 1, "kind": "recovered"},
        {"rank": 3, "kind": "stopped", "error": "RankFailureError: ...", "during": "step() #2",
         "culprits": {"2": "rank 2 died (no heartbeat for 16.0 s)"}, "details": {}},
    ])
    assert snapshot.culprits() == {2: ("rank 2 died (no heartbeat for 16.0 s)", "")}
    assert snapshot.culprits(members=[0, 1]) == {}
