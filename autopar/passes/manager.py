"""The pass runner: runs named passes in order, logs each one, names the one that fails.

Modelled on ``torch/fx/passes/pass_manager.py`` and torchtitan's graph_trainer runner:
passes never print; the runner logs each pass's wall time and node-count change under
``autopar.passes``, and with ``AUTOPAR_DUMP_DIR=dir`` in the environment writes the graph
after each pass as ``dir/<label>_NN_<pass>.py`` (readable code with a header naming the
pass; the label says which graph: ``analysis`` for the global one, ``rank0`` …).
A pass can be switched off by name with ``AUTOPAR_DISABLE_PASSES=name1,name2``.

Analysis degrades, rewrites fail loudly. An analysis pass only finds regions, so a
pattern it cannot read costs a region, never the compile: the analysis runner is built
with ``degrade=True``, and a pass that raises there is logged as a warning and its
regions are dropped (``gm.meta`` and the nodes' tags are restored to what they were
before it ran), while the later passes still run. Inside a pass,
:func:`examining` does the same for one candidate (an attention core, a linear, a
block): a failure skips that candidate with a warning naming the pass and the node,
and the pass goes on with the next. A rewrite pass that raises stops the compile with
:class:`PassError`, since a half-rewritten rank program would compute something else.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.ir import REGION_OF, REGIONS

log = logging.getLogger("autopar.passes")


class PassError(RuntimeError):
    """A pass raised; the message names it and the passes that ran before it."""


@dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int


@dataclass
class PassRunner:
    """Run ``passes`` (``(name, fn, kwargs)`` triples) over a GraphModule.

    ``degrade=True`` (analysis only): a pass that raises is logged as a warning, its
    regions are dropped and the next pass runs; its name is in ``failed``. Otherwise a
    pass that raises stops the run with :class:`PassError`.
    """

    passes: list[tuple[str, Callable[..., fx.GraphModule], dict[str, Any]]]
    records: list[PassRecord] = field(default_factory=list)
    degrade: bool = False
    failed: list[str] = field(default_factory=list)
    plain_names: bool = False   # after each pass, groups named as plain strings (plain_axis_names)

    def run(self, gm: fx.GraphModule, *, label: str = "") -> fx.GraphModule:
        disabled = _disabled()
        dump_dir = os.environ.get("AUTOPAR_DUMP_DIR")
        ran: list[str] = []
        for index, (name, fn, kwargs) in enumerate(self.passes):
            if name in disabled:
                log.info("%s: pass %s disabled by AUTOPAR_DISABLE_PASSES", label, name)
                continue
            before = len(gm.graph.nodes)
            start = time.perf_counter()
            saved = _region_state(gm) if self.degrade else None
            try:
                result = fn(gm, **kwargs)
            except Exception as e:
                where = (f"pass {name!r} failed{' on ' + label if label else ''} "
                         f"(after {', '.join(ran) or 'no other pass'}): {type(e).__name__}: {e}")
                if not self.degrade:
                    raise PassError(where) from e
                _restore_region_state(gm, saved)
                self.failed.append(name)
                _warn_once(f"analysis {where}; the regions of this pass are dropped and that part of "
                           f"the model stays outside regions (replicated); the rest of the model is still "
                           f"planned", exc_info=e)
                continue
            if not isinstance(result, fx.GraphModule):
                raise PassError(f"pass {name!r} returned {type(result).__name__}, expected a GraphModule")
            gm = result
            if self.plain_names:
                plain_axis_names(gm)
            seconds = time.perf_counter() - start
            self.records.append(PassRecord(name, seconds, before, len(gm.graph.nodes)))
            log.debug("%s: %s took %.1f ms, nodes %d -> %d", label, name, seconds * 1e3, before,
                      len(gm.graph.nodes))
            if dump_dir:
                os.makedirs(dump_dir, exist_ok=True)
                path = os.path.join(dump_dir, f"{label + '_' if label else ''}{index:02d}_{name}.py")
                with open(path, "w") as f:
                    f.write(graph_code(gm, header=f"after pass {name} ({seconds * 1e3:.1f} ms)"))
            ran.append(name)
        return gm


def plain_axis_names(gm: fx.GraphModule) -> None:
    """A group named by a :class:`~autopar.grid.MeshAxis` member in a node's arguments
    becomes its plain value: a program's code names groups as strings (torch.fx would
    write a member as ``MeshAxis.DATA``, with the class among the code's globals). Run
    after every pass, so that a pass copying nodes into a graph of its own (the recompute
    pass's blocks) and each pass's dump see plain names too."""
    found = 0

    def plain(a):
        nonlocal found
        if isinstance(a, MeshAxis):   # (a member equals its value: only its type tells it apart)
            found += 1
            return a.value
        return a
    for node in gm.graph.nodes:
        before = found
        args, kwargs = fx.node.map_aggregate(node.args, plain), fx.node.map_aggregate(node.kwargs, plain)
        if found > before:
            node.args, node.kwargs = args, kwargs
    if found:
        gm.recompile()


# what the warnings already said in this process: every rank analyses its own graph
# again (once per program), and one unreadable pattern should be reported once
_warned: set[str] = set()


def _warn_once(message: str, exc_info: BaseException | None = None) -> None:
    if message in _warned:
        log.debug("%s", message)
        return
    _warned.add(message)
    log.warning("%s", message)
    if exc_info is not None:
        log.debug("traceback of the analysis failure above", exc_info=exc_info)


@contextlib.contextmanager
def examining(pass_name: str, where: fx.Node | str, what: str = "candidate") -> Iterator[None]:
    """Run one candidate of an analysis pass; an exception skips the candidate.

    ``with examining("attention", node, "attention core"): ...`` around the code that
    reads one candidate and records its region: when that code raises, the candidate
    gets no region, a warning names the pass, the node (or ``where`` as text: a module
    path) and the error, and the pass continues with its next candidate. Record the
    region last, so a failure leaves nothing half-recorded. Analysis passes only;
    rewrites must fail loudly.
    """
    try:
        yield
    except Exception as e:  # noqa: BLE001 - any failure to read a pattern costs only its region
        place = f"node {where.name}" if isinstance(where, fx.Node) else str(where)
        _warn_once(f"analysis pass {pass_name!r} could not read the {what} at {place} "
                   f"({type(e).__name__}: {e}); it gets no region and stays replicated", exc_info=e)


def _region_state(gm: fx.GraphModule):
    """A copy of the regions and the nodes' region tags, to restore after a failed pass."""
    return (copy.copy(gm.meta.get(REGIONS)),
            {n: dict(n.meta[REGION_OF]) for n in gm.graph.nodes if REGION_OF in n.meta})


def _restore_region_state(gm: fx.GraphModule, saved) -> None:
    table, tags = saved
    if table is None:
        gm.meta.pop(REGIONS, None)
    else:
        gm.meta[REGIONS] = table
    for n in gm.graph.nodes:
        if n in tags:
            n.meta[REGION_OF] = tags[n]
        else:
            n.meta.pop(REGION_OF, None)


def _disabled() -> set[str]:
    return {p for p in os.environ.get("AUTOPAR_DISABLE_PASSES", "").split(",") if p}


def pass_disabled(name: str) -> bool:
    """Whether ``AUTOPAR_DISABLE_PASSES`` switches the pass ``name`` off."""
    return name in _disabled()


def graph_code(gm: fx.GraphModule, header: str) -> str:
    """The graph as readable Python with a header comment (used by dumps and plan.save)."""
    lines = [f"# {line}" for line in header.splitlines()]
    return "\n".join(lines) + "\n" + gm.code.strip("\n") + "\n"
