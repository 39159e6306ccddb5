"""A parallelism family written outside autopar, in this one file, and registered with
``autopar.register_family``: "data parallelism, gradients averaged after backward".

Built-in data parallelism averages the gradients in buckets *during* backward, each
bucket's all-reduce hidden behind the backward of the layers before it. This family
splits the batch the same way but averages every gradient in one pass once backward has
finished: nothing overlaps, and each step issues its all-reduces back to back at the
end (what a user wants when the network is shared with other traffic during backward, or
to see the gradient exchange on its own in a profile). It is priced as such (the whole
all-reduce exposed, axonn eq 3, with the same bucket copies), so ``"auto"`` weighs it
beside the built-in families and never prefers it to overlapped data parallelism (at
best a tie, which goes to the family registered first); forced by name, it runs.

What the family defines (docs/architecture.md, "Adding a family"):

* planning: ``candidates`` (one configuration: ``data = world``), ``price`` (the shared
  data × tensor pricing, :func:`autopar.strategies.shared.mesh.price_mesh`, with its
  overlapped gradient exchange replaced by the whole all-reduce) and ``to_plan``;
* compiling: ``place`` (its parameters' gradient buckets without hooks: reduced at the
  end of the step). The batch split, the gradient buckets and the loss's average are the
  compiler's and the runtime's, as for every plan that splits the batch;
* explaining: a line in ``Plan.explain()``.

The script registers it, plans a hand-written model on 2 ranks under ``"auto"`` (the
family is weighed and listed; ``why_not`` says why it lost) and forced by name (the
plan, its explain text and its report written to a directory, read back from
plan.json), then trains the model from that plan on 2 gloo ranks for three steps against
the single device and prints ``EQUAL``.

    python examples/custom_family.py
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.cost import model as cost_model
from autopar.planning.model import bucket_copy_s
from autopar.planning.strategy import Strategy
from autopar.strategies.family import CompileHooks, PlanContext, Priced, mesh_plan, rejected
from autopar.strategies.shared.mesh import judge, price_mesh


class AfterBackward(CompileHooks):
    """Data parallelism whose gradients are averaged after backward, in one pass."""

    name = "after_backward"

    def regions(self, model) -> list:
        return []   # it splits the batch, no region

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        if ctx.forced is not None and ctx.forced.kind() != self.name:
            return []   # another family's strategy was forced
        return [Strategy(data=ctx.world, tensor=1, family=self.name)]

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, data = ctx.model, config.data
        mesh = {"data": data, "tensor": 1}
        if model.batch % data:
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by data degree {data}",
                            form=self.name)
        table = price_mesh(model, ctx.hw, data, 1, False)
        # the whole gradient all-reduce (axonn eq 3) after backward, in place of the part
        # that overlapping leaves exposed; the buckets' copies as data parallelism's
        grad_bytes = table.param_elems * 4   # float32 gradients, as the shared pricing counts them
        exchange = cost_model.all_reduce_time(data, grad_bytes, ctx.hw) + bucket_copy_s(grad_bytes, ctx.hw) \
            if data > 1 else 0.0
        overlapped = table.total.comm_s.get("data", 0.0)
        total = dataclasses.replace(table.total, comm_s={**table.total.comm_s, "data": exchange})
        table = dataclasses.replace(table, total=total, step_s=table.step_s - overlapped + exchange)
        return judge(self.name, ctx, config, mesh, table)

    def to_plan(self, ctx: PlanContext, priced: Priced):
        return mesh_plan(ctx, priced, priced.table)

    def place(self, builder, build) -> None:
        """Every gradient bucket without hooks: averaged when the step finishes backward."""
        if builder.plan.family != self.name:
            return
        for name in builder.names():
            bucket = builder.placement(name).bucket
            if bucket is not None:   # (None: a parameter whose gradient no group reduces)
                builder.update(name, bucket=dataclasses.replace(bucket, hooks=False))


def explain_lines(plan) -> list[str]:
    return [f"gradients averaged over the {plan.degree('data')} data ranks after backward, in one pass "
            f"(not overlapped with it)"]


# at import, so that spawned ranks (which import this file) know the family too
autopar.register_family(AfterBackward(), explain=explain_lines)


class Net(nn.Module):
    """A small hand-written language model: embedding, two pre-norm MLP blocks, a head."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(2))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, 64, (8, 16), generator=generator), torch.randint(0, 64, (8, 16), generator=generator))


def rank_job(plan_dir: str) -> dict:
    """On each rank: train from the reviewed plan against the single device (float64)."""
    from autopar.testing import compare_with_single_device
    ids, target = batch()
    report = compare_with_single_device(Net, (ids,), target, loss_fn, dtype=torch.float64, plan=plan_dir)
    return {k: report[k] for k in ("mesh", "output", "loss", "grad", "param")}


def main() -> int:
    from autopar.runtime.launcher import launch
    ids, target = batch()
    torch.manual_seed(0)
    model = Net().double()   # float64, as the ranks train it
    auto = autopar.plan(model, 2, example_inputs=(ids,), loss_fn=loss_fn, example_target=target)
    print(f"'auto' on 2 ranks chose {auto.mesh}" + (f" ({auto.family})" if auto.family else ""))
    print(auto.why_not("after_backward"))
    forced = autopar.plan(model, 2, example_inputs=(ids,), loss_fn=loss_fn, example_target=target,
                          strategy="after_backward")
    print(forced.explain().split("\n\n")[0])
    with tempfile.TemporaryDirectory() as tmp:
        plan_dir = forced.save(os.path.join(tmp, "plan"))
        with open(os.path.join(plan_dir, "plan.json")) as f:
            loaded = autopar.Plan.from_json(f.read())
        assert loaded.family == "after_backward", loaded.family
        print(f"plan.json read back: family {loaded.family}, mesh {loaded.mesh}")
        reports = launch(rank_job, 2, (plan_dir,), timeout_s=300)
    worst = max(max(r[kind][1] for kind in ("output", "loss", "grad", "param")) for r in reports)
    equal = worst < 1e-10 and all(r["mesh"] == {"data": 2, "tensor": 1} for r in reports)
    print(f"{'EQUAL' if equal else 'DIFFERENT'}: 2 ranks under after_backward against one process, three steps, "
          f"largest relative difference {worst:.1e} (float64)")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
