"""Planning is a pure function of what every rank agrees on: the model, the example
inputs, the strategy, the world and the hardware.

``compile`` plans on every rank independently and then checks that the plans are equal
(``ranks planned differently`` otherwise), so anything else that reaches a plan fails a
user's job at random. Checked here:

* processes with different ``PYTHONHASHSEED`` (set and string-keyed dict orders) plan the
  examples byte-identically: a 3D-capable transformer (3D grids, cubes and pipelines
  weighed), a forced 3D grid, and a Hugging Face GPT-2 captured by ``torch.export`` in a
  2-stage pipeline (its microbatches and schedule searched); each priced with this
  machine's cached profile while another thread rewrites that profile (``save_profile``:
  atomic, so a reader sees the old file or the new one, never a torn one), and the
  transformer again with the same profile passed as a ``Hardware`` whose measured
  figures are inserted in a shuffled order;
* ranks whose caches differ (another node's cache, or ``autopar calibrate`` writing the
  profile while the ranks start: some see it, some do not) plan with the first rank's
  hardware, on 2 gloo ranks. Before that, each rank priced with its own cache and the
  ranks failed with ``ranks [1] planned differently``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import threading

import pytest

import shared_ranks
from autopar.cost import profiles
from autopar.cost.hardware import PRESETS, Hardware

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(order_seed: int | None = None) -> Hardware:
    """A calibrated-looking profile (collective fits, a measured table, overhead terms)
    that prices differently from the preset; ``order_seed``: its measured figures
    inserted in a shuffled order (the same figures)."""
    fits = {name: {str(g): [2e-5 * g, 8e8 / g] for g in (2, 4, 8)}
            for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")}
    fits["send"] = {"2": [3e-5, 9e8]}
    table = {"all_reduce": {str(g): [[float(m), 2e-5 * g + m / 8e8] for m in (1e3, 1e5, 1e7)] for g in (2, 4, 8)}}
    measured = {**fits, "table": table}
    if order_seed is not None:
        rng = random.Random(order_seed)

        def shuffled(d):  # (a table's points stay sorted by size, as Hardware.from_json has them)
            items = list(d.items())
            rng.shuffle(items)
            return {k: shuffled(v) if isinstance(v, dict) else v for k, v in items}
        measured = shuffled(measured)
    return dataclasses.replace(PRESETS["cpu-gloo"], name="determinism-profile", peak_flops=1.5e11,
                               host_op_s=4e-6, collective_call_s=2e-5, step_overhead_s=1e-4, measured=measured)


# ------------------------------------------------------------ across processes and hash seeds
_PLANS = r"""
import json, random, sys
sys.path.insert(0, {repo!r})
import torch, autopar
from examples.factories import training_case
from test_plan_determinism import _profile

CASES = [("transformer", 8, "auto", None), ("transformer", 8, {{"x": 2, "y": 2, "z": 2}}, None),
         ("gpt2", 4, {{"pipeline": 2}}, 4)]

def plans(hardware, cases=CASES):
    out = {{}}
    for name, world, strategy, layers in cases:
        factory, inputs, target, loss = training_case(name, layers=layers)
        torch.manual_seed(0)
        plan = autopar.plan(factory(), world, inputs, loss, strategy, example_target=target, hardware=hardware)
        out[f"{{name}} {{world}} {{strategy}}"] = plan.to_json()
    return out

cached = [plans(None), plans(None, CASES[:2])]  # the cached profile, read while it is rewritten
given = plans(_profile(order_seed={seed}), CASES[:1])  # the same figures, inserted in another order
print(json.dumps({{"cached": cached, "given": given}}))
"""


def test_processes_with_other_hash_seeds_plan_alike_while_the_profile_is_rewritten(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    env = {**os.environ, "AUTOPAR_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])}
    # save_profile writes where the processes read; this process's environment stays as it
    # is (ranks the suite starts meanwhile inherit it)
    monkeypatch.setattr(profiles, "cache_dir", lambda: cache)
    profiles.save_profile(_profile(), "gloo")
    stop, writes = threading.Event(), [0]

    def rewrite():  # the same profile over and over, its figures inserted in a new order each time
        while not stop.is_set():
            profiles.save_profile(_profile(order_seed=writes[0]), "gloo")
            writes[0] += 1

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        procs = [subprocess.Popen([sys.executable, "-c", _PLANS.format(repo=REPO, seed=seed)], env={
            **env, "PYTHONHASHSEED": str(seed)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed in (1, 2)]
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        stop.set()
        writer.join()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert writes[0] > 10  # the profile was rewritten while the processes read it
    results = [json.loads(out) for out, _ in outs]
    reference = results[0]["cached"][0]
    assert list(reference) == ["transformer 8 auto", "transformer 8 {'x': 2, 'y': 2, 'z': 2}",
                               "gpt2 4 {'pipeline': 2}"]
    for result in results:
        for plans in result["cached"]:
            assert plans == {key: reference[key] for key in plans}  # byte-identical, every read of the profile whole
        for key, text in result["given"].items():
            # the profile given as a Hardware: the same plan, only its source says "given"
            assert json.loads(text) == {**json.loads(reference[key]), "hardware_source": "given"}
    for key, text in reference.items():
        plan = json.loads(text)
        assert plan["hardware"] == "determinism-profile", key
        assert plan["hardware_source"].startswith("this machine's calibrated profile"), key
    assert json.loads(reference["gpt2 4 {'pipeline': 2}"])["mesh"].get("pipeline", 1) > 1  # a pipeline plan
    weighed = {(c["form"].split(" ")[0], "x" in c["mesh"], "pipeline" in c["mesh"])
               for c in json.loads(reference["transformer 8 auto"])["candidates"]}
    assert {("", True, False), ("cube", True, False), ("pipeline", False, True)} <= weighed  # 3D, cube, pipeline


# ------------------------------------------------------------ ranks whose caches differ
def caches_differ_job(root):
    """On 2 ranks: only one rank has a cached profile (rank 1, then rank 0); compile
    prices with rank 0's hardware on both and the plans agree."""
    import torch
    import torch.distributed as dist

    import autopar
    from examples.factories import training_case

    rank = dist.get_rank()
    out = {}
    for holder in (1, 0):
        cache = os.path.join(root, f"holder{holder}", f"rank{rank}")
        os.environ[profiles.CACHE_ENV] = cache  # this rank's machine, as it were
        if rank == holder:
            profiles.save_profile(_profile(), "gloo")
        factory, inputs, target, loss = training_case("mlp")
        torch.manual_seed(0)
        try:
            pm = autopar.compile(factory(), None, inputs, loss, "auto", example_target=target)
            out[holder] = {"plan": pm.plan.to_json(), "hardware": pm.plan.hardware,
                           "source": pm.plan.hardware_source}
        except Exception as error:  # noqa: BLE001 - what the test reports
            out[holder] = {"error": f"{type(error).__name__}: {error}"}
    return out


_LAUNCHED = shared_ranks.register(2, __name__, caches_differ_job, (shared_ranks.scratch_dir("determinism"),))


@pytest.mark.multiprocess
@pytest.mark.parametrize("holder", [1, 0])
def test_ranks_with_different_cached_profiles_plan_alike_with_the_first_ranks(holder):
    reports = [per_rank[holder] for per_rank in _LAUNCHED()]
    for rank, report in enumerate(reports):
        assert "error" not in report, f"rank {rank}: {report['error']}"
    assert reports[0]["plan"] == reports[1]["plan"]
    if holder == 0:  # rank 0 has the profile: both price with it
        assert [r["hardware"] for r in reports] == ["determinism-profile"] * 2
        assert all(r["source"].startswith("this machine's calibrated profile") for r in reports)
    else:  # rank 0 has none: both price with the preset, whatever rank 1's cache holds
        assert [r["hardware"] for r in reports] == ["cpu-gloo"] * 2
        assert all(r["source"].startswith("default preset; no calibrated profile") for r in reports)
