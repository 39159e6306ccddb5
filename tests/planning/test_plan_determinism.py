"""Planning is a pure function of what every rank agrees on: the model, the example
inputs, the strategy, the world and the hardware; and ``compile`` runs one plan on every
rank by construction: rank 0 plans and broadcasts its plan, which every other rank checks
against its own capture (as a reviewed plan) and runs. Checked here:

* processes with different ``PYTHONHASHSEED`` (set and string-keyed dict orders) and
  differently laid out memory (the order of sets of objects) plan the examples
  byte-identically: a 3D-capable transformer (3D grids, cubes and pipelines weighed), a
  forced 3D grid, a Hugging Face GPT-2 captured by ``torch.export`` in a 2-stage
  pipeline (its microbatches and schedule searched), and Hugging Face Llama 4 (routed
  experts, context parallelism weighed), Whisper (an encoder-decoder) and CLIP (rows of
  the batch meeting) on 4 ranks under ``"auto"``; each priced with this
  machine's cached profile while another thread rewrites that profile (``save_profile``:
  atomic, so a reader sees the old file or the new one, never a torn one), and the
  transformer again with the same profile passed as a ``Hardware`` whose measured
  figures are inserted in a shuffled order;
* on 2 gloo ranks, a rank 1 that would plan differently (its planner replaced by one
  that fails) runs rank 0's plan;
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
import torch

import shared_ranks
from autopar.cost import profiles
from autopar.cost.hardware import PRESETS, Hardware

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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

from test_plan_determinism import hf_cases
_junk = [object() for _ in range({seed} * 7919)]  # another memory layout: other orders of sets of objects

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

def hf_plans():
    out = {{}}
    for name, (factory, kwargs) in hf_cases().items():
        with torch.device("meta"):
            model = factory()
        out[name] = autopar.plan(model, 4, example_kwargs=kwargs, hardware="cpu-gloo").to_json()
    return out

cached = [plans(None), plans(None, CASES[:2])]  # the cached profile, read while it is rewritten
given = plans(_profile(order_seed={seed}), CASES[:1])  # the same figures, inserted in another order
print(json.dumps({{"cached": cached, "given": given, "hf": hf_plans()}}))
"""


def hf_cases() -> dict:
    """Hugging Face models (small configurations) planned on 4 ranks under "auto": routed
    experts, an encoder-decoder, a contrastive model; each with its own loss."""
    import transformers as T
    ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(0))

    def llama4():
        return T.Llama4ForCausalLM(T.Llama4TextConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
            max_position_embeddings=32))

    def whisper():
        return T.WhisperForConditionalGeneration(T.WhisperConfig(
            vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=8, max_target_positions=16, pad_token_id=0, decoder_start_token_id=1))

    def clip():
        return T.CLIPModel(T.CLIPConfig(
            text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, max_position_embeddings=16),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                               image_size=16, patch_size=8)))

    return {"llama4": (llama4, {"input_ids": ids, "labels": ids}),
            "whisper": (whisper, {"input_features": torch.randn(4, 8, 16), "labels": ids[:4, :6]}),
            "clip": (clip, {"input_ids": ids, "pixel_values": torch.randn(8, 3, 16, 16), "return_loss": True})}


@pytest.mark.extended  # fresh processes, about 20 s: the extended suite (test_planner_search's cross-process case runs in both)
def test_processes_with_other_hash_seeds_plan_alike_while_the_profile_is_rewritten(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    env = {**os.environ, "AUTOPAR_CACHE_DIR": str(cache)}  # PYTHONPATH: tests/conftest.py
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
    assert sorted(results[0]["hf"]) == ["clip", "llama4", "whisper"]
    assert all(result["hf"] == results[0]["hf"] for result in results)


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


def rank_0_plans_job():
    """On 2 ranks: rank 1's planner fails if called; compile runs rank 0's plan on both."""
    import torch.distributed as dist

    import autopar
    from autopar import agreement
    from examples.factories import training_case

    def not_here(*args, **kwargs):
        raise AssertionError(f"rank {dist.get_rank()} planned")
    planner = agreement.plan_graph
    if dist.get_rank() == 1:
        agreement.plan_graph = not_here
    factory, inputs, target, loss = training_case("mlp")
    torch.manual_seed(0)
    try:
        pm = autopar.compile(factory(), None, inputs, loss, "auto", example_target=target)
        return {"plan": pm.plan.to_json(), "loss": float(pm.step(*inputs, target=target))}
    except Exception as error:  # noqa: BLE001 - what the test reports
        return {"error": f"{type(error).__name__}: {error}"}
    finally:   # the jobs after this one on these ranks plan as usual
        agreement.plan_graph = planner


_LAUNCHED = shared_ranks.register(2, __name__, caches_differ_job, (shared_ranks.scratch_dir("determinism"),))
_RANK_0 = shared_ranks.register(2, __name__ + ":rank0", rank_0_plans_job)


@pytest.mark.multiprocess
def test_the_other_ranks_run_rank_0s_plan_without_planning():
    reports = _RANK_0()
    for rank, report in enumerate(reports):
        assert "error" not in report, f"rank {rank}: {report['error']}"
    assert reports[0]["plan"] == reports[1]["plan"] and reports[0]["loss"] == reports[1]["loss"]


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
