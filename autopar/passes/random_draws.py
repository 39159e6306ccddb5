"""Rewrite pass: every random op of a rank program draws from autopar's streams.

Each random op the analysis found (:mod:`autopar.passes.analysis.random_sites`, stamped
on its node and kept by the rewrites that replace it) becomes the call of
:mod:`autopar.runtime.draws` of its kind, with its site (its index among the plan's
random sites, by its captured name) and the layout of its value on this rank
(:data:`autopar.runtime.rng.Layout`): per dimension,

* the whole dimension, where the rank's capture has the plan's size;
* the rows of the batch, where the rank's capture (at its share of the batch) has a
  smaller size than the plan's (at the whole batch): ``f = plan's size / batch`` elements
  per row, the rows outermost in the dimension (a dimension that folds the batch inside
  another is refused);
* a contiguous part over a group, where a rewrite split the dimension
  (``node.meta[RANDOM_SPLIT]``: Megatron's heads, sequence parallelism's tokens).

So the op draws, on every plan and world size, the draws of the element it is in the
value the single device computes (:mod:`autopar.runtime.rng`). It runs after the
families' splits and before recomputation outlines the blocks.

Example: ``F.dropout(h, 0.1, True)`` on ``[4, 16, 32]`` rows of a batch of 8 becomes
``dropout(h, 0.1, True, _form='dropout', _site=2, _at=(('rows', 1), None, None))``.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import RANDOM_SITE, RANDOM_SPLIT
from autopar.passes.analysis.random_sites import shape_of
from autopar.passes.analysis import ops
from autopar.runtime import draws


class RandomDrawError(ValueError):
    """A random op whose draws autopar cannot place on this rank (the planner refuses the
    plans that would meet one: :func:`autopar.driver.search.random_conflict`)."""


_FORMS = {"dropout1d": "feature_dropout", "dropout2d": "feature_dropout", "dropout3d": "feature_dropout"}


def site_layout(name: str, local: tuple | None, whole: list, batch: int, split: dict) -> tuple:
    """The layout of random site ``name``'s value on a rank whose capture gave it shape
    ``local`` (the plan's: ``whole``, at ``batch`` rows), ``split``: the dimensions a
    rewrite split (dim → group). Raises :class:`RandomDrawError` where a dimension differs in a
    way no split explains."""
    if local is None:
        return tuple(("split", split[d]) if d in split else None for d in range(len(whole)))
    if len(local) != len(whole):
        raise RandomDrawError(f"random op {name}: its value is {list(local)} on this rank and {whole} in the plan's "
                        f"capture (another rank); autopar cannot place its draws")
    out = []
    for d, (n, g) in enumerate(zip(local, whole)):
        if d in split:
            out.append(("split", split[d]))
        elif n == g:
            out.append(None)
        elif batch and g % batch == 0 and n % (g // batch) == 0:
            out.append(("rows", g // batch))
        else:
            raise RandomDrawError(f"random op {name}: dimension {d} of its value holds {n} elements on this rank and {g} "
                            f"over the whole batch of {batch} rows, which is no split of the batch's rows autopar can "
                            f"place its draws in")
    return tuple(out)


def random_draws_pass(gm: fx.GraphModule, *, sites: list, batch: int) -> fx.GraphModule:
    """Replace every random op of ``gm`` by its draw (module docstring). ``sites``: the
    plan's random sites (``Plan.random_sites``); ``batch``: the plan's global batch."""
    index = {site["node"]: i for i, site in enumerate(sites)}
    changed = False
    for node in list(gm.graph.nodes):
        name = node.meta.get(RANDOM_SITE)
        if name is None or node.op not in ("call_function", "call_method", "call_module"):
            continue   # (a later pipeline stage receives a draw as its input, its meta copied)
        if name not in index:
            raise RandomDrawError(f"random op {name} ({ops.op_name(node)}) is in this rank's program but not in the plan's "
                            f"capture: the model draws differently at this rank's shapes; autopar cannot key its "
                            f"draws")
        site = sites[index[name]]
        kind = site["kind"]
        if kind == "unsupported":
            raise RandomDrawError(f"random op {name} ({site.get('op', ops.op_name(node))}) has no plan-independent draw "
                            f"in autopar (docs/random_draws.md); run this model on one rank or replace "
                            f"the op")
        if site.get("folded"):
            raise RandomDrawError(f"random op {name}: the batch's rows sit inside dimension {site['folded'][0]} of its "
                            f"value, after another dimension; autopar places draws on rows outermost only")
        layout = site_layout(name, shape_of(node), site["shape"], batch, dict(node.meta.get(RANDOM_SPLIT, {})))
        _replace(gm, node, kind, index[name], layout)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _replace(gm: fx.GraphModule, node: fx.Node, kind: str, site: int, layout: tuple) -> None:
    fn = draws.KIND_FUNCTIONS[kind]
    keywords = {"_site": site, "_at": layout}
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        args, kwargs = (node.args[0],), {"p": float(module.p), "training": True}
        form = {"dropout": "dropout", "feature_dropout": "feature_dropout", "alpha_dropout": "alpha_dropout",
                "feature_alpha_dropout": "feature_alpha_dropout"}[kind]
    else:
        args, kwargs = node.args, dict(node.kwargs)
        form = ops.call_name(node)
        form = _FORMS.get(form, form)
        if kind == "sdpa":
            form = "sdpa"
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(fn, tuple(args), {**kwargs, "_form": form, **keywords})
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
