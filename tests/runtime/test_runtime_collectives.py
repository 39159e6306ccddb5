"""The runtime against single-process math: collectives (forward and backward), vocab-
parallel embedding and cross-entropy, gradient buckets, random draws, the launcher.

Multi-process checks run in real gloo processes through ``launch``. Spawning costs
seconds, so each world size is launched once (shared with other modules' jobs,
tests/shared_ranks.py) and its worker computes every check and returns ``{name:
(parallel, reference)}``; the tests below only compare. The launcher's own failure
paths get a launch each.
"""
from __future__ import annotations

import os
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shared_ranks

from autopar.runtime import (
    GradientBuckets,
    LaunchError,
    all_gather_batch,
    copy_to_tensor_region,
    gather_from_tensor_region,
    get_group,
    group_rank,
    group_size,
    groups_from_mesh,
    init_from_env,
    launch,
    reduce_from_tensor_region,
    registered_groups,
    scatter_to_tensor_region,
    seed_everything,
    set_groups,
    sync_gradients,
    use_groups,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)
from autopar.runtime import rng
from autopar.runtime.groups import clear_groups

TIGHT = dict(rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- worker-side checks


def _chunk(t: torch.Tensor, dim: int, rank: int, parts: int) -> torch.Tensor:
    return t.chunk(parts, dim)[rank].clone()


def _check_f_g_mlp(out: dict, group: str, seed: int) -> None:
    """y = g(gelu(f(x) @ A_r) @ B_r) against the single-device MLP (Megatron §2.3)."""
    size, rank = group_size(group), group_rank(group)
    gen = torch.Generator().manual_seed(seed)
    x_full = torch.randn(4, 6, generator=gen)
    a, b = torch.randn(6, 8, generator=gen), torch.randn(8, 6, generator=gen)
    upstream = torch.randn(4, 6, generator=gen)

    x = x_full.clone().requires_grad_()
    a_shard = _chunk(a, 1, rank, size).requires_grad_()
    b_shard = _chunk(b, 0, rank, size).requires_grad_()
    y = reduce_from_tensor_region(F.gelu(copy_to_tensor_region(x, group) @ a_shard) @ b_shard, group)
    (y * upstream).sum().backward()

    x_ref, a_ref = x_full.clone().requires_grad_(), a.clone().requires_grad_()
    y_ref = F.gelu(x_ref @ a_ref) @ b
    (y_ref * upstream).sum().backward()
    out["mlp_y"] = (y.detach(), y_ref.detach())
    out["mlp_x_grad"] = (x.grad, x_ref.grad)
    out["mlp_a_grad"] = (a_shard.grad, _chunk(a_ref.grad, 1, rank, size))


def _check_backward_after_use_groups(out: dict, group: str) -> None:
    """A collective keeps its group for backward, even once the registry has changed."""
    x = torch.ones(3, requires_grad=True)
    with use_groups({"borrowed": get_group(group)}):
        y = copy_to_tensor_region(x, "borrowed") * (group_rank("borrowed") + 1)
    y.sum().backward()  # outside the block: "borrowed" is no longer registered
    size = group_size(group)
    out["gather_after_use_groups_grad"] = (x.grad, torch.full((3,), size * (size + 1) / 2))


def _check_gather_scatter(out: dict, group: str) -> None:
    size, rank = group_size(group), group_rank(group)
    full = torch.arange(4.0 * 3 * size).reshape(4, 3 * size)
    weights = torch.linspace(-1, 1, full.numel()).reshape(full.shape)

    local = _chunk(full, 1, rank, size).requires_grad_()
    gathered = gather_from_tensor_region(local, -1, group)
    (gathered * weights).sum().backward()
    out["gather_value"] = (gathered.detach(), full)
    out["gather_grad"] = (local.grad, _chunk(weights, 1, rank, size))

    whole = full.clone().requires_grad_()
    mine = scatter_to_tensor_region(whole, 1, group)
    (mine * _chunk(weights, 1, rank, size)).sum().backward()
    out["scatter_value"] = (mine.detach(), _chunk(full, 1, rank, size))
    out["scatter_grad"] = (whole.grad, weights)  # the ranks' chunks, all-gathered

    rows = _chunk(full, 0, rank, size) if full.shape[0] % size == 0 else full
    out["all_gather_batch"] = (all_gather_batch(rows, group), full)


def _cross_entropy_case(out, name, group, full_logits, target, padded_to=None, **kw):
    """Compare loss and logits gradient with F.cross_entropy on the unpadded logits."""
    size, rank = group_size(group), group_rank(group)
    vocab = full_logits.shape[-1]
    padded = full_logits
    if padded_to is not None:
        padding = torch.full((*full_logits.shape[:-1], padded_to - vocab), 1e4)
        padded = torch.cat([full_logits, padding], -1)  # huge logits that must be masked out
    shard = _chunk(padded, -1, rank, size).requires_grad_()
    start = rank * shard.shape[-1]
    loss = vocab_parallel_cross_entropy(
        shard, target, start, group, vocab_size=vocab if padded_to else None, **kw
    )
    upstream = torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape)
    (loss * upstream).sum().backward()

    ref_logits = full_logits.clone().requires_grad_()
    flat = ref_logits.reshape(-1, vocab)
    ref = F.cross_entropy(flat, target.reshape(-1), **kw)
    if kw.get("reduction") == "none":
        ref = ref.reshape(target.shape)
    (ref * upstream).sum().backward()
    ref_grad = ref_logits.grad
    if padded_to is not None:
        ref_grad = torch.cat([ref_grad, torch.zeros(padding.shape)], -1)
    out[f"ce_{name}_loss"] = (loss.detach(), ref.detach())
    out[f"ce_{name}_grad"] = (shard.grad, _chunk(ref_grad, -1, rank, size))


def _check_cross_entropy(out: dict, group: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    vocab = 4 * group_size(group)
    logits = torch.randn(6, vocab, generator=gen) * 3
    target = torch.randint(0, vocab, (6,), generator=gen)
    target[2] = -100
    for reduction in ("mean", "sum", "none"):
        _cross_entropy_case(out, reduction, group, logits, target, reduction=reduction)
    odd_ignore = target.clone()
    odd_ignore[0], odd_ignore[2] = 3, 1  # ignore_index inside rank 0's vocabulary range
    _cross_entropy_case(out, "ignore3", group, logits, odd_ignore, ignore_index=3)
    logits3 = torch.randn(2, 3, vocab, generator=gen)
    target3 = torch.randint(0, vocab, (2, 3), generator=gen)
    target3[1, 0] = -100
    _cross_entropy_case(out, "3d", group, logits3, target3)
    _cross_entropy_case(out, "3d_none", group, logits3, target3, reduction="none")
    # Padded vocabulary: vocab - 3 real entries, padded to `vocab` (the last shard may be all padding).
    real = vocab - 3
    _cross_entropy_case(out, "padded", group, logits3[..., :real], target3.clamp(max=real - 1), padded_to=vocab)


def _check_embedding(out: dict, group: str, seed: int) -> None:
    size, rank = group_size(group), group_rank(group)
    gen = torch.Generator().manual_seed(seed)
    vocab, padding_idx = 3 * size, 3 * size - 2
    weight = torch.randn(vocab, 4, generator=gen)
    ids = torch.tensor([[0, vocab - 1, padding_idx], [1, 1, vocab // 2]])
    upstream = torch.randn(2, 3, 4, generator=gen)
    shard = _chunk(weight, 0, rank, size).requires_grad_()
    y = vocab_parallel_embedding(ids, shard, rank * shard.shape[0], group, padding_idx=padding_idx)
    (y * upstream).sum().backward()
    ref_weight = weight.clone().requires_grad_()
    y_ref = F.embedding(ids, ref_weight, padding_idx=padding_idx)
    (y_ref * upstream).sum().backward()
    out["embedding_value"] = (y.detach(), y_ref.detach())
    out["embedding_grad"] = (shard.grad, _chunk(ref_weight.grad, 0, rank, size))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(5, 7)
        self.second = torch.nn.Linear(7, 3)
        self.sometimes = torch.nn.Linear(3, 3)  # used on data rank 1 only
        self.never = torch.nn.Linear(3, 2)  # used on no rank

    def forward(self, x, use_sometimes: bool):
        y = self.second(torch.tanh(self.first(x)))
        return self.sometimes(y) if use_sometimes else y


def _check_gradient_buckets(out: dict, group: str) -> None:
    """Bucketed+overlapped, flat, and manual averages agree over two steps and with accumulation."""
    rank, size = group_rank(group), group_size(group)
    torch.manual_seed(0)
    nets = [_Net() for _ in range(3)]
    for net in nets[1:]:
        net.load_state_dict(nets[0].state_dict())
    bucketed, flat, manual = nets
    buckets = GradientBuckets(list(bucketed.parameters()), group, bucket_bytes=64)
    # Reverse order, 64-byte buckets: [never.*, sometimes.bias] [sometimes.weight,
    # second.bias] [second.weight] [first.bias] [first.weight].
    out["bucket_count"] = (torch.tensor(len(buckets.buckets)), torch.tensor(5))

    def microbatch(step, micro):
        gen = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
        return torch.randn(4, 5, generator=gen)

    for step, micro_count in ((0, 1), (1, 1), (2, 3)):
        for net in nets:
            net.zero_grad(set_to_none=True)
        for micro in range(micro_count):
            x, use = microbatch(step, micro), rank % 2 == 1
            buckets.enabled = micro == micro_count - 1
            for net in nets:
                net(x, use).square().sum().backward()
        buckets.finish()
        # each gradient is held once: as its slot of its bucket's buffer
        in_buffer = all(p.grad.untyped_storage().data_ptr() == buckets._bucket_of[id(p)].buffer.untyped_storage()
                        .data_ptr() for p in bucketed.parameters())
        out[f"grads_in_buckets_step{step}"] = (torch.tensor(in_buffer), torch.tensor(True))
        sync_gradients(list(flat.parameters()), group)
        for name, p in manual.named_parameters():
            local = p.grad if p.grad is not None else torch.zeros_like(p)
            everyone = [torch.empty_like(local) for _ in range(size)]
            dist.all_gather(everyone, local, group=get_group(group))
            average = torch.stack(everyone).mean(0)
            # a bucketed gradient is a view of its bucket, which the next step overwrites
            got = dict(bucketed.named_parameters())[name].grad.clone()
            out[f"buckets_step{step}_{name}"] = (got, average)
            out[f"flat_step{step}_{name}"] = (dict(flat.named_parameters())[name].grad, average)


def _check_bucket_overlap_and_misuse(out: dict, group: str) -> None:
    """With every parameter used, all buckets are in flight before finish(); a second
    backward with the hooks enabled is refused."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    buckets = GradientBuckets(list(net.parameters()), group, bucket_bytes=64)
    x = torch.randn(3, 5) + group_rank(group)
    net(x).sum().backward()
    launched = buckets.launched_buckets
    buckets.finish()
    out["bucket_overlap_launched"] = (torch.tensor(launched), torch.tensor(len(buckets.buckets)))
    net(x).sum().backward()
    try:
        net(x).sum().backward()
        refused = False
    except RuntimeError as error:
        refused = "buckets.enabled = False" in str(error)
    buckets.finish()
    out["bucket_second_backward_refused"] = (torch.tensor(refused), torch.tensor(True))


def _dropout_masks(group: str) -> dict:
    """A dropout of a value whole on every rank of ``group`` and of one split over it (this
    rank's part), and the whole value's mask the split one is a part of."""
    ones, n = torch.ones(64), group_size(group)
    return {
        "replicated": rng.dropout(ones, 0.5, True, 1, (None,)),
        "split": rng.dropout(ones, 0.5, True, 2, (("split", group),)),
        "whole": rng.dropout(torch.ones(64 * n), 0.5, True, 2, (None,)),
        "eval": rng.dropout(ones, 0.5, False, 1, (None,)),
    }


def _check_dropout(out: dict, tensor_group: str, data_group: str | None) -> None:
    seed_everything(1234)
    first = _dropout_masks(tensor_group)
    seed_everything(1234)
    again = _dropout_masks(tensor_group)
    out["dropout_reproducible"] = (again["replicated"], first["replicated"])
    out["dropout_split_reproducible"] = (again["split"], first["split"])
    r = group_rank(tensor_group)
    out["dropout_split_is_its_part"] = (first["split"], first["whole"][r * 64:(r + 1) * 64])
    out["dropout_masks"] = {k: v for k, v in first.items()}


def worker_world2() -> dict:
    out: dict = {"init_from_env": init_from_env()}
    set_groups({"tensor": dist.group.WORLD})
    _check_f_g_mlp(out, "tensor", seed=1)
    _check_gather_scatter(out, "tensor")
    _check_backward_after_use_groups(out, "tensor")
    _check_cross_entropy(out, "tensor", seed=2)
    _check_embedding(out, "tensor", seed=3)
    _check_gradient_buckets(out, "tensor")
    _check_bucket_overlap_and_misuse(out, "tensor")
    _check_dropout(out, "tensor", None)
    return out


def worker_world4() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "tensor"))
    set_groups({**groups_from_mesh(mesh), "world": dist.group.WORLD})
    out: dict = {"coords": (group_rank("data"), group_rank("tensor"), group_size("data"), group_size("tensor"))}
    _check_f_g_mlp(out, "tensor", seed=10 + group_rank("data"))  # each replica its own data
    _check_gather_scatter(out, "tensor")
    _check_cross_entropy(out, "world", seed=4)
    _check_embedding(out, "world", seed=5)
    _check_gradient_buckets(out, "data")
    _check_bucket_overlap_and_misuse(out, "data")
    _check_dropout(out, "tensor", "data")
    return out


# ---------------------------------------------------------------- fixtures and tests


# one launch per world size, shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = {2: shared_ranks.register(2, __name__, worker_world2, timeout_s=60),
             4: shared_ranks.register(4, __name__, worker_world4, timeout_s=60)}


@pytest.fixture(scope="module")
def world2():
    return _LAUNCHED[2]()


@pytest.fixture(scope="module")
def world4():
    return _LAUNCHED[4]()


def _compared(results: list[dict], prefix: str):
    names = sorted(k for k in results[0] if k.startswith(prefix))
    assert names, f"no check named {prefix}*"
    for rank, checks in enumerate(results):
        for name in names:
            yield rank, name, checks[name]


CHECK_PREFIXES = ["mlp_", "gather_", "scatter_", "all_gather_batch", "ce_", "embedding_",
                  "bucket", "flat_", "grads_in_buckets", "dropout_reproducible", "dropout_split_"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("prefix", CHECK_PREFIXES)
@pytest.mark.parametrize("world", ["world2", "world4"])
def test_matches_single_device(world, prefix, request):
    for rank, name, (parallel, reference) in _compared(request.getfixturevalue(world), prefix):
        torch.testing.assert_close(parallel, reference, **TIGHT, msg=lambda m: f"rank {rank} {name}: {m}")


@pytest.mark.multiprocess
def test_launch_returns_in_rank_order(world2, world4):
    assert [r["init_from_env"] for r in world2] == [(0, 2), (1, 2)]
    assert [r["coords"] for r in world4] == [(0, 0, 2, 2), (0, 1, 2, 2), (1, 0, 2, 2), (1, 1, 2, 2)]


@pytest.mark.multiprocess
def test_dropout_draws_world2(world2):
    first, second = (r["dropout_masks"] for r in world2)
    assert torch.equal(first["replicated"], second["replicated"])     # a whole value: the same on every rank
    assert not torch.equal(first["split"], second["split"])           # a split one: each rank its part
    assert torch.equal(first["whole"], second["whole"])
    assert torch.equal(first["eval"], torch.ones(64))
    assert set(first["replicated"].unique().tolist()) == {0.0, 2.0}


@pytest.mark.multiprocess
def test_dropout_draws_world4(world4):
    masks = {r["coords"][:2]: r["dropout_masks"] for r in world4}
    for data in (0, 1):  # the data ranks draw the same: the draws do not depend on the rank
        assert torch.equal(masks[data, 0]["replicated"], masks[data, 1]["replicated"])
        assert torch.equal(masks[0, data]["split"], masks[1, data]["split"])
    assert not torch.equal(masks[0, 0]["split"], masks[0, 1]["split"])


def fail_on_rank_1(marker: str):
    if dist.get_rank() == 1:
        raise ValueError("rank one fails on purpose")
    # rank 0 goes on long after rank 1 failed (as one stuck in a collective would, until
    # the timeout): launch must stop it, not wait for it
    time.sleep(120)
    open(marker, "w").close()


def sleep_on_rank_0(marker: str):
    if dist.get_rank() == 0:
        time.sleep(120)  # far past launch's timeout: a hang, unless launch ignores its deadline
        open(marker, "w").close()


def write_pid_and_wait(directory: str):
    with open(os.path.join(directory, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


_LAUNCHER_SCRIPT = """
import sys
sys.path[:0] = {tests!r}
from autopar.runtime.launcher import launch
import test_runtime_collectives as t
launch(t.write_pid_and_wait, 2, ({directory!r},), timeout_s=300)
"""


@pytest.mark.extended   # 30 s of a killed launcher's ranks ending (make test-extended, CI)
@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    """A launcher killed outright (no chance to reap its ranks) leaves no rank running."""
    import signal
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    tests = [here, os.path.dirname(here)]   # this module's folder, and tests/ with the helpers it imports
    parent = subprocess.Popen([sys.executable, "-c", _LAUNCHER_SCRIPT.format(tests=tests, directory=str(tmp_path))])
    try:
        pids = []
        for _ in range(1200):  # the ranks start (importing torch) and write their pids
            pids = [int(f.read_text()) for f in tmp_path.glob("rank*.pid") if f.read_text()]
            if len(pids) == 2 or parent.poll() is not None:
                break
            time.sleep(0.1)
        assert len(pids) == 2, parent.poll()
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        alive = pids
        for _ in range(300):
            alive = [pid for pid in pids if _running(pid)]
            if not alive:
                break
            time.sleep(0.1)
        assert not alive, f"ranks {alive} outlived their launcher"
    finally:
        if parent.poll() is None:
            parent.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def exit_on_rank_0():
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def _rank_processes(job) -> list[str]:
    """The ranks of this process's launches of ``job`` still alive (the shared worlds of
    tests/shared_ranks.py may be running beside)."""
    import multiprocessing
    return [p.name for p in multiprocessing.active_children()
            if p.name.startswith("autopar-rank") and p.name.endswith(f"-{job.__name__}")]


@pytest.mark.multiprocess
def test_launch_error_names_rank_and_traceback(tmp_path):
    marker = tmp_path / "rank-0-finished"
    with pytest.raises(LaunchError, match="rank 1") as error:
        launch(fail_on_rank_1, 2, (str(marker),), timeout_s=60)
    assert "ValueError: rank one fails on purpose" in str(error.value)
    assert "fail_on_rank_1" in str(error.value)  # the traceback, not only the message
    # rank 0 was stopped when rank 1 failed: it is gone and never finished its sleep
    assert _rank_processes(fail_on_rank_1) == [] and not marker.exists()


@pytest.mark.multiprocess
def test_launch_kills_a_hang_after_timeout(tmp_path):
    marker = tmp_path / "rank-0-finished"
    # a rank still starting at the deadline is listed too (a busy machine)
    with pytest.raises(LaunchError, match=r"timed out after 4s; ranks still running: \[0[],]"):
        launch(sleep_on_rank_0, 2, (str(marker),), timeout_s=4)
    assert _rank_processes(sleep_on_rank_0) == [] and not marker.exists()


@pytest.mark.multiprocess
def test_launch_reports_a_rank_that_dies_silently():
    with pytest.raises(LaunchError, match="rank 0 exited with code 3"):
        launch(exit_on_rank_0, 2, timeout_s=60)


# ---------------------------------------------------------------- single process


@pytest.fixture
def size_one_groups():
    with use_groups({"tensor": None, "data": None}):
        yield


def test_group_registry_and_use_groups():
    with use_groups({}):  # leaves the registry as other tests had it
        with pytest.raises(KeyError, match="no process group named 'tensor'"):
            get_group("tensor")
        set_groups({"outer": None})
        with use_groups({"tensor": None}):
            assert registered_groups() == {"tensor": None}
            assert (group_size("tensor"), group_rank("tensor")) == (1, 0)
        assert registered_groups() == {"outer": None}
        clear_groups()
        assert registered_groups() == {}


def test_size_one_collectives_are_identity(size_one_groups):
    x = torch.randn(3, 4, requires_grad=True)
    for y in (copy_to_tensor_region(x, "tensor"), reduce_from_tensor_region(x, "tensor"),
              gather_from_tensor_region(x, 1, "tensor"), scatter_to_tensor_region(x, 0, "tensor"),
              all_gather_batch(x, "data")):
        assert y is x
    weight = torch.randn(5, 2)
    ids = torch.tensor([0, 4, 2])
    assert torch.equal(vocab_parallel_embedding(ids, weight, 0, "tensor"), F.embedding(ids, weight))


def test_size_one_cross_entropy_matches_torch(size_one_groups):
    out: dict = {}
    _check_cross_entropy(out, "tensor", seed=7)
    for name, (got, expected) in out.items():
        torch.testing.assert_close(got, expected, **TIGHT, msg=lambda m: f"{name}: {m}")


def test_cross_entropy_keeps_dtype_and_second_backward(size_one_groups):
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 5, 2, -100])
    loss = vocab_parallel_cross_entropy(logits, target, 0, "tensor")
    assert loss.dtype == torch.float64
    loss.backward(retain_graph=True)
    first = logits.grad.clone()
    loss.backward()
    torch.testing.assert_close(logits.grad, 2 * first)


def test_cross_entropy_all_ignored_like_torch(size_one_groups):
    logits = torch.randn(3, 4, requires_grad=True)
    loss = vocab_parallel_cross_entropy(logits, torch.full((3,), -100), 0, "tensor")
    loss.backward()
    assert loss.isnan() and torch.equal(logits.grad, torch.zeros(3, 4))


def test_size_one_buckets_and_dropout_reproducible(size_one_groups):
    p = torch.nn.Parameter(torch.ones(3))
    buckets = GradientBuckets([p], "data")
    (p * 2).sum().backward()
    buckets.finish()
    sync_gradients([p], "data")
    assert torch.equal(p.grad, torch.full((3,), 2.0))
    seed_everything(5)
    first = rng.dropout(torch.ones(32), 0.3, True, 0, (("split", "tensor"),))
    seed_everything(5)
    assert torch.equal(rng.dropout(torch.ones(32), 0.3, True, 0, (("split", "tensor"),)), first)


def test_init_from_env_single_rank(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this test process")
    try:
        assert init_from_env("gloo") == (0, 1)
        assert init_from_env() == (0, 1)  # already initialised: only reports
    finally:
        dist.destroy_process_group()
