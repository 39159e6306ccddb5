"""One fused Q/K/V projection, laid out each way model code in the wild writes it, and the
job that trains each under tensor parallelism against the single device
(``tests/strategies/megatron/test_qkv_layouts.py``).

The projection yields ``3·H·d`` features; the layouts differ in what is outermost:

* ``heads_3_d``: ``view(B, T, H, 3, d).unbind(3)`` (torchtitan's and BLOOM's fused
  projection): each head's q, k, v contiguous;
* ``heads_3d``: ``view(B, T, H, 3·d).split(d, -1)`` (GPT-NeoX);
* ``unflatten``: ``unflatten(-1, (H, 3, d)).unbind(-2)``, the first spelled otherwise;
* ``3_heads_d``: ``view(B, T, 3, H, d).unbind(2)``: Q, K and V as three blocks;
* ``permuted``: ``reshape(B, T, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)`` (timm's
  vision transformer): three blocks, taken after a permute;
* ``chunk``: ``chunk(3, -1)`` of the packed features, each viewed ``[B, T, H, d]``;
* ``groups``: grouped-query attention with ``H/2`` key/value heads, the projection's
  ``(H + 2·G)·d`` features viewed ``[B, T, G, H/G + 2, d]`` and split ``[H/G, 1, 1]``
  (torchtitan's fused projection in its larger flavours), attention with ``enable_gqa``:
  the groups are outermost;
* ``slots_groups``: the same features first viewed as ``H + 2·G`` slots of ``d``
  (``view(B, T, -1, d)``), then regrouped ``[B, T, G, H/G + 2, d]``; the queries a slice
  flattened back to ``H`` heads, the key and value taken by integer indexes, repeated to
  their groups' heads by ``expand`` and ``reshape`` (Hugging Face's Falcon since
  transformers 5.25): reshapes in a row compose, so the groups are outermost;
* ``indexed_groups``: ``[B, T, G, H/G + 2, d]`` taken apart by a slice and by indexes
  with lists (``qkv[..., [-2], :]``), the key and value broadcast to their groups
  (Hugging Face's Falcon before transformers 5.25);
* ``slots_heads``: ``3·H`` slots of ``d`` regrouped ``unflatten(-2, (H, 3))`` and
  unbound (Hugging Face's Falcon without grouped queries): each head's q, k, v contiguous;
* ``sized_groups``: grouped-query attention whose packed features are cut by sizes
  ``[H·d, G·d, G·d]`` (ChatGLM's, Phi-3's): three unequal blocks, which a split by
  equal blocks would mix up, so the attention is not a region and stays whole.

With heads outermost a plain column split of the projection is a split by heads; with
Q, K and V outermost each block is split (``qkv_blocks = 3``). With three heads the
shapes alone cannot tell the two apart, and the dimension the query is taken along does.

``rotary=True`` rotates q and k as torchtitan's Llama does, in complex numbers
(``view_as_complex`` of pairs, a product with a complex table, ``view_as_real``);
``saved_apart=True`` gives the projection torchtitan's state-dict hooks: it is saved as
``q``, ``k`` and ``v`` weights and merged again on load. ``tied=True`` ties the head to
the embedding.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.models import lm_loss

VOCAB, SEQ = 64, 8
LAYOUTS = ("heads_3_d", "heads_3d", "unflatten", "3_heads_d", "permuted", "chunk", "groups", "slots_groups",
           "indexed_groups", "slots_heads")
GROUPED = {"groups", "sized_groups", "slots_groups", "indexed_groups"}
HEAD_MAJOR = {"heads_3_d", "heads_3d", "unflatten", "groups", "slots_groups", "indexed_groups", "slots_heads"}
UNSPLIT = ("sized_groups",)


def complex_rotary_table(head_dim: int, positions: int, theta: float = 10000.0) -> torch.Tensor:
    """``[positions, head_dim / 2]`` unit complex numbers (torchtitan's ``precompute_freqs_cis``)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, T, H, d]`` rotated by ``table``, in complex numbers."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    turned = pairs * table[: x.shape[1]].view(1, x.shape[1], 1, pairs.shape[-1])
    return torch.view_as_real(turned).flatten(3).type_as(x)


class FusedAttention(nn.Module):
    def __init__(self, layout: str, heads: int, width: int, rotary: bool = False, saved_apart: bool = False):
        super().__init__()
        if layout not in LAYOUTS + UNSPLIT:
            raise ValueError(f"layout {layout!r} is not one of {LAYOUTS + UNSPLIT}")
        self.layout, self.heads, self.rotary = layout, heads, rotary
        self.groups = heads // 2 if layout in GROUPED else heads
        self.qkv = nn.Linear(width, (heads + 2 * self.groups) * (width // heads))
        self.out = nn.Linear(width, width)
        if rotary:
            self.register_buffer("table", complex_rotary_table(width // heads, 4 * SEQ), persistent=False)
        if saved_apart:
            if layout != "chunk":
                raise ValueError("saved_apart splits a [Q | K | V] projection: use layout='chunk'")
            self.register_state_dict_post_hook(_save_apart)
            self.register_load_state_dict_pre_hook(_load_together)

    def forward(self, x):
        b, t, width = x.shape
        h, d = self.heads, width // self.heads
        y = self.qkv(x)
        if self.layout == "heads_3_d":
            q, k, v = y.view(b, t, h, 3, d).unbind(3)
        elif self.layout == "heads_3d":
            q, k, v = y.view(b, t, h, 3 * d).split(d, dim=-1)
        elif self.layout == "unflatten":
            q, k, v = y.unflatten(-1, (h, 3, d)).unbind(-2)
        elif self.layout == "3_heads_d":
            q, k, v = y.view(b, t, 3, h, d).unbind(2)
        elif self.layout == "permuted":
            q, k, v = y.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        elif self.layout == "groups":
            g = self.groups
            q, k, v = y.view(b, t, g, h // g + 2, d).split([h // g, 1, 1], dim=-2)
            q, k, v = q.reshape(b, t, h, d), k.reshape(b, t, g, d), v.reshape(b, t, g, d)
        elif self.layout == "slots_groups":
            g = self.groups
            grouped = y.view(b, t, -1, d).view(b, t, g, -1, d)
            q = grouped[..., :-2, :].flatten(-3, -2)
            k, v = (z[:, :, :, None].expand(b, t, g, h // g, d).reshape(b, t, h, d)
                    for z in (grouped[..., -2, :], grouped[..., -1, :]))
        elif self.layout == "indexed_groups":
            g = self.groups
            grouped = y.view(b, t, g, h // g + 2, d)
            q = grouped[:, :, :, :-2]
            k, v = (torch.broadcast_to(z, q.shape) for z in (grouped[:, :, :, [-2]], grouped[:, :, :, [-1]]))
            q, k, v = (z.flatten(2, 3) for z in (q, k, v))
        elif self.layout == "slots_heads":
            q, k, v = y.view(b, t, -1, d).unflatten(-2, (h, 3)).unbind(-2)
        elif self.layout == "sized_groups":
            g = self.groups
            q, k, v = y.split([h * d, g * d, g * d], dim=-1)
            q, k, v = q.view(b, t, h, d), k.view(b, t, g, d), v.view(b, t, g, d)
        else:
            q, k, v = (z.view(b, t, h, d) for z in y.chunk(3, dim=-1))
        if self.rotary:
            q, k = rotate(q, self.table), rotate(k, self.table)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=k.shape[2] != h)
        return self.out(o.transpose(1, 2).reshape(b, t, width))


def _save_apart(module, state, prefix, local_metadata):
    for kind in ("weight", "bias"):
        fused = state.pop(f"{prefix}qkv.{kind}")
        for name, part in zip("qkv", fused.chunk(3, dim=0)):
            state[f"{prefix}{name}.{kind}"] = part


def _load_together(module, state, prefix, *args):
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in "qkv"]
        if all(n in state for n in names):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(n) for n in names], dim=0)


class FusedAttentionLM(nn.Module):
    """Embedding → :class:`FusedAttention` (residual) → linear head."""

    def __init__(self, layout: str, heads: int = 4, width: int = 32, tied: bool = False, **attention):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.attn = FusedAttention(layout, heads, width, **attention)
        self.head = nn.Linear(width, VOCAB)
        if tied:   # the head reads the embedding's table (one parameter under two names)
            self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(h + self.attn(h))


def attention_strategies(report: dict) -> list[str]:
    """The strategy of each attention region in a comparison's plan, in plan order."""
    return [strategy for region, strategy in report["regions"].items() if region.startswith("attention:")]


def qkv_layouts_job(cases: list[tuple]) -> list[dict[str, Any]]:
    """On every rank: each ``(layout, heads, strategy[, options])`` trained in float64
    against the single device (:func:`autopar.testing.compare_with_single_device`), with
    the regions the plan split (``options``: :class:`FusedAttention`'s ``rotary`` and
    ``saved_apart``; with ``saved_apart`` the full state dict's keys and a load of it
    are checked too); an error is reported in the row, unless it leaves the process
    group unusable."""
    from autopar.testing import compare_with_single_device, reported_in
    rows = []
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    target = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    for layout, heads, strategy, *more in cases:
        options = more[0] if more else {}
        row: dict[str, Any] = {"layout": layout, "heads": heads, "strategy": strategy, "options": options}
        with reported_in(row, f"layout {layout} under {strategy}"):
            report = compare_with_single_device(lambda: FusedAttentionLM(layout, heads, 8 * heads, **options), (ids,),
                                                target, lm_loss, strategy, dtype=torch.float64)
            row.update({k: report[k] for k in ("output", "loss", "grad", "param", "strategies")})
            if options.get("saved_apart"):
                row["round_trip"] = _round_trip(layout, heads, options, strategy)
            row["attention"] = attention_strategies(report)
        rows.append(row)
    return rows


def _round_trip(layout: str, heads: int, options: dict, strategy) -> dict[str, Any]:
    """The keys of a compiled model's full state dict, and whether loading another
    model's (saved apart by its hooks) gives back that model's state exactly."""
    import autopar
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    torch.manual_seed(1)
    pm = autopar.compile(FusedAttentionLM(layout, heads, 8 * heads, **options).double(), strategy=strategy,
                         example_inputs=(ids,), loss_fn=lm_loss, example_target=ids)
    torch.manual_seed(2)
    other = FusedAttentionLM(layout, heads, 8 * heads, **options).double().state_dict()
    pm.load_full_state_dict(other)
    back = pm.full_state_dict()
    out = {"keys": sorted(back), "equal": sorted(back) == sorted(other)
           and all(torch.equal(back[k], other[k]) for k in other)}
    # autopar's own checkpoint holds the layout's names (the hooks are for the user's files)
    where = _shared_directory()
    autopar.save_checkpoint(pm, where)
    pm.load_full_state_dict(FusedAttentionLM(layout, heads, 8 * heads, **options).double().state_dict())
    autopar.load_checkpoint(pm, where)
    again = pm.full_state_dict()
    out["checkpoint"] = all(torch.equal(again[k], other[k]) for k in other)
    try:
        pm.save_pretrained(where + "-hf")
        out["save_pretrained"] = "written"
    except NotImplementedError as error:
        out["save_pretrained"] = str(error)
    import shutil

    import torch.distributed as dist
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(where, ignore_errors=True)
    return out


def _shared_directory() -> str:
    """A fresh directory every rank names alike (rank 0 makes it and tells the others)."""
    import tempfile

    import torch.distributed as dist
    box = [tempfile.mkdtemp(prefix="autopar-qkv-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
