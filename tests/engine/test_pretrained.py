"""Hugging Face safetensors checkpoints (``pm.load_pretrained`` / ``pm.save_pretrained``,
docs/guide/checkpoints.md, "Loading and saving Hugging Face checkpoints").

On 4 gloo ranks, a single-device model's checkpoint, written by ``transformers``'
``save_pretrained`` (one file, sharded, or the base ``LlamaModel``'s) or by
``safetensors.torch.save_file``, is loaded into a differently seeded copy compiled under
``tensor 2 × data 2`` (a Llama with its own head, from a sharded checkpoint),
``pipeline 2 × data 2`` (a tied Llama, its embedding on both stages), the 3D grid
``x 2 × y 1 × z 2`` (a plain MLP with buffers, from one ``.safetensors`` file) and
``data 4`` with ZeRO-3 (a tied Llama from its base model's checkpoint: no ``model.``
prefix, no head): the full state dict equals the single-device model's. After one step,
``save_pretrained`` writes what ``LlamaForCausalLM.from_pretrained`` (no missing or
unexpected key) and ``safetensors.torch.load_file`` load back equal to
``pm.full_state_dict()``, giving the loss the compiled model gives. Under the tensor plan a
wrapped ``safe_open`` records every read: no split parameter is read whole, and each
rank reads exactly the elements it holds. A rank that fails makes every rank raise.

In one process: matching keys (exact, prefixes both ways, tied names, legacy renames,
``key_mapping``, converted keys refused), ``max_shard_size``, the errors, a DCP
directory, the files an earlier save leaves.
"""
import json
import os
import pathlib

import pytest
import torch
import torch.nn as nn

import autopar
import shared_ranks
from autopar.engine.pretrained import shard_bytes
from autopar.engine.pretrained_keys import _fallback_renamer, match_keys, saved_names

VOCAB = 96


def _llama_config(tie: bool):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                       tie_word_embeddings=tie, use_cache=False)


def _llama(tie: bool, seed: int):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(_llama_config(tie))


class Scaled(nn.Module):
    """A plain MLP with a persistent buffer, a scalar one and a non-persistent one."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.up, self.down, self.head = nn.Linear(width, 64), nn.Linear(64, width), nn.Linear(width, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        self.register_buffer("version", torch.tensor(3))
        self.register_buffer("cache", torch.zeros(width), persistent=False)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))) * self.scale)


def _scaled(seed: int) -> Scaled:
    torch.manual_seed(seed)
    model = Scaled()
    if seed:
        with torch.no_grad():
            model.scale.mul_(2.0)
            model.version.fill_(seed)
    return model


def _tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (4, 8), generator=g)


def _scaled_batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)


def _differences(a: dict, b: dict) -> list[str]:
    return sorted(set(a) ^ set(b)) + [k for k in sorted(set(a) & set(b)) if not torch.equal(a[k], b[k])]


# ---------------------------------------------------------------------------- on 4 ranks
class _Recorder:
    """``safe_open`` with every read recorded: ``(key, elements read)`` per slice taken and
    per whole tensor (``get_tensor``)."""

    def __init__(self, reads: list):
        import safetensors
        self.original, self.reads = safetensors.safe_open, reads

    def __call__(self, *args, **kwargs):
        recorder = self

        class Handle:
            def __init__(self):
                self.inner = recorder.original(*args, **kwargs)

            def __enter__(self):
                self.inner.__enter__()
                return self

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_tensor(self, key):
                value = self.inner.get_tensor(key)
                recorder.reads.append((key, "whole", value.numel()))
                return value

            def get_slice(self, key):
                stored = self.inner.get_slice(key)

                class Slice:
                    def get_shape(self):
                        return stored.get_shape()

                    def __getitem__(self, index):
                        value = stored[index]
                        recorder.reads.append((key, "slice", value.numel()))
                        return value
                return Slice()
        return Handle()


def _compile_llama(tie, strategy):
    ids = _tokens()
    return autopar.compile(_llama(tie, seed=1), None, example_kwargs={"input_ids": ids, "labels": ids},
                           strategy=strategy)


def _train_and_save(pm, out, inputs, **save):
    """One step, save, and the loss of the saved parameters (a second step's, whose
    program is the first's: no second capture)."""
    optimizer = torch.optim.SGD(pm.parameters(), lr=0.1)
    pm.step(*inputs["args"], **inputs["kwargs"])
    optimizer.step()
    pm.save_pretrained(out, **save)
    saved = pm.full_state_dict()
    loss = pm.step(*inputs["args"], **inputs["kwargs"]).detach()
    parts = [p for p in pm.layout.unique() if p.cut is not None or p.zero is not None or not p.held]
    return {"saved": saved if torch.distributed.get_rank() == 0 else None, "loss": loss, "parts": len(parts)}


def _held_elements(pm) -> dict[str, int]:
    """Per split parameter this rank holds: the elements of the full tensor it holds."""
    out = {}
    for name, value in pm.root.model.state_dict(keep_vars=True).items():
        placement = pm.layout.get(name)
        if placement is not None and placement.held and (placement.cut is not None or placement.zero is not None):
            out[name] = value.numel()
    return out


def four_ranks_job(root):
    import safetensors
    from safetensors.torch import save_file
    rank = torch.distributed.get_rank()
    root = pathlib.Path(root)
    sources = {"tensor": root / "llama_sharded", "pipeline": root / "llama_tied", "grid3d": root / "scaled.safetensors",
               "zero3": root / "llama_base"}
    if rank == 0:  # the single-device models' checkpoints
        _llama(False, seed=0).save_pretrained(sources["tensor"], max_shard_size="20KB")
        _llama(True, seed=0).save_pretrained(sources["pipeline"])
        save_file(_scaled(0).state_dict(), str(sources["grid3d"]), metadata={"format": "pt"})
        _llama(True, seed=0).model.save_pretrained(sources["zero3"])
    torch.distributed.barrier()
    ids = _tokens()
    llama_inputs = {"args": (), "kwargs": {"input_ids": ids, "labels": ids}}
    reports = {}

    # tensor 2 x data 2, an untied Llama from a sharded checkpoint, every read recorded
    pm = _compile_llama(False, {"tensor": 2, "data": 2})
    reads: list = []
    original = safetensors.safe_open
    safetensors.safe_open = _Recorder(reads)
    try:
        pm.load_pretrained(sources["tensor"])
    finally:
        safetensors.safe_open = original
    reports["tensor"] = {"differences": _differences(pm.full_state_dict(), _llama(False, 0).state_dict()),
                         "reads": reads, "held": _held_elements(pm),
                         **_train_and_save(pm, root / "out_tensor", llama_inputs)}

    # pipeline 2 x data 2, a tied Llama (its embedding on both stages)
    pm = _compile_llama(True, {"pipeline": 2, "data": 2, "microbatches": 2})
    pm.load_pretrained(sources["pipeline"])
    reports["pipeline"] = {"differences": _differences(pm.full_state_dict(), _llama(True, 0).state_dict()),
                           **_train_and_save(pm, root / "out_pipeline", llama_inputs, max_shard_size="30KB")}

    # the 3D grid, a plain model with buffers, from one .safetensors file
    x, y = _scaled_batch()
    pm = autopar.compile(_scaled(1), None, example_inputs=(x,), loss_fn=nn.functional.cross_entropy,
                         example_target=y, strategy={"x": 2, "y": 1, "z": 2})
    pm.load_pretrained(sources["grid3d"])
    reports["grid3d"] = {"differences": _differences(pm.full_state_dict(), _scaled(0).state_dict()),
                         "cache": pm.root.model.cache.clone(),
                         **_train_and_save(pm, root / "out_grid3d", {"args": (x,), "kwargs": {"target": y}})}

    # data 4 under ZeRO-3, a tied Llama from its base model's checkpoint
    pm = _compile_llama(True, {"data": 4, "zero": 3})
    pm.load_pretrained(sources["zero3"])
    reports["zero3"] = {"differences": _differences(pm.full_state_dict(), _llama(True, 0).state_dict()),
                        **_train_and_save(pm, root / "out_zero3", llama_inputs)}

    # one rank fails (its path does not exist): every rank raises, none hangs
    try:
        pm.load_pretrained(sources["zero3"] if rank != 1 else root / "nowhere")
        reports["failure"] = None
    except Exception as error:  # noqa: BLE001 - reported to the test
        reports["failure"] = f"{type(error).__name__}: {error}"
    return reports


_ROOT = shared_ranks.scratch_dir("pretrained")
_LAUNCHED = shared_ranks.register(4, __name__, four_ranks_job, (_ROOT,))


@pytest.fixture(scope="module")
def runs():
    return _LAUNCHED(), pathlib.Path(_ROOT)


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", ["tensor", "pipeline", "grid3d", "zero3"])
def test_load_then_save_under_each_plan(runs, case):
    reports, root = runs
    for rank, report in enumerate(reports):
        assert report[case]["differences"] == [], (rank, case, report[case]["differences"])
        assert report[case]["parts"] > 0, (rank, case)  # the plan splits or places some parameters
    saved, loss = reports[0][case]["saved"], reports[0][case]["loss"]
    assert all(torch.equal(report[case]["loss"], loss) for report in reports)
    out = root / f"out_{case}"
    if case == "grid3d":
        from safetensors.torch import load_file
        assert sorted(os.listdir(out)) == ["model.safetensors"]
        stored = load_file(out / "model.safetensors")
        assert sorted(stored) == ["down.bias", "down.weight", "head.bias", "head.weight", "scale", "up.bias",
                                  "up.weight", "version"]  # no non-persistent buffer
        assert _differences(stored, saved) == []
        assert torch.equal(reports[0][case]["cache"], torch.zeros(32))  # left as it was
        model = _scaled(5)
        model.load_state_dict(stored)
        x, y = _scaled_batch()
        torch.testing.assert_close(nn.functional.cross_entropy(model(x), y), loss, rtol=1e-5, atol=1e-6)
        return
    from transformers import LlamaForCausalLM
    model, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert _differences(model.state_dict(), saved) == []
    assert model.config.tie_word_embeddings == (case != "tensor")
    torch.testing.assert_close(model(input_ids=_tokens(), labels=_tokens()).loss, loss, rtol=1e-5, atol=1e-6)
    files = sorted(os.listdir(out))
    if case == "pipeline":  # sharded: the index names every key once, in files that hold it
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = [f for f in files if f.startswith("model-")]
        assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
        assert "lm_head.weight" not in index["weight_map"]  # tied: saved once, as the embedding
        assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for k, v in saved.items()
                                                      if k != "lm_head.weight")
    else:
        assert "model.safetensors" in files and not any(f.startswith(("model-", ".")) for f in files), files
        assert "config.json" in files and "generation_config.json" in files


@pytest.mark.multiprocess
def test_each_rank_reads_only_the_boxes_it_holds(runs):
    reports, _ = runs
    full = _llama(False, 0).state_dict()
    for rank, report in enumerate(reports):
        case = report["tensor"]
        split = case["held"]
        assert "lm_head.weight" in split and "model.embed_tokens.weight" in split
        read: dict = {}
        for key, how, count in case["reads"]:
            assert not (key in split and how == "whole"), (rank, key)
            read[key] = read.get(key, 0) + count
        for name, held in split.items():
            assert read[name] == held, (rank, name, read[name], held)  # exactly its elements, once each
            assert held < full[name].numel(), (rank, name, held)


@pytest.mark.multiprocess
def test_a_failure_on_one_rank_fails_every_rank(runs):
    reports, _ = runs
    for rank, report in enumerate(reports):
        failure = report["failure"]
        assert failure is not None, rank
        if rank == 1:
            assert failure.startswith("FileNotFoundError: load_pretrained: no checkpoint at") and "nowhere" in failure
        else:
            assert failure.startswith("CheckpointError: load_pretrained: rank 1 failed: FileNotFoundError"), failure


# ---------------------------------------------------------------------------- in one process
def test_max_shard_size():
    assert shard_bytes(1000) == 1000
    assert shard_bytes("5GB") == 5 * 10 ** 9 and shard_bytes("500MB") == 5 * 10 ** 8
    assert shard_bytes("2GiB") == 2 * 2 ** 30 and shard_bytes("10KiB") == 10240 and shard_bytes("1kb") == 125
    for bad in ("lots", "5XB", 0, "0MB", -1):
        with pytest.raises(ValueError, match="max_shard_size"):
            shard_bytes(bad)


def test_keys_are_matched_as_from_pretrained_matches_them():
    model = _llama(True, 0)
    names = list(model.state_dict())
    tied = {"lm_head.weight": ("model.embed_tokens.weight", "lm_head.weight"),
            "model.embed_tokens.weight": ("model.embed_tokens.weight", "lm_head.weight")}
    # a base model's checkpoint: prefix added, the tied head read from the embedding
    base = [n[len("model."):] for n in names if n.startswith("model.")]
    match = match_keys(model, names, tied, base)
    assert not match.missing and not match.unexpected
    assert match.sources["model.norm.weight"] == "norm.weight"
    assert match.sources["lm_head.weight"] == "embed_tokens.weight"
    # the reverse: a LlamaModel reading a LlamaForCausalLM checkpoint, whose head is unexpected
    match = match_keys(model.model, base, {}, names)
    assert match.sources["norm.weight"] == "model.norm.weight" and match.unexpected == ["lm_head.weight"]
    # an exact key wins over a renamed one; key_mapping renames
    match = match_keys(model, names, tied, ["model.norm.weight", "norm.weight"] + names[:1])
    assert match.sources["model.norm.weight"] == "model.norm.weight" and match.unexpected == ["norm.weight"]
    match = match_keys(model, names, tied, [n.replace("mlp.", "ffn.") for n in names], {r"\.ffn\.": ".mlp."})
    assert not match.missing and not match.unexpected
    # saving keeps the name transformers expects of each tied parameter
    assert saved_names(model, names, tied) == [n for n in names if n != "lm_head.weight"]
    assert saved_names(nn.Linear(2, 2), ["weight", "bias"], {}) == ["weight", "bias"]
    # transformers 4's renaming (no conversion mapping): legacy LayerNorm names, prefixes
    from transformers import BertConfig, BertModel
    bert = BertModel(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32))
    rename = _fallback_renamer(bert, list(bert.state_dict()), None)
    assert rename("bert.embeddings.LayerNorm.gamma") == ("embeddings.LayerNorm.weight", False)
    bert_names = list(bert.state_dict())
    legacy = [n.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
              for n in bert_names]
    match = match_keys(bert, bert_names, {}, legacy)
    assert not match.missing and not match.unexpected


def test_keys_transformers_would_convert_are_refused(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM
    model = MixtralForCausalLM(MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, num_local_experts=2))
    names = list(model.state_dict())
    match = match_keys(model, names, {}, ["model.layers.0.mlp.experts.0.w1.weight"])
    assert list(match.converted) == ["model.layers.0.mlp.experts.0.w1.weight"]


def _single(seed=0):
    return autopar.compile(_scaled(seed), None, example_inputs=(torch.randn(8, 32),))


def test_errors_and_formats_in_one_process(tmp_path):
    from safetensors.torch import load_file, save_file
    reference = _scaled(0).state_dict()
    pm = _single(seed=1)
    save_file(reference, str(tmp_path / "one.safetensors"))
    pm.load_pretrained(tmp_path / "one.safetensors")
    assert _differences(pm.full_state_dict(), reference) == []

    without = {k: v for k, v in reference.items() if k != "down.weight"}
    save_file(without, str(tmp_path / "missing.safetensors"))
    with pytest.raises(autopar.CheckpointError, match=r"missing 1 key\(s\): down\.weight.*strict=False"):
        pm.load_pretrained(tmp_path / "missing.safetensors")
    with pytest.warns(UserWarning, match=r"missing 1 key\(s\): down\.weight"):
        pm.load_pretrained(tmp_path / "missing.safetensors", strict=False)
    save_file({**reference, "extra.weight": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(autopar.CheckpointError, match=r"unexpected 1 key\(s\): extra\.weight"):
        pm.load_pretrained(tmp_path / "extra.safetensors")
    with pytest.warns(UserWarning, match=r"unexpected 1 key\(s\): extra\.weight"):
        pm.load_pretrained(tmp_path / "extra.safetensors", strict=False)
    save_file({**reference, "up.weight": torch.zeros(64, 16)}, str(tmp_path / "shape.safetensors"))
    with pytest.raises(autopar.CheckpointError, match=r"up\.weight in '.*shape\.safetensors' has shape \[64, 16\], "
                                                      r"the model's up\.weight is \[64, 32\]"):
        pm.load_pretrained(tmp_path / "shape.safetensors")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        pm.load_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds neither model.safetensors nor"):
        pm.load_pretrained(tmp_path / "empty")

    # saving: one file, then several (the single file goes), then one again (the shards go)
    out = tmp_path / "out"
    pm.load_pretrained(tmp_path / "one.safetensors")
    pm.save_pretrained(out)
    assert sorted(os.listdir(out)) == ["model.safetensors"]
    assert _differences(load_file(out / "model.safetensors"), reference) == []
    pm.save_pretrained(out, max_shard_size=9000)
    files = sorted(os.listdir(out))  # 8448 bytes, 8320, then the rest
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)] + ["model.safetensors.index.json"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    merged = {k: v for f in files[:3] for k, v in load_file(out / f).items()}
    assert _differences(merged, reference) == [] and set(index["weight_map"]) == set(reference)
    pm.save_pretrained(out, max_shard_size="1GB")
    assert sorted(os.listdir(out)) == ["model.safetensors"]
    # a save that fails (a full disk at its second file) leaves the earlier one as it was
    import safetensors.torch
    calls = []

    def full_disk(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise OSError("No space left on device")
        return original(*args, **kwargs)
    original, safetensors.torch.save_file = safetensors.torch.save_file, full_disk
    try:
        with pytest.raises(OSError, match="No space left"):
            pm.save_pretrained(out, max_shard_size=9000)
    finally:
        safetensors.torch.save_file = original
    assert sorted(os.listdir(out)) == ["model.safetensors"] and len(calls) == 2
    assert _differences(load_file(out / "model.safetensors"), reference) == []

    # a DCP checkpoint directory goes to load_checkpoint
    autopar.save_checkpoint(pm, tmp_path / "dcp")
    fresh = _single(seed=2)
    fresh.load_pretrained(tmp_path / "dcp")
    assert _differences(fresh.full_state_dict(), reference) == []
