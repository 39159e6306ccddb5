"""Step checkpoints and resuming (``autopar.save_checkpoint(..., step=)``,
``autopar.resume``; autopar/engine/checkpoint_dir.py).

On 2 gloo ranks, float64, Hugging Face GPT-2 with dropout under ``data 1 × tensor 2``
(dropout on both streams) and an LR schedule: a run of 6 steps saving at steps 2 and 4
(``keep=1``) against a fresh module and optimizer that resume from the directory and
train steps 5 and 6 — the parameters, the optimizer's state and the learning rate equal
the uninterrupted run's bit for bit; resuming from an empty directory returns None and
changes nothing. A save whose rank 1 dies (``os._exit``) after writing its shards and
before the commit leaves the previous entry complete and the interrupted one hidden, and
the next save removes it. Without ranks: the names, the argument errors.
"""
import os
import pytest
import torch

import autopar
import shared_ranks
from autopar.engine import checkpoint_dir
from autopar.runtime.launcher import RankFailure, launch

STRATEGY = {"data": 1, "tensor": 2}


def _build(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    from examples.factories import training_case
    _, inputs, target, loss_fn = training_case("gpt2", 4)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, use_cache=False,
                                       resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)).to(torch.float64)
    pm = autopar.compile(model, None, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         strategy=STRATEGY)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-6)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return pm, optimizer, scheduler, inputs, target


def _step(pm, optimizer, scheduler, inputs, target):
    optimizer.zero_grad()
    pm.step(*inputs, target=target)
    optimizer.step()
    scheduler.step()


def _state(pm, optimizer):
    params = {n: p.detach().clone() for n, p in pm.named_parameters()}
    names = {id(p): n for n, p in pm.named_parameters()}
    opt = {names[id(p)] + "." + k: v.clone() for p, s in optimizer.state.items() for k, v in s.items()
           if torch.is_tensor(v)}
    return params, opt


def resume_job(root, async_=False):
    directory = os.path.join(root, "async" if async_ else "steps")
    pm, optimizer, scheduler, inputs, target = _build()
    for step in range(1, 7):
        _step(pm, optimizer, scheduler, inputs, target)
        if step in (2, 4):
            autopar.save_checkpoint(pm, directory, optimizer, step=step, extra={"data_position": step * 4},
                                    scheduler=scheduler, keep=1, async_=async_)
    autopar.wait_checkpoints()
    reference, reference_opt = _state(pm, optimizer)
    entries = [name for name in sorted(os.listdir(directory))]
    fresh, optimizer2, scheduler2, _, _ = _build(seed=1)
    empty = autopar.resume(fresh, os.path.join(root, "none"), optimizer2, scheduler=scheduler2)
    found = autopar.resume(fresh, directory, optimizer2, scheduler=scheduler2)
    for _ in range(5, 7):
        _step(fresh, optimizer2, scheduler2, inputs, target)
    resumed, resumed_opt = _state(fresh, optimizer2)
    return {"entries": entries, "empty": empty, "found": found,
            "params": [n for n in reference if not torch.equal(reference[n], resumed[n])],
            "optimizer": [n for n in reference_opt if not torch.equal(reference_opt[n], resumed_opt[n])],
            "lr": (optimizer.param_groups[0]["lr"], optimizer2.param_groups[0]["lr"])}


def crash_job(root, async_=False):
    """Step 2 saved; the save of step 4 loses rank 1: after its shards are written
    (synchronous), or in the middle of the background write (asynchronous)."""
    directory = os.path.join(root, "crash")
    pm, optimizer, scheduler, inputs, target = _build()
    for step in range(1, 5):
        _step(pm, optimizer, scheduler, inputs, target)
        if step == 2:
            autopar.save_checkpoint(pm, directory, optimizer, step=2, scheduler=scheduler, async_=async_)
    if async_ and torch.distributed.get_rank() == 1:
        def dying_write(state, path, rank, process_group=None):
            torch.save({}, os.path.join(path, "half-written"))
            os._exit(3)
        from autopar.engine import checkpoint
        checkpoint.write_state = dying_write
    elif torch.distributed.get_rank() == 1:
        original = checkpoint_dir._barrier
        calls = []

        def dying_barrier():
            calls.append(1)
            if len(calls) == 2:  # the barrier before the commit: the shards are on disk
                os._exit(3)
            original()
        checkpoint_dir._barrier = dying_barrier
    autopar.save_checkpoint(pm, directory, optimizer, step=4, scheduler=scheduler, async_=async_)
    for _ in range(2):  # training goes on while the save writes (and rank 1 dies)
        _step(pm, optimizer, scheduler, inputs, target)
    autopar.wait_checkpoints()
    return "not reached"


def after_crash_job(root):
    """Resume what the crashed run left: step 2, bit for bit the state of 2 steps."""
    pm, optimizer, scheduler, inputs, target = _build()
    for _ in range(2):
        _step(pm, optimizer, scheduler, inputs, target)
    reference, reference_opt = _state(pm, optimizer)
    fresh, optimizer2, scheduler2, _, _ = _build(seed=1)
    found = autopar.resume(fresh, os.path.join(root, "crash"), optimizer2, scheduler=scheduler2)
    resumed, resumed_opt = _state(fresh, optimizer2)
    return {"found": found, "params": [n for n in reference if not torch.equal(reference[n], resumed[n])],
            "optimizer": [n for n in reference_opt if not torch.equal(reference_opt[n], resumed_opt[n])]}


_ROOT = shared_ranks.scratch_dir("resume")
_LAUNCHED = {False: shared_ranks.register(2, __name__, resume_job, (_ROOT,)),
             True: shared_ranks.register(2, __name__ + ":async", resume_job, (_ROOT, True), extended=True)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("async_", [False, pytest.param(True, marks=pytest.mark.extended)],
                         ids=["synchronous", "asynchronous"])
def test_resume_continues_exactly(async_):
    for rank, report in enumerate(_LAUNCHED[async_]()):
        assert report["empty"] is None
        assert report["entries"] == ["step_00000004"]  # keep=1
        assert report["found"] == (4, {"data_position": 16})
        assert report["params"] == [] and report["optimizer"] == [], (rank, report)
        assert report["lr"][0] == report["lr"][1]


@pytest.mark.multiprocess
@pytest.mark.extended  # three launches of their own
@pytest.mark.parametrize("async_", [False, True], ids=["synchronous", "asynchronous"])
def test_a_save_killed_before_its_commit_leaves_the_previous_one(tmp_path, async_):
    results = launch(crash_job, 2, (str(tmp_path), async_), timeout_s=300, return_exceptions=True)
    assert all(isinstance(r, RankFailure) for r in results)  # rank 1 died, rank 0 stopped
    directory = tmp_path / "crash"
    names = sorted(os.listdir(directory))
    assert "step_00000002" in names and ".partial-step_00000004" in names and "step_00000004" not in names
    assert [step for step, _ in checkpoint_dir.complete_entries(directory)] == [2]
    (directory / "step_00000006").mkdir()  # a directory without trainer.pt is no entry
    assert [step for step, _ in checkpoint_dir.complete_entries(directory)] == [2]
    if async_:  # the next run resumes the previous entry, bit for bit
        for report in launch(after_crash_job, 2, (str(tmp_path),), timeout_s=300):
            assert report["found"] == (2, None) and report["params"] == [] and report["optimizer"] == []


def test_names_and_argument_errors(tmp_path):
    assert checkpoint_dir.entry_name(12) == "step_00000012"
    with pytest.raises(ValueError, match="step must be 0 or more"):
        checkpoint_dir.entry_name(-1)
    assert checkpoint_dir.complete_entries(tmp_path / "absent") == []
    with pytest.raises(ValueError, match="give step= as well"):
        autopar.save_checkpoint(None, tmp_path, keep=2)
    with pytest.raises(ValueError, match="keep a whole number of at least 1"):
        checkpoint_dir.save_step(None, tmp_path, step=1, keep=0)
