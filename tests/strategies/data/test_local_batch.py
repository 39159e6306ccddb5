"""Each rank loads only its share: ``compile(..., batch="local")``, ``pm.data_parallel_rank``
/ ``data_parallel_size`` and ``autopar.data`` (sampler, shard, local_rows).

On 4 gloo ranks under data, tensor x data and pipeline x data plans: the first steps'
losses with each rank given its share equal those of the global-batch form, and a
``DataLoader`` over ``autopar.data.sampler`` feeds every row exactly once per epoch
across the shares, the ranks of one share the same rows.
"""
from __future__ import annotations

import pytest
import torch

import autopar
import shared_ranks

ROWS = 48  # the data set's rows: 6 global batches of 8

CASES = [{"tensor": 2, "data": 2}]
EXTENDED = [{"data": 4}, {"pipeline": 2, "data": 2, "microbatches": 2}]


def local_job(cases):
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    from examples.factories import training_case
    out = []
    for strategy in cases:
        factory, inputs, target, loss = training_case("gpt2", batch=8)
        ids = inputs[0]
        sides = {}
        for form in ("global", "local"):
            torch.manual_seed(0)
            pm = autopar.compile(factory(), None, inputs, loss, strategy, example_target=target, batch=form)
            optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2)
            losses = []
            for _ in range(3):
                optimizer.zero_grad()
                if form == "global":
                    losses.append(pm.step(ids, target=target).item())
                else:
                    losses.append(pm.step(autopar.data.local_rows(pm, ids),
                                          target=autopar.data.local_rows(pm, target)).item())
                optimizer.step()
            sides[form] = (pm, losses)
        pm = sides["local"][0]
        dataset = TensorDataset(torch.arange(ROWS))
        sampler = autopar.data.sampler(pm, dataset, seed=3)
        loader = DataLoader(dataset, batch_size=8 // pm.data_parallel_size, sampler=sampler, drop_last=True)
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([row for (batch,) in loader for row in batch.tolist()])
        streamed = list(autopar.data.shard(pm, iter(range(ROWS))))
        # only what has the batch's rows is cut; a [heads, T, T] bias stays whole
        cut = autopar.data.local_rows(pm, {"ids": torch.arange(16).view(8, 2), "bias": torch.zeros(3, 2, 2)})
        try:
            autopar.data.local_rows(pm, torch.zeros(5, 2))
            odd = "cut"
        except ValueError as e:
            odd = str(e)
        out.append({"losses": (sides["global"][1], sides["local"][1]), "share": pm.data_parallel_rank,
                    "shares": pm.data_parallel_size, "epochs": epochs, "streamed": streamed,
                    "reads": (pm.reads_inputs, pm.reads_target), "rank": dist.get_rank(),
                    "cut": (cut["ids"][:, 0].tolist(), tuple(cut["bias"].shape)), "odd": odd})
    return out


_LAUNCHED = shared_ranks.register(4, __name__, local_job, (CASES,))
_EXTENDED = shared_ranks.register(4, __name__ + ":extended", local_job, (EXTENDED,), extended=True)


def _check(strategy, reports):
    shares = reports[0]["shares"]
    assert shares == strategy.get("data", 1)
    for report in reports:
        global_losses, local_losses = report["losses"]
        assert local_losses == pytest.approx(global_losses, rel=1e-6, abs=1e-7), (strategy, report["rank"])
    by_share: dict[int, list] = {}
    for report in reports:
        by_share.setdefault(report["share"], []).append(report)
    assert sorted(by_share) == list(range(shares))
    for epoch in range(2):
        for share, members in by_share.items():  # the ranks of one share read the same rows
            assert all(m["epochs"][epoch] == members[0]["epochs"][epoch] for m in members), (strategy, share)
        rows = [row for members in by_share.values() for row in members[0]["epochs"][epoch]]
        assert sorted(rows) == list(range(ROWS)), (strategy, epoch)  # every row once per epoch
        assert len(members[0]["epochs"][epoch]) == ROWS // shares  # each share read only its own
    streamed = [row for members in by_share.values() for row in members[0]["streamed"]]
    assert sorted(streamed) == list(range(ROWS))
    for r in reports:
        assert r["cut"] == ([2 * i for i in range(8)][r["share"] * 8 // shares:(r["share"] + 1) * 8 // shares],
                            (3, 2, 2)), r["cut"]
        assert r["odd"] == f"local_rows: a batch of 5 rows does not split into {shares} equal shares" or shares == 1
    if "pipeline" in strategy:  # the first stage reads the inputs, the last the targets and the labels among them
        assert {r["reads"] for r in reports} == {(True, False), (True, True)}
    else:
        assert all(r["reads"] == (True, True) for r in reports)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_each_rank_given_its_share_trains_as_the_global_batch_does(index):
    _check(CASES[index], [reports[index] for reports in _LAUNCHED()])


@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)))
def test_each_rank_given_its_share_under_data_and_pipeline_plans(index):
    _check(EXTENDED[index], [reports[index] for reports in _EXTENDED()])


def test_bad_batch_forms_are_named():
    from examples.factories import training_case
    factory, inputs, target, loss = training_case("gpt2")
    with pytest.raises(ValueError, match="batch='locale'"):
        autopar.compile(factory(), None, inputs, loss, example_target=target, batch="locale")
    pm = autopar.compile(factory(), None, inputs, loss, example_target=target, batch="local")
    assert (pm.data_parallel_rank, pm.data_parallel_size, pm.reads_inputs, pm.reads_target) == (0, 1, True, True)
    scalar = torch.tensor(0.5)  # no rows: kept whole, as the global form keeps it
    assert autopar.data.local_rows(pm, (scalar, torch.zeros(4, 2)))[0] is scalar

