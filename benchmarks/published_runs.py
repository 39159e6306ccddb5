"""The cost model against published training runs: predicted / published throughput.

    python benchmarks/published_runs.py [--rows ID,PREFIX*,...] [--auto] [--json out.json] [--markdown]

Each row of :mod:`published_runs_data` (a published run: its architecture, hardware, world
size, mesh, schedule and microbatching, recomputation, precision and the throughput its
authors measured, each with its source; benchmarks/published_runs_sources.md) is built on
the meta device from its architecture, planned on the preset of its hardware with the
published configuration forced (:func:`strategy_of`) and, with ``--auto``, with
``"auto"``, and the predicted step compared with the published one:

* the published step: as printed, else the tokens of a step over the published tokens
  per second per GPU times the GPUs, else the source's FLOPs of a step (its own counting
  convention, :func:`source_flops`) over its TFLOP/s per GPU (or MFU × peak) times the
  GPUs;
* the ratio: published step / predicted step = predicted throughput / published (1.0 is
  exact; above 1 the model is optimistic).

The models: GPT-style rows as the runs computed them: where attention's scores were
written out (Megatron PTD-P, Megatron-DeepSpeed's BLOOM, metaseq's OPT:
:data:`WRITTEN_ATTENTION`) :class:`examples.models.TinyTransformer`, else (Megatron-Core,
MPT, AxoNN) :class:`examples.models.UserGPT` with a flash kernel's causal
``scaled_dot_product_attention``; both a 4h GeLU MLP and a tied head (ALiBi and OPT's
ReLU cost no GEMM and are not modelled). Llama rows from ``LlamaConfig``, GPT-OSS from
``GptOssConfig`` (Hugging Face ``transformers``, random weights never allocated).
Hardware: ``a100-80gb`` → ``a100`` (Megatron PTD-P's rows: ``a100-selene``, their
machine, whose memory-bound figure is fitted to its GPT), ``a100-40gb`` → ``a100-perlmutter``,
``h100``, ``h200``, ``b200``, ``mi300x`` → the preset of that name
(autopar/cost/presets.py; the rows' machines differ from the presets' where the notes
say, e.g. torchtitan's 500 W H100s), with the run's kernels (:func:`hardware_of`: fused
where the run fused its pointwise chains, :data:`FUSED`, or compiled; an eager run's
one kernel per op) and room for the forced configuration (the memory it predicts is
reported beside it, "over memory" where it exceeds the device).

**Held-out rows.** Every third row (:func:`held_out`: by position in the table, a rule
fixed before any figure was fitted) is kept out of every fitted figure of the presets
and reported apart; a change that helps the fitted rows and not the held-out ones is not
a fix. Rows whose configuration autopar cannot express, or whose model does not plan,
are listed with the reason.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import statistics
import sys
import time

from common import REPO_ROOT

import torch  # noqa: E402

from published_runs_data import ROWS  # noqa: E402

assert REPO_ROOT

PRESET = {"a100-80gb": "a100", "a100-40gb": "a100-perlmutter", "h100": "h100", "h200": "h200",
          "b200": "b200", "mi300x": "mi300x"}
"""The autopar preset each row's hardware is priced on; Megatron PTD-P's runs on the
preset of their machine, ``a100-selene`` (:func:`preset_of`)."""


def preset_of(row: dict) -> str:
    """The preset ``row`` is priced on: its machine's where autopar has one (Selene for
    Megatron PTD-P's tables), else its hardware's."""
    return "a100-selene" if row["id"].startswith("megatron-ptdp") else PRESET[row["hardware"]]

PEAK = {"a100-80gb": 312e12, "a100-40gb": 312e12, "h100": 989e12, "h200": 989e12, "b200": 2250e12,
        "mi300x": 1307e12}
"""Dense 16-bit peak per GPU, for the rows that publish only an MFU (datasheets)."""

ZERO = {None: 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}

WRITTEN_ATTENTION = ("megatron-ptdp", "bloom", "opt")
"""Sources whose runs computed attention's scores explicitly (Megatron's fused
scale-mask-softmax, before flash attention): their GPT is built with the scores written
out (:class:`examples.models.TinyTransformer`), the others with a flash kernel's
``scaled_dot_product_attention``."""

FUSED = ("megatron", "bloom", "llama3", "axonn", "opt")
"""Sources whose runs fused their pointwise chains (Megatron's and Megatron-DeepSpeed's
fused bias-GeLU, layer norm and softmax kernels; Meta's stack); elsewhere a row's own
``torch_compile`` says, and an eager run (MPT's tables, torchtitan without compile)
launches each pointwise op on its own, priced with ``fused_kernels=False``."""


ROOM = 4
"""A forced configuration is priced with this many times the device's memory: the table
judges its time whatever memory the model predicts for it (reported beside it, "over
memory" past the device's); ``"auto"`` plans within the device's memory."""


def hardware_of(row: dict, room: float = 1.0):
    """The preset of ``row``'s hardware with its kernels as the run had them (fused or
    not) and ``room`` times its memory."""
    import dataclasses
    from autopar.cost.hardware import get_hardware
    hw = get_hardware(preset_of(row))
    fused = row["id"].startswith(FUSED) or bool(row.get("torch_compile"))
    return dataclasses.replace(hw, fused_kernels=fused, memory_bytes=hw.memory_bytes * room)


def held_out(index: int) -> bool:
    """Whether the row at ``index`` of :data:`ROWS` is held out of every fit: every third."""
    return index % 3 == 2


# ---------------------------------------------------------------- models


def build(row: dict):
    """(model on the meta device in bf16, token ids [global batch, seq]) of ``row``."""
    import transformers
    m, batch = row["model"], global_batch(row)
    family = m["family"]
    with torch.device("meta"):
        if family == "llama":
            config = transformers.LlamaConfig(
                vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
                num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
                num_key_value_heads=m.get("kv_heads") or m["heads"], max_position_embeddings=m["seq"],
                tie_word_embeddings=bool(m.get("tied_embeddings")), use_cache=False)
            model = transformers.LlamaForCausalLM(config)
        elif family == "gpt_oss":
            config = transformers.GptOssConfig(
                vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
                num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                head_dim=64, num_local_experts=128, num_experts_per_tok=4, sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * (m["layers"] // 2),
                max_position_embeddings=max(m["seq"], 4096), attention_bias=True, tie_word_embeddings=False,
                use_cache=False)
            model = transformers.GptOssForCausalLM(config)
        elif row["id"].startswith(WRITTEN_ATTENTION):  # GPT blocks, the scores written out
            from examples.models import TinyTransformer
            model = TinyTransformer(vocab=m.get("vocab") or 51200, width=m["hidden"], heads=m["heads"],
                                    layers=m["layers"], block=m["seq"])
        else:  # GPT-style blocks with a flash kernel: Megatron-Core's GPT, MPT, AxoNN's
            from examples.models import UserGPT
            model = UserGPT(vocab=m.get("vocab") or 51200, width=m["hidden"], heads=m["heads"], layers=m["layers"],
                            block=m["seq"])
        model = model.to(torch.bfloat16)
    return model, torch.zeros(batch, m["seq"], dtype=torch.long, device="meta")


def global_batch(row: dict) -> int:
    """Sequences per step: as published, else (OPT's "2M tokens") tokens over the sequence."""
    if row.get("global_batch"):
        return int(row["global_batch"])
    return 992  # OPT-175B: "2M" tokens of 2048, about 1000 sequences: 8 for each of its 124 data ranks


def logits_loss(logits, target):
    """Next-token cross-entropy of a model returning its logits."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


def output_loss(output, target):
    """The same of a Hugging Face model's output (its ``.logits``)."""
    return logits_loss(output.logits, target)


def loss_of(row: dict):
    """The loss for ``row``'s model. One function per kind of output: probing the output
    with ``hasattr`` makes symbolic tracing fall back to ``torch.export``, whose graph
    holds ``arange(2048)`` as a constant, which at a batch of 2048 sequences of 2048
    tokens cannot be told from an arange over the batch (the plan is refused)."""
    return output_loss if row["model"]["family"] in ("llama", "gpt_oss") else logits_loss


# ---------------------------------------------------------------- configuration


def strategy_of(row: dict) -> "dict | str":
    """The published configuration as an autopar strategy (every degree, the schedule
    and microbatching, the ZeRO stage, recomputation and sequence parallelism where the
    source gives them; the rest left to the planner), or a reason it cannot be."""
    mesh = row["mesh"]
    if mesh.get("tp") is None or mesh.get("dp") is None:
        return "the source gives the 4D grid's degrees only as a search result, not per row"
    tp, pp, dp, cp, ep = (int(mesh.get(k) or 1) for k in ("tp", "pp", "dp", "cp", "ep"))
    s: dict = {"data": dp, "tensor": tp}
    batch, mbs = global_batch(row), row.get("micro_batch")
    if pp > 1:
        s["pipeline"] = pp
        schedule = row.get("schedule") or "1f1b"
        s["schedule"] = schedule
        if schedule == "interleaved":
            s["chunks"] = int(mesh.get("vp") or 2)
        s["microbatches"] = max(1, batch // (dp * (mbs or 1)))
    elif mbs:
        s["microbatches"] = max(1, batch // (dp * mbs))
    if cp > 1:
        s["context"] = cp
    if ep > 1:
        s["experts"] = ep
    s["zero"] = ZERO[row.get("fsdp")]
    if row.get("recompute") is not None:
        s["recompute"] = row["recompute"]
    if row.get("sequence_parallel") is not None and tp > 1:
        s["sequence_parallel"] = bool(row["sequence_parallel"])
    return s


# ---------------------------------------------------------------- the published step


def _attention_width(m: dict) -> int:
    return m["heads"] * (64 if m["family"] == "gpt_oss" else m["hidden"] // m["heads"])


def source_flops(row: dict, params: int) -> "tuple[float, str]":
    """(FLOPs of one step by the source's own counting convention, its name)."""
    m, tokens = row["model"], global_batch(row) * row["model"]["seq"]
    l, h, s, v = m["layers"], m["hidden"], m["seq"], m.get("vocab") or 51200
    rid = row["id"]
    if rid.startswith(("megatron-ptdp", "axonn", "bloom")):
        # Megatron PTD-P eq (3): 96·B·s·l·h²·(1 + s/6h + V/16lh), the recomputation's forward counted
        return 96 * global_batch(row) * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), "megatron eq 3"
    if rid.startswith("megatron-core"):
        # megatron/training/training.py num_floating_point_operations (core_r0.8.0): 3 passes
        kv = (m.get("kv_heads") or m["heads"]) / m["heads"]
        ffn = m.get("ffn") or 4 * h
        return 12 * global_batch(row) * s * l * h * h * (1 + kv + s / h + ffn / h + v / (2 * l * h)), \
            "megatron-core r0.8 (3 passes)"
    # PaLM's (Chowdhery et al. 2023, appendix B): 6N + 12·l·H·Q·T per token, non-causal
    return tokens * (6 * params + 12 * l * _attention_width(m) * s), "6N + 12·l·h·s per token"


def published_step(row: dict, params: int) -> "tuple[float, str]":
    """(the published step in seconds, how it was read)."""
    p, gpus = row["published"], row["gpus"]
    tokens = global_batch(row) * row["model"]["seq"]
    if p.get("step_s"):
        return float(p["step_s"]), "step as published"
    if p.get("tokens_per_s_per_gpu"):
        return tokens / (p["tokens_per_s_per_gpu"] * gpus), "tokens/s per GPU"
    flops, convention = source_flops(row, params)
    rate = p.get("tflops_per_gpu") and p["tflops_per_gpu"] * 1e12 or p["mfu"] * PEAK[row["hardware"]]
    return flops / (rate * gpus), f"TFLOP/s by {convention}"


# ---------------------------------------------------------------- one row


def predict(row: dict, strategy) -> dict:
    """Plan ``row`` with ``strategy`` on its preset: the predicted step and the plan."""
    import autopar
    model, ids = build(row)
    params = sum(p.numel() for p in model.parameters())
    started = time.perf_counter()
    try:
        room = 1.0 if strategy == "auto" else ROOM
        hw = hardware_of(row, room)
        plan = autopar.plan(model, row["gpus"], (ids,), loss_of(row), strategy, example_target=ids, hardware=hw)
    except Exception as e:  # noqa: BLE001 - reported per row: a refusal is a finding
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "params": params,
                "plan_s": time.perf_counter() - started}
    terms = {"compute": plan.total.compute_s, **{f"comm {k}": v for k, v in plan.total.comm_s.items()}}
    pipe = plan.pipeline or {}
    return {"step_s": plan.step_s, "params": params, "plan_s": time.perf_counter() - started,
            "mesh": dict(plan.mesh), "zero": plan.zero, "recompute": plan.recompute,
            "microbatches": pipe.get("microbatches", plan.microbatches), "schedule": pipe.get("schedule"),
            "chunks": pipe.get("chunks"), "memory_gib": plan.total.memory_bytes / 2**30,
            "over_memory": plan.total.memory_bytes > hw.memory_bytes / room, "terms": terms}


def run_row(index: int, row: dict, auto: bool) -> dict:
    out = {"id": row["id"], "source": row["source"], "held_out": held_out(index), "hardware": row["hardware"],
           "gpus": row["gpus"], "preset": preset_of(row)}
    strategy = strategy_of(row)
    if isinstance(strategy, str):
        out["forced"] = {"error": strategy}
    else:
        out["strategy"] = strategy
        out["forced"] = predict(row, strategy)
    if auto:
        out["auto"] = predict(row, "auto")
    params = next((out[k]["params"] for k in ("forced", "auto") if k in out and "params" in out[k]), None)
    if params is None:
        params = sum(p.numel() for p in build(row)[0].parameters())
    out["published_step_s"], out["published_as"] = published_step(row, params)
    for k in ("forced", "auto"):
        if k in out and "step_s" in out[k]:
            out[k]["ratio"] = out["published_step_s"] / out[k]["step_s"]
    return out


# ---------------------------------------------------------------- report


def _describe(p: dict) -> str:
    if "error" in p:
        return "refused: " + p["error"].split("\n")[0][:90]
    mesh = " ".join(f"{k[0]}{v}" for k, v in p["mesh"].items() if v > 1) or "d1"
    extra = (f" {p['schedule']}" + (f" v{p['chunks']}" if (p.get("chunks") or 1) > 1 else "")) if p["schedule"] else ""
    extra += f" m{p['microbatches']}" if (p.get("microbatches") or 1) > 1 else ""
    extra += f" ZeRO-{p['zero']}" if p["zero"] else ""
    extra += " rc" if p["recompute"] else ""
    extra += " (over memory)" if p.get("over_memory") else ""
    return mesh + extra


def summary(results: list[dict], key: str = "forced") -> dict:
    """Median and spread of |ratio − 1| over the fitted and the held-out rows."""
    out = {}
    for name, rows in (("fitted", [r for r in results if not r["held_out"]]),
                       ("held out", [r for r in results if r["held_out"]])):
        ratios = [r[key]["ratio"] for r in rows if key in r and "ratio" in r[key]]
        if not ratios:
            continue
        errors = sorted(abs(x - 1) for x in ratios)
        out[name] = {"rows": len(rows), "predicted": len(ratios), "median_ratio": statistics.median(ratios),
                     "median_abs_error": statistics.median(errors),
                     "within_10pct": sum(e <= 0.10 for e in errors), "within_25pct": sum(e <= 0.25 for e in errors)}
    return out


def markdown(results: list[dict]) -> str:
    lines = ["| row | split | GPUs | preset | published config (forced) | predicted / published | auto's plan | "
             "auto / published | published step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f, a = r.get("forced", {}), r.get("auto", {})
        lines.append(f"| {r['id']} | {'held out' if r['held_out'] else 'fitted'} | {r['gpus']} | {r['preset']} | "
                     f"{_describe(f)} | {f['ratio']:.2f} | " if "ratio" in f else
                     f"| {r['id']} | {'held out' if r['held_out'] else 'fitted'} | {r['gpus']} | {r['preset']} | "
                     f"{_describe(f)} | - | ")
        lines[-1] += (f"{_describe(a)} | {a['ratio']:.2f} | " if "ratio" in a else
                      (f"{_describe(a)} | - | " if a else "- | - | "))
        lines[-1] += f"{r['published_step_s']:.3g} s ({r['published_as']}) |"
    return "\n".join(lines)


SOURCES = ("megatron-ptdp", "megatron-core", "llama3", "torchtitan", "mpt", "megatron-bridge", "bloom", "opt", "axonn")
"""The independent sources, by the prefix of their rows' ids."""


def source_of(row_id: str) -> str:
    return next(s for s in SOURCES if row_id.startswith(s))


def _print_summary(results: list[dict]) -> None:
    for key in ("forced", "auto"):
        if any(key in r for r in results):
            for name, s in summary(results, key).items():
                print(f"{key:6s} {name:8s}: {s['predicted']}/{s['rows']} rows predicted, median ratio "
                      f"{s['median_ratio']:.2f}, median |error| {s['median_abs_error']:.1%}, within 10 %: "
                      f"{s['within_10pct']}, within 25 %: {s['within_25pct']}")
    close = [r for r in results if abs(r.get("forced", {}).get("ratio", 0) - 1) <= 0.10]
    print(f"forced within 10 %: {len(close)} rows ({sum(r['held_out'] for r in close)} held out) from "
          f"{len({source_of(r['id']) for r in close})} sources")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="*", help="comma-separated row ids or fnmatch patterns (default: all)")
    parser.add_argument("--auto", action="store_true", help="also plan each row with strategy='auto'")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown at the end")
    parser.add_argument("--from-json", nargs="+", default=None,
                        help="print the table and summary of earlier runs' --json files (merged, in table order)")
    args = parser.parse_args(argv)
    if args.from_json:
        merged = {}
        for name in args.from_json:
            with open(name) as f:
                merged.update({r["id"]: r for r in json.load(f)["results"]})
        results = [merged[r["id"]] for r in ROWS if r["id"] in merged]
        _print_summary(results)
        print(markdown(results))
        return 0
    patterns = args.rows.split(",")
    chosen = [(i, r) for i, r in enumerate(ROWS) if any(fnmatch.fnmatch(r["id"], p) for p in patterns)]
    results = []
    for i, row in chosen:
        r = run_row(i, row, args.auto)
        results.append(r)
        f = r["forced"]
        text = f"x{f['ratio']:.2f}" if "ratio" in f else "-"
        auto = f" | auto {_describe(r['auto'])} x{r['auto']['ratio']:.2f}" if "ratio" in r.get("auto", {}) else \
            (f" | auto {_describe(r['auto'])}" if "auto" in r else "")
        print(f"{r['id']:<48s} {'held' if r['held_out'] else 'fit ':4s} {text:>6s}  {_describe(f):<40s}"
              f" published {r['published_step_s']:.3g} s{auto}", flush=True)
    _print_summary(results)
    if args.markdown:
        print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "summary": {k: summary(results, k) for k in ("forced", "auto")}}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
