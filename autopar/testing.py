"""Equivalence checks against single-device training, used by the tests and the demo.

:func:`compare_with_single_device` runs on every rank of a launched job: it builds the
model twice from the same seed, compiles one with autopar and keeps the other as the
single-device reference, then compares

* outputs of ``pm(*inputs, **kwargs)`` with ``model(*inputs, **kwargs)`` (their logits, and
  the loss a Hugging Face output carries),
* the loss and every parameter's gradient after one ``pm.step``,
* every parameter after ``steps`` AdamW steps on both,

and returns, per kind, the largest absolute difference and the largest relative error over
every tensor of that kind (each tensor's relative error is its largest difference over
its reference's largest magnitude, see :func:`_relative`), the tensor with the largest
relative error, and the plan used.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import tempfile
import traceback
from typing import Any, Callable

import torch
from safetensors.torch import save_model

import autopar
from autopar.planning import golden
from autopar.runtime.health import RankFailureError, is_collective_failure
from autopar.trace.capture import output_loss


ZERO_BELOW = {"grad": 1e-6, "param": 1e-4}
"""Per kind, the fraction of the largest reference value of that kind (over every gradient;
over every floating-point entry of the state dict) below which a tensor is zero at the
comparison's resolution, and is measured against that largest value instead of its own.
Such a tensor is all zero, or exactly zero in exact arithmetic and computed as rounding
noise: the key bias of attention gets no gradient (softmax ignores a shift shared by all
keys), so its computed gradient is noise (1e-13..5e-9 of the largest gradient in float32),
which the parallel model and the reference round differently; a parameter with that
gradient (a key bias initialised to zero, as BERT and ViT do) is moved by Adam's
normalisation of the noise only (up to ~1e-6 of the largest parameter after 3 steps in
float32). The smallest gradients that are not noise sit at ~3e-6 of the largest (BERT's
query bias), the smallest parameters at ~4e-4 (ResNet's normalisation biases)."""


@contextlib.contextmanager
def reported_in(row: dict, case: str):
    """Run one case of a job that runs several in one launch: an error goes into ``row``
    (``error``, ``traceback``) and the job goes on to the next case, except one after which
    the process group cannot be used (another rank's
    :class:`~autopar.runtime.health.RankFailureError`, a failed collective): the next
    case's collectives would wait on ranks that left, so that one ends the job, naming
    ``case``."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - reported in the row
        if isinstance(error, RankFailureError) or is_collective_failure(error):
            raise RuntimeError(f"{case}: {type(error).__name__}: {error}") from error
        row.update({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()})


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max |a - b|, max |b|)`` of one tensor ``a`` against its reference ``b``: entries
    equal on both sides (infinities included) or NaN on both differ by 0, a NaN or an
    infinity on one side only by inf; ``max |b|`` is over ``b``'s finite entries."""
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    a, b = a.detach().to(device="cpu", dtype=wide), b.detach().to(device="cpu", dtype=wide)
    if a.shape != b.shape:
        raise AssertionError(f"shape {list(a.shape)} != {list(b.shape)}")
    if not a.numel():
        return 0.0, 0.0
    same = (a == b) | (a.isnan() & b.isnan())
    diff = torch.where(same, 0.0, (a - b).abs().nan_to_num(nan=math.inf))
    finite = b[b.isfinite()]
    return diff.max().item(), finite.abs().max().item() if finite.numel() else 0.0


def _relative(abs_diff: float, scale: float, largest: float, zero_below: float) -> float:
    """One tensor's relative error: its largest difference over its reference's largest
    magnitude ``scale``, or over ``largest`` (the kind's largest) where ``scale`` is below
    ``zero_below`` of it (:data:`ZERO_BELOW`). With nothing to scale by (every reference
    of the kind all zero) an exact match is 0 and any difference inf."""
    if scale < zero_below * largest:
        scale = largest
    if scale > 0:
        return abs_diff / scale
    return 0.0 if abs_diff == 0 else math.inf


def _fingerprint(t: torch.Tensor) -> tuple[float, float]:
    """A tensor in two numbers (its sum and its sum of squares, in float64): what this
    rank computed, compared between ranks (they must agree exactly)."""
    t = t.detach().to(device="cpu", dtype=torch.complex128 if t.is_complex() else torch.float64)
    return t.sum().item(), t.abs().square().sum().item()


def _compare(pairs: dict[str, tuple[Any, Any]], report: dict[str, Any], kind: str) -> None:
    """Every named ``(result, reference)`` pair of one ``kind`` compared:
    ``report[kind] = (max abs, max relative)``, each the largest over every tensor (the two
    may come from different tensors; the relative error of each tensor is
    :func:`_relative`'s), ``report["worst_" + kind]`` the tensor with the largest relative
    error, and ``report["computed"][kind]`` each result's :func:`_fingerprint`."""
    diffs: dict[str, tuple[float, float, bool]] = {}
    computed = report.setdefault("computed", {}).setdefault(kind, {})
    for name, (a, b) in pairs.items():
        if a is None and b is None:
            continue
        if a is None or b is None:  # a gradient on one side only: the other's is zero
            a = torch.zeros_like(b) if a is None else a
            b = torch.zeros_like(a) if b is None else b
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        diffs[name] = (*_max_diff(a, b), b.is_floating_point() or b.is_complex())
        computed[name] = _fingerprint(a)
    largest = max((scale for _, scale, floating in diffs.values() if floating), default=0.0)
    zero_below = ZERO_BELOW.get(kind, 0.0)
    worst_abs, worst_rel, worst_name = 0.0, 0.0, None
    for name, (abs_diff, scale, floating) in diffs.items():
        rel = _relative(abs_diff, scale, largest if floating else scale, zero_below)
        worst_abs = max(worst_abs, abs_diff)
        if worst_name is None or rel > worst_rel:
            worst_rel, worst_name = rel, name
    report[kind] = (worst_abs, worst_rel)
    report["worst_" + kind] = worst_name


def _logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def _output_pairs(out: Any, ref: Any) -> dict[str, tuple[Any, Any]]:
    """The tensors of a forward's output beside the reference's: ``logits`` for one tensor,
    ``logits.<i>`` for each tensor leaf of a tuple, list or dict (a VAE's reconstruction,
    mean and log-variance)."""
    if isinstance(out, torch.Tensor) or not isinstance(ref, (tuple, list, dict)):
        return {"logits": (out, ref)}
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    ref_leaves, _ = torch.utils._pytree.tree_flatten(ref)
    if len(leaves) != len(ref_leaves):
        raise AssertionError(f"the output has {len(leaves)} leaves, the reference's {len(ref_leaves)}")
    return {f"logits.{i}": (a, b) for i, (a, b) in enumerate(zip(leaves, ref_leaves))
            if isinstance(b, torch.Tensor)}


def _own_loss(output: Any) -> torch.Tensor:
    """The loss a model's output carries (``ModelOutput.loss``, a dict's, or a scalar)."""
    return output_loss(output, required=True)[0]


def assert_plan_unchanged(plan: "autopar.Plan", golden_dir: str, ranks: int = 8, accept: bool | None = None) -> None:
    """Fail (:class:`~autopar.planning.golden.PlanChangedError`) where ``plan`` or its
    first ``ranks`` rank programs differ from the golden saved at ``golden_dir``, saying
    what changed; with ``AUTOPAR_ACCEPT=1`` in the environment (or ``accept=True``) write
    the golden instead (:mod:`autopar.planning.golden`). For a user's CI::

        plan = autopar.plan(model, 64, inputs, loss_fn, hardware="h100")
        autopar.testing.assert_plan_unchanged(plan, "tests/golden/my_model")
    """
    golden.check(plan, golden_dir, ranks, accept)


def compare_with_single_device(model_factory: Callable[[], torch.nn.Module], inputs: tuple,
                               target: torch.Tensor | None, loss_fn: Callable | None, strategy: Any = "auto", *,
                               kwargs: dict[str, Any] | None = None, steps: int = 3, lr: float = 1e-2,
                               hardware: str | None = None, mesh=None,
                               dtype: torch.dtype | None = None, overlap: Any = None,
                               recompute: bool | str | None = None, default_device: str | None = None,
                               device: torch.device | str | None = None,
                               from_meta: str | None = None, plan: Any = None) -> dict[str, Any]:
    """Run on every rank; returns ``{"mesh", "plan", "regions", "output", "loss", "grad",
    "grad_norm", "param"}`` (``regions``: each region's strategy in the plan) where each difference entry is ``(max abs, max relative)``, each the largest
    over every tensor of that kind (``output``: the logits and the model's own loss;
    ``grad_norm``: the 2-norm and the inf-norm; ``param``: every state dict entry); a
    tensor's relative error is ``max |a - b| / max |b|`` over its own entries, a tensor that
    is zero at the comparison's resolution (:data:`ZERO_BELOW`) measured against its kind's
    largest. ``worst_<kind>`` names the tensor with the largest relative error of each kind,
    and ``computed[kind][name]`` fingerprints what this rank's compiled model computed
    (ranks that compute the same agree on it exactly). Every optimizer step clips the
    gradients to half the first step's norm on both sides (``pm.clip_grad_norm_``), so
    ``param`` checks the norm helpers as well.
    ``kwargs``: keyword inputs (``example_kwargs``); ``loss_fn=None`` (and no target):
    the model computes its own loss (``labels`` among the keywords), which ``step`` trains
    on; then ``"output"`` covers the loss in the forward's output too. ``default_device``:
    every call into the compiled model (forward, step, norms, clipping, state) runs with
    ``torch.device(default_device)`` as the default device (``"meta"``: a tensor autopar
    creates without naming its device lands there and the step fails, the CPU guard of
    :mod:`autopar.runtime.devices`); the model, inputs and optimizer stay where they are.
    ``device``: the model, inputs and target are moved there first (a GPU run), the
    single-device reference alike. ``from_meta``: the compiled side is built by
    ``model_factory`` under ``torch.device("meta")`` and given the reference's weights by
    ``"state_dict"`` (``pm.load_full_state_dict``) or ``"pretrained"`` (the reference
    saved as a safetensors checkpoint, then ``pm.load_pretrained``). ``plan``: a reviewed
    plan (or its directory) that compile runs instead of planning (``compile(plan=...)``)."""
    torch.manual_seed(0)
    model = model_factory()
    kwargs = dict(kwargs or {})
    if dtype is not None:
        model = model.to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                  for k, v in kwargs.items()}
    if device is not None:
        model = model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        target = target.to(device) if target is not None else None
    reference = copy.deepcopy(model)
    if from_meta is not None:
        model = _on_meta(model_factory, dtype)
    pm = autopar.compile(model, mesh, example_inputs=inputs, loss_fn=loss_fn, example_target=target,
                         example_kwargs=kwargs, strategy=strategy, hardware=hardware, overlap=overlap,
                         recompute=recompute, device=device, plan=plan)
    if from_meta is not None:
        _load_reference(pm, reference, from_meta)
    twins = _Twins(pm, reference, inputs, kwargs, target, loss_fn, default_device)
    report: dict[str, Any] = {"mesh": dict(pm.plan.mesh), "plan": pm.plan.explain(), "tracer": pm.plan.tracer,
                              "strategies": {r.strategy for r in pm.plan.regions} - {"replicate"},
                              "regions": {r.region: r.strategy for r in pm.plan.regions},
                              # parameters this rank holds no element of (the cube's off-diagonal vectors)
                              "empty_params": sum(p.numel() == 0 for p in pm.parameters())}
    _compare(twins.outputs(), report, "output")
    max_norm = _compare_first_step(twins, report)
    _train_and_compare_parameters(twins, report, max_norm, steps, lr)
    _add_run_stats(pm, reference, report)
    return report


def _on_meta(model_factory: Callable[[], torch.nn.Module], dtype: torch.dtype | None) -> torch.nn.Module:
    """The model built on the meta device (shapes only)."""
    with torch.device("meta"):
        model = model_factory()
    return model.to(dtype) if dtype is not None else model


def _load_reference(pm, reference: torch.nn.Module, how: str) -> None:
    """Give a model compiled from the meta device the reference's weights."""
    if how == "state_dict":
        pm.load_full_state_dict(reference.state_dict())
    elif how == "pretrained":
        with tempfile.TemporaryDirectory() as folder:
            save_model(reference, os.path.join(folder, "model.safetensors"))
            pm.load_pretrained(folder)
    else:
        raise ValueError(f"from_meta={how!r}: use 'state_dict' or 'pretrained'")


class _Twins:
    """The compiled model and its single-device reference, called alike."""

    def __init__(self, pm, reference: torch.nn.Module, inputs: tuple, kwargs: dict[str, Any],
                 target: torch.Tensor | None, loss_fn: Callable | None, default_device: str | None = None):
        self.pm, self.reference = pm, reference
        self.inputs, self.kwargs, self.target, self.loss_fn = inputs, kwargs, target, loss_fn
        self.default_device = default_device

    def guarded(self):
        """The context calls into the compiled model run in (its default device set)."""
        return torch.device(self.default_device) if self.default_device else contextlib.nullcontext()

    def outputs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The forward's outputs (logits, and the loss the model's output carries when it
        computes its own), each beside the reference's, without gradients."""
        with torch.no_grad():
            with self.guarded():
                out = self.pm(*self.inputs, **self.kwargs)
            ref_out = self.reference(*self.inputs, **self.kwargs)
            pairs = _output_pairs(_logits(out), _logits(ref_out))
            if self.loss_fn is None:
                pairs["loss"] = (_own_loss(out), _own_loss(ref_out))
        return pairs

    def step(self) -> torch.Tensor:
        """One ``pm.step`` (forward and backward), its loss."""
        with self.guarded():
            if self.loss_fn is not None:
                return self.pm.step(*self.inputs, target=self.target, **self.kwargs)
            return self.pm.step(*self.inputs, **self.kwargs)

    def reference_loss(self) -> torch.Tensor:
        output = self.reference(*self.inputs, **self.kwargs)
        return self.loss_fn(output, self.target) if self.loss_fn is not None else _own_loss(output)

    def clip(self, max_norm: float) -> None:
        with self.guarded():
            self.pm.clip_grad_norm_(max_norm)
        torch.nn.utils.clip_grad_norm_(self.reference.parameters(), max_norm)


def _compare_first_step(twins: _Twins, report: dict[str, Any]) -> float:
    """One step on both: the loss, every gradient (the worst one named) and the gradient
    norms compared; both clipped to half the reference's norm, which is returned."""
    pm, reference = twins.pm, twins.reference
    loss = twins.step()
    ref_loss = twins.reference_loss()
    if not torch.isfinite(ref_loss.detach()).all():
        # NaN on both sides compares as equal: a comparison with a reference that is not a
        # number would pass whatever the plan computed
        raise AssertionError(f"the single-device model's loss is {ref_loss.item()}: nothing to compare against; "
                             f"give inputs on which the model computes a finite loss")
    ref_loss.backward()
    _compare({"loss": (loss, ref_loss)}, report, "loss")
    with twins.guarded():
        grads = pm.full_gradients()
    _compare({name: (grads[name], p.grad) for name, p in reference.named_parameters()}, report, "grad")
    # the gradient norm as the single-device model has it, then clipping to half of it on
    # both sides before every optimizer step (so the parameters check it too)
    ref_grads = [p.grad for p in reference.parameters() if p.grad is not None]
    ref_norm = torch.nn.utils.get_total_norm(ref_grads)
    with twins.guarded():
        norms = pm.grad_norm(), pm.grad_norm(float("inf"))
    _compare({"2-norm": (norms[0], ref_norm), "inf-norm": (norms[1], torch.nn.utils.get_total_norm(ref_grads, "inf"))},
           report, "grad_norm")
    max_norm = 0.5 * float(ref_norm)
    twins.clip(max_norm)
    return max_norm


def _train_and_compare_parameters(twins: _Twins, report: dict[str, Any], max_norm: float, steps: int,
                                  lr: float) -> None:
    """``steps`` AdamW steps on both (the first on the gradients already there), then every
    entry of the state dict compared (the worst one named)."""
    # eps=1e-6 rather than 1e-8: some gradients are exactly zero in exact arithmetic (the
    # key bias of attention: softmax ignores a shift shared by all keys), and Adam's
    # normalisation would turn their rounding noise (~1e-10, different on both sides)
    # into steps of size lr.
    optimizer = torch.optim.AdamW(twins.pm.parameters(), lr=lr, eps=1e-6)
    ref_optimizer = torch.optim.AdamW(twins.reference.parameters(), lr=lr, eps=1e-6)
    optimizer.step()
    ref_optimizer.step()
    for _ in range(steps - 1):
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
        twins.step()
        twins.reference_loss().backward()
        twins.clip(max_norm)
        optimizer.step()
        ref_optimizer.step()
    with twins.guarded():
        state = twins.pm.full_state_dict()
    _compare({name: (state[name], value) for name, value in twins.reference.state_dict().items()}, report, "param")


def _add_run_stats(pm, reference: torch.nn.Module, report: dict[str, Any]) -> None:
    """What the 3-D layers and the pipeline counted while running (recomputations, sent
    bytes, the parameters this rank holds)."""
    if pm.plan.grid is not None or pm._state.recompute or pm.plan.zero or pm.plan.microbatches > 1 \
            or pm.plan.pipeline:
        report["code"] = pm.rank_graph_code()
        report["recomputed"] = report["code"].count("= recompute_")
    if pm.plan.grid is not None:
        report["tensor3d_stats"] = pm.tensor3d_stats
    if pm.plan.zero or pm.plan.microbatches > 1:  # the memory levers (docs/memory.md)
        report["held_params"] = sum(p.numel() for p in pm.parameters())
        report["all_params"] = sum(p.numel() for p in reference.parameters())
        report["held_without_zero"] = sum(math.prod(pm.layout.cut_shape(p)) for p in pm.layout.unique() if p.held)
        report["zero_stats"] = pm.zero_stats
        if not pm.plan.pipeline:  # the rows of the training program: a microbatch's
            report["program_rows"] = sorted({key[0][0][0][0] for key in pm.runner.programs if key[2]})
    if pm.plan.experts > 1:  # expert parallelism: its rank program, the measured load, the plan's text
        report["code"] = pm.rank_graph_code()
        report["expert_load"] = pm.expert_load()
        report["explain"] = pm.plan.explain()
        report["held_params"] = sum(p.numel() for p in pm.parameters())
        report["all_params"] = sum(p.numel() for p in reference.parameters())
    if pm.plan.pipeline:
        report["buckets_in_backward"] = sum(b.launched_in_backward for b in pm.gradient_buckets.values())
        report["executed"] = pm.pipeline_executor.executed
        report["sent_bytes"] = pm.pipeline_executor.stats["sent_bytes"]
        report["held_params"] = sum(p.numel() for p in pm.parameters())
        report["all_params"] = sum(p.numel() for p in reference.parameters())


# ---------------------------------------------------------------------- cases run on ranks

def equivalence_job(cases: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Run :func:`compare_with_single_device` for each ``(model name, strategy)`` on this rank.

    A strategy ``("mesh", (d, t))`` passes a live 2-D DeviceMesh named ("data", "tensor")
    instead, whose shape fixes the degrees. A third element, ``{"dtype": "float64"}``,
    runs the comparison in that dtype; ``{"hardware": "a100-selene"}`` plans for that machine;
    ``{"overlap": {...}}`` sets the 3D layers' overlap switches; ``{"recompute": True}``
    recomputes the blocks in backward (activation checkpointing; ``"selective"``: the
    attention cores); ``{"device": "cuda"}`` runs model and inputs on the rank's GPU;
    ``{"default_device": "meta"}`` calls the compiled model under that
    default device (the device guard), ``{"steps": 1}`` takes fewer optimizer steps; ``{"batch": 8}``
    sets the language models' batch, ``{"layers": 4}`` their number of blocks, ``{"vocab": 63}``
    their vocabulary, ``{"tied": False}`` the transformer's own LM head (with a bias)."""
    from torch.distributed.device_mesh import init_device_mesh

    from examples.factories import training_case
    reports = []
    for case in cases:
        model_name, strategy = case[0], case[1]
        options = case[2] if len(case) > 2 else {}
        dtype = getattr(torch, options["dtype"]) if "dtype" in options else None
        factory, inputs, target, loss_fn = training_case(model_name, options.get("batch"), options.get("layers"),
                                                         options.get("vocab"), options.get("tied", True))
        mesh = None
        if isinstance(strategy, tuple) and strategy[0] == "mesh":
            mesh = init_device_mesh("cpu", strategy[1], mesh_dim_names=("data", "tensor"))
            strategy = "auto"
        report = compare_with_single_device(factory, inputs, target, loss_fn, strategy, mesh=mesh, dtype=dtype,
                                            hardware=options.get("hardware"), overlap=options.get("overlap"),
                                            recompute=options.get("recompute"),
                                            default_device=options.get("default_device"),
                                            steps=options.get("steps", 3), device=_rank_device(options))
        report["case"] = tuple(case)
        reports.append(report)
    return reports


def _rank_device(options: dict) -> torch.device | None:
    """``{"device": "cuda"}``: this rank's GPU (ranks share the machine's GPUs in turn: one GPU
    serves every rank under gloo, NCCL needs one each); else None (the CPU)."""
    if options.get("device") != "cuda":
        return None
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    return torch.device("cuda", rank % torch.cuda.device_count())


def zoo_equivalence_job(cases: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """:func:`compare_with_single_device` for each ``(zoo model name, strategy)`` of
    :mod:`examples.zoo` (``ZOO`` or ``OWN_LOSS``) on this rank, called as the case calls
    the model: its positional and keyword inputs, its loss or the model's own."""
    from examples.zoo import OWN_LOSS, ZOO
    reports = []
    for name, strategy in cases:
        case = (ZOO.get(name) or OWN_LOSS[name])()
        report = compare_with_single_device(case.factory, case.inputs, case.target, case.loss_fn, strategy,
                                            kwargs=case.kwargs)
        report["case"] = (name, strategy)
        reports.append(report)
    return reports


def measured_bubbles(reports: list[dict[str, Any]]) -> list[float]:
    """Per step, the pipeline's idle share as megatron §2.2 defines the bubble, from every
    rank's report (``{"spans": [(start, end, busy) per step]}``, ``bench_pipeline.py``):
    (makespan − busy) / busy averaged over the
    ranks, the makespan from the first rank's first action to the last rank's last one
    (``time.perf_counter`` is one clock for every process of the machine)."""
    out = []
    for step in range(len(reports[0]["spans"])):
        spans = [r["spans"][step] for r in reports]
        makespan = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
        out.append(sum((makespan - busy) / busy for _, _, busy in spans) / len(spans))
    return out
