"""A differential fuzzer for autopar's soundness contract: every plan ``compile`` accepts
trains exactly as the single device does (float64: outputs, loss, gradients, and the
parameters after 3 AdamW steps, relative error at most :data:`EXACT`, the parameters
:data:`PARAM_EXACT`), or ``compile``
refuses it with :class:`autopar.PlanError`. Nothing else is allowed: no error after
``compile``, no silent difference, no hang.

:func:`generate` makes a small random model and loss from a seed (``random.Random``): a
few operations applied to activations of shape ``[B, T, H]`` or ``[B, H]`` (``B`` = 8),
drawn from a vocabulary of linear layers, pointwise ops, views merging the batch with
other dimensions, masks from the target and the inputs, boolean indexing, reductions
over every dimension, gathers, scatters, concatenations, sorts and scans, tensors built
from ``x.shape[0]``, products across rows, a buffer updated in forward, random draws,
and losses written several ways. The model is written as Python source
(:attr:`Case.source`), executed, and checked to train on one device; a composition that
does not (a shape error, a loss without a gradient, a NaN) is drawn again from the same
generator, so a seed always gives the same case. ``Case.describe()`` is that source with
the operations listed: a failure is reproduced from its seed alone.

:func:`fuzz_job` runs on every rank of a launch: for each ``(seed, strategy)`` it builds
the case and classifies it (:func:`run_case`) as

* ``"exact"``: every relative error within :data:`EXACT` (:data:`PARAM_EXACT`);
* ``"refused"``: ``compile`` raised :class:`autopar.PlanError` (its message kept);
* ``"failure"``: anything else: an error after ``compile`` (or an error other than
  ``PlanError`` inside it), a difference above those bounds (the worst tensor named),
  ranks that disagree, a collective that timed out.

Models that draw random numbers cannot be compared with plain PyTorch (autopar draws its
own numbers, the same under every plan: docs/random_draws.md); they are compared with
autopar on one process instead (a one-rank mesh, the same seed).

``python -m examples.fuzz --cases 2000`` launches the ranks itself and prints the counts
and every failure (``make fuzz``).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import linecache
import logging
import math
import os
import random
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, H0 = 8, 4, 6          # batch, sequence, input width
CLASSES, OUTPUTS = 5, 3     # a classifier's classes, a regression's outputs
WIDTHS = (4, 6, 8)
EXACT = 1e-12
"""The largest relative error (``autopar.testing``'s measure: a tensor's largest
difference over its reference's largest magnitude) of an exact case's outputs, loss,
gradients and gradient norms: float64 sums taken in another order differ by a few units
of 1e-16 (1e-14 at most over these cases)."""
PARAM_EXACT = 1e-10
"""The same bound for the parameters after the AdamW steps. AdamW divides each
gradient entry by its own root mean square: an entry that is zero in exact arithmetic
(a bias followed by a centring, whose gradient is rounding noise ``d`` of about 1e-16
of the largest gradient, different under another summation order) moves by up to
``lr * d / eps`` = 1e-2 * 1e-15 / 1e-6 = 1e-11 per step, where the other side moves by
another noise: up to 1e-10 of a parameter of magnitude 0.1 after 3 steps. Measured:
up to 1.2e-12 (seeds with such a bias), while every difference of a wrong plan so far
was above 1e-4."""
STEPS = 3
SEED = 11                   # autopar's seed of the random draws (compile(seed=...))
COLLECTIVE_TIMEOUT_S = 120  # a collective waiting longer is a hang (a rank that failed alone)
STRATEGIES = {2: [{"data": 2}], 4: [{"data": 2, "tensor": 2}, "auto"]}


# --------------------------------------------------------------------------- the cases

@dataclasses.dataclass
class Case:
    """One generated model and loss. ``factory()`` builds the model (seed 0);
    ``inputs``/``kwargs`` are one batch of ``B`` rows; the loss is
    ``loss_fn(model(*inputs), target)``, or the model's own (``loss_fn`` None: the model
    takes the target as its last input and returns ``{"loss", "logits"}``)."""

    seed: int
    source: str
    ops: list[str]
    factory: Callable[[], nn.Module]
    inputs: tuple
    target: torch.Tensor | None
    loss_fn: Callable | None
    random: bool
    attempts: int

    def describe(self) -> str:
        shapes = ", ".join(f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in self.inputs)
        target = "" if self.target is None else \
            f"; target {list(self.target.shape)} {str(self.target.dtype).removeprefix('torch.')}"
        header = (f"# fuzz case seed={self.seed} (drawn {self.attempts} time(s)); inputs {shapes}{target}; "
                  f"{'random draws: compared with autopar on one process' if self.random else 'deterministic'}\n"
                  f"# ops: {', '.join(self.ops)}\n")
        return header + self.source


class _Invalid(Exception):
    """A composition that does not run (or train) on one device: drawn again."""


class _Program:
    """The model's source, written as the operations are drawn. ``h`` is the running
    activation, ``[B, T, W]`` (``self.seq``) or ``[B, W]``; ``x`` the input; ``y`` the
    target where the model computes its own loss.

    Each kind of operation has variants that keep rows apart (*local*) and variants where
    rows meet or the batch's size is read (*across*: a reduction, scan, index, product or
    concatenation along the batch, positions of rows, ``x.shape[0]`` as a number, a literal
    batch size). A case may draw ``self.across`` of the latter (0 for about half of the
    cases), so that plans splitting the batch are both accepted and refused often."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.init: list[str] = []
        self.body: list[str] = []
        self.ops: list[str] = []
        self.params = 0
        self.temps = 0
        self.random = False
        self.buffer = False
        self.task = rng.choice(["cls", "cls", "reg"])
        self.per_token = rng.random() < 0.5           # the target is [B, T] (or [B, T, C]) rather than [B] ([B, C])
        self.own_loss = rng.random() < 0.4             # the model takes the target and returns its loss
        self.x_seq = self.per_token or rng.random() < 0.6
        self.seq = self.x_seq
        self.width = H0
        self.across = rng.choices([0, 1, 2], [0.45, 0.4, 0.15])[0]

    # ------------------------------------------------------------------ helpers
    def choice(self, options):
        return self.rng.choice(options)

    def pick(self, local: list, across: list = ()):
        """A variant: one of ``across`` while the case may still draw one (six times in
        ten), else one of ``local``; ``(name, ...)`` with the name tagged ``across:``."""
        if across and self.across > 0 and (not local or self.rng.random() < 0.6):
            self.across -= 1
            chosen = self.choice(list(across))
            return (f"across:{chosen[0]}",) + tuple(chosen[1:])
        return self.choice(list(local))

    def layer(self, text: str) -> str:
        name = f"m{self.params}"
        self.params += 1
        self.init.append(f"self.{name} = {text}")
        return f"self.{name}"

    def temp(self) -> str:
        self.temps += 1
        return f"t{self.temps}"

    def emit(self, tag: str, *lines: str) -> None:
        self.ops.append(tag)
        self.body.extend(lines)
        self.body[-len(lines)] += f"  # {tag}"

    def lead(self) -> str:
        """Indexing that broadcasts a [B] tensor against ``h``."""
        return "[:, None, None]" if self.seq else "[:, None]"

    def dims(self) -> str:
        return "(0, 1, 2)" if self.seq else "(0, 1)"

    def mask(self, source: str) -> tuple[str, int]:
        """A boolean mask from the target or the inputs: (expression, 2 for [B, T] or 1 for [B])."""
        if source == "target":
            rank = 2 if self.per_token else 1
            return ("(y != 0)" if self.task == "cls" else "(y[..., 0] != 0)"), rank
        return "(x[..., 0] > 0)", (2 if self.x_seq else 1)

    def against_h(self, mask: str, rank: int) -> str:
        """``mask`` broadcast against ``h``."""
        if self.seq:
            return f"{mask}[..., None]" if rank == 2 else f"{mask}[:, None, None]"
        return f"{mask}[:, None]" if rank == 1 else f"{mask}.any(1)[:, None]"

    def leading(self, mask: str, rank: int) -> str:
        """``mask`` over ``h``'s leading dimensions (``[B, T]`` or ``[B]``), for ``h[mask]``."""
        if (rank == 2) == self.seq:
            return mask
        return f"{mask}.any(1)" if rank == 2 else f"{mask}[:, None].expand(-1, {T})"

    # ------------------------------------------------------------------ row-local ops
    def linear(self):
        out = self.choice(WIDTHS)
        fc = self.layer(f"nn.Linear({self.width}, {out})")
        self.width = out
        self.emit("linear", f"h = {fc}(h)")

    def mlp(self):
        fc1 = self.layer(f"nn.Linear({self.width}, 8)")
        fc2 = self.layer(f"nn.Linear(8, {self.width})")
        act = self.choice(["F.gelu", "torch.relu", "torch.tanh"])
        self.emit("mlp", f"h = h + {fc2}({act}({fc1}(h)))")

    def pointwise(self):
        name, expr = self.choice([("tanh", "torch.tanh(h)"), ("relu", "torch.relu(h)"), ("gelu", "F.gelu(h)"),
                                  ("silu", "F.silu(h)"), ("sigmoid_gate", "h * torch.sigmoid(h)"),
                                  ("square", "0.5 * h * h"), ("gauss", "torch.exp(-h * h)"),
                                  ("softplus", "F.softplus(h)"), ("sin", "torch.sin(h) + h")])
        self.emit(f"pointwise:{name}", f"h = {expr}")

    def residual(self):
        fc = self.layer(f"nn.Linear({self.width}, {self.width})")
        self.emit("residual_linear", f"h = h + {fc}(torch.tanh(h))")

    def feature_norm(self):
        name, expr = self.choice([("layer_norm", f"F.layer_norm(h, ({self.width},))"),
                                  ("normalize", "F.normalize(h, dim=-1)"), ("softmax", "h.softmax(-1)"),
                                  ("log_softmax", "h.log_softmax(-1)"), ("layernorm_module", "{ln}(h)")])
        if "{ln}" in expr:
            expr = expr.format(ln=self.layer(f"nn.LayerNorm({self.width})"))
        self.emit(f"norm:{name}", f"h = {expr}")

    # ------------------------------------------------------------------ views over the batch
    def merge_view(self):
        if not self.seq:
            return self.unpool()
        w, out = self.width, self.choice(WIDTHS)
        kind = self.pick([("reshape",), ("flatten",), ("shape0",), ("features",), ("permute",), ("transpose_T",)],
                         [("literal_batch",), ("transpose_batch_mean",), ("transpose_batch_cumsum",)])[0]
        if kind == "reshape":
            fc = self.layer(f"nn.Linear({w}, {out})")
            self.width = out
            self.emit("view:reshape(-1,H)", f"h = {fc}(h.reshape(-1, {w})).view(-1, {T}, {out})")
        elif kind == "flatten":
            fc = self.layer(f"nn.Linear({w}, {out})")
            self.width = out
            self.emit("view:flatten(0,1)", "h = h.flatten(0, 1)", f"h = torch.tanh({fc}(h))",
                      f"h = h.unflatten(0, (-1, {T}))")
        elif kind == "shape0":
            self.emit("view:x.shape[0]", f"h = h.reshape(x.shape[0] * {T}, {w}).view(x.shape[0], {T}, {w})")
        elif kind == "features":
            fc = self.layer(f"nn.Linear({T * w}, {out})")
            self.width = out
            self.seq = False
            self.emit("view:merge_T_into_features", f"h = {fc}(h.reshape(-1, {T * w}))")
        elif kind == "permute":
            self.emit("view:permute_batch_last", "h = h.permute(2, 1, 0).tanh().permute(2, 1, 0)")
        elif kind == "transpose_T":
            self.emit("view:transpose_batch_cumsum_T", "h = h.transpose(0, 1).cumsum(0).transpose(0, 1)")
        elif kind == "across:literal_batch":
            self.emit("view:across:literal_batch", f"h = h.reshape({B * T}, {w}).view({B}, {T}, {w})")
        elif kind == "across:transpose_batch_mean":
            self.emit("view:across:transpose_mean_batch", "h = h - h.transpose(0, 1).mean(1, keepdim=True).transpose(0, 1)")
        else:
            self.emit("view:across:transpose_cumsum_batch", "h = h.transpose(0, 1).cumsum(1).transpose(0, 1)")

    def pool(self):
        if not self.seq:
            return self.unpool()
        name, expr = self.choice([("mean", "h.mean(1)"), ("sum", "h.sum(1)"), ("amax", "h.amax(1)"),
                                  ("logsumexp", "h.logsumexp(1)"), ("first", "h[:, 0]"), ("last", "h[:, -1]"),
                                  ("var", "h.var(1)")])
        self.seq = False
        self.emit(f"pool_T:{name}", f"h = {expr}")

    def unpool(self):
        if self.seq:
            return self.pool()
        name, expr = self.choice([("expand", f"h[:, None, :].expand(-1, {T}, -1)"),
                                  ("repeat", f"h.unsqueeze(1).repeat(1, {T}, 1)"),
                                  ("positions", f"h[:, None, :] + 0.1 * torch.arange({T}, dtype=h.dtype)[:, None]")])
        self.seq = True
        self.emit(f"unpool_T:{name}", f"h = {expr}")

    # ------------------------------------------------------------------ masks
    def mask_op(self):
        source = "target" if self.own_loss and self.rng.random() < 0.6 else "input"
        mask, rank = self.mask(source)
        m = self.against_h(mask, rank)
        name, expr = self.choice([("float", f"h * {m}.float()"), ("where", f"torch.where({m}, h, 0.0)"),
                                  ("masked_fill", f"h.masked_fill(~{m}, 0.0)"),
                                  ("where_shift", f"torch.where({m}, h, h - 1.0)")])
        self.emit(f"mask:{source}:{name}", f"h = {expr}")

    def bool_index(self):
        source = "target" if self.own_loss and self.rng.random() < 0.5 else "input"
        mask, rank = self.mask(source)
        m = self.leading(mask, rank)
        t = self.temp()
        name, *rest = self.pick([("index_put_tanh",), ("masked_scatter",)],
                                [("mean", f"{t}.mean(0)"), ("sum", f"{t}.sum(0)"), ("amax", f"{t}.amax(0)"),
                                 ("scalar_mean", f"{t}.mean()"), ("norm", f"{t}.pow(2).sum(0).sqrt()")])
        if name == "index_put_tanh":      # the selected rows changed in place of the others: rows kept apart
            self.emit(f"bool_index:{source}:{name}", f"{t} = h[{m}]", f"h = h.index_put(({m},), torch.tanh({t}))")
        elif name == "masked_scatter":
            self.emit(f"bool_index:{source}:{name}", f"{t} = {self.against_h(mask, rank)}.expand_as(h)",
                      f"h = h.masked_scatter({t}, 2.0 * h[{t}])")
        else:
            self.emit(f"bool_index:{source}:{name}", f"{t} = h[{m}]", f"h = h - 0.5 * {rest[0]}")

    # ------------------------------------------------------------------ reductions
    def reduce(self):
        dim, = self.pick([(-1,), (-1,)] + ([(1,)] if self.seq else []), [("batch", 0), ("all", "all")])[-1:]
        across = dim in (0, "all")
        if dim == "all":
            name, expr = self.choice([("mean", "h - h.mean()"), ("sum", "h / (1.0 + h.sum().abs())"),
                                      ("amax", "h - h.amax()"), ("var", "h / (1.0 + h.var())"),
                                      ("logsumexp", f"h - h.logsumexp({self.dims()})"),
                                      ("rms", "h * torch.rsqrt(1.0 + h.pow(2).mean())")])
        else:
            k = f"{dim}, keepdim=True"
            name, expr = self.choice([("mean", f"h - h.mean({k})"), ("sum", f"h / (1.0 + h.sum({k}).abs())"),
                                      ("amax", f"h - h.amax({k})"), ("var", f"h / (1.0 + h.var({k}))"),
                                      ("logsumexp", f"h - h.logsumexp({k})"),
                                      ("std", f"h / (1.0 + h.std({k}))"), ("amin", f"h - h.amin({k})")])
        self.emit(f"reduce:{'across:' if across else ''}{name}:dim={dim}", f"h = {expr}")

    # ------------------------------------------------------------------ indexing
    def gather(self):
        w = self.width
        local = [("gather_features_argsort", "torch.gather(h, -1, h.argsort(-1))"),
                 ("take_along_features_argmax", "h * torch.take_along_dim(h, h.argmax(-1, keepdim=True), -1)"),
                 ("index_select_features", f"h.index_select(-1, torch.tensor({list(reversed(range(w)))}))")]
        across = [("index_select_batch_flip", "h.index_select(0, torch.arange(h.shape[0]).flip(0))"),
                  ("gather_batch_argmax", "h + torch.gather(h, 0, h.argmax(0, keepdim=True))"),
                  ("index_batch_argsort", "h[h.reshape(h.shape[0], -1)[:, 0].argsort()]"),
                  ("take_along_batch", "torch.take_along_dim(h, h.argsort(0), 0)")]
        if not self.seq:
            local.append(("pick_per_row", "h * h[torch.arange(h.shape[0]), h.argmax(-1)][:, None]"))
        else:
            local.append(("take_along_T", "torch.take_along_dim(h, h[..., :1].argsort(1), 1)"))
            local.append(("pick_per_row_T", "h * h[torch.arange(h.shape[0]), 0][:, None, :]"))
        name, expr = self.pick(local, across)
        self.emit(f"gather:{name}", f"h = {expr}")

    def scatter(self):
        w = self.width
        rows = f"h.new_zeros(2, h.shape[1], h.shape[2])" if self.seq else "h.new_zeros(2, h.shape[1])"
        local = [("scatter_add_features",
                  f"torch.zeros_like(h).scatter_add(-1, torch.arange({w}).flip(0).expand_as(h), h)"),
                 ("index_add_features", f"h.new_zeros(h.shape).index_add(-1, torch.tensor({[i % 2 for i in range(w)]}), h)"),
                 ("index_add_features_zeros_like",
                  f"torch.zeros_like(h).index_add(-1, torch.tensor({[i % 2 for i in range(w)]}), h)")]
        across = [("index_add_batch_parity", f"h + 0.1 * {rows}.index_add(0, torch.arange(h.shape[0]) % 2, h)"
                                             "[torch.arange(h.shape[0]) % 2]")]
        if self.own_loss and self.task == "cls" and not self.per_token and not self.seq:
            across.append(("class_centroids", f"h - 0.1 * h.new_zeros({CLASSES}, {w}).index_add(0, y, h)[y]"))
        if not self.seq:
            across.append(("scatter_add_batch_argmax",
                           "h + h.new_zeros(h.shape).scatter_add(0, h.argmax(0, keepdim=True).expand_as(h), h)"))
        name, expr = self.pick(local, across)
        self.emit(f"scatter:{name}", f"h = {expr}")

    def cat_stack(self):
        last = 2 if self.seq else 1
        local = [("cat_features", "torch.cat([h, torch.tanh(h)], -1)", 2),
                 ("stack_new0_amax", "torch.stack([h, -h], 0).amax(0)", 1),
                 ("stack_new1_mean", "torch.stack([h, h * h], 1).mean(1)", 1),
                 ("stack_last_sum", "torch.stack([h, h.sin()], -1).sum(-1)", 1)]
        across = [("cat_batch_fold", "torch.cat([h, torch.tanh(h)], 0).unflatten(0, (2, -1)).sum(0)", 1),
                  ("cat_batch_then_mean", f"torch.cat([h, h.roll(1, {last})], 0).mean(0, keepdim=True) + h", 1),
                  ("cat_roll_batch", "torch.cat([h, h.roll(1, 0)], -1)", 2)]
        name, expr, grow = self.pick(local, across)
        self.width *= grow
        self.emit(f"cat:{name}", f"h = {expr}")

    def sort_scan(self):
        dim = self.pick([(-1,)] + ([(1,)] if self.seq else []), [("batch", 0)])[-1]
        name, expr = self.choice([("sort", f"h.sort({dim}).values"), ("cumsum", f"h.cumsum({dim})"),
                                  ("topk_sum", f"h + h.topk(2, {dim}).values.sum({dim}, keepdim=True)"),
                                  ("cummax", f"h.cummax({dim}).values"), ("flip", f"h + 0.5 * h.flip({dim})"),
                                  ("softmax", f"h.softmax({dim})"), ("logcumsumexp", f"torch.logcumsumexp(h, {dim})")])
        self.emit(f"scan:{'across:' if dim == 0 else ''}{name}:dim={dim}", f"h = {expr}")

    # ------------------------------------------------------------------ positions and sizes
    def positions(self):
        ones = "h.new_ones(h.shape[0], h.shape[1], 1)" if self.seq else "h.new_ones(h.shape[0], 1)"
        local = [("arange_features", "h + 0.1 * torch.arange(h.shape[-1], dtype=h.dtype)"),
                 ("ones_batch_column", f"torch.cat([h, {ones}], -1)"),
                 ("ones_like_rows", f"h + torch.ones(x.shape[0], dtype=h.dtype){self.lead()}")]
        across = [("arange_batch_scale", f"h * torch.arange(h.shape[0], dtype=h.dtype){self.lead()}"),
                  ("eye_batch_matmul", "(torch.eye(x.shape[0], dtype=h.dtype) @ h.reshape(x.shape[0], -1)).view(h.shape)"),
                  ("batch_size_scale", "h * (x.shape[0] / 4.0)"),
                  ("ones_count", "h / torch.ones(x.shape[0]).sum()"),
                  ("sum_over_batch_size", "h - h.sum(0, keepdim=True) / x.shape[0]")]
        if self.seq:
            local.append(("arange_T", "h + 0.1 * torch.arange(x.shape[1], dtype=h.dtype)[:, None]"))
        name, expr = self.pick(local, across)
        if name.endswith("ones_batch_column"):
            self.width += 1
        self.emit(f"positions:{name}", f"h = {expr}")

    def products(self):
        z = "h" if not self.seq else "h.mean(1)"
        lead = self.lead()
        t = self.temp()
        local = [("einsum_within_row",)]
        across = [("scores_mean",), ("scores_logsumexp",), ("attention_over_batch",), ("einsum_pairwise",),
                  ("contract_batch",), ("scores_eye",), ("scores_diag",)]
        kind = self.pick(local, across)[0]
        if kind == "einsum_within_row":
            if self.seq:
                lines = [f"{t} = torch.einsum('bth,bsh->bts', h, h)", f"h = {t}.softmax(-1) @ h"]
            else:
                lines = [f"{t} = torch.einsum('bi,bj->bij', h, h)", f"h = {t}.mean(-1)"]
        elif kind.endswith("scores_mean"):
            lines = [f"{t} = {z} @ {z}.t()", f"h = h + 0.1 * {t}.mean(-1){lead}"]
        elif kind.endswith("scores_logsumexp"):
            lines = [f"{t} = {z} @ {z}.transpose(0, 1)", f"h = h - 0.1 * {t}.logsumexp(-1){lead}"]
        elif kind.endswith("attention_over_batch"):
            if self.seq:
                lines = [f"{t} = torch.einsum('bth,cth->bc', h, h)", f"h = torch.einsum('bc,cth->bth', {t}.softmax(-1), h)"]
            else:
                lines = [f"{t} = h @ h.t()", f"h = {t}.softmax(-1) @ h"]
        elif kind.endswith("einsum_pairwise"):
            lines = [f"{t} = torch.einsum('bh,ch->bc', {z}, {z})", f"h = h * torch.sigmoid({t}.sum(-1)){lead}"]
        elif kind.endswith("contract_batch"):
            lines = [f"{t} = torch.einsum('bi,bj->ij', {z}, {z}) / 8.0", f"h = h @ {t}"]
        elif kind.endswith("scores_eye"):
            lines = [f"{t} = {z} @ {z}.t() - 1e3 * torch.eye(x.shape[0], dtype=h.dtype)",
                     f"h = h + 0.1 * {t}.logsumexp(-1){lead}"]
        else:
            lines = [f"{t} = {z} @ {z}.t()", f"h = h * {t}.diagonal(){lead}"]
        self.emit(f"product:{kind}", *lines)

    def buffer_update(self):
        if self.buffer:
            return self.reduce()
        self.buffer = True
        w = self.width
        flat = "h" if not self.seq else f"h.reshape(-1, {w})"
        name, stat = self.pick([("counter", None)],
                               [("mean", f"{flat}.mean(0)"), ("var", f"{flat}.var(0)"), ("amax", f"{flat}.amax(0)"),
                                ("sum_over_rows", f"{flat}.sum(0) / {flat}.shape[0]")])
        if stat is None:
            self.init.append("self.register_buffer('count', torch.zeros(()))")
            self.emit(f"buffer_update:{name}", "with torch.no_grad():", "    self.count.add_(1.0)",
                      "h = h * (1.0 + 0.1 * self.count)")
        else:
            self.init.append(f"self.register_buffer('stat', torch.zeros({w}))")
            self.emit(f"buffer_update:{name}", "with torch.no_grad():",
                      f"    self.stat.mul_(0.9).add_(0.1 * {stat})", "h = h - self.stat")

    def draws(self):
        self.random = True
        p = self.choice([0.1, 0.25, 0.5])
        name, expr = self.choice([("dropout_fn", f"F.dropout(h, {p}, self.training)"),
                                  ("dropout_module", "{d}(h)"),
                                  ("rand_like_mask", f"h * (torch.rand_like(h) > {p})"),
                                  ("randn_like_noise", "h + 0.1 * torch.randn_like(h)"),
                                  ("randn_shape", "h + 0.1 * torch.randn(h.shape, dtype=h.dtype)"),
                                  ("bernoulli", f"h * torch.bernoulli(torch.full_like(h, {1 - p}))")])
        if "{d}" in expr:
            expr = expr.format(d=self.layer(f"nn.Dropout({p})"))
        self.emit(f"random:{name}", f"h = {expr}")

    def exotic(self):
        """Ops the batch analysis may have no rule for: along another dimension, or along the batch."""
        dim = self.pick([(-1,)], [("batch", 0)])[-1]
        options = [("diff", f"h - torch.diff(h, dim={dim}, prepend=h.narrow({dim}, 0, 1))"),
                   ("renorm", f"torch.renorm(h, 2, {1 if dim == 0 else 0}, 1.0)"),
                   ("vector_norm", f"h / (1.0 + torch.linalg.vector_norm(h, dim={dim}, keepdim=True))"),
                   ("cummin", f"h.cummin({dim}).values"),
                   ("median", f"h - h.median({dim}, keepdim=True).values"),
                   ("kthvalue", f"h - h.kthvalue(2, {dim}, keepdim=True).values"),
                   ("std_mean", f"torch.std_mean(h, {dim}, keepdim=True)[1] + h"),
                   ("roll", f"h + 0.5 * h.roll(1, {dim})"),
                   ("trapezoid", f"h + torch.trapezoid(h, dim={dim}).unsqueeze({dim})"),
                   ("cosine_similarity", f"h * F.cosine_similarity(h, h.roll(1, {dim}), dim=-1).unsqueeze(-1)"),
                   ("aminmax", f"h - torch.aminmax(h, dim={dim}, keepdim=True).max"),
                   ("nanmean", f"h - h.nanmean({dim}, keepdim=True)"),
                   ("count_nonzero", f"h * torch.count_nonzero(h > 0, dim={dim}).unsqueeze({dim})")]
        if dim == 0 and not self.seq:
            options.append(("tril", "torch.tril(h)"))
        name, expr = self.choice(options)
        self.emit(f"exotic:{'across:' if dim == 0 else ''}{name}:dim={dim}", f"h = {expr}")

    # ------------------------------------------------------------------ the head and the loss
    BLOCKS = [("linear", 8), ("mlp", 5), ("pointwise", 8), ("residual", 3), ("feature_norm", 4), ("merge_view", 7),
              ("pool", 3), ("mask_op", 5), ("bool_index", 3), ("reduce", 7), ("gather", 4), ("scatter", 3),
              ("cat_stack", 4), ("sort_scan", 4), ("positions", 4), ("products", 5), ("buffer_update", 2),
              ("draws", 3), ("exotic", 4)]

    def write(self) -> str:
        n = self.rng.randint(2, 5)
        names, weights = zip(*self.BLOCKS)
        self.linear()   # the first op is a layer, so every case has a parameter before anything else
        for _ in range(n):
            getattr(self, self.rng.choices(names, weights)[0])()
        if self.seq != self.per_token:   # the head's rank is the target's
            self.pool() if self.seq else self.unpool()
        outputs = CLASSES if self.task == "cls" else OUTPUTS
        head = self.layer(f"nn.Linear({self.width}, {outputs})")
        self.body.append(f"out = {head}(h)")
        loss = self.loss_lines()
        args = "x, y" if self.own_loss else "x"
        lines = ["class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
        lines += [f"        {line}" for line in self.init]
        lines += ["", f"    def forward(self, {args}):", "        h = x"]
        lines += [f"        {line}" for line in self.body]
        if self.own_loss:
            lines += [f"        {line}" for line in loss]
            lines += ["        return {'loss': loss, 'logits': out}"]
        else:
            lines += ["        return out", "", "", "def loss_fn(out, y):"]
            lines += [f"    {line}" for line in loss] + ["    return loss"]
        return "\n".join(lines) + "\n"

    def loss_lines(self) -> list[str]:
        if self.task == "cls":
            flat = "out.reshape(-1, out.shape[-1]), y.reshape(-1)" if self.per_token else "out, y"
            local = ["ce", "ce_ignore", "masked_mean", "sum_over_n", "mean_plus_sum", "bool_index_mean", "nll",
                     "smoothing", "sum_over_numel", "sum_over_literal"] + (["ce_transpose"] if self.per_token else [])
            kind = self.pick([(k,) for k in local], [("amax",)])[0]
            lines = {
                "ce": [f"loss = F.cross_entropy({flat})"],
                "ce_ignore": [f"loss = F.cross_entropy({flat}, ignore_index=0)"],
                "ce_transpose": ["loss = F.cross_entropy(out.transpose(1, 2), y)"],
                "masked_mean": [f"per = F.cross_entropy({flat}, reduction='none').view(y.shape)",
                                "m = (y != 0).float()", "loss = (per * m).sum() / m.sum()"],
                "sum_over_n": [f"loss = F.cross_entropy({flat}, reduction='sum') / y.shape[0]"],
                "mean_plus_sum": [f"loss = F.cross_entropy({flat}) + 0.01 * out.pow(2).sum()"],
                "bool_index_mean": [f"per = F.cross_entropy({flat}, reduction='none').view(y.shape)",
                                    "loss = per[y != 0].mean()"],
                "nll": ["loss = F.nll_loss(F.log_softmax(out, -1).reshape(-1, out.shape[-1]), y.reshape(-1))"],
                "smoothing": [f"loss = F.cross_entropy({flat}, label_smoothing=0.1)"],
                "across:amax": [f"loss = F.cross_entropy({flat}, reduction='none').amax()"],
                "sum_over_numel": [f"loss = F.cross_entropy({flat}, reduction='sum') / y.numel()"],
                "sum_over_literal": [f"loss = F.cross_entropy({flat}, reduction='sum') / "
                                     f"{B * (T if self.per_token else 1)}.0"],
            }[kind]
        else:
            local = ["mse", "mse_sum_over_7", "l1", "huber", "masked_mean", "mean_plus_sum", "sum_over_n",
                     "bool_index_mean"]
            kind = self.pick([(k,) for k in local], [("amax",)])[0]
            lines = {
                "mse": ["loss = F.mse_loss(out, y)"],
                "mse_sum_over_7": ["loss = F.mse_loss(out, y, reduction='sum') / 7.0"],
                "l1": ["loss = F.l1_loss(out, y)"],
                "huber": ["loss = F.huber_loss(out, y, delta=0.5)"],
                "masked_mean": ["m = (y[..., 0] != 0).float()[..., None]",
                                "loss = ((out - y).pow(2) * m).sum() / m.sum()"],
                "mean_plus_sum": ["loss = F.mse_loss(out, y) + 0.01 * out.pow(2).sum()"],
                "sum_over_n": ["loss = (out - y).pow(2).sum() / out.shape[0]"],
                "bool_index_mean": ["loss = (out - y).pow(2).sum(-1)[y[..., 0] != 0].mean()"],
                "across:amax": ["loss = (out - y).pow(2).amax()"],
            }[kind]
        self.ops.append(f"loss:{self.task}:{kind}")
        if self.rng.random() < 0.25:
            z = "out" if not self.per_token else "out.mean(1)"
            aux, expr = self.pick([("l2_sum", "out.pow(2).sum()"), ("l2_mean", "out.pow(2).mean()")],
                                  [("contrastive_arange", f"F.cross_entropy({z} @ {z}.t(), torch.arange({z}.shape[0]))"),
                                   ("contrastive_flipped",
                                    f"F.cross_entropy({z} @ {z}.t(), torch.arange({z}.shape[0]).flip(0))"),
                                   ("logsumexp_over_batch", "out.logsumexp(0).mean()"),
                                   ("batch_variance", "out.var(0).mean()")])
            lines = lines + [f"loss = loss + 0.1 * {expr}"]
            self.ops.append(f"loss_term:{aux}")
        return lines


def _data(rng: random.Random, program: _Program) -> tuple[tuple, torch.Tensor]:
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    x = torch.randn(*((B, T, H0) if program.x_seq else (B, H0)), generator=g)
    lead = (B, T) if program.per_token else (B,)
    if program.task == "cls":
        y = torch.randint(0, CLASSES, lead, generator=g)
        y[0] = 1 if not program.per_token else y[0].clamp(min=1)   # some rows counted in each half of the batch
        y[-1] = 2 if not program.per_token else y[-1].clamp(min=1)
    else:
        y = torch.randn(*lead, OUTPUTS, generator=g)
        y = y * (torch.rand(*lead, 1, generator=g) > 0.3)
        y[0], y[-1] = y[0] + (y[0] == 0) * 1.0, y[-1] + (y[-1] == 0) * 1.0
    return (x,), y


def _load(source: str, seed: int, attempt: int) -> dict:
    """Execute the generated source (its lines kept for tracebacks)."""
    filename = f"<fuzz seed {seed} attempt {attempt}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch, "nn": nn, "F": F}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the fuzzer's own generated code
    return namespace


def _check_runs(case: Case) -> None:
    """The case trains on one device in float64: a finite loss with a gradient, finite
    gradients; else :class:`_Invalid`."""
    torch.manual_seed(0)
    model = case.factory().double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in case.inputs)
    target = case.target.double() if case.target is not None and case.target.is_floating_point() else case.target
    try:
        out = model(*inputs)
        loss = case.loss_fn(out, target) if case.loss_fn is not None else out["loss"]
        if loss.dim() != 0 or not loss.requires_grad:
            raise _Invalid("the loss is not a scalar with a gradient")
        loss.backward()
    except _Invalid:
        raise
    except Exception as error:  # noqa: BLE001 - an invalid composition, drawn again
        raise _Invalid(f"{type(error).__name__}: {error}") from error
    if not torch.isfinite(loss) or abs(loss.item()) > 1e6:
        raise _Invalid("the loss is not finite")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads or not all(torch.isfinite(g).all() for g in grads):
        raise _Invalid("a gradient is not finite")


def generate(seed: int, max_attempts: int = 100) -> Case:
    """The case of ``seed``: drawn from ``random.Random(seed)`` until a composition trains
    on one device (each later draw continues the same generator)."""
    rng = random.Random(seed)
    last = None
    for attempt in range(1, max_attempts + 1):
        program = _Program(rng)
        source = program.write()
        inputs, target = _data(rng, program)
        namespace = _load(source, seed, attempt)
        model_class = namespace["Model"]

        def factory(model_class=model_class):
            torch.manual_seed(0)
            return model_class()
        if program.own_loss:
            inputs, loss_fn, case_target = inputs + (target,), None, None
        else:
            loss_fn, case_target = namespace["loss_fn"], target
        case = Case(seed, source, program.ops, factory, inputs, case_target, loss_fn, program.random, attempt)
        try:
            _check_runs(case)
        except _Invalid as error:
            last = error
            continue
        return case
    raise RuntimeError(f"seed {seed}: no valid composition in {max_attempts} draws (last: {last})")


# --------------------------------------------------------------------------- on the ranks

def _worst(report: dict) -> tuple[str, str | None, float]:
    """(kind, tensor, relative error) of the largest relative error of a comparison
    report; a NaN counts as infinite."""
    worst = None
    for kind in ("output", "loss", "grad", "grad_norm", "param"):
        if kind in report:
            rel = report[kind][1]
            rel = math.inf if math.isnan(rel) else rel
            if worst is None or rel > worst[2]:
                worst = (kind, report.get("worst_" + kind), rel)
    return worst or ("", None, math.inf)


def _within_bounds(report: dict) -> bool:
    """Whether every relative error of a report is within its kind's bound (:data:`EXACT`,
    :data:`PARAM_EXACT` for the parameters); NaN is not."""
    return all(report[kind][1] <= (PARAM_EXACT if kind == "param" else EXACT)
               for kind in ("output", "loss", "grad", "grad_norm", "param") if kind in report) \
        and all(kind in report for kind in ("output", "loss", "grad", "param"))


def _one_rank_mesh():
    """A mesh of this rank alone (autopar on one process, world 1, inside a launch): the
    groups of one rank each, made collectively once."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    global _SOLO
    if _SOLO is None or _SOLO[0] is not dist.group.WORLD:
        groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
        _SOLO = (dist.group.WORLD, DeviceMesh.from_group(groups[dist.get_rank()], "cpu"))
    return _SOLO[1]


_SOLO = None


def _train_autopar(case: Case, strategy, mesh) -> dict[str, Any]:
    """The case compiled by autopar (float64, seed :data:`SEED`) and trained as
    ``compare_with_single_device`` trains: the forward's outputs, the first step's loss
    and gradients (clipped to half their norm), then :data:`STEPS` AdamW steps; every
    state dict entry at the end."""
    import autopar
    torch.manual_seed(0)
    model = case.factory().double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in case.inputs)
    target = case.target.double() if case.target is not None and case.target.is_floating_point() else case.target
    pm = autopar.compile(model, mesh, example_inputs=inputs, loss_fn=case.loss_fn, example_target=target,
                         strategy=strategy, seed=SEED)
    return _train_compiled(pm, case, inputs, target)


def _train_compiled(pm, case: Case, inputs: tuple, target) -> dict[str, Any]:
    def step():
        return pm.step(*inputs, target=target) if case.loss_fn is not None else pm.step(*inputs)
    with torch.no_grad():
        out = pm(*inputs)
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    result: dict[str, Any] = {"output": {f"logits.{i}": t.detach().clone() for i, t in enumerate(leaves)
                                         if isinstance(t, torch.Tensor)}}
    result["loss"] = {"loss": step().detach().clone()}
    grads = pm.full_gradients()
    result["grad"] = {k: (v.detach().clone() if v is not None else None) for k, v in grads.items()}
    norm = pm.grad_norm()
    result["grad_norm"] = {"2-norm": torch.as_tensor(norm).detach().clone()}
    pm.clip_grad_norm_(0.5 * float(norm))
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-6)
    optimizer.step()
    for _ in range(STEPS - 1):
        optimizer.zero_grad()
        step()
        pm.clip_grad_norm_(0.5 * float(norm))
        optimizer.step()
    result["param"] = {k: v.detach().clone() for k, v in pm.full_state_dict().items()}
    result["mesh"], result["form"] = dict(pm.plan.mesh), getattr(pm.plan, "form", None)
    return result


def _compare_random(case: Case, strategy) -> dict[str, Any]:
    """A case with random draws: autopar under ``strategy`` against autopar on this rank
    alone (a one-rank mesh), the same seed; a report shaped like
    ``compare_with_single_device``'s."""
    from autopar.testing import _compare
    reference = _train_autopar(case, "auto", _one_rank_mesh())
    got = _train_autopar(case, strategy, None)
    report: dict[str, Any] = {"mesh": got["mesh"], "reference": "autopar on one process"}
    for kind in ("output", "loss", "grad", "grad_norm", "param"):
        if set(got[kind]) != set(reference[kind]):
            raise AssertionError(f"{kind}: the plan gives {sorted(got[kind])}, one process {sorted(reference[kind])}")
        _compare({k: (got[kind][k], reference[kind][k]) for k in reference[kind]}, report, kind)
    return report


def _compiled_here(tb) -> bool:
    """Whether the traceback ``tb`` passes through ``autopar.compile``."""
    import autopar.api
    code = getattr(autopar.api.compile, "__wrapped__", autopar.api.compile).__code__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _tail(text: str, lines: int = 14, chars: int = 3000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def run_case(seed: int, strategy, case: Case | None = None) -> dict[str, Any]:
    """One case on this rank (inside a launch): ``{"seed", "strategy", "outcome",
    "message", "worst", "errors", "mesh", "seconds", "ops", "random"}``; ``outcome`` is
    ``"exact"``, ``"refused"`` or ``"failure"``; an error after ``compile`` sets
    ``"collective"`` where it is a failed collective (the process group may be unusable
    after it). ``case``: this case instead of ``generate(seed)``'s."""
    from autopar.planning.strategy import PlanError
    from autopar.runtime.health import RankFailureError, is_collective_failure
    from autopar.testing import compare_with_single_device
    start = time.perf_counter()
    result: dict[str, Any] = {"seed": seed, "strategy": strategy, "message": "", "worst": None, "mesh": None}
    try:
        case = case or generate(seed)
    except Exception:  # noqa: BLE001 - the generator's own failure (no composition), reported
        result.update(outcome="failure", message="generator: " + _tail(traceback.format_exc()), ops=[], random=False)
        return result
    result["ops"], result["random"] = case.ops, case.random
    try:
        if case.random:
            report = _compare_random(case, strategy)
        else:
            target = case.target.double() if case.target is not None and case.target.is_floating_point() \
                else case.target   # as the model (a loss of two dtypes fails in backward on one device too)
            report = compare_with_single_device(case.factory, case.inputs, target, case.loss_fn, strategy,
                                                dtype=torch.float64, steps=STEPS)
    except PlanError as error:
        if _compiled_here(error.__traceback__):
            result.update(outcome="refused", message=str(error))
        else:
            result.update(outcome="failure", message="PlanError after compile: " + _tail(traceback.format_exc()))
    except Exception as error:  # noqa: BLE001 - every other error is the case's failure
        where = "compile" if _compiled_here(error.__traceback__) else "after compile"
        result.update(outcome="failure", message=f"{type(error).__name__} in {where}: " + _tail(traceback.format_exc()))
        result["collective"] = isinstance(error, RankFailureError) or is_collective_failure(error)
    else:
        kind, name, rel = _worst(report)
        result["worst"], result["mesh"] = (kind, name, rel), report.get("mesh")
        result["errors"] = {k: report[k][1] for k in ("output", "loss", "grad", "grad_norm", "param") if k in report}
        result["tracer"] = report.get("tracer")
        if _within_bounds(report):
            result["outcome"] = "exact"
        else:
            errors = {k: report[k] for k in ("output", "loss", "grad", "grad_norm", "param") if k in report}
            result.update(outcome="failure", message=f"relative error {rel:.3g} at {kind} {name} (max abs, max rel "
                                                     f"per kind: {errors})")
    result["seconds"] = time.perf_counter() - start
    return result


def _agree(store, key: str, outcome: str, world: int, rank: int, timeout_s: float) -> list[str | None]:
    """Every rank's outcome of one case, through the launch's store (not a collective: a
    rank stuck in one still answers once its collective times out)."""
    store.set(f"{key}/{rank}", outcome)
    keys = [f"{key}/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 - a rank that never answered: None
        return [store.get(k).decode() if store.check([k]) else None for k in keys]
    return [store.get(k).decode() for k in keys]


def fuzz_job(pairs: list[tuple[int, Any]], collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
             raise_when_broken: bool = True) -> list[dict]:
    """On every rank of a launch: :func:`run_case` for each ``(seed, strategy)``. Each case's
    exception is caught; after each case the ranks compare outcomes (``"failure"`` where
    they disagree) and recover from the failures autopar's board holds. Collectives time
    out after ``collective_timeout_s`` (a rank that failed alone leaves the others waiting:
    a hang); after a failed collective the process group is not trusted: the job raises
    :class:`ProcessGroupFailed` with the results so far (a launch shared with other jobs
    runs those again on fresh ranks), or with ``raise_when_broken=False`` returns the cases
    left as ``"not run"``. autopar's log is kept off the console; the batch analysis's
    warnings of a case (the ops it has no rule for) go into its result."""
    import torch.distributed as dist
    from autopar._torch_compat import group_timeout, set_group_timeout
    from autopar.runtime import health
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    token = [f"{os.getpid()}-{time.time_ns()}" if rank == 0 else None]
    dist.broadcast_object_list(token)
    previous = group_timeout(dist.group.WORLD)
    results: list[dict] = []
    with warnings.catch_warnings(), _QuietLog() as log:
        warnings.simplefilter("ignore")
        set_group_timeout(dist.group.WORLD, datetime.timedelta(seconds=collective_timeout_s))
        try:
            for index, (seed, strategy) in enumerate(pairs):
                log.records.clear()
                result = run_case(seed, strategy)
                if log.records:
                    result["analysis_warnings"] = sorted(set(log.records))
                if health._STATE.reported:
                    health._recovered()
                state = "broken" if result.get("collective") else result["outcome"]
                everyone = _agree(store, f"autopar-fuzz/{token[0]}/{index}", state, world, rank,
                                  2 * collective_timeout_s)
                result["ranks"] = everyone
                if len(set(everyone)) > 1 and result["outcome"] != "failure":
                    result.update(outcome="failure", message=f"the ranks disagree: {everyone}. " + result["message"])
                results.append(result)
                if "broken" in everyone or None in everyone:
                    results += [{"seed": s, "strategy": st, "outcome": "not run", "ops": [], "random": False,
                                 "message": f"not run: the process group failed at seed {seed}", "worst": None}
                                for s, st in pairs[index + 1:]]
                    break
        finally:
            if previous is not None:
                set_group_timeout(dist.group.WORLD, previous)
    if raise_when_broken and any(r["outcome"] == "not run" for r in results):
        raise ProcessGroupFailed(summary([r for r in results if r["outcome"] != "not run"]) +
                                 f"\n{sum(r['outcome'] == 'not run' for r in results)} cases not run")
    return results


class ProcessGroupFailed(RuntimeError):
    """A case left the process group unusable (a collective timed out: a hang)."""


class _QuietLog(logging.Handler):
    """Inside the block, autopar's log goes here instead of the console; ``records``
    keeps the batch analysis's warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self.logger = logging.getLogger("autopar")

    def emit(self, record):
        if record.name.startswith("autopar.analysis.batch_rows"):
            self.records.append(record.getMessage()[:500])

    def __enter__(self):
        self.saved = (self.logger.propagate, self.logger.level)
        self.logger.propagate = False
        self.logger.setLevel(logging.WARNING)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.propagate, level = self.saved
        self.logger.setLevel(level)


# --------------------------------------------------------------------------- minimizing a failure

def op_blocks(source: str) -> list[tuple[int, int]]:
    """The forward's operations in ``source``: ``(first line, end)`` of each, a line
    tagged ``# <op>`` and the untagged lines after it, up to the head."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "h = x") + 1
    blocks: list[list[int]] = []
    for i in range(start, len(lines)):
        text = lines[i].strip()
        if text.startswith("out = ") or not text or text.startswith("return"):
            break
        if "  # " in lines[i]:
            blocks.append([i, i + 1])
        elif blocks:
            blocks[-1][1] = i + 1
    return [tuple(b) for b in blocks]


def _drop_unused(source: str) -> str:
    """``source`` without the layers and buffers its forward no longer uses (an unused
    parameter is a case of its own: no gradient)."""
    lines = source.splitlines(True)
    forward = "".join(lines[next(i for i, line in enumerate(lines) if "def forward" in line):])
    kept = []
    for line in lines:
        text = line.strip()
        name = text.split(" = ")[0].removeprefix("self.") if text.startswith("self.m") else \
            text.split("'")[1] if text.startswith("self.register_buffer(") else None
        if name is None or f"self.{name}" in forward:
            kept.append(line)
    return "".join(kept)


def with_source(case: Case, source: str) -> Case:
    """``case`` with the model and loss of ``source`` (its inputs and target kept)."""
    namespace = _load(source, case.seed, 0)
    model_class = namespace["Model"]

    def factory():
        torch.manual_seed(0)
        return model_class()
    tags = [line.split("  # ")[1] for line in source.splitlines() if "  # " in line and line.startswith("        ")]
    loss_fn = namespace.get("loss_fn") if case.loss_fn is not None else None
    random_ = any(tag.startswith("random:") for tag in tags)
    return dataclasses.replace(case, source=source, factory=factory, loss_fn=loss_fn, random=random_,
                               ops=tags + [op for op in case.ops if op.startswith("loss")])


def _signature(result: dict) -> str:
    """What a failure is, to tell whether a smaller case fails alike: the error's type
    and phase, or a difference."""
    if result["outcome"] != "failure":
        return result["outcome"]
    if result.get("errors"):
        for kind in ("output", "loss", "grad", "grad_norm", "param"):
            if not result["errors"].get(kind, 0.0) <= (PARAM_EXACT if kind == "param" else EXACT):
                return f"difference in {kind}"
    return result["message"].split(":", 1)[0]


def minimize_job(seed: int, strategy) -> dict[str, Any]:
    """On every rank: remove the operations of case ``seed`` one at a time while the case
    still fails alike under ``strategy`` (every rank agreeing) and still trains on one
    device; the smallest failing case's source and result."""
    import torch.distributed as dist
    from autopar.runtime import health
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    token = [f"min-{os.getpid()}-{time.time_ns()}" if rank == 0 else None]
    dist.broadcast_object_list(token)
    case = generate(seed)
    with warnings.catch_warnings(), _QuietLog():
        warnings.simplefilter("ignore")
        first = run_case(seed, strategy, case)
        if health._STATE.reported:
            health._recovered()
        wanted = _signature(first)
        tries = 0
        if wanted in ("exact", "refused"):
            return {"seed": seed, "strategy": strategy, "source": case.describe(), "result": first, "tries": 0}
        best, result = case, first
        changed = True
        while changed:
            changed = False
            for block in reversed(op_blocks(best.source)):
                lines = best.source.splitlines(True)
                smaller = with_source(best, _drop_unused("".join(lines[:block[0]] + lines[block[1]:])))
                try:
                    _check_runs(smaller)
                except _Invalid:
                    continue
                tries += 1
                got = run_case(seed, strategy, smaller)
                if health._STATE.reported:
                    health._recovered()
                everyone = _agree(store, f"autopar-fuzz/{token[0]}/{tries}", _signature(got), world, rank,
                                  2 * COLLECTIVE_TIMEOUT_S)
                if all(s == wanted for s in everyone):
                    best, result, changed = smaller, got, True
                    break
    return {"seed": seed, "strategy": strategy, "source": best.describe(), "result": result, "tries": tries}


# --------------------------------------------------------------------------- the sweep

def pairs_for(world: int, seeds: range) -> list[tuple[int, Any]]:
    """The ``(seed, strategy)`` pairs a ``world``-rank launch runs over ``seeds``: on 2
    ranks ``{"data": 2}``; on 4 ``{"data": 2, "tensor": 2}`` and ``"auto"`` in turn."""
    strategies = STRATEGIES[world]
    return [(seed, strategies[seed % len(strategies)]) for seed in seeds]


def merge(per_rank: list[list[dict]]) -> list[dict]:
    """Rank 0's result of each case, a failure where any rank's is (its message kept)."""
    merged = []
    for results in zip(*per_rank):
        chosen = dict(results[0])
        for rank, result in enumerate(results):
            if result["outcome"] in ("failure", "not run") and chosen["outcome"] not in ("failure", "not run"):
                chosen = dict(result, message=f"rank {rank}: {result['message']}")
        if any(r["outcome"] != chosen["outcome"] for r in results) and chosen["outcome"] != "failure":
            chosen.update(outcome="failure", message=f"ranks disagree: {[r['outcome'] for r in results]}")
        merged.append(chosen)
    return merged


def strategy_name(strategy) -> str:
    return strategy if isinstance(strategy, str) else json.dumps(strategy, sort_keys=True)


def summary(results: list[dict]) -> str:
    """Counts per strategy (cases, exact, refused, failures), then every failure with its
    case's description."""
    lines = []
    by_strategy: dict[str, list[dict]] = {}
    for r in results:
        by_strategy.setdefault(strategy_name(r["strategy"]), []).append(r)
    lines.append(f"{'strategy':28} {'cases':>6} {'exact':>6} {'refused':>8} {'failures':>9} {'not run':>8}")
    for name, group in list(by_strategy.items()) + [("all", results)]:
        count = {k: sum(r["outcome"] == k for r in group) for k in ("exact", "refused", "failure", "not run")}
        lines.append(f"{name:28} {len(group):6} {count['exact']:6} {count['refused']:8} {count['failure']:9} "
                     f"{count['not run']:8}")
    exact = [r.get("errors") or {} for r in results if r["outcome"] == "exact"]
    first = max((v for e in exact for k, v in e.items() if k != "param"), default=0.0)
    params = max((e.get("param", 0.0) for e in exact), default=0.0)
    lines.append(f"largest relative error of an exact case: {first:.3g} (outputs, loss, gradients; bound {EXACT:g}), "
                 f"{params:.3g} (parameters after {STEPS} steps; bound {PARAM_EXACT:g})")
    for r in results:
        if r["outcome"] == "failure":
            lines.append("")
            lines.append(f"FAILURE seed={r['seed']} strategy={strategy_name(r['strategy'])} mesh={r.get('mesh')}")
            lines.append(r["message"])
            try:
                lines.append(generate(r["seed"]).describe())
            except Exception as error:  # noqa: BLE001
                lines.append(f"(no description: {error})")
    return "\n".join(lines)


def sweep(cases: int, start: int = 0, chunk: int = 200, worlds=(2, 4), log=print, seeds=None) -> list[dict]:
    """``cases`` cases from seed ``start``: half on 2 ranks, half on 4 (:func:`pairs_for`),
    launched ``chunk`` cases at a time; a launch whose process group failed is launched
    again from the case after the one that broke it. ``seeds``: these seeds only, each
    under every strategy of ``worlds``."""
    from autopar.runtime.launcher import launch
    per_world = {w: cases // len(worlds) + (i < cases % len(worlds)) for i, w in enumerate(worlds)}
    results = []
    for world in worlds:
        if seeds is not None:
            pending = [(seed, strategy) for seed in seeds for strategy in STRATEGIES[world]]
        else:
            pending = pairs_for(world, range(start, start + per_world[world]))
        while pending:
            batch, pending = pending[:chunk], pending[chunk:]
            began = time.perf_counter()
            try:
                got = merge(launch(fuzz_job, world, (batch, COLLECTIVE_TIMEOUT_S, False),
                                   timeout_s=max(600, 10 * len(batch))))
            except Exception as error:  # noqa: BLE001 - a launch that died: its first case is the failure
                got = [{"seed": batch[0][0], "strategy": batch[0][1], "outcome": "failure", "ops": [],
                        "random": False, "worst": None, "message": f"the launch failed: {_tail(str(error))}"}]
                pending = batch[1:] + pending
            ran = [r for r in got if r["outcome"] != "not run"]
            results += ran
            if len(ran) < len(got):
                pending = batch[len(ran):] + pending
            log(f"{world} ranks: {len(ran)} cases in {time.perf_counter() - began:.1f} s "
                f"({sum(r['outcome'] == 'failure' for r in ran)} failures)")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="cases in all (half on 2 ranks, half on 4)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--chunk", type=int, default=200, help="cases per launch")
    parser.add_argument("--worlds", default="2,4", help="the launches' world sizes (2 and/or 4)")
    parser.add_argument("--seeds", help="run only these seeds (comma-separated), each under every strategy of "
                                          "the worlds given")
    parser.add_argument("--show", type=int, help="print the case of this seed and exit")
    parser.add_argument("--minimize", type=int, metavar="SEED",
                        help="remove the operations of this seed's case while it still fails alike, and print "
                             "the smallest (under --strategy, on --worlds' first world)")
    parser.add_argument("--strategy", default=None, help="the strategy of --minimize (JSON or 'auto')")
    parser.add_argument("--json", help="write every case's result to this file")
    args = parser.parse_args(argv)
    if args.show is not None:
        print(generate(args.show).describe())
        return 0
    os.environ.setdefault("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.minimize is not None:
        from autopar.runtime.launcher import launch
        world = int(args.worlds.split(",")[0])
        strategy = STRATEGIES[world][0] if args.strategy is None else \
            (args.strategy if args.strategy == "auto" else json.loads(args.strategy))
        out = launch(minimize_job, world, (args.minimize, strategy), timeout_s=1200)[0]
        print(f"seed {out['seed']} under {strategy_name(strategy)} on {world} ranks, {out['tries']} smaller cases "
              f"tried: {out['result']['outcome']}\n{out['result']['message']}\n{out['source']}")
        return 0
    began = time.perf_counter()
    worlds = tuple(int(w) for w in args.worlds.split(","))
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    results = sweep(args.cases, args.start, args.chunk, worlds, log=lambda s: print(s, file=sys.stderr, flush=True),
                    seeds=seeds)
    print(summary(results))
    print(f"\n{len(results)} cases in {time.perf_counter() - began:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 1 if any(r["outcome"] == "failure" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
