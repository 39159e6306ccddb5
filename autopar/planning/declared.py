"""The registry of the strategy language: what each family declares to the generic
layers, so that they learn what a family is from here and never by its name.

A family declares itself with a :class:`Language`: its name, the strategy keys it owns
and how they parse into :class:`~autopar.planning.strategy.Strategy` fields (with the
error texts naming them), its pin form for ``strategy={"regions": {...}}``, which
strategies are its kind, the mesh axes and process groups it owns
(:class:`autopar.grid.MeshAxis`), its part of the plan's rank layout and groups, and
how the plan's explanation and report show it. Every hook has a default that declares
nothing, so a family says only what it owns. The built-in families declare theirs in
their packages (``autopar/strategies/<family>/language.py``); a family registered with
:func:`autopar.register_family` gets a :class:`Declared` (its name, option keys and
explain lines) or passes its own :class:`Language`. Both reach :data:`DECLARED` through
:func:`declare`, called by :mod:`autopar.strategies.registry` with the family object.

The generic code (:mod:`autopar.planning.strategy`, :mod:`~autopar.planning.plan`,
:mod:`~autopar.planning.explain`, :mod:`~autopar.planning.report`, the search) loops
over :func:`declarations`: in descending :attr:`Language.precedence` where the first
that answers wins (a family whose strategies carry another's fields, such as a pipeline
with pinned regions, goes before it), else in the order of registration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

RESERVED = ("auto", "data", "tensor", "mesh")
"""Strategy words no registered family may take: ``strategy="auto"``, ``"data"``,
``"tensor"``, and the kind of a plain data × tensor strategy (:meth:`Strategy.kind`)."""


@dataclass(frozen=True)
class PinForm:
    """How a family is pinned to regions (``strategy={"regions": {PATTERN: SPEC}}``):
    ``SPEC`` is the word ``name``, or with ``options`` (the keys it reads) the dict
    ``{name: {option: value}}``; ``text`` shows it in the error that lists the pins,
    ``full`` (default ``text``) where an unreadable one is refused; ``parse(pattern,
    options, where)`` makes the :class:`~autopar.planning.strategy.Pin` (None: the pin
    of the word alone); ``describe(pin)`` how errors show a pin (None: the word). A
    family's other words (``Language.aliases``) name its pin too."""

    name: str
    text: str
    full: str = ""
    options: frozenset | None = None
    parse: Callable | None = None
    describe: Callable | None = None


class Language:
    """What one family declares; every hook optional (the defaults declare nothing).

    Identity: ``name`` (the family's, as registered), ``kind`` (what
    :meth:`Strategy.kind` names its strategies; "" none), ``precedence`` (module
    docstring), ``aliases`` (other words for it: in ``why_not``, pins, ``family_runtime``), ``absent`` (why_not's
    text when it offered nothing; None: why_not does not list it), ``axes`` (the mesh
    dimensions and process groups it owns, :class:`autopar.grid.MeshAxis`),
    ``region_strategies`` (what ``RegionChoice.strategy`` says of the regions it splits),
    ``renamed`` ((plan format version, older word, word) of a word an older plan.json
    spelled otherwise: a region's strategy, a key of its alternatives, a word of a
    candidate's form; loading that file reads the word now),
    ``colours`` ((strategy prefix, colour) pairs of the report), ``draws_follow``
    (whether random draws can follow its regions' split: False where it moves rows or
    parts elsewhere), ``runs_as`` (how a sentence says a region runs under it:
    "replicated"), ``branches`` (whether its regions run branches on other rows).

    Strategy keys: ``keys`` (what it owns), ``key_text`` (how the error that lists a
    plain strategy's keys names them; "" for a family its own key sets up), ``trigger``
    (keys that make a strategy dict its own: :meth:`parse` reads it whole).
    """

    name: str = ""
    keys: tuple[str, ...] = ()
    explain: Any = None      # a registered family's explain(plan) -> list[str] (Declared)
    by_name: bool = False    # strategy="NAME" / {"family": NAME, ...} forces it
    built_in: bool = False
    kind: str = ""
    precedence: int = 0
    aliases: tuple[str, ...] = ()
    absent: str | None = None
    axes: tuple[str, ...] = ()
    region_strategies: tuple[str, ...] = ()
    renamed: tuple[tuple[int, str, str], ...] = ()
    colours: tuple[tuple[str, str], ...] = ()
    draws_follow: bool = True
    runs_as: str = ""
    branches: bool = False
    key_text: str = ""
    trigger: frozenset = frozenset()
    pin: PinForm | None = None

    # -- the strategy language (autopar.planning.strategy) -----------------------------------
    def outer(self, strategy: dict, parse: Callable) -> Any:
        """The Strategy of a whole strategy dict this family wraps around another's
        (``parse`` reads the rest), or None when it is not its."""
        return None

    def take(self, strategy: dict) -> tuple[dict, dict, bool]:
        """``strategy`` (the levers taken off) less this family's keys, the Strategy
        fields those give, and whether they need a family under them."""
        return strategy, {}, False

    def combine(self, parsed, fields: dict) -> None:
        """Refuse (``PlanError``) a strategy ``parsed`` that ``fields`` of :meth:`take` do not ride on."""

    def parse(self, strategy: dict) -> Any:
        """The Strategy of a dict holding one of :attr:`trigger` (a ``PlanError`` naming
        what cannot be read)."""
        raise NotImplementedError

    def fields(self, strategy: dict) -> dict:
        """The Strategy fields of a plain strategy's keys of this family's."""
        return {}

    def stray(self, strategy: dict) -> str | None:
        """Why keys of this family's that need its :attr:`trigger` cannot stand alone, or None."""
        return None

    def is_kind(self, strategy) -> bool:
        """Whether ``strategy`` is of this family's :attr:`kind`."""
        return False

    # -- the plan's layout (autopar.planning.plan) -------------------------------------------
    def rank_dims(self, plan) -> dict | None:
        """The plan's rank grid (dimension → size, outermost first) where this family lays it out."""
        return None

    def refine_dims(self, plan, dims: dict) -> dict:
        """The rank grid with this family's dimensions within another's."""
        return dims

    def group_specs(self, plan, tied: tuple) -> dict | None:
        """The process groups of the plan's rank programs where this family lays them out."""
        return None

    def refine_groups(self, plan, specs: dict, tied: tuple) -> dict:
        """The groups with this family's, around another's (applied inner family first)."""
        return specs

    def form(self, plan) -> str | None:
        """The plan's form (``Plan.form``) where it is this family's."""
        return None

    def batch_parts(self, plan) -> int | None:
        """Into how many chunks the common layers split the batch, where this family says."""
        return None

    def batch_chunk(self, plan, rank: int) -> int | None:
        """Which of those chunks ``rank`` takes, where this family says."""
        return None

    def layout_key(self, layout) -> tuple:
        """What of a plan's or a configuration's layout this family adds (``Plan._same_layout``)."""
        return ()

    def partial_rank(self, plan, rank: int) -> bool:
        """Whether ``rank``'s program is a part that takes no inputs (the others send it
        the call's outputs and loss)."""
        return False

    # -- the explanation (autopar.planning.explain) and the report (autopar.planning.report) -----
    def rank_layout(self, plan) -> str | None:
        """The explanation's rank layout beside the mesh, where this family lays the ranks out."""
        return None

    def rank_note(self, plan) -> str | None:
        """What the generic rank layout adds after "tensor ranks adjacent"."""
        return None

    def mesh_note(self, plan) -> str:
        """This family's note after the mesh."""
        return ""

    def lever_note(self, plan, lever: str) -> str | None:
        """The step line's note on ``lever`` where this family runs it."""
        return None

    def header_lines(self, plan) -> list[str]:
        """Lines after the step line."""
        return []

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        """``(place, lines)`` sections after the region table (the places:
        :data:`autopar.planning.explain.PLACES`)."""
        return []

    def owns(self, candidate) -> bool:
        """Whether a configuration weighed is this family's (``why_not``)."""
        return False

    def candidate_text(self, candidate) -> str | None:
        """How the configurations weighed show a configuration of this family's."""
        return None

    def boundary(self, plan, choice) -> str | None:
        """A region of this family's in a mixed plan: its conversions to and from the
        activation replicated over the tensor group (None: none shown)."""
        return None

    def region_label(self, plan, choice) -> str | None:
        """The region's strategy as the drawing of the regions labels it."""
        return None

    def report(self, plan) -> str:
        """This family's section of report.html."""
        return ""


@dataclass(frozen=True)
class Declared(Language):
    """A family registered through :func:`autopar.register_family` whose strategy is
    forced by its name: ``strategy="NAME"`` or ``{"family": "NAME", OPTION: value, ...}``
    with the option ``keys`` it declares (a memory lever of :data:`autopar.planning.strategy.LEVER_KEYS` among them
    when it prices the levers; the others are refused); ``explain``: its lines in
    :meth:`Plan.explain` (``explain(plan) -> list[str]``)."""

    name: str
    keys: tuple[str, ...] = ()
    explain: Any = None
    by_name: bool = True   # False: weighed and run, never forced by name


DECLARED: dict[str, Language] = {}
"""Every family's declaration by name, in the order of registration (the built-in ones first)."""


def declare(family: Language) -> None:
    """Let the generic layers read ``family``'s declaration (:class:`Language`)."""
    taken = set(RESERVED) | {d.kind for d in DECLARED.values() if d.kind}
    if not family.built_in and (family.name in taken or family.name in DECLARED):
        raise ValueError(f"register_family: the name {family.name!r} is taken by a built-in strategy; choose another")
    owned = {axis for d in DECLARED.values() for axis in d.axes}
    if owned & set(family.axes):
        raise ValueError(f"register_family: {family.name!r} declares the axes {sorted(owned & set(family.axes))}, "
                         f"which another family owns")
    DECLARED[family.name] = family


def declarations() -> list[Language]:
    """Every declaration, in descending precedence (registration order among equals)."""
    return sorted(DECLARED.values(), key=lambda d: -d.precedence)


def first(answers) -> Any:
    """The first answer that is not None (None when none is)."""
    return next((a for a in answers if a is not None), None)


def registered(name: str) -> Language | None:
    """The declaration of a family registered from outside autopar (not built in), or None."""
    found = DECLARED.get(name)
    return None if found is None or found.built_in else found


def region_owner(strategy: str) -> Language | None:
    """The family whose regions carry ``strategy`` (``RegionChoice.strategy``), or None."""
    return next((d for d in DECLARED.values() if strategy in d.region_strategies), None)


def region_label(plan, choice) -> str:
    """A region's strategy as the drawing of the regions labels it: its family's label
    (``Language.region_label``: Megatron's with the tensor degree), else the strategy."""
    owner = region_owner(choice.strategy)
    return (owner.region_label(plan, choice) if owner is not None else None) or choice.strategy


def by_word(word: str) -> Language | None:
    """The family a word names: its name or one of its aliases (any case), or None."""
    word = word.lower()
    return DECLARED.get(word) or next((d for d in DECLARED.values() if word in d.aliases), None)


__all__ = ["DECLARED", "Declared", "Language", "PinForm", "RESERVED", "by_word", "declarations", "declare", "first",
           "region_label", "region_owner", "registered"]
