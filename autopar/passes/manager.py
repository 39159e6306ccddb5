"""The pass runner: runs named passes in order, logs each one, names the one that fails.

Modelled on ``torch/fx/passes/pass_manager.py`` and torchtitan's graph_trainer runner:
passes never print; the runner logs each pass's wall time and node-count change under
``autopar.passes``, and with ``AUTOPAR_DUMP_DIR=dir`` in the environment writes the graph
after each pass as ``dir/<label>_NN_<pass>.py`` (readable code with a header naming the
pass; the label says which graph: ``analysis`` for the global one, ``rank0`` …).
A pass can be switched off by name with ``AUTOPAR_DISABLE_PASSES=name1,name2``.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.fx as fx

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
    """Run ``passes`` (``(name, fn, kwargs)`` triples) over a GraphModule."""

    passes: list[tuple[str, Callable[..., fx.GraphModule], dict[str, Any]]]
    records: list[PassRecord] = field(default_factory=list)

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
            try:
                result = fn(gm, **kwargs)
            except Exception as e:
                raise PassError(
                    f"pass {name!r} failed{' on ' + label if label else ''} "
                    f"(after {', '.join(ran) or 'no other pass'}): {type(e).__name__}: {e}"
                ) from e
            if not isinstance(result, fx.GraphModule):
                raise PassError(f"pass {name!r} returned {type(result).__name__}, expected a GraphModule")
            gm = result
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


def _disabled() -> set[str]:
    return {p for p in os.environ.get("AUTOPAR_DISABLE_PASSES", "").split(",") if p}


def pass_disabled(name: str) -> bool:
    """Whether ``AUTOPAR_DISABLE_PASSES`` switches the pass ``name`` off."""
    return name in _disabled()


def graph_code(gm: fx.GraphModule, header: str) -> str:
    """The graph as readable Python with a header comment (used by dumps and plan.save)."""
    lines = [f"# {line}" for line in header.splitlines()]
    return "\n".join(lines) + "\n" + gm.code.strip("\n") + "\n"
