"""What a user may force, and the error a plan that cannot run raises.

:class:`Strategy` is a configuration of every family in one frozen dataclass: the
degrees of data × tensor (Megatron), D&SP's sub-grids (with their rank order and cSub),
AxoNN's ``Gx × Gy × Gz × Gdata`` grid or Bian's ``p × p × p`` cube, and PTD-P's pipeline
(stages, chunks, microbatches, schedule, scatter/gather). :meth:`Strategy.parse` reads
what ``compile``/``plan`` are given (``"auto"``, ``"data"``, ``"tensor"`` or a dict of
degrees); the planner's families offer their candidate configurations as Strategies too
(:mod:`autopar.strategies.family`).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
from dataclasses import dataclass
from typing import Any

from autopar.grid import Grid3D
from autopar.planning.declared import DECLARED
from autopar.planning.schedules import SCHEDULES, ScheduleError, check_chunks

PIPELINE_KEYS = ("schedule", "chunks", "scatter_gather")
LEVER_KEYS = ("microbatches", "zero", "recompute", "sequence_parallel")
"""Keys that combine with every family's (docs/memory.md): gradient accumulation over
``microbatches`` (a pipeline's microbatches), ZeRO's stage of sharded data parallelism
over the data group, which activations are recomputed in backward, and whether the
values between tensor-parallel regions run split over the sequence (docs/sequence.md)."""
RECOMPUTE_MODES = ("none", "selective", "full")
REGION_KINDS = ("fork_join", "attention", "linear_chain", "vocab", "experts")
PIN_FAMILIES = ("replicate", "megatron", "dsp", "3d", "cube")


class PlanError(ValueError):
    """A forced strategy that cannot run; the message names the argument or region."""


@dataclass(frozen=True)
class Pin:
    """A region pinned to a family (``strategy={"regions": {PATTERN: SPEC}}``).

    ``pattern`` is a glob over region names (``"linear_chain:blocks.*.mlp"``) or
    ``"kind:K"`` for every region of kind K; ``family`` one of :data:`PIN_FAMILIES`;
    ``subgrids`` D&SP's (0: the tensor degree), ``grid`` the 3D grid's ``(x, y, z)``
    (None: the planner's)."""

    pattern: str
    family: str
    subgrids: int = 0
    csub: bool = False
    grid: tuple[int, int, int] | None = None

    def matches(self, region) -> bool:
        if self.pattern.startswith("kind:"):
            return region.kind == self.pattern[len("kind:"):]
        return fnmatch.fnmatchcase(region.id, self.pattern)

    def describe(self) -> str:
        if self.family == "dsp":
            return "dsp" + (f" subgrids={self.subgrids}" if self.subgrids else "") + (" csub" if self.csub else "")
        if self.family == "3d" and self.grid is not None:
            return "3d {}x{}x{}".format(*self.grid)
        return self.family

    @staticmethod
    def parse(pattern: Any, spec: Any) -> "Pin":
        """One ``PATTERN: SPEC`` of ``strategy["regions"]``; a :class:`PlanError` naming
        the pattern when either cannot be read."""
        if not isinstance(pattern, str) or not pattern:
            raise PlanError(f"strategy['regions']: the pattern {pattern!r} is not a region name glob or 'kind:K'")
        if pattern.startswith("kind:") and pattern[len("kind:"):] not in REGION_KINDS:
            raise PlanError(f"strategy['regions'][{pattern!r}]: unknown region kind; use one of "
                            f"{', '.join('kind:' + k for k in REGION_KINDS)}")
        where = f"strategy['regions'][{pattern!r}]"
        if isinstance(spec, str):
            if spec not in ("replicate", "megatron", "cube", "dsp", "3d"):
                raise PlanError(f"{where}: {spec!r} is no family; use 'replicate', 'megatron', 'cube', "
                                f"{{'dsp': {{'subgrids': g}}}} or {{'3d': {{'x': gx, 'y': gy, 'z': gz}}}}")
            return Pin(pattern, spec)
        if isinstance(spec, dict) and len(spec) == 1:
            (family, options), = spec.items()
            options = options or {}
            if family == "dsp" and isinstance(options, dict) and set(options) <= {"subgrids", "csub"}:
                g = int(options.get("subgrids", 0))
                if g < 0 or g == 1:
                    raise PlanError(f"{where}: D&SP needs at least 2 sub-grids, got subgrids={g}")
                return Pin(pattern, "dsp", g, bool(options.get("csub", False)))
            if family == "3d" and isinstance(options, dict) and set(options) <= {"x", "y", "z"}:
                grid = tuple(int(options.get(a, 1)) for a in ("x", "y", "z"))
                if min(grid) < 1:
                    raise PlanError(f"{where}: 3D grid sizes must be at least 1, got {options}")
                return Pin(pattern, "3d", grid=grid)
        raise PlanError(f"{where}: cannot read {spec!r}; a pin is 'replicate', 'megatron', 'cube', "
                        f"{{'dsp': {{'subgrids': g, 'csub': False}}}} or {{'3d': {{'x': gx, 'y': gy, 'z': gz}}}}")


@dataclass(frozen=True)
class Strategy:
    """Forced degrees. ``None`` for a degree means: whatever the world size leaves."""

    data: int | None = None
    tensor: int | None = None
    subgrids: int = 1
    topology_aware: bool = True
    csub: bool = False
    grid: Grid3D | None = None  # AxoNN's Gx x Gy x Gz x Gdata (3D/4D tensor parallelism)
    cube: bool = False  # the grid is Bian's p x p x p cube form (its data degree: None = what the world leaves)
    # pipeline parallelism (megatron §2.2): stages (pipeline ranks), chunks per rank,
    # microbatches (None: the planner chooses), schedule (None: the planner weighs those
    # of its chunks, docs/pipelining.md#schedules), §4.1's scatter/gather
    pipeline: int = 1
    chunks: int = 1
    microbatches: int | None = None
    schedule: str | None = None
    scatter_gather: bool = True
    # a mixed plan (docs/mixed_plans.md): each region picks its own family over the
    # tensor group; ``regions`` pins some (forced), ``grid`` is then the tensor group's
    # x × y × z factorisation for 3D regions (z = 1 inside pipeline stages)
    mixed: bool = False
    regions: tuple[Pin, ...] = ()
    # a mixed plan's D&SP sub-grids of the tensor group (0: each tensor rank one; g < t:
    # g sub-grids of t/g ranks, their branches Megatron-split inside)
    tensor_subgrids: int = 0
    # the memory levers of every family (docs/memory.md); ``microbatches`` above is also
    # the gradient accumulation of a plan without a pipeline. zero: ZeRO's stage over the
    # data group (0 none, 1 optimizer state, 2 + gradients, 3 + parameters: FSDP);
    # recompute: "none", "selective" (the attention core), "full" (every block), None:
    # the planner's choice
    zero: int | None = None
    recompute: str | None = None
    # Megatron-SP (docs/sequence.md): the values between tensor-parallel regions split
    # over the sequence (None: the planner's choice, on wherever a tensor group splits)
    sequence_parallel: bool | None = None
    levers_only: bool = False  # {"zero": 3} alone: these levers, every family weighed
    # expert parallelism (docs/experts.md): the routed experts of the MoE regions over
    # expert groups of this many consecutive data ranks (1: none; None: the planner's
    # choice), on top of a data × tensor plan or a pipeline; ``expert_pins``: (pattern, E)
    # of the region pins {"regions": {"kind:experts": {"experts": E}}} (E = 1: "replicate")
    experts: int | None = 1
    expert_pins: tuple[tuple[str, int], ...] = ()
    # context parallelism (docs/context.md): the sequence split over this many ranks of a
    # ``context`` mesh dimension between data and tensor (1: none)
    context: int = 1
    # a registered family forced by its name (:data:`DECLARED`), with its options as
    # sorted (key, JSON text) pairs (:meth:`option` reads one)
    family: str | None = None
    family_options: tuple = ()

    def levers(self) -> dict:
        """The levers forced (:data:`LEVER_KEYS`), by key."""
        out = {"microbatches": self.microbatches, "zero": self.zero, "recompute": self.recompute,
               "sequence_parallel": self.sequence_parallel}
        return {k: v for k, v in out.items() if v is not None}

    @staticmethod
    def parse(strategy: Any) -> "Strategy | None":
        """``"auto"`` → None; ``"data"``; ``"tensor"``; ``{"data": 2, "tensor": 2}``; a Strategy."""
        if strategy is None or strategy == "auto":
            return None
        if isinstance(strategy, Strategy):
            return strategy
        if strategy == "data":
            return Strategy(tensor=1)
        if strategy == "tensor":
            return Strategy(data=1)
        if isinstance(strategy, str) and strategy in DECLARED and DECLARED[strategy].by_name:
            return Strategy(family=strategy)
        if isinstance(strategy, dict) and "family" in strategy:
            return Strategy._declared(strategy)
        if isinstance(strategy, dict):
            if "context" in strategy:
                return Strategy._with_context(strategy)
            levers = Strategy._levers(strategy)
            family, experts = Strategy._experts({k: v for k, v in strategy.items() if k not in LEVER_KEYS})
            if not family and experts.get("experts", 1) == 1:  # levers alone: the planner picks the families
                return Strategy(levers_only=True, **levers, **experts)
            parsed = Strategy._parse_family(family) if family else Strategy()
            if experts and parsed.kind() not in ("mesh", "pipeline"):
                raise PlanError(f"strategy: expert parallelism combines with data, tensor and pipeline plans in this "
                                f"version, not with {parsed.kind()!r}; drop 'experts' or those keys")
            return dataclasses.replace(parsed, **levers, **experts)
        named = "".join(f", {name!r}" for name, d in DECLARED.items() if d.by_name)
        raise PlanError(f"strategy={strategy!r}: expected 'auto', 'data', 'tensor'{named} or a dict like "
                        f"{{'data': 2, 'tensor': 2}}")

    @staticmethod
    def _declared(strategy: dict) -> "Strategy":
        """``{"family": NAME, option: value, ...}`` of a registered family: its option keys
        as it declared them (a memory lever among them is parsed as the lever), each value
        one that plan.json can hold."""
        name = strategy["family"]
        declared = DECLARED.get(name)
        if declared is None or not declared.by_name:
            known = ", ".join(repr(n) for n, d in DECLARED.items() if d.by_name) or "none is registered"
            raise PlanError(f"strategy['family']={name!r}: no family of that name is registered to be forced "
                            f"(autopar.register_family); registered: {known}")
        unknown = sorted(set(strategy) - {"family", *declared.keys})
        if unknown:
            raise PlanError(f"strategy: {unknown} are not options of the family {name!r}; it takes "
                            f"{list(declared.keys) or 'none'}")
        options = []
        for key, value in sorted((k, v) for k, v in strategy.items() if k in declared.keys and k not in LEVER_KEYS):
            try:
                options.append((key, json.dumps(value, sort_keys=True)))
            except (TypeError, ValueError) as e:
                raise PlanError(f"strategy[{key!r}]={value!r}: the family {name!r}'s options are saved in plan.json; "
                                f"give a number, string, bool, list or dict ({e})") from None
        levers = Strategy._levers({k: v for k, v in strategy.items() if k in LEVER_KEYS})
        return Strategy(family=name, family_options=tuple(options), **levers)

    def option(self, key: str, default: Any = None) -> Any:
        """A registered family's option ``key`` as forced (``default`` when not given)."""
        found = dict(self.family_options).get(key)
        return default if found is None else json.loads(found)

    def options(self) -> dict:
        """A registered family's options as forced, by key."""
        return {k: json.loads(v) for k, v in self.family_options}

    @staticmethod
    def _with_context(strategy: dict) -> "Strategy":
        """``{"context": c, "data": d, "tensor": t, levers...}``: context parallelism on a
        data × tensor configuration (a degree left out: the planner's)."""
        c = strategy["context"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise PlanError(f"strategy: context={c!r}; give the context degree, the number of ranks the sequence "
                            f"is split over (an integer at least 1)")
        rest = {k: v for k, v in strategy.items() if k != "context"}
        other = set(rest) - {"data", "tensor", "pipeline"} - set(PIPELINE_KEYS) - set(LEVER_KEYS)
        if other:
            raise PlanError(f"strategy: context parallelism combines with 'data', 'tensor', a pipeline and the "
                            f"memory levers in this version, not {sorted(other)}; drop them or 'context'")
        parsed = Strategy.parse(rest) if rest else Strategy(levers_only=True)
        return dataclasses.replace(parsed, context=c, levers_only=False) if c > 1 else parsed

    @staticmethod
    def _levers(strategy: dict) -> dict:
        """The memory levers of ``strategy`` (:data:`LEVER_KEYS`), checked."""
        out = {}
        if "microbatches" in strategy:
            m = strategy["microbatches"]
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise PlanError(f"strategy: microbatches={m!r}; give the number of microbatches a step runs "
                                f"(an integer at least 1)")
            out["microbatches"] = m
        if "zero" in strategy:
            z = strategy["zero"]
            if isinstance(z, bool) or z not in (0, 1, 2, 3):
                raise PlanError(f"strategy: zero={z!r}; ZeRO's stage is 0 (off), 1 (optimizer state sharded over "
                                f"the data ranks), 2 (and gradients) or 3 (and parameters, as FSDP)")
            out["zero"] = z
        if "recompute" in strategy:
            r = strategy["recompute"]
            if r not in RECOMPUTE_MODES:
                raise PlanError(f"strategy: recompute={r!r}; use 'none', 'selective' (the attention core) or "
                                f"'full' (every block)")
            out["recompute"] = r
        if "sequence_parallel" in strategy:
            sp = strategy["sequence_parallel"]
            if not isinstance(sp, bool):
                raise PlanError(f"strategy: sequence_parallel={sp!r}; give True (the values between tensor-parallel "
                                f"regions split over the sequence) or False")
            out["sequence_parallel"] = sp
        return out

    @staticmethod
    def _experts(strategy: dict) -> tuple[dict, dict]:
        """``strategy`` less its expert parallelism (the ``"experts"`` degree and the region
        pins ``{"experts": E}``, or ``"replicate"`` on ``"kind:experts"``), and the
        Strategy fields those give (``{}`` without)."""
        rest, degree, pins = dict(strategy), None, []
        if "experts" in rest:
            degree = rest.pop("experts")
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise PlanError(f"strategy: experts={degree!r}; give the expert degree, the number of data ranks "
                                f"each MoE layer's experts are spread over (an integer at least 1)")
        regions = rest.get("regions")
        if isinstance(regions, dict):
            others = {}
            for pattern, spec in regions.items():
                if isinstance(spec, dict) and set(spec) == {"experts"}:
                    e = spec["experts"]
                    if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                        raise PlanError(f"strategy['regions'][{pattern!r}]: experts={e!r}; give the expert degree "
                                        f"(an integer at least 1)")
                    pins.append((pattern, e))
                elif pattern == "kind:experts" or (isinstance(pattern, str) and pattern.startswith("experts:")):
                    if spec != "replicate":
                        raise PlanError(f"strategy['regions'][{pattern!r}]: cannot read {spec!r}; an MoE region "
                                        f"is pinned to {{'experts': E}} or 'replicate'")
                    pins.append((pattern, 1))
                else:
                    others[pattern] = spec
            if others:
                rest["regions"] = others
            else:
                del rest["regions"]
        degrees = {e for _, e in pins if e > 1} | ({degree} if degree is not None and degree > 1 else set())
        if len(degrees) > 1:
            raise PlanError(f"strategy: expert degrees {sorted(degrees)} asked for; the MoE regions of one plan "
                            f"share one expert degree in this version")
        if degree is None and not pins:
            return rest, {}
        if degree == 1 and not pins:   # {"experts": 1}: no expert parallelism anywhere
            pins = [("kind:experts", 1)]
        if degree is None:
            degree = next(iter(degrees), 1)
        return rest, {"experts": degree, "expert_pins": tuple(pins)}

    @staticmethod
    def _parse_family(strategy: dict) -> "Strategy":
        """A dict of one family's keys (the levers taken off)."""
        if "pipeline" in strategy:
            return Strategy._parse_pipeline(strategy)
        if "regions" in strategy:
            return Strategy._parse_pins(strategy)
        stray = set(strategy) & set(PIPELINE_KEYS)
        if stray:
            raise PlanError(f"strategy: {sorted(stray)} set up a pipeline; add 'pipeline': p (the number of "
                            f"pipeline ranks)")
        unknown = set(strategy) - {"data", "tensor", "subgrids", "topology_aware", "csub", "x", "y", "z", "cube"}
        if unknown:
            raise PlanError(f"strategy: unknown mesh dimension(s) {sorted(unknown)}; this version plans "
                            f"'data', 'tensor', D&SP 'subgrids' (with 'topology_aware' and 'csub'), the 3D "
                            f"grid 'x', 'y', 'z' (with 'data') and Bian's 'cube' (with 'data')")
        if "cube" in strategy:
            if set(strategy) - {"cube", "data"}:
                raise PlanError(f"strategy: the cube form {strategy} combines only with 'data'; drop "
                                f"{sorted(set(strategy) - {'cube', 'data'})}")
            p, data = int(strategy["cube"]), strategy.get("data")
            if p < 2 or (data is not None and int(data) < 1):
                raise PlanError(f"strategy: cube={p}, data={data}: the cube's edge p must be at least 2 and "
                                f"the data degree at least 1")
            return Strategy(None if data is None else int(data), 1, grid=Grid3D(p, p, p, int(data or 1)),
                            cube=True)
        if set(strategy) & {"x", "y", "z"}:
            if set(strategy) - {"x", "y", "z", "data"}:
                raise PlanError(f"strategy: a 3D grid {strategy} combines only with 'data'; drop "
                                f"{sorted(set(strategy) - {'x', 'y', 'z', 'data'})}")
            try:
                grid = Grid3D(*(int(strategy.get(a, 1)) for a in ("x", "y", "z", "data")))
            except ValueError as e:
                raise PlanError(f"strategy: {e}") from None
            return Strategy(grid.data, 1, grid=grid)
        return Strategy(strategy.get("data"), strategy.get("tensor"), int(strategy.get("subgrids", 1)),
                        bool(strategy.get("topology_aware", True)), bool(strategy.get("csub", False)))

    @staticmethod
    def _parse_pins(strategy: dict) -> "Strategy":
        """``{"data": d, "tensor": t, "regions": {PATTERN: SPEC}}``, or ``{"regions": ...}``
        alone (the planner picks the mesh): a mixed plan with those regions pinned."""
        rest = set(strategy) - {"regions", "data", "tensor"}
        if rest & set(PIPELINE_KEYS):
            raise PlanError(f"strategy: {sorted(rest & set(PIPELINE_KEYS))} set up a pipeline; add 'pipeline': p "
                            f"(the number of pipeline ranks) beside the region pins")
        if rest:
            raise PlanError(f"strategy: region pins combine with 'data', 'tensor' and a pipeline's keys in this "
                            f"version (the other families' degrees go into the pins), not {sorted(rest)}")
        parsed, grid = Strategy._pins(strategy["regions"])
        data, tensor = strategy.get("data"), strategy.get("tensor")
        return Strategy(None if data is None else int(data), None if tensor is None else int(tensor),
                        grid=grid, mixed=True, regions=parsed)

    @staticmethod
    def _pins(pins: Any) -> tuple[tuple[Pin, ...], Grid3D | None]:
        """The pins of ``strategy["regions"]`` and the tensor group's 3D grid they ask for."""
        if not isinstance(pins, dict) or not pins:
            raise PlanError(f"strategy['regions']: expected a dict {{PATTERN: SPEC}}, got {pins!r}")
        parsed = tuple(Pin.parse(k, v) for k, v in pins.items())
        for pin in parsed:
            if pin.family == "cube":
                raise PlanError(f"strategy['regions'][{pin.pattern!r}]: Bian's cube has no per-region layout in "
                                f"this version; pin AxoNN's grid {{'3d': {{'x': gx, 'y': gy, 'z': gz}}}}, or force "
                                f"the whole model onto the cube ({{'cube': p}})")
            if pin.family == "dsp" and pin.csub:
                raise PlanError(f"strategy['regions'][{pin.pattern!r}]: D&SP-cSub runs the common layers on one "
                                f"sub-grid, which a mixed plan does not; force {{'subgrids': g, 'csub': True}} "
                                f"for the whole model")
        grids = {p.grid for p in parsed if p.grid is not None}
        if len(grids) > 1:
            raise PlanError(f"strategy['regions']: pins ask for 3D grids {sorted(grids)}; the regions of one plan "
                            f"share one x × y × z grid of the tensor group in this version")
        grid = next(iter(grids), None)
        return parsed, None if grid is None else Grid3D(*grid)

    @staticmethod
    def _parse_pipeline(strategy: dict) -> "Strategy":
        """``{"pipeline": p, "microbatches": m, "schedule": "1f1b", "chunks": v, "data": d,
        "tensor": t, "scatter_gather": True}``: PTD-P (megatron §2-§4), Megatron inside
        the stages; with ``"regions": {PATTERN: SPEC}`` the stages' regions pinned as in
        a mixed plan, the rest chosen per region; with ``"x", "y", "z": 1`` the tensor
        group of every stage an ``x × y × 1`` 3D grid (the 3D regions split on it)."""
        unknown = set(strategy) - {"pipeline", "data", "tensor", "regions", "x", "y", "z"} - set(PIPELINE_KEYS)
        if unknown:
            raise PlanError(f"strategy: a pipeline combines with 'data', 'tensor', a 3D grid 'x', 'y', 'z' and "
                            f"region pins 'regions' in this version, not {sorted(unknown)}; drop them")
        name = strategy.get("schedule")
        p = int(strategy["pipeline"])
        v = int(strategy.get("chunks", 2 if name in ("interleaved", "interleaved-zb", "zbv") else 1))
        m = strategy.get("microbatches")
        if p < 2 or v < 1 or (m is not None and int(m) < 1):
            raise PlanError(f"strategy: pipeline={p}, chunks={v}, microbatches={m}: a pipeline needs at least 2 "
                            f"ranks, and chunks and microbatches at least 1")
        if name is not None and name not in SCHEDULES:
            raise PlanError(f"strategy: unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}, or leave "
                            f"it out for the planner to choose")
        try:
            if name is not None:
                check_chunks(name, v)
        except ScheduleError as e:
            raise PlanError(f"strategy: {e}") from None
        pins, grid = Strategy._pins(strategy["regions"]) if "regions" in strategy else ((), None)
        if grid is not None and grid.z != 1:
            raise PlanError(f"strategy['regions']: the pinned 3D grid {grid.x}x{grid.y}x{grid.z} splits its regions' "
                            f"rows over z, which pipeline stages do not in this version (their rows are split over "
                            f"data only); pin {{'3d': {{'x': gx, 'y': gy}}}} (z = 1)")
        tensor = strategy.get("tensor")
        if set(strategy) & {"x", "y", "z"}:
            x, y, z = (int(strategy.get(a, 1)) for a in ("x", "y", "z"))
            if z != 1 or x < 1 or y < 1 or x * y < 2:
                raise PlanError(f"strategy: a 3D grid inside pipeline stages is x × y × 1 with x·y ≥ 2 (the rows "
                                f"are split over data only) in this version, got x={x}, y={y}, z={z}")
            if grid is not None and (grid.x, grid.y) != (x, y):
                raise PlanError(f"strategy: the grid x={x}, y={y} and the pinned 3D grid {grid.x}x{grid.y}x1 differ")
            if tensor is not None and int(tensor) != x * y:
                raise PlanError(f"strategy: tensor={tensor} is not the 3D grid's x·y = {x * y}; drop 'tensor'")
            grid, tensor = Grid3D(x, y, 1), x * y
        if grid is not None and tensor is None:
            tensor = grid.x * grid.y
        return Strategy(strategy.get("data"), None if tensor is None else int(tensor), pipeline=p, chunks=v,
                        microbatches=None if m is None else int(m), schedule=name,
                        scatter_gather=bool(strategy.get("scatter_gather", True)), grid=grid,
                        mixed=bool(pins) or grid is not None, regions=pins)

    def kind(self) -> str:
        """Which family a forced strategy is for: ``"pipeline"``, ``"mixed"`` (region
        pins: :mod:`autopar.strategies.mixed`), ``"cube"``, ``"3d"``,
        ``"dsp"`` (sub-grids or cSub), else ``"mesh"``: data × tensor, pure data
        parallelism or Megatron by the degrees :meth:`resolve` gives; ``"experts"`` with
        an expert degree above 1 (:mod:`autopar.strategies.experts`, on the family of
        :meth:`base`); a registered family's name (:data:`DECLARED`) for its strategy."""
        if self.family:
            return self.family
        if self.experts is not None and self.experts > 1:
            return "experts"
        if self.context > 1:
            return "context"
        if self.pipeline > 1:
            return "pipeline"
        if self.mixed:
            return "mixed"
        if self.cube:
            return "cube"
        if self.grid is not None:
            return "3d"
        if self.subgrids > 1 or self.csub:
            return "dsp"
        return "mesh"

    def base(self) -> "Strategy":
        """This configuration without expert parallelism (the family it rides on)."""
        return dataclasses.replace(self, experts=1, expert_pins=())

    def resolve(self, world: int) -> tuple[int, int]:
        """``(data, tensor)`` on ``world`` ranks, a degree left ``None`` filled in."""
        data, tensor = self.data, self.tensor
        if data is None and tensor is None:
            data, tensor = world, 1
        elif data is None:
            data = world // tensor if world % tensor == 0 else 0
        elif tensor is None:
            tensor = world // data if world % data == 0 else 0
        if data * tensor != world or data < 1 or tensor < 1:
            raise PlanError(f"strategy: the forced degrees data={self.data} x tensor={self.tensor} do not match "
                            f"the world size {world}; give degrees whose product is {world}")
        return data, tensor


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (the degrees a world of ``n`` ranks can take)."""
    return [k for k in range(1, n + 1) if n % k == 0]
