"""What a user may force, and the error a plan that cannot run raises.

:class:`Strategy` is a configuration of every family in one frozen dataclass: the
degrees of data × tensor, and the fields of each family's own keys (sub-grids, a 3D
grid or a cube, a pipeline, region pins, experts, context). :meth:`Strategy.parse` reads
what ``compile``/``plan`` are given (``"auto"``, ``"data"``, ``"tensor"`` or a dict of
degrees): the keys, the pins of ``strategy["regions"]``, :meth:`Strategy.kind` and the
errors naming them come from the families' declarations
(:mod:`autopar.planning.declared`), so this module names no family. The planner's
families offer their candidate configurations as Strategies too
(:mod:`autopar.strategies.family`).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
from dataclasses import dataclass
from typing import Any

from autopar.grid import Grid3D
from autopar.planning.declared import DECLARED, PinForm, by_word, declarations, first

LEVER_KEYS = ("microbatches", "zero", "recompute", "sequence_parallel")
"""Keys that combine with every family's (docs/memory.md): gradient accumulation over
``microbatches`` (a pipeline's microbatches), ZeRO's stage of sharded data parallelism
over the data group, which activations are recomputed in backward, and whether the
values between tensor-parallel regions run split over the sequence (docs/sequence.md)."""
RECOMPUTE_MODES = ("none", "selective", "full")
REGION_KINDS = ("fork_join", "attention", "linear_chain", "vocab", "experts")
LEFT_WHOLE = "replicate"
"""The pin every region may take: left whole (replicated over the tensor group)."""


class PlanError(ValueError):
    """A forced strategy that cannot run; the message names the argument or region."""


@dataclass(frozen=True)
class Pin:
    """A region pinned to a family (``strategy={"regions": {PATTERN: SPEC}}``).

    ``pattern`` is a glob over region names (``"linear_chain:blocks.*.mlp"``) or
    ``"kind:K"`` for every region of kind K; ``family`` the word of a family's pin form
    (:class:`~autopar.planning.declared.PinForm`) or ``"replicate"``; ``subgrids`` the
    sub-grids a pin asks for (0: the tensor degree), ``grid`` the 3D grid's
    ``(x, y, z)`` (None: the planner's)."""

    pattern: str
    family: str
    subgrids: int = 0
    grid: tuple[int, int, int] | None = None

    def matches(self, region) -> bool:
        if self.pattern.startswith("kind:"):
            return region.kind == self.pattern[len("kind:"):]
        return fnmatch.fnmatchcase(region.id, self.pattern)

    def describe(self) -> str:
        form = _pin_forms().get(self.family)
        return form.describe(self) if form is not None and form.describe is not None else self.family

    @staticmethod
    def parse(pattern: Any, spec: Any) -> "Pin":
        """One ``PATTERN: SPEC`` of ``strategy["regions"]``; a :class:`PlanError` naming
        the pattern when either cannot be read (the families' pin forms, in the order
        the errors list them: the words, then the forms with options)."""
        if not isinstance(pattern, str) or not pattern:
            raise PlanError(f"strategy['regions']: the pattern {pattern!r} is not a region name glob or 'kind:K'")
        if pattern.startswith("kind:") and pattern[len("kind:"):] not in REGION_KINDS:
            raise PlanError(f"strategy['regions'][{pattern!r}]: unknown region kind; use one of "
                            f"{', '.join('kind:' + k for k in REGION_KINDS)}")
        where = f"strategy['regions'][{pattern!r}]"
        forms = _pin_forms()
        if isinstance(spec, str):
            form = _pin_form(forms, spec)
            if spec != LEFT_WHOLE and form is None:
                raise PlanError(f"{where}: {spec!r} is no family; use "
                                f"{_either([repr(LEFT_WHOLE), *(f.text for f in forms.values())], 'or')}")
            return form.parse(pattern, None, where) if form is not None and form.parse is not None \
                else Pin(pattern, form.name if form is not None else spec)
        if isinstance(spec, dict) and len(spec) == 1:
            (family, options), = spec.items()
            options = options or {}
            form = _pin_form(forms, family)
            if form is not None and form.options is not None and isinstance(options, dict) \
                    and set(options) <= form.options:
                return form.parse(pattern, options, where)
        raise PlanError(f"{where}: cannot read {spec!r}; a pin is "
                        f"{_either([repr(LEFT_WHOLE), *(f.full or f.text for f in forms.values())], 'or')}")


def _pin_forms() -> dict[str, PinForm]:
    """The families' pin forms by word: those of the word alone, then those with options
    (each in the order of registration)."""
    forms = [d.pin for d in DECLARED.values() if d.pin is not None]
    return {f.name: f for f in sorted(forms, key=lambda f: f.options is not None)}


def _pin_form(forms: dict[str, PinForm], word) -> PinForm | None:
    """The pin form ``word`` names: by its name, or by another word for its family
    (:func:`~autopar.planning.declared.by_word`: ``"3d"`` for ``tensor3d``)."""
    if not isinstance(word, str):
        return None
    family = by_word(word)
    return forms.get(word) or (family.pin if family is not None and family.pin in forms.values() else None)


def _either(texts: list[str], word: str) -> str:
    """``'a', 'b' or 'c'`` (``word``: "or", "and")."""
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} {word} {texts[-1]}"


def parse_pins(pins: Any) -> tuple[tuple[Pin, ...], Grid3D | None]:
    """The pins of ``strategy["regions"]`` and the tensor group's 3D grid they ask for."""
    if not isinstance(pins, dict) or not pins:
        raise PlanError(f"strategy['regions']: expected a dict {{PATTERN: SPEC}}, got {pins!r}")
    parsed = tuple(Pin.parse(k, v) for k, v in pins.items())
    grids = {p.grid for p in parsed if p.grid is not None}
    if len(grids) > 1:
        raise PlanError(f"strategy['regions']: pins ask for 3D grids {sorted(grids)}; the regions of one plan "
                        f"share one x × y × z grid of the tensor group in this version")
    grid = next(iter(grids), None)
    return parsed, None if grid is None else Grid3D(*grid)


@dataclass(frozen=True)
class Strategy:
    """Forced degrees. ``None`` for a degree means: whatever the world size leaves."""

    data: int | None = None
    tensor: int | None = None
    subgrids: int = 1
    topology_aware: bool = True
    csub: bool = False
    grid: Grid3D | None = None  # AxoNN's Gx x Gy x Gz x Gdata (3D/4D tensor parallelism)
    # the form a family runs the grid in, as Plan.form and MeshCandidate.form name it (""
    # none: AxoNN's; the cube family's p x p x p form, its data degree None = what the world leaves)
    form: str = ""
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
        """``"auto"`` → None; ``"data"``; ``"tensor"``; ``{"data": 2, "tensor": 2}``; a Strategy.

        A dict is read by the families' declarations (:mod:`autopar.planning.declared`),
        in descending precedence: a family that wraps another's strategy (``outer``)
        reads it whole; the memory levers are taken off (:data:`LEVER_KEYS`), then the
        keys a family rides with (``take``: experts); the rest is one family's: the first
        whose ``trigger`` key it holds, else a plain strategy whose keys the families
        with a ``key_text`` own (their ``fields``, or their ``trigger`` read after the
        keys are checked)."""
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
            return Strategy._parse_dict(strategy)
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
    def _parse_dict(strategy: dict) -> "Strategy":
        """A dict of degrees and keys (:meth:`parse`)."""
        wrapped = first(d.outer(strategy, Strategy.parse) for d in declarations())
        if wrapped is not None:
            return wrapped
        levers = Strategy._levers(strategy)
        rest, fields, rides, takers = {k: v for k, v in strategy.items() if k not in LEVER_KEYS}, {}, False, []
        for d in declarations():
            rest, more, needs = d.take(rest)
            if more:
                takers.append((d, more))
                fields.update(more)
                rides = rides or needs
        if not rest and not rides:  # levers alone: the planner picks the families
            return Strategy(levers_only=True, **levers, **fields)
        parsed = Strategy._parse_family(rest) if rest else Strategy()
        for d, more in takers:
            d.combine(parsed, more)
        return dataclasses.replace(parsed, **levers, **fields)

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
    def _parse_family(strategy: dict) -> "Strategy":
        """A dict of one family's keys (the levers and the keys families ride with taken off)."""
        keys = set(strategy)
        plain = [d for d in DECLARED.values() if d.key_text]   # a plain strategy's families, registration order
        triggered = next((d for d in declarations() if not d.key_text and d.trigger & keys), None)
        if triggered is not None:
            return triggered.parse(strategy)
        why = first(d.stray(strategy) for d in declarations())
        if why is not None:
            raise PlanError(why)
        unknown = keys - {k for d in plain for k in d.keys}
        if unknown:
            raise PlanError(f"strategy: unknown mesh dimension(s) {sorted(unknown)}; this version plans "
                            f"{_either([d.key_text for d in plain], 'and')}")
        triggered = next((d for d in declarations() if d.key_text and d.trigger & keys), None)
        if triggered is not None:
            return triggered.parse(strategy)
        fields: dict = {}
        for d in plain:
            fields.update(d.fields(strategy))
        return Strategy(**fields)

    def kind(self) -> str:
        """Which family a forced strategy is for: a registered family's name
        (:data:`DECLARED`) for its strategy, else the ``kind`` of the first declaration
        (in descending precedence) whose ``is_kind`` holds (a family that rides on
        another, as expert parallelism on :meth:`base`, before it), else ``"mesh"``:
        data × tensor, pure data parallelism or Megatron by the degrees :meth:`resolve`
        gives."""
        if self.family:
            return self.family
        return first(d.kind if d.is_kind(self) else None for d in declarations()) or "mesh"

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
